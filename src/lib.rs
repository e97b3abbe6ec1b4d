//! filedock: a file-upload backend where many writes to the same user,
//! session or agent, arriving within milliseconds, all succeed.
//!
//! Dependencies point one way: `http → domain → ports ← adapters`
//! (`scripts/layers.sh` checks it; README "Layout" has the table).
//! - [`http`] extracts, calls one service, maps the result; only it knows
//!   status codes ([`http::error::ApiError`] wraps [`domain::DomainError`]).
//! - [`domain`] holds the flows, as services that own the ports they use.
//! - [`vocab`] is what every layer speaks: ids, keys, commands. It imports
//!   nothing from the crate and every layer may use it.
//! - The ports ([`meta`], [`blob`], [`lock`], [`coord`]) are narrow traits,
//!   each with its adapters underneath; they never import a service, HTTP
//!   or the wiring.
//! - [`redis_link`] is how the Redis adapters reach Redis and read its
//!   errors (an outage, or a topology answer such as MOVED).
//! - [`startup`] wires adapters ([`ports::Ports`]) into services and runs
//!   the server and the background [`worker`]s.

pub mod blob;
pub mod config;
pub mod coord;
pub mod domain;
pub mod hooks;
pub mod http;
pub mod lock;
pub mod meta;
pub mod metrics;
pub mod ports;
pub mod redis_link;
pub mod startup;
pub mod telemetry;
#[cfg(feature = "testing")]
pub mod testing;
pub mod vocab;
pub mod worker;

/// A failpoint for the crash trials: when `FILEDOCK_TEST_CRASH_AT` names
/// this point, the process dies here as if killed (no unwinding, no cleanup);
/// when it names it as `panic:NAME`, the request panics here instead (a bug,
/// which the HTTP layer answers as a 500).
pub fn crash_point(name: &str) {
    static AT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let Some(at) = AT
        .get_or_init(|| std::env::var("FILEDOCK_TEST_CRASH_AT").ok())
        .as_deref()
    else {
        return;
    };
    if at == name {
        eprintln!("filedock: crash point {name} reached; aborting");
        std::process::abort();
    }
    if at.strip_prefix("panic:") == Some(name) {
        panic!("filedock: panic point {name} reached");
    }
}
