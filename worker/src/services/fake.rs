//! Replicas that exist only in memory, for tests of the action path.

use super::{ReplicaDriver, Served, ServiceError};
use futures::future::BoxFuture;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tangram_shared::{GpuRoute, ReplicaReport, ServiceReport};

/// Services that score every input `score` after `latency` of tokio time, one replica per
/// service on the first chunk it is routed to.
#[derive(Debug)]
pub struct FakeReplicas {
    services: Vec<String>,
    score: f64,
    latency: Duration,
    stopped: AtomicBool,
}

impl FakeReplicas {
    /// Fake replicas of `services`.
    pub fn new(services: &[&str], score: f64, latency: Duration) -> Self {
        Self {
            services: services.iter().map(|s| s.to_string()).collect(),
            score,
            latency,
            stopped: AtomicBool::new(false),
        }
    }

    /// True once [`ReplicaDriver::stop_all`] ran.
    pub fn stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }
}

impl ReplicaDriver for FakeReplicas {
    fn report(&self) -> Vec<ServiceReport> {
        self.services
            .iter()
            .map(|name| ServiceReport {
                name: name.clone(),
                gpus: 1,
                restore_ms: 0,
                slots: 1,
                replicas: Vec::<ReplicaReport>::new(),
            })
            .collect()
    }

    fn serve<'a>(
        &'a self,
        route: &'a GpuRoute,
        inputs: &'a [String],
        _options: &'a BTreeMap<String, String>,
        _timeout: Duration,
    ) -> BoxFuture<'a, Result<Served, ServiceError>> {
        Box::pin(async move {
            if !self.services.contains(&route.service) {
                return Err(ServiceError::Unknown(route.service.clone()));
            }
            tokio::time::sleep(self.latency).await;
            Ok(Served {
                scores: vec![self.score; inputs.len()],
                overhead_us: 0,
                exec_us: self.latency.as_micros() as u64,
                gpus: vec![u32::from(route.chunk.start)],
                restored: false,
                evicted: Vec::new(),
            })
        })
    }

    fn check_health(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    fn stop_all(&self, _grace: Duration) -> BoxFuture<'_, ()> {
        self.stopped.store(true, Ordering::SeqCst);
        Box::pin(async {})
    }
}
