//! filedock: a file-upload backend where many writes to the same user,
//! session or agent, arriving within milliseconds, all succeed.

pub mod blob;
pub mod config;
pub mod coord;
pub mod domain;
pub mod http;
pub mod lock;
pub mod meta;
pub mod metrics;
pub mod ports;
pub mod startup;
pub mod telemetry;
#[cfg(feature = "testing")]
pub mod testing;
pub mod worker;

/// A failpoint for the crash trials: when `FILEDOCK_TEST_CRASH_AT` names
/// this point, the process dies here as if killed (no unwinding, no cleanup).
pub fn crash_point(name: &str) {
    static AT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    if AT
        .get_or_init(|| std::env::var("FILEDOCK_TEST_CRASH_AT").ok())
        .as_deref()
        == Some(name)
    {
        eprintln!("filedock: crash point {name} reached; aborting");
        std::process::abort();
    }
}
