//! Behavioural tests through real HTTP. `FILEDOCK_TEST_BACKEND=real` runs
//! them against Redis, MongoDB and S3 servers (scripts/test.sh starts them);
//! otherwise against the embedded adapters.

mod account;
mod cli;
mod connections;
mod content;
mod crash;
mod fault_cluster;
mod fault_proxy;
mod fault_suite;
mod fault_workload;
mod faults;
mod files;
mod group_commit;
mod hardening;
mod helpers;
mod history;
mod hostile;
mod http_semantics;
mod idempotency;
mod links;
mod lock_faults;
mod locks;
mod openapi;
mod orphans;
mod platform;
mod queue;
mod queue_faults;
mod real;
mod rename;
mod same_user;
mod servers;
mod tus;
mod tus_recovery;
