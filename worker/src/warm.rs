//! The warm pool: sandboxes created and parked before anyone asks for one, so that a
//! `sandbox_open` is a claim (tens of milliseconds) instead of a container creation (about
//! two seconds).
//!
//! [`WarmPool`] wraps the real runtime and is itself a [`SandboxRuntime`]. A pooled
//! container is made by the same `start` as any other, so it has the same hardening; it has
//! never run a command, and it is handed out once, to one trajectory, then closed like any
//! other sandbox: nothing is reused between trajectories.
//!
//! Every open can be a claim. What a container fixes at creation is its image and the size
//! of its `/work`: the pool keeps sandboxes of the default image and of the images in demand
//! (learned from the last minute's opens on this worker, [`demand`]). What an open may vary
//! freely is fitted on claim: the memory limit is set to the open's (up or down), and the
//! open's environment rides on each command (a sandbox's environment is applied per exec,
//! warm or cold, with the command's own on top).
//!
//! Its size follows demand, per shape: the most opens of that shape seen in any stretch as
//! long as a creation takes (over the last minute), with a quarter on top; the default
//! shape never below `warm_pool_min`, all shapes together never above `warm_pool`. Several
//! creations run at once when the pool is short. Under memory pressure (the host has less
//! than a tenth of its memory available) the pool lets its containers go and makes no new
//! ones.

mod demand;

pub use demand::{target, Demand, Shape, OTHER_SHAPES, WINDOW};

use crate::sandbox::{
    ExecOutput, ExecRequest, RuntimeKind, SandboxError, SandboxHandle, SandboxKey, SandboxRuntime,
};
use futures::future::BoxFuture;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tangram_shared::SandboxOpen;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// What a creation is taken to cost before one has been measured.
const FIRST_CREATE: Duration = Duration::from_secs(2);
/// Below this share of the host's memory available, the pool empties.
const PRESSURE: f64 = 0.10;
/// After a failed creation, the next waits this long.
const RETRY: Duration = Duration::from_secs(2);
/// How long a stopping pool waits for the creations in flight, to remove what they make (the
/// worker waits 3 s for its background tasks in all).
const STOP_CREATE_WAIT: Duration = Duration::from_millis(2_500);
/// Creations in flight at once, at most: a pool emptied by a burst refills in about one
/// creation time per this many sandboxes, not one creation time each.
pub const REFILL_PARALLEL: usize = 4;

/// What the pool reports (heartbeats, status, metrics).
pub type PoolReport = tangram_shared::WarmPoolReport;

#[derive(Debug, Default)]
struct PoolState {
    ready: HashMap<Shape, VecDeque<SandboxHandle>>,
    creating: HashMap<Shape, usize>,
    demand: Demand,
    /// Mean creation time, smoothed.
    create: Option<Duration>,
    hits: u64,
    misses: u64,
    closed: bool,
}

impl PoolState {
    fn ready_total(&self) -> usize {
        self.ready.values().map(VecDeque::len).sum()
    }
    fn creating_total(&self) -> usize {
        self.creating.values().sum()
    }
}

/// What one pass of the pool's loop decided.
enum Step {
    Shrink(SandboxHandle),
    Grow(Shape),
    Wait,
}

/// A warm pool in front of a runtime. See the module docs.
pub struct WarmPool {
    inner: Arc<dyn SandboxRuntime>,
    /// What a pooled sandbox is opened with, its image aside.
    template: SandboxOpen,
    /// The default image's shape.
    default: Shape,
    parking: String,
    min: usize,
    max: usize,
    state: Mutex<PoolState>,
    wake: tokio::sync::Notify,
    /// Whether the host is short of memory now.
    pressure: Box<dyn Fn() -> bool + Send + Sync>,
}

impl std::fmt::Debug for WarmPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WarmPool")
            .field("min", &self.min)
            .field("max", &self.max)
            .field("report", &self.report())
            .finish()
    }
}

