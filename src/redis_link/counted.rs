//! A connection that counts the commands it sends into
//! `filedock_redis_commands_total`: what a request costs in Redis round trips.

use prometheus_client::metrics::counter::Counter;
use redis::{Cmd, Pipeline, RedisFuture, Value, aio::ConnectionLike};

/// `inner`, counting every command (each of a pipeline's) into `commands`.
#[derive(Clone)]
pub struct Counted<C> {
    pub(super) inner: C,
    pub(super) commands: Counter,
}

impl<C: ConnectionLike + Send> ConnectionLike for Counted<C> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.commands.inc();
        self.inner.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.commands.inc_by(count as u64);
        self.inner.req_packed_commands(cmd, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}
