//! Model services on a GPU worker: replica processes, their sleep/wake lifecycle through the
//! serving engine's own API, scoring, health checks and restarts (the worker's half of
//! Evict-on-Execution; the scheduler decides what is resident where).
//!
//! A replica is one process of one service bound to one aligned chunk of GPUs (its
//! `CUDA_VISIBLE_DEVICES`). Every service is deployed at start with one replica asleep on a
//! home chunk, its state in host memory; the scheduler's routes name the chunk, and a route to
//! a chunk where the service has no process yet starts one there first.

pub use crate::config::service::{Driver, ServiceConfig, REPLICA_PASSTHROUGH};
use crate::docker::{DockerError, ReplicaContainers};
use crate::metrics as m;
use futures::future::BoxFuture;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tangram_shared::{ChunkRef, GpuInventory, GpuRoute, ReplicaReport, ServiceReport};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

mod engine;
mod fake;
mod replica;

pub use engine::ReplicaError;
pub use fake::FakeReplicas;
use replica::Replica;

/// What the worker needs from its model replicas: the seam between the action path and the
/// serving engines. [`Services`] runs real replica processes; [`FakeReplicas`] scores from
/// memory, for tests.
pub trait ReplicaDriver: Send + Sync + std::fmt::Debug {
    /// The services and replicas this worker offers (its fingerprint, in the heartbeat).
    fn report(&self) -> Vec<ServiceReport>;

    /// Serves one routed reward action: evicts what the route says, makes the replica
    /// resident, scores.
    fn serve<'a>(
        &'a self,
        route: &'a GpuRoute,
        inputs: &'a [String],
        options: &'a BTreeMap<String, String>,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Served, ServiceError>>;

    /// Health checks; a replica whose process died is started again.
    fn check_health(&self) -> BoxFuture<'_, ()>;

    /// Stops every replica, waiting up to `grace` for them to go.
    fn stop_all(&self, grace: Duration) -> BoxFuture<'_, ()>;
}

/// Why a reward action failed on the worker.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The worker serves no such service.
    #[error("worker serves no service named {0:?}")]
    Unknown(String),
    /// The route names GPUs the worker does not have.
    #[error("{0}")]
    BadRoute(String),
    /// No replica could be started for the route.
    #[error("starting a replica of {service:?}")]
    Start {
        /// Which service.
        service: String,
        /// Why.
        #[source]
        source: Box<ReplicaError>,
    },
    /// The replica could not be made resident.
    #[error("restoring {service:?} on GPUs {gpus:?}")]
    Restore {
        /// Which service.
        service: String,
        /// Its GPUs.
        gpus: Vec<u32>,
        /// Why.
        #[source]
        source: Box<ReplicaError>,
    },
    /// Scoring failed.
    #[error("scoring on {service:?} (attempt {attempt})")]
    Score {
        /// Which service.
        service: String,
        /// 1, or 2 when the first attempt never reached the replica (it had died).
        attempt: u32,
        /// Why.
        #[source]
        source: Box<ReplicaError>,
    },
    /// The replica returned the wrong number of scores.
    #[error("{service:?} returned {got} scores for {want} inputs")]
    ScoreCount {
        /// Which service.
        service: String,
        /// Scores returned.
        got: usize,
        /// Inputs sent.
        want: usize,
    },
}

/// What a served reward action measured.
#[derive(Debug, Clone)]
pub struct Served {
    /// Scores, one per input.
    pub scores: Vec<f64>,
    /// Time spent evicting and restoring, µs.
    pub overhead_us: u64,
    /// Time spent scoring, µs.
    pub exec_us: u64,
    /// The replica's GPUs.
    pub gpus: Vec<u32>,
    /// True when this action woke the replica.
    pub restored: bool,
    /// Services put to sleep first.
    pub evicted: Vec<String>,
}

/// Held while a replica of one (service, chunk) is being started.
type StartGate = Arc<tokio::sync::Mutex<()>>;

