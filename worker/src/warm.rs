//! The warm pool: sandboxes created and parked before anyone asks for one, so that a
//! `sandbox_open` is a claim (tens of milliseconds) instead of a container creation (about
//! two seconds).
//!
//! [`WarmPool`] wraps the real runtime and is itself a [`SandboxRuntime`]. A pooled
//! container is made by the same `start` as any other, so it has the same hardening; it has
//! never run a command, and it is handed out once, to one trajectory, then closed like any
//! other sandbox: nothing is reused between trajectories. Only opens that ask for what the
//! pool holds claim from it (the default image, memory and work directory, no environment);
//! the rest create as before.
//!
//! Its size follows demand: the most matching opens seen in any stretch as long as a
//! creation takes (over the last minute), with a quarter on top, between `warm_pool_min` and
//! `warm_pool`. Under memory pressure (the host has less than a tenth of its memory
//! available) the pool lets its containers go and makes no new ones.

use crate::sandbox::{
    ExecOutput, ExecRequest, RuntimeKind, SandboxError, SandboxHandle, SandboxKey, SandboxRuntime,
};
use futures::future::BoxFuture;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tangram_shared::SandboxOpen;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// How far back opens count toward the pool's size.
const WINDOW: Duration = Duration::from_secs(60);
/// Head room over the observed burst.
const HEADROOM: f64 = 1.25;
/// What a creation is taken to cost before one has been measured.
const FIRST_CREATE: Duration = Duration::from_secs(2);
/// Below this share of the host's memory available, the pool empties.
const PRESSURE: f64 = 0.10;
/// After a failed creation, the next waits this long.
const RETRY: Duration = Duration::from_secs(2);
/// How long a stopping pool waits for a creation in flight, to remove what it makes (the
/// worker waits 3 s for its background tasks in all).
const STOP_CREATE_WAIT: Duration = Duration::from_millis(2_500);
/// Opens remembered for sizing, at most.
const OPENS_KEPT: usize = 4096;

/// How many warm sandboxes to hold: the largest number of matching opens in any stretch of
/// `create` within `opens` (times of the last minute's opens), with head room, clamped to
/// `[min, max]`. Pure, for tests.
pub fn target(opens: &[Instant], create: Duration, min: usize, max: usize) -> usize {
    let mut peak = 0;
    let mut start = 0;
    for (end, t) in opens.iter().enumerate() {
        while t.duration_since(opens[start]) > create {
            start += 1;
        }
        peak = peak.max(end + 1 - start);
    }
    let want = (peak as f64 * HEADROOM).ceil() as usize;
    want.clamp(min, max.max(min))
}

/// What the pool reports (heartbeats, status, metrics).
pub type PoolReport = tangram_shared::WarmPoolReport;

#[derive(Debug, Default)]
struct PoolState {
    ready: VecDeque<SandboxHandle>,
    creating: usize,
    opens: VecDeque<Instant>,
    /// Mean creation time, smoothed.
    create: Option<Duration>,
    hits: u64,
    misses: u64,
    closed: bool,
}

