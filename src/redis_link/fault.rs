//! What a Redis error means for the adapters: an outage to degrade around,
//! or a topology answer (MOVED, ASK…) that says the request went to the
//! wrong node and nothing ran.

use redis::{ErrorKind, RedisError, ServerErrorKind};

/// What a failed Redis call says about Redis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Redis is unreachable, slow or failing: the adapters degrade around it.
    Outage,
    /// Redis answered, but from a node that does not own the key (MOVED,
    /// ASK, READONLY), while a slot moves (TRYAGAIN), refused keys in
    /// several slots (CROSSSLOT), or from a node cut off from its cluster or
    /// its master (CLUSTERDOWN, MASTERDOWN) while the rest may still grant
    /// locks. The command did not run. Not an outage: a lock taken "without
    /// Redis" here would run beside a holder that the right node knows about
    /// (issue 43: 66 uploads ran unlocked this way). With Sentinel, no
    /// primary the sentinels agree on (one marked down, a failover under
    /// way) is one too: an instance still on the old primary may grant locks.
    Topology,
}

/// Classifies `e`; only a server's topology answer (or the sentinels'
/// "no primary") is [`Fault::Topology`].
pub fn fault_of(e: &RedisError) -> Fault {
    match e.kind() {
        ErrorKind::MasterNameNotFoundBySentinel => Fault::Topology,
        ErrorKind::Server(
            ServerErrorKind::Moved
            | ServerErrorKind::Ask
            | ServerErrorKind::TryAgain
            | ServerErrorKind::CrossSlot
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown,
        ) => Fault::Topology,
        _ => Fault::Outage,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_of(reply: &[u8]) -> RedisError {
        redis::parse_redis_value(reply)
            .unwrap()
            .extract_error()
            .unwrap_err()
    }

    #[test]
    fn topology_answers_are_not_outages() {
        for reply in [
            &b"-MOVED 5514 127.0.0.1:17002\r\n"[..],
            b"-ASK 5514 127.0.0.1:17002\r\n",
            b"-TRYAGAIN Multiple keys request during rehashing of slot\r\n",
            b"-CROSSSLOT Keys in request don't hash to the same slot\r\n",
            b"-READONLY You can't write against a read only replica.\r\n",
            b"-CLUSTERDOWN The cluster is down\r\n",
            b"-MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.\r\n",
        ] {
            assert_eq!(fault_of(&error_of(reply)), Fault::Topology, "{reply:?}");
        }
        for reply in [
            &b"-ERR unknown command\r\n"[..],
            b"-LOADING Redis is loading the dataset in memory\r\n",
        ] {
            assert_eq!(fault_of(&error_of(reply)), Fault::Outage, "{reply:?}");
        }
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(fault_of(&io), Fault::Outage);
        let no_primary = RedisError::from((ErrorKind::MasterNameNotFoundBySentinel, "none"));
        assert_eq!(fault_of(&no_primary), Fault::Topology);
    }
}
