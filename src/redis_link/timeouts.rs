//! How long filedock waits for Redis: not long (an unreachable Redis is an
//! outage to degrade around or refuse, not something to wait for).

use std::time::Duration;

use redis::aio::ConnectionManagerConfig;

/// How long a connection attempt may take: an unreachable Redis is an
/// outage to degrade around, not something to wait for.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// How long one command may wait for its answer.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);
/// On a cluster, how long a command may take in all, its retries included.
pub const OVERALL_TIMEOUT: Duration = Duration::from_secs(3);

/// How filedock talks to one node: fail fast (see [`CONNECT_TIMEOUT`]).
pub fn connection_config() -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(RESPONSE_TIMEOUT))
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_millis(500))
}