/// The worker's services and replicas.
#[derive(Debug)]
pub struct Services {
    configs: BTreeMap<String, ServiceConfig>,
    inventory: GpuInventory,
    replicas: Mutex<BTreeMap<(String, ChunkRef), Arc<Replica>>>,
    /// One lock per (service, chunk): whoever finds no live replica there starts one while
    /// holding it, so two requests (or a request and the health check) never both start one
    /// and the second never replaces, and kills, the first mid-request.
    launching: Mutex<BTreeMap<(String, ChunkRef), StartGate>>,
    http: reqwest::Client,
    state_dir: PathBuf,
    worker: String,
    containers: tokio::sync::OnceCell<ReplicaContainers>,
    /// Log forwarders, container watchers and removals.
    tasks: TaskTracker,
    /// Ends those tasks at [`ReplicaDriver::stop_all`].
    stop: CancellationToken,
}

impl Services {
    /// Builds the manager; nothing starts until [`Services::start`].
    pub fn new(
        worker: &str,
        configs: Vec<ServiceConfig>,
        inventory: GpuInventory,
        state_dir: PathBuf,
    ) -> Self {
        Self {
            configs: configs.into_iter().map(|c| (c.name.clone(), c)).collect(),
            inventory,
            replicas: Mutex::new(BTreeMap::new()),
            launching: Mutex::new(BTreeMap::new()),
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(2))
                .pool_idle_timeout(Duration::from_secs(30))
                // Small JSON exchanges: never wait on Nagle's algorithm.
                .tcp_nodelay(true)
                .build()
                .expect("building the HTTP client"),
            state_dir,
            worker: worker.to_string(),
            containers: tokio::sync::OnceCell::new(),
            tasks: TaskTracker::new(),
            stop: CancellationToken::new(),
        }
    }

    async fn containers(&self) -> Result<&ReplicaContainers, DockerError> {
        self.containers
            .get_or_try_init(|| ReplicaContainers::connect(&self.worker))
            .await
    }

    /// The GPUs of a chunk, or why the route is wrong.
    fn gpus_of(&self, chunk: ChunkRef) -> Result<Vec<u32>, ServiceError> {
        let group = self
            .inventory
            .groups
            .get(chunk.group as usize)
            .ok_or_else(|| {
                ServiceError::BadRoute(format!(
                    "GPU group {} does not exist on this worker",
                    chunk.group
                ))
            })?;
        let (s, l) = (chunk.start as usize, chunk.len as usize);
        if !tangram_shared::CHUNK_SIZES.contains(&chunk.len) || s % l != 0 || s + l > group.len() {
            return Err(ServiceError::BadRoute(format!(
                "chunk {}+{} is not an aligned chunk of group {} ({} GPUs)",
                s,
                l,
                chunk.group,
                group.len()
            )));
        }
        Ok(group[s..s + l].to_vec())
    }

    /// Kills replicas an earlier run of this worker left behind (their pids are kept in the
    /// state directory), then deploys one sleeping replica per service on its home chunk.
    pub async fn start(&self) -> Result<(), ReplicaError> {
        std::fs::create_dir_all(&self.state_dir).map_err(|source| ReplicaError::Local {
            what: format!("creating {}", self.state_dir.display()),
            source,
        })?;
        let killed = self.reconcile_leftovers();
        if killed > 0 {
            info!(
                count = killed,
                "stopped leftover replicas of an earlier run"
            );
        }
        // Home chunks: round-robin over the aligned chunks of each size, so services spread.
        let mut next: BTreeMap<u8, usize> = BTreeMap::new();
        let configs: Vec<ServiceConfig> = self.configs.values().cloned().collect();
        let mut starting = Vec::new();
        for c in &configs {
            let chunks: Vec<ChunkRef> = self
                .inventory
                .groups
                .iter()
                .enumerate()
                .flat_map(|(g, gpus)| {
                    (0..gpus.len())
                        .step_by(c.gpus as usize)
                        .filter(move |s| s + c.gpus as usize <= gpus.len())
                        .map(move |s| ChunkRef {
                            group: g as u16,
                            start: s as u8,
                            len: c.gpus,
                        })
                })
                .collect();
            if chunks.is_empty() {
                return Err(ReplicaError::NoChunk {
                    service: c.name.clone(),
                    gpus: c.gpus,
                });
            }
            let i = next.entry(c.gpus).or_default();
            let chunk = chunks[*i % chunks.len()];
            *i += 1;
            starting.push(self.launch(&c.name, chunk));
        }
        for r in futures::future::join_all(starting).await {
            r?;
        }
        info!(
            services = self.configs.len(),
            "services deployed, all asleep"
        );
        Ok(())
    }

    fn replica(&self, service: &str, chunk: ChunkRef) -> Option<Arc<Replica>> {
        self.replicas
            .lock()
            .expect("replicas lock")
            .get(&(service.to_string(), chunk))
            .cloned()
    }

    /// The live replica of `service` on `chunk`, started first if there is none. Starts are
    /// serialised per (service, chunk), and the check is repeated under the lock: of two
    /// callers that both found none, the second gets the first's replica.
    async fn ensure(&self, service: &str, chunk: ChunkRef) -> Result<Arc<Replica>, ReplicaError> {
        if let Some(r) = self.replica(service, chunk).filter(|r| !r.exited()) {
            return Ok(r);
        }
        let gate = self
            .launching
            .lock()
            .expect("launching lock")
            .entry((service.to_string(), chunk))
            .or_default()
            .clone();
        let _held = gate.lock().await;
        if let Some(r) = self.replica(service, chunk).filter(|r| !r.exited()) {
            return Ok(r);
        }
        self.launch(service, chunk).await
    }

    /// Serves one routed reward action: evicts what the route says, makes the replica
    /// resident (starting it first if the service has no process on that chunk), scores.
    /// A request that never reached the replica (the connection was refused: it had died)
    /// is retried once on a fresh one; a request that reached it is never sent twice, so a
    /// replica dying mid-request gives a `service` infra error, not a second scoring.
    async fn serve_one(
        &self,
        route: &GpuRoute,
        inputs: &[String],
        options: &BTreeMap<String, String>,
        timeout: Duration,
    ) -> Result<Served, ServiceError> {
        let c = self
            .configs
            .get(&route.service)
            .ok_or_else(|| ServiceError::Unknown(route.service.clone()))?;
        let gpus = self.gpus_of(route.chunk)?;
        let t0 = Instant::now();
        let mut evicted = Vec::new();
        for e in &route.evict {
            if let Some(v) = self.replica(&e.service, e.chunk) {
                let d = self
                    .configs
                    .get(&e.service)
                    .map(|c| c.driver)
                    .unwrap_or(Driver::Reference);
                let _g = v.lifecycle.lock().await;
                if v.is_awake() {
                    if let Err(err) = engine::sleep(&self.http, d, &v).await {
                        // A replica that cannot sleep holds GPU memory: stop it outright.
                        warn!(service = %e.service, error = %err, "eviction failed; stopping the replica");
                        self.kill(&v);
                        v.set_awake(false);
                    }
                    m::eviction(&e.service);
                    evicted.push(e.service.clone());
                }
            }
        }
        let mut restored = false;
        let mut last_err = None;
        for attempt in 1..=2 {
            let replica = self
                .ensure(&route.service, route.chunk)
                .await
                .map_err(|source| ServiceError::Start {
                    service: route.service.clone(),
                    source: Box::new(source),
                })?;
            {
                let _g = replica.lifecycle.lock().await;
                if !replica.is_awake() {
                    let w0 = Instant::now();
                    if let Err(source) = engine::wake(&self.http, c.driver, &replica).await {
                        last_err = Some(ServiceError::Restore {
                            service: route.service.clone(),
                            gpus: gpus.clone(),
                            source: Box::new(source),
                        });
                        self.kill(&replica);
                        continue;
                    }
                    restored = true;
                    m::restore(&route.service, w0.elapsed().as_secs_f64());
                }
            }
            let overhead_us = t0.elapsed().as_micros() as u64;
            let s0 = Instant::now();
            match engine::score(&self.http, c, &replica, inputs, options, timeout).await {
                Ok(scores) if scores.len() == inputs.len() => {
                    return Ok(Served {
                        scores,
                        overhead_us,
                        exec_us: s0.elapsed().as_micros() as u64,
                        gpus,
                        restored,
                        evicted,
                    })
                }
                Ok(scores) => {
                    return Err(ServiceError::ScoreCount {
                        service: route.service.clone(),
                        got: scores.len(),
                        want: inputs.len(),
                    })
                }
                Err(source) => {
                    warn!(service = %route.service, error = %source, "scoring failed");
                    let unsent = source.never_sent();
                    let err = ServiceError::Score {
                        service: route.service.clone(),
                        attempt,
                        source: Box::new(source),
                    };
                    if replica.exited() {
                        replica.set_awake(false);
                        replica.set_healthy(false);
                        m::replica_crashed(&route.service);
                    }
                    if unsent {
                        last_err = Some(err);
                        continue; // nothing was scored: a fresh (or the same) replica, once
                    }
                    return Err(err);
                }
            }
        }
        Err(last_err.expect("each failed attempt records its error"))
    }

    async fn check_health_once(&self) {
        let all: Vec<Arc<Replica>> = self
            .replicas
            .lock()
            .expect("replicas lock")
            .values()
            .cloned()
            .collect();
        for r in all {
            if r.lifecycle.try_lock().is_err() {
                continue; // busy with a sleep or wake: not the moment to judge it
            }
            let ok = !r.exited() && engine::get_json(&self.http, &r, "/health").await.is_ok();
            r.set_healthy(ok);
            if !ok && r.exited() {
                warn!(service = %r.service, gpus = ?r.gpus, "replica died; starting a fresh one");
                m::replica_crashed(&r.service);
                if let Err(e) = self.ensure(&r.service, r.chunk).await {
                    warn!(service = %r.service, error = %e, "restarting a replica failed");
                }
            }
        }
    }
}

