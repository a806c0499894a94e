//! The worker runtime: intake of dispatches, admission, execution, results, heartbeats and
//! the two-phase shutdown. `worker/README.md` draws the action path.
//!
//! Every foreign system sits behind a seam ([`SandboxRuntime`], [`ReplicaDriver`],
//! [`ApiCaller`], and NATS as [`intake::Delivery`] and [`intake::ResultSink`]), so the whole
//! path runs in unit tests on paused time with in-memory fakes.

mod admission;
mod calls;
mod execute;
mod fence;
mod heartbeat;
pub(crate) mod intake;
mod prepull;
mod resize;
mod spool;
mod start;
#[cfg(test)]
mod tests;

use crate::config::Config;
use crate::cpuset::{self, CoreAllocator};
use crate::docker::DockerRuntime;
use crate::gpu::NvmlDiscovery;
use crate::metrics as m;
use crate::providers::{ApiCaller, Providers};
use crate::sandbox::{InMemorySandboxes, RuntimeKind, SandboxError, SandboxKey, SandboxRuntime};
use crate::services::{ReplicaDriver, Services};
use crate::warm::WarmPool;
use admission::Admissions;
use anyhow::Context as _;
use execute::Sandbox;
use futures::{Stream, StreamExt};
use intake::{Delivery, JetStreamResults, ResultSink};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tangram_shared::codec::Encoding;
use tangram_shared::{ActionResult, Dispatch, GpuInventory, InfraCode, Outcome};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn, Instrument};

pub use start::run;

/// In-progress acks while an action runs; the dispatch consumer's ack_wait is 10 s.
const PROGRESS_EVERY: Duration = Duration::from_secs(3);
/// After the drain deadline, how long killed actions get to report `shutdown`.
const KILL_WAIT: Duration = Duration::from_secs(10);
/// How long the last heartbeat and flush may take: NATS may be gone by then.
const GOODBYE_WAIT: Duration = Duration::from_secs(3);

/// What one task owns; every other task reaches it through the worker's lock, held briefly
/// and never across an await.
pub(crate) struct State {
    pub(crate) cores: CoreAllocator,
    pub(crate) sandboxes: HashMap<SandboxKey, Arc<Sandbox>>,
    pub(crate) admissions: Admissions,
    /// Execs running now, with the cores they hold (re-sizes change them).
    pub(crate) execs: HashMap<tangram_shared::ActionId, resize::Sizing>,
    /// Re-sizes for admitted execs not yet holding cores.
    pub(crate) early: HashMap<tangram_shared::ActionId, tangram_shared::Regrant>,
    /// Cores promised to admitted execs that have not taken them yet (their task waits for
    /// its sandbox or has not run): a widening read meanwhile must leave them free, as the
    /// scheduler booked them in the same order.
    pub(crate) reserved: HashMap<tangram_shared::ActionId, u32>,
}

/// One worker: its configuration, its seams, its state.
pub(crate) struct Worker {
    pub(crate) config: Config,
    /// Absent on workers that run no sandboxes (GPU hosts).
    pub(crate) sandboxes: Option<Arc<dyn SandboxRuntime>>,
    /// Model services, on GPU hosts.
    pub(crate) services: Option<Arc<dyn ReplicaDriver>>,
    /// External API providers.
    pub(crate) providers: Option<Arc<dyn ApiCaller>>,
    pub(crate) results: Arc<dyn ResultSink>,
    pub(crate) state: Mutex<State>,
    /// Cancelled when the drain deadline passes: running commands are killed.
    pub(crate) hard_stop: CancellationToken,
    /// Results not yet stored, on disk.
    spool: spool::Spool,
    /// Cancelled when the worker starts draining: heartbeats say so at once, so the
    /// scheduler stops placing here before the grace period, not after it.
    pub(crate) draining: CancellationToken,
    /// GPUs, when the worker has any.
    pub(crate) inventory: Option<GpuInventory>,
    /// This instance's id, as heartbeats carry it; a new one after a fence. Locked after
    /// `state` when both are held.
    pub(crate) instance: Mutex<String>,
    /// Generation of the instance: bumped by a fence, so that actions admitted before it
    /// drop their results (the scheduler settled them when it declared the worker lost).
    pub(crate) era: std::sync::atomic::AtomicU64,
    /// Woken whenever cores are given back (an exec's end, a narrowing): an exec waiting
    /// for the cores it was booked tries again (see `execute::CORE_WAIT`).
    pub(crate) cores_freed: tokio::sync::Notify,
}

