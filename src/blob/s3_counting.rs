//! Counts every request the S3 client sends (each attempt, by operation)
//! into `filedock_s3_requests_total`: what an upload costs in round trips.

use std::sync::Arc;

use aws_sdk_s3::{
    config::{
        ConfigBag, Intercept, RuntimeComponents, interceptors::BeforeTransmitInterceptorContextRef,
    },
    error::BoxError,
};
use aws_smithy_runtime_api::client::orchestrator::Metadata;

use crate::metrics::Metrics;

pub(super) struct CountRequests(pub(super) Arc<Metrics>);

impl std::fmt::Debug for CountRequests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CountRequests")
    }
}

impl Intercept for CountRequests {
    fn name(&self) -> &'static str {
        "CountRequests"
    }

    fn read_before_transmit(
        &self,
        _request: &BeforeTransmitInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let op = cfg.load::<Metadata>().map_or("unknown", Metadata::name);
        self.0.s3_requests.get_or_create(&Metrics::op(op)).inc();
        Ok(())
    }
}