/// A warm pool in front of a runtime. See the module docs.
pub struct WarmPool {
    inner: Arc<dyn SandboxRuntime>,
    /// What a pooled sandbox is opened with.
    template: SandboxOpen,
    /// The default image's name: an open naming it matches the template.
    image: String,
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
    /// A pool of between `min` and `max` sandboxes of the default open, parked on `parking`.
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
        Self {
            inner,
            template: SandboxOpen::default(),
            image: image.to_string(),
            parking: parking.to_string(),
            min: min.min(max),
            max,
            state: Mutex::new(PoolState::default()),
            wake: tokio::sync::Notify::new(),
            pressure,
        }
    }

    /// Whether an open can be served by a pooled sandbox.
    fn matches(&self, open: &SandboxOpen) -> bool {
        open.image.as_deref().is_none_or(|i| i == self.image)
            && open.memory_mb == self.template.memory_mb
            && open.workdir_mb == self.template.workdir_mb
            && open.env.is_empty()
    }

    /// Where the pool stands.
    pub fn report(&self) -> PoolReport {
        let mut st = self.state.lock().expect("pool lock");
        PoolReport {
            target: self.target_of(&mut st) as u32,
            ready: st.ready.len() as u32,
            hits: st.hits,
            misses: st.misses,
            mem_mb: st.ready.len() as u64 * self.template.memory_mb,
        }
    }

    fn target_of(&self, st: &mut PoolState) -> usize {
        if st.closed {
            return 0;
        }
        target(
            st.opens.make_contiguous(),
            st.create.unwrap_or(FIRST_CREATE),
            self.min,
            self.max,
        )
    }

    /// Keeps the pool at its target until `stop`, then removes what it holds.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut n: u64 = 0;
        loop {
            if stop.is_cancelled() || self.state.lock().expect("pool lock").closed {
                break;
            }
            let pressure = (self.pressure)();
            let (grow, shrink) = {
                let mut st = self.state.lock().expect("pool lock");
                let now = Instant::now();
                while st
                    .opens
                    .front()
                    .is_some_and(|t| now.duration_since(*t) > WINDOW)
                {
                    st.opens.pop_front();
                }
                let want = if pressure { 0 } else { self.target_of(&mut st) };
                let have = st.ready.len() + st.creating;
                let grow = have < want;
                if grow {
                    st.creating += 1;
                }
                let shrink = (st.ready.len() > want)
                    .then(|| st.ready.pop_front())
                    .flatten();
                (grow, shrink)
            };
            if let Some(h) = shrink {
                if pressure {
                    info!("memory pressure: releasing a warm sandbox");
                }
                let _ = self.inner.remove(&h).await;
                self.publish_gauges();
                continue;
            }
            if !grow {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = self.wake.notified() => {}
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
                continue;
            }
            n += 1;
            let key = SandboxKey {
                job: "warm".into(),
                trajectory: format!("pool-{n}"),
            };
            let t0 = Instant::now();
            let start = self.inner.start(&key, &self.template, &self.parking);
            tokio::pin!(start);
            let made = tokio::select! {
                r = &mut start => r,
                _ = stop.cancelled() => {
                    // The daemon goes on creating the container whatever becomes of this
                    // future: let it finish (bounded) and remove it, or it outlives the worker.
                    if let Ok(Ok(h)) = tokio::time::timeout(STOP_CREATE_WAIT, &mut start).await {
                        let _ = self.inner.remove(&h).await;
                    }
                    self.state.lock().expect("pool lock").creating -= 1;
                    break;
                }
            };
            let took = t0.elapsed();
            // Decided under the lock, done after it.
            let (discard, failed) = {
                let mut st = self.state.lock().expect("pool lock");
                st.creating -= 1;
                match made {
                    Ok(h) if st.closed => (Some(h), None),
                    Ok(h) => {
                        st.create = Some(match st.create {
                            Some(c) => (c * 3 + took) / 4,
                            None => took,
                        });
                        st.ready.push_back(h);
                        debug!(took_ms = took.as_millis() as u64, "warm sandbox ready");
                        (None, None)
                    }
                    Err(e) => (None, Some(e)),
                }
            };
            if let Some(h) = discard {
                let _ = self.inner.remove(&h).await;
            }
            if let Some(e) = failed {
                warn!(error = %e, "creating a warm sandbox failed; trying again shortly");
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(tangram_nats::backoff::jitter(RETRY)) => {}
                }
            }
            self.publish_gauges();
        }
        self.close().await;
    }

    /// Removes every warm sandbox; the pool makes no more.
    pub async fn close(&self) {
        let ready: Vec<SandboxHandle> = {
            let mut st = self.state.lock().expect("pool lock");
            st.closed = true;
            st.ready.drain(..).collect()
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
            if !self.matches(open) || parking_cores != self.parking {
                return self.inner.start(key, open, parking_cores).await;
            }
            let claimed = {
                let mut st = self.state.lock().expect("pool lock");
                st.opens.push_back(Instant::now());
                while st.opens.len() > OPENS_KEPT {
                    st.opens.pop_front();
                }
                let h = if st.closed {
                    None
                } else {
                    st.ready.pop_front()
                };
                match h.is_some() {
                    true => st.hits += 1,
                    false => st.misses += 1,
                }
                h
            };
            self.wake.notify_one();
            crate::metrics::warm_claim(claimed.is_some());
            match claimed {
                Some(h) => {
                    self.publish_gauges();
                    Ok(h)
                }
                None => self.inner.start(key, open, parking_cores).await,
            }
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