impl Worker {
    pub(crate) fn new(
        config: Config,
        sandboxes: Option<Arc<dyn SandboxRuntime>>,
        services: Option<Arc<dyn ReplicaDriver>>,
        providers: Option<Arc<dyn ApiCaller>>,
        results: Arc<dyn ResultSink>,
        inventory: Option<GpuInventory>,
    ) -> Self {
        let cores = CoreAllocator::with_domains(&config.cores, &cpuset::numa_domains());
        let spool = spool::Spool::new(&config.state_dir);
        Self {
            state: Mutex::new(State {
                cores,
                sandboxes: HashMap::new(),
                admissions: Admissions::default(),
                execs: HashMap::new(),
                early: HashMap::new(),
                reserved: HashMap::new(),
            }),
            config,
            sandboxes,
            services,
            providers,
            results,
            hard_stop: CancellationToken::new(),
            spool,
            draining: CancellationToken::new(),
            inventory,
            instance: Mutex::new(fence::new_instance_id()),
            era: std::sync::atomic::AtomicU64::new(0),
            cores_freed: tokio::sync::Notify::new(),
        }
    }

    /// This instance's id.
    pub(crate) fn instance(&self) -> String {
        self.instance.lock().expect("instance lock").clone()
    }

    /// Publishes the results an earlier run of this worker kept on disk (it died before
    /// NATS took them); before any dispatch is taken, so that the real result comes first.
    pub(crate) async fn publish_kept(&self) -> usize {
        let kept = self.spool.all();
        let n = kept.len();
        for (result, encoding) in kept {
            info!(action = %result.id, "publishing a result an earlier run kept on disk");
            if self.publish_result(&result, encoding).await {
                self.spool.forget(&result.id);
            }
        }
        n
    }

    /// Stores a result, trying for as long as this process runs (an outage or a stream
    /// election of any length); false only when it stops first or the result cannot be
    /// encoded. The dispatch is not acked until then, so a result not stored is settled
    /// by the next instance of this worker or by the scheduler, never dropped silently.
    pub(crate) async fn publish_result(&self, result: &ActionResult, encoding: Encoding) -> bool {
        let mut round = 0u32;
        let mut kept = false;
        loop {
            // Biased: a publish that completes counts even when a hard stop came meanwhile
            // (a result of the drain deadline itself is published as the worker stops).
            let tried = tokio::select! {
                biased;
                r = self.results.publish(result, encoding) => r,
                _ = self.hard_stop.cancelled() => {
                    warn!(action = %result.id, "stopping with a result not stored; the dispatch stays unacked, and the next instance or the scheduler settles it");
                    return false;
                }
            };
            match tried {
                Ok(()) => {
                    if kept {
                        self.spool.forget(&result.id);
                    }
                    return true;
                }
                Err(e @ tangram_nats::PublishError::Encode(_)) => {
                    warn!(action = %result.id, error = %e, "result cannot be encoded; the scheduler settles the action");
                    return false;
                }
                Err(e) => {
                    round += 1;
                    m::result_retry();
                    if !kept {
                        // Should this process die before NATS is back, its next start
                        // publishes it.
                        kept = self.spool.keep(result, encoding);
                    }
                    warn!(action = %result.id, round, error = %e, "result not stored yet; trying again");
                }
            }
        }
    }
}

/// Wall-clock microseconds since the Unix epoch: the wire's timestamps (`submitted_at_us`,
/// `finished_at_ms`) are wall time, shared across hosts.
#[allow(clippy::disallowed_methods)] // the one reading of wall time in the worker
pub(crate) fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

pub(crate) fn infra(code: InfraCode, reason: String) -> Outcome {
    Outcome::InfraError { code, reason }
}

/// An error and its sources, `: `-joined: the reason a person reads in a result.
pub(crate) fn reason(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let next = s.to_string();
        if !out.contains(&next) {
            out.push_str(": ");
            out.push_str(&next);
        }
        source = s.source();
    }
    out
}