impl WarmPool {
    /// A pool of between `min` and `max` sandboxes, parked on `parking`.
    pub fn new(
        inner: Arc<dyn SandboxRuntime>,
        image: &str,
        parking: &str,
        min: usize,
        max: usize,
    ) -> Self {
        Self::with_pressure(
            inner,
            image,
            parking,
            min,
            max,
            Box::new(host_under_pressure),
        )
    }

    /// As [`WarmPool::new`], with the memory-pressure probe given (tests).
    pub fn with_pressure(
        inner: Arc<dyn SandboxRuntime>,
        image: &str,
        parking: &str,
        min: usize,
        max: usize,
        pressure: Box<dyn Fn() -> bool + Send + Sync>,
    ) -> Self {
        let template = SandboxOpen::default();
        Self {
            inner,
            default: Shape {
                image: image.to_string(),
                workdir_mb: template.workdir_mb,
            },
            template,
            parking: parking.to_string(),
            min: min.min(max),
            max,
            state: Mutex::new(PoolState::default()),
            wake: tokio::sync::Notify::new(),
            pressure,
        }
    }

    /// The shape that serves an open.
    fn shape_of(&self, open: &SandboxOpen) -> Shape {
        Shape {
            image: open
                .image
                .clone()
                .unwrap_or_else(|| self.default.image.clone()),
            workdir_mb: open.workdir_mb,
        }
    }

    /// Where the pool stands.
    pub fn report(&self) -> PoolReport {
        let st = self.state.lock().expect("pool lock");
        let ready = st.ready_total();
        PoolReport {
            target: self.targets_of(&st).iter().map(|(_, n)| *n).sum::<usize>() as u32,
            ready: ready as u32,
            hits: st.hits,
            misses: st.misses,
            mem_mb: ready as u64 * self.template.memory_mb,
        }
    }

    /// How many of each shape the pool wants now (none once closed).
    fn targets_of(&self, st: &PoolState) -> Vec<(Shape, usize)> {
        if st.closed {
            return Vec::new();
        }
        st.demand.targets(
            &self.default,
            st.create.unwrap_or(FIRST_CREATE),
            self.min,
            self.max,
        )
    }

    /// Decides the next move under the lock: release a sandbox of a shape over its target
    /// (every shape, under pressure), or start a creation for the first shape under its
    /// target while fewer than [`REFILL_PARALLEL`] are in flight.
    fn step(&self, pressure: bool) -> Step {
        let mut st = self.state.lock().expect("pool lock");
        st.demand.expire(Instant::now());
        let targets = if pressure {
            Vec::new()
        } else {
            self.targets_of(&st)
        };
        let want = |s: &Shape| targets.iter().find(|(t, _)| t == s).map_or(0, |(_, n)| *n);
        let over = st
            .ready
            .iter()
            .find(|(s, q)| q.len() > want(s))
            .map(|(s, _)| s.clone());
        if let Some(s) = over {
            if let Some(h) = st.ready.get_mut(&s).and_then(VecDeque::pop_front) {
                return Step::Shrink(h);
            }
        }
        st.ready.retain(|_, q| !q.is_empty());
        if st.creating_total() >= REFILL_PARALLEL {
            return Step::Wait;
        }
        for (shape, n) in &targets {
            let have = st.ready.get(shape).map_or(0, VecDeque::len)
                + st.creating.get(shape).copied().unwrap_or(0);
            if have < *n {
                *st.creating.entry(shape.clone()).or_default() += 1;
                return Step::Grow(shape.clone());
            }
        }
        Step::Wait
    }

