//! Behavioural tests through real HTTP. `FILEDOCK_TEST_BACKEND=real` runs
//! them against Redis, MongoDB and S3 servers (scripts/test.sh starts them);
//! otherwise against the embedded adapters.

mod account;
mod audit;
mod cli;
mod clients;
mod content;
mod crash;
mod fault_suite;
mod faults;
mod files;
mod group_commit;
mod helpers;
mod idempotency;
mod key_upgrade;
mod keys;
mod lifecycle;
mod links;
mod lock_faults;
mod lock_waiters;
mod locks;
mod memory;
mod openapi;
mod orphans;
mod platform;
mod queue;
mod queue_faults;
mod real;
mod rename;
mod same_user;
mod support;
mod tokens;
mod tus;
mod tus_completed;
mod tus_recovery;
mod tus_release;
mod tus_sweep;