impl ReplicaDriver for Services {
    fn report(&self) -> Vec<ServiceReport> {
        let replicas = self.replicas.lock().expect("replicas lock");
        self.configs
            .values()
            .map(|c| ServiceReport {
                name: c.name.clone(),
                gpus: c.gpus,
                restore_ms: c.restore_ms,
                slots: c.slots,
                replicas: replicas
                    .iter()
                    .filter(|((s, _), _)| s == &c.name)
                    .map(|((_, chunk), r)| ReplicaReport {
                        chunk: *chunk,
                        resident: r.is_awake(),
                        healthy: r.is_healthy(),
                    })
                    .collect(),
            })
            .collect()
    }

    fn serve<'a>(
        &'a self,
        route: &'a GpuRoute,
        inputs: &'a [String],
        options: &'a BTreeMap<String, String>,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Served, ServiceError>> {
        Box::pin(self.serve_one(route, inputs, options, timeout))
    }

    fn check_health(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.check_health_once())
    }

    fn stop_all(&self, grace: Duration) -> BoxFuture<'_, ()> {
        self.stop.cancel();
        self.tasks.close();
        let all: Vec<Arc<Replica>> =
            std::mem::take(&mut *self.replicas.lock().expect("replicas lock"))
                .into_values()
                .collect();
        for r in all {
            self.kill(&r);
            let _ = std::fs::remove_file(self.pid_file(r.port));
        }
        Box::pin(async move {
            if tokio::time::timeout(grace, self.tasks.wait())
                .await
                .is_err()
            {
                warn!("replica containers still being removed at the deadline");
            }
        })
    }
}