/// The action path until `shutdown`, then the drain: phase one stops intake and lets running
/// actions finish until the grace period ends; phase two kills what is left (each reports
/// `infra_error: shutdown`), then removes sandboxes and stops replicas.
pub(crate) async fn serve<S>(worker: Arc<Worker>, mut intake: S, shutdown: CancellationToken)
where
    S: Stream<Item = Box<dyn Delivery>> + Unpin,
{
    let actions = TaskTracker::new();
    loop {
        let delivery = tokio::select! {
            _ = shutdown.cancelled() => break,
            d = intake.next() => match d {
                Some(d) => d,
                None => break,
            },
        };
        if delivery.subject().ends_with(".regrant") {
            worker.regrant(delivery.as_ref()).await;
            continue;
        }
        if let Some((dispatch, era)) = worker.admit(delivery.as_ref()).await {
            let span = tracing::info_span!("action", id = %dispatch.action.id, kind = dispatch.action.kind().as_str());
            actions.spawn(
                worker
                    .clone()
                    .handle(dispatch, era, delivery)
                    .instrument(span),
            );
        }
    }
    drop(intake);
    worker.draining.cancel();

    info!(
        grace_ms = worker.config.shutdown_grace.as_millis() as u64,
        "draining"
    );
    actions.close();
    if tokio::time::timeout(worker.config.shutdown_grace, actions.wait())
        .await
        .is_err()
    {
        warn!("grace period over; stopping running actions");
        worker.hard_stop.cancel();
        if tokio::time::timeout(KILL_WAIT, actions.wait())
            .await
            .is_err()
        {
            warn!("actions still running after the kill; leaving them");
        }
    }
    worker.close_all_sandboxes("stopping").await;
    if let Some(rt) = &worker.sandboxes {
        rt.shutdown().await;
    }
    if let Some(svc) = &worker.services {
        svc.stop_all(KILL_WAIT).await;
    }
}

impl Worker {
    /// Runs one admitted action and settles it: result durable first, then the dispatch acked.
    async fn handle(self: Arc<Self>, dispatch: Dispatch, era: u64, delivery: Box<dyn Delivery>) {
        // Keep the dispatch from being redelivered while it runs (ack_wait is short so that a
        // crashed instance's work comes back quickly).
        // The result is published inside the same in-progress window: storing it may take a
        // while (a NATS cluster electing a stream leader), and the dispatch must not come
        // back meanwhile. An action of a fenced instance was settled by the scheduler: its
        // result would be a second one, so it is dropped.
        let (result, stored) = {
            let work = async {
                let result = self.execute(&dispatch);
                let result = result.await;
                m::action(
                    dispatch.action.kind().as_str(),
                    result.outcome.label(),
                    result.timing.overhead_us as f64 / 1e6,
                    result.timing.exec_us as f64 / 1e6,
                );
                let stored = if self.era.load(std::sync::atomic::Ordering::SeqCst) == era {
                    self.publish_result(&result, dispatch.result_encoding).await
                } else {
                    m::fenced_result();
                    info!(
                        outcome = result.outcome.label(),
                        "result of a fenced instance dropped; the scheduler settled this action"
                    );
                    false
                };
                (result, stored)
            };
            tokio::pin!(work);
            // The first in-progress ack is due one period from now. (An interval's first tick
            // is "now", and awaiting it waits for the timer wheel's next millisecond: about
            // 1 ms on every action's path.)
            let mut tick = tokio::time::interval_at(
                tokio::time::Instant::now() + PROGRESS_EVERY,
                PROGRESS_EVERY,
            );
            loop {
                tokio::select! {
                    r = &mut work => break r,
                    _ = tick.tick() => {
                        if let Err(e) = delivery.progress().await {
                            warn!(error = %e, "in-progress ack");
                        }
                    }
                }
            }
        };
        if stored {
            tracing::debug!(outcome = result.outcome.label(), "result published");
        }
        // A crash before the ack means a redelivery: the next instance reports it lost, and
        // a stored result refuses that second one. A result not stored leaves the dispatch
        // unacked, in the backlog, for the next instance or the scheduler to settle. (A
        // fenced instance's result was dropped on purpose: the scheduler settled it.)
        let fenced = self.era.load(std::sync::atomic::Ordering::SeqCst) != era;
        let acked = if stored || fenced {
            match delivery.ack().await {
                Ok(()) => true,
                Err(e) => {
                    warn!(error = %e, "acking a dispatch (not confirmed; its id is kept)");
                    false
                }
            }
        } else {
            false
        };
        let mut st = self.state.lock().expect("state lock");
        // An exec that ended before taking its cores (no sandbox, stopped) promises none.
        st.reserved.remove(&dispatch.action.id);
        st.admissions.settle(&dispatch.action.id, stored, acked);
    }
}