    /// Keeps the pool at its targets until `stop`, then removes what it holds.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut n: u64 = 0;
        let mut creations: JoinSet<(Shape, Duration, Result<SandboxHandle, SandboxError>)> =
            JoinSet::new();
        loop {
            if stop.is_cancelled() || self.state.lock().expect("pool lock").closed {
                break;
            }
            let pressure = (self.pressure)();
            match self.step(pressure) {
                Step::Shrink(h) => {
                    if pressure {
                        info!("memory pressure: releasing a warm sandbox");
                    }
                    let _ = self.inner.remove(&h).await;
                    self.publish_gauges();
                }
                Step::Grow(shape) => {
                    n += 1;
                    let key = SandboxKey {
                        job: "warm".into(),
                        trajectory: format!("pool-{n}"),
                    };
                    let open = SandboxOpen {
                        image: (shape != self.default).then(|| shape.image.clone()),
                        workdir_mb: shape.workdir_mb,
                        ..self.template.clone()
                    };
                    let (inner, parking) = (self.inner.clone(), self.parking.clone());
                    creations.spawn(async move {
                        let t0 = Instant::now();
                        let made = inner.start(&key, &open, &parking).await;
                        (shape, t0.elapsed(), made)
                    });
                }
                Step::Wait => {
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = self.wake.notified() => {}
                        Some(done) = creations.join_next() => self.created(done, &stop).await,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            }
        }
        // The daemon goes on creating containers whatever becomes of the futures: let the
        // creations in flight finish (bounded) and remove what they make, or it outlives the
        // worker.
        let deadline = Instant::now() + STOP_CREATE_WAIT;
        while let Ok(Some(done)) = tokio::time::timeout_at(deadline, creations.join_next()).await {
            if let Ok((_, _, Ok(h))) = done {
                let _ = self.inner.remove(&h).await;
            }
        }
        creations.abort_all();
        self.close().await;
    }

    /// Files a finished creation: parked, or removed when the pool closed meanwhile.
    async fn created(
        &self,
        done: Result<
            (Shape, Duration, Result<SandboxHandle, SandboxError>),
            tokio::task::JoinError,
        >,
        stop: &CancellationToken,
    ) {
        let Ok((shape, took, made)) = done else {
            return;
        };
        // Decided under the lock, done after it.
        let (discard, failed) = {
            let mut st = self.state.lock().expect("pool lock");
            if let Some(c) = st.creating.get_mut(&shape) {
                *c = c.saturating_sub(1);
            }
            match made {
                Ok(h) if st.closed || stop.is_cancelled() => (Some(h), None),
                Ok(h) => {
                    st.create = Some(match st.create {
                        Some(c) => (c * 3 + took) / 4,
                        None => took,
                    });
                    st.ready.entry(shape.clone()).or_default().push_back(h);
                    debug!(took_ms = took.as_millis() as u64, image = %shape.image, "warm sandbox ready");
                    (None, None)
                }
                Err(e) => {
                    if shape != self.default {
                        st.demand.forget(&shape);
                    }
                    (None, Some(e))
                }
            }
        };
        if let Some(h) = discard {
            let _ = self.inner.remove(&h).await;
        }
        if let Some(e) = failed {
            warn!(error = %e, image = %shape.image, "creating a warm sandbox failed; trying again shortly");
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep(tangram_nats::backoff::jitter(RETRY)) => {}
            }
        }
        self.publish_gauges();
    }

    /// Removes every warm sandbox; the pool makes no more.
    pub async fn close(&self) {
        let ready: Vec<SandboxHandle> = {
            let mut st = self.state.lock().expect("pool lock");
            st.closed = true;
            st.ready.drain().flat_map(|(_, q)| q).collect()
        };
        for h in &ready {
            let _ = self.inner.remove(h).await;
        }
        self.publish_gauges();
    }

    fn publish_gauges(&self) {
        let r = self.report();
        crate::metrics::warm_pool(r.ready, r.mem_mb);
    }

    /// Takes a parked sandbox of `shape`, counting the open toward demand.
    fn claim(&self, shape: &Shape, asked: Instant) -> Option<SandboxHandle> {
        let mut st = self.state.lock().expect("pool lock");
        if st.closed {
            return None;
        }
        let h = st.ready.get_mut(shape).and_then(VecDeque::pop_front);
        match h.is_some() {
            true => {
                st.hits += 1;
                st.demand.record(asked, shape.clone());
            }
            false => st.misses += 1,
        }
        h
    }

    /// Makes a claimed sandbox the open's: its memory limit and its environment.
    async fn fit(
        &self,
        mut h: SandboxHandle,
        open: &SandboxOpen,
    ) -> Result<SandboxHandle, SandboxError> {
        if open.memory_mb != self.template.memory_mb {
            self.inner.resize(&h, open.memory_mb).await?;
        }
        h.env = crate::sandbox::env_list(&open.env);
        Ok(h)
    }
}

