//! Test support beyond `helpers.rs`: servers a test may stop and start, a
//! fault-injecting TCP proxy, and the fault suite's cluster, nemesis,
//! workload, history, read-back and checker (with its per-key model and
//! its events checks).

pub mod account_readback;
pub mod account_workload;
pub mod accounts;
pub mod checker;
pub mod cluster;
pub mod container_event_checks;
pub mod container_workload;
pub mod event_checks;
pub mod every_path;
pub mod failover_waiters;
pub mod fault_deck;
pub mod fault_proxy;
pub mod faulty_blobs;
pub mod feed_checks;
pub mod history;
pub mod key_event_checks;
pub mod lives;
pub mod mints;
pub mod model;
pub mod nemesis;
pub mod own_cluster;
pub mod own_rabbit;
pub mod own_sentinel;
pub mod precommit_hook;
pub mod proc_tree;
pub mod readback;
pub mod redis_cluster;
pub mod round_robin;
pub mod sentinel;
pub mod servers;
pub mod sets;
pub mod shard_rules;
pub mod signed_links;
pub mod tus_workload;
pub mod verdict;
pub mod webhook_receiver;
pub mod workload;