impl SandboxRuntime for WarmPool {
    fn kind(&self) -> RuntimeKind {
        self.inner.kind()
    }

    fn images(&self) -> Vec<tangram_shared::ImageReport> {
        self.inner.images()
    }

    fn prepull<'a>(&'a self, image: &'a str) -> BoxFuture<'a, Result<Option<u64>, SandboxError>> {
        self.inner.prepull(image)
    }

    fn validate(&self) -> BoxFuture<'_, Result<(), SandboxError>> {
        self.inner.validate()
    }

    fn recover(&self) -> BoxFuture<'_, Result<usize, SandboxError>> {
        // An earlier run's warm sandboxes carry this worker's label too: they go with the rest.
        self.inner.recover()
    }

    fn start<'a>(
        &'a self,
        key: &'a SandboxKey,
        open: &'a SandboxOpen,
        parking_cores: &'a str,
    ) -> BoxFuture<'a, Result<SandboxHandle, SandboxError>> {
        Box::pin(async move {
            if parking_cores != self.parking {
                return self.inner.start(key, open, parking_cores).await;
            }
            let asked = Instant::now();
            let shape = self.shape_of(open);
            let claimed = self.claim(&shape, asked);
            self.wake.notify_one();
            crate::metrics::warm_claim(claimed.is_some());
            if let Some(h) = claimed {
                self.publish_gauges();
                match self.fit(h.clone(), open).await {
                    Ok(h) => return Ok(h),
                    Err(e) => {
                        // It cannot be made the open's (a limit below what it uses): it goes,
                        // and the open creates its own.
                        warn!(error = %e, sandbox = %h.id, "fitting a warm sandbox failed; creating one");
                        let _ = self.inner.remove(&h).await;
                    }
                }
            }
            let made = self.inner.start(key, open, parking_cores).await;
            if made.is_ok() {
                // Demand counts opens that could be served: an image that cannot be pulled or
                // run never gets a pool.
                let mut st = self.state.lock().expect("pool lock");
                st.demand.record(asked, shape);
                drop(st);
                self.wake.notify_one();
            }
            made
        })
    }

    fn grant<'a>(
        &'a self,
        sandbox: &'a SandboxHandle,
        cpus: &'a str,
        quota_us: i64,
        widening: bool,
    ) -> BoxFuture<'a, Result<(), SandboxError>> {
        self.inner.grant(sandbox, cpus, quota_us, widening)
    }

    fn exec<'a>(
        &'a self,
        sandbox: &'a SandboxHandle,
        request: ExecRequest<'a>,
    ) -> BoxFuture<'a, Result<ExecOutput, SandboxError>> {
        self.inner.exec(sandbox, request)
    }

    fn resize<'a>(
        &'a self,
        sandbox: &'a SandboxHandle,
        memory_mb: u64,
    ) -> BoxFuture<'a, Result<(), SandboxError>> {
        self.inner.resize(sandbox, memory_mb)
    }

    fn stop<'a>(&'a self, sandbox: &'a SandboxHandle) -> BoxFuture<'a, ()> {
        self.inner.stop(sandbox)
    }

    fn remove<'a>(&'a self, sandbox: &'a SandboxHandle) -> BoxFuture<'a, Result<(), SandboxError>> {
        self.inner.remove(sandbox)
    }

    fn warm(&self) -> Option<PoolReport> {
        Some(self.report())
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.close())
    }
}

/// Whether the host has less than [`PRESSURE`] of its memory available (`/proc/meminfo`);
/// false where that cannot be read.
fn host_under_pressure() -> bool {
    let Ok(text) = std::fs::read_to_string("/proc/meminfo") else {
        return false;
    };
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    match (field("MemAvailable:"), field("MemTotal:")) {
        (Some(avail), Some(total)) if total > 0.0 => avail / total < PRESSURE,
        _ => false,
    }
}

#[cfg(test)]
mod tests;
