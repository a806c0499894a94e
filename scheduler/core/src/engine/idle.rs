//! Sandboxes nobody closed: the idle timeout, closing a whole job, and rollout leases.
//!
//! A sandbox holds memory on its worker until a `sandbox_close`. A rollout that crashes, or
//! a framework that never closes, would hold it for ever; so the engine closes, itself:
//! - a sandbox that no action used for its idle timeout (the open's `idle_timeout_ms`, else
//!   the fleet's default; see [`super::EngineConfig::idle_timeout_ms`]);
//! - every sandbox of a job, when asked (`tangram close --job`, a client's `close_job()`);
//! - every sandbox of a job whose rollout lease ran out: a job that renewed a lease once
//!   is expected to go on renewing it.
//!
//! A close is not applied in place: the engine submits a `sandbox_close` with a reason
//! ([`Effect::Submit`]), which comes back through the action stream like a rollout's. So the
//! worker removes the container and reports, the booking is settled by the close's result,
//! that result (on the job's results subject) is the job's notice, and a second leader
//! asking for the same close is deduplicated by the stream (the close's id is derived from
//! the sandbox's open and the reason). A close that never comes back is asked again.
//!
//! Idle time starts at the open's launch (or when this engine first learns of the sandbox)
//! and restarts whenever an action for the sandbox arrives or settles; a sandbox with an
//! action not yet settled is never idle.

use super::lifecycle::{SandboxKey, SandboxState};
use super::{Effect, Engine, Now, Observation};
use std::collections::{HashMap, HashSet, VecDeque};
use tangram_shared::{
    Action, ActionId, ActionKind, ActionSpec, CloseReason, JobId, SandboxClose, TrajectoryId,
};

/// A close asked for and not yet seen arriving is asked again after this long.
pub(crate) const ASK_AGAIN_MS: u64 = 30_000;
/// The timeout of the scheduler's own closes, ms.
const CLOSE_TIMEOUT_MS: u64 = 60_000;
/// Leases are bounded to this range, ms.
pub(crate) const LEASE_MIN_MS: u64 = 1_000;
/// See [`LEASE_MIN_MS`].
pub(crate) const LEASE_MAX_MS: u64 = 3_600_000;
/// Sandboxes the engine closed, remembered to say why in the rejection of a later command.
const CLOSED_MEMORY: usize = 10_000;

/// One sandbox's idle clock.
#[derive(Debug, Clone, Default)]
pub(crate) struct Clock {
    /// The open that created it, when known: closes of it are named after it.
    pub(crate) open: Option<ActionId>,
    /// The idle timeout its open asked for.
    pub(crate) asked_timeout_ms: Option<u64>,
    /// Last used (an action for it arrived or settled), engine ms.
    pub(crate) active_ms: u64,
    /// A close of ours was asked for at this time, and why.
    pub(crate) closing: Option<(u64, CloseReason)>,
}

/// The engine's idle clocks, leases and memory of its closes.
#[derive(Debug, Default)]
pub(crate) struct Idle {
    pub(crate) clocks: HashMap<SandboxKey, Clock>,
    /// When each leased job's lease runs out, engine ms.
    pub(crate) leases: HashMap<JobId, u64>,
    /// The earliest an idle sandbox may be due (a lower bound; recomputed by each scan).
    next_scan_ms: Option<u64>,
    /// Sandboxes this engine closed, and why (bounded, oldest first out).
    closed: HashMap<SandboxKey, CloseReason>,
    closed_order: VecDeque<SandboxKey>,
}

impl Engine {
    /// The idle timeout that applies to a sandbox whose open asked for `asked` (`None`:
    /// none).
    fn idle_timeout(&self, asked: Option<u64>) -> Option<u64> {
        timeout_of(
            asked,
            self.config.idle_timeout_ms,
            self.config.limits.max_idle_timeout_ms,
        )
    }

    /// An open was launched (or adopted): its sandbox's idle clock starts.
    pub(crate) fn idle_opened(&mut self, key: &SandboxKey, open: &Action, now: Now) {
        let asked = match &open.spec {
            ActionSpec::SandboxOpen(o) => o.idle_timeout_ms,
            _ => None,
        };
        self.idle_start(key, Some(open.id.clone()), asked, now);
    }

    /// A sandbox this engine did not open became known (a worker reported it).
    pub(crate) fn idle_start(
        &mut self,
        key: &SandboxKey,
        open: Option<ActionId>,
        asked_timeout_ms: Option<u64>,
        now: Now,
    ) {
        self.idle.closed.remove(key);
        self.idle.clocks.insert(
            key.clone(),
            Clock {
                open,
                asked_timeout_ms,
                active_ms: now.ms,
                closing: None,
            },
        );
        if let Some(t) = self.idle_timeout(asked_timeout_ms) {
            self.idle_due_by(now.ms + t);
        }
    }

    /// An action for the sandbox arrived or settled: its idle time starts again.
    pub(crate) fn idle_touch(&mut self, job: &JobId, trajectory: &TrajectoryId, now: Now) {
        if let Some(c) = self.idle.clocks.get_mut(&(job.clone(), trajectory.clone())) {
            c.active_ms = c.active_ms.max(now.ms);
        }
    }

    fn idle_due_by(&mut self, at: u64) {
        let next = &mut self.idle.next_scan_ms;
        *next = Some(next.map_or(at, |n| n.min(at)));
    }

    /// A rollout renewed its job's lease.
    pub(crate) fn on_lease(&mut self, job: JobId, ttl_ms: u64, now: Now) {
        let ttl = ttl_ms.clamp(LEASE_MIN_MS, LEASE_MAX_MS);
        self.idle.leases.insert(job, now.ms + ttl);
    }

    /// Closes every sandbox of `job` that is open or opening (`tangram close --job`):
    /// returns how many closes it asked for.
    pub fn close_job(&mut self, job: &JobId, now: Now) -> u64 {
        self.close_all_of(job, CloseReason::JobClosed, now)
    }

    fn close_all_of(&mut self, job: &JobId, reason: CloseReason, now: Now) -> u64 {
        let keys: Vec<SandboxKey> = self
            .sandboxes
            .iter()
            .filter(|(k, s)| {
                &k.0 == job && matches!(s.state, SandboxState::Open | SandboxState::Opening)
            })
            .map(|(k, _)| k.clone())
            .collect();
        let mut asked = 0;
        for key in keys {
            if self.ask_close(&key, reason, now) {
                asked += 1;
            }
        }
        asked
    }

    /// Submits a close of the sandbox unless one of ours is on its way: true when it did.
    fn ask_close(&mut self, key: &SandboxKey, reason: CloseReason, now: Now) -> bool {
        let Some(s) = self.sandboxes.get(key) else {
            return false;
        };
        let worker = s.worker.clone();
        let clock = self.idle.clocks.entry(key.clone()).or_insert(Clock {
            active_ms: now.ms,
            ..Clock::default()
        });
        if clock
            .closing
            .is_some_and(|(at, _)| now.ms < at + ASK_AGAIN_MS)
        {
            return false;
        }
        // Named after the sandbox's open (or, for one whose open is unknown, its place) and
        // the reason, so that two leaders asking for the same close ask for one action.
        let incarnation = clock
            .open
            .as_ref()
            .map_or_else(|| format!("{}@{worker}", key.1), |o| o.to_string());
        let id = close_id(&key.0, &key.1, &incarnation, reason);
        clock.closing = Some((now.ms, reason));
        self.out.push(Effect::Submit(Box::new(Action {
            id,
            job: key.0.clone(),
            trajectory: key.1.clone(),
            timeout_ms: CLOSE_TIMEOUT_MS,
            spec: ActionSpec::SandboxClose(SandboxClose {
                reason: Some(reason),
            }),
        })));
        self.out.push(Effect::Observe(Observation::Closing(reason)));
        true
    }

    /// A sandbox this engine knew is gone: forget its clock, and remember why when it was
    /// one of ours that closed it.
    pub(crate) fn idle_forget(&mut self, key: &SandboxKey) {
        let Some(c) = self.idle.clocks.remove(key) else {
            return;
        };
        if let Some((_, reason)) = c.closing {
            if self.idle.closed.insert(key.clone(), reason).is_none() {
                self.idle.closed_order.push_back(key.clone());
            }
            while self.idle.closed_order.len() > CLOSED_MEMORY {
                if let Some(old) = self.idle.closed_order.pop_front() {
                    self.idle.closed.remove(&old);
                }
            }
        }
    }

    /// Whether this engine asked to close the sandbox and its close has not settled.
    pub(crate) fn closing_asked(&self, key: &SandboxKey) -> bool {
        self.idle
            .clocks
            .get(key)
            .is_some_and(|c| c.closing.is_some())
    }

    /// Why this engine closed the trajectory's sandbox, if it did (for the rejection of a
    /// command sent to it afterwards).
    pub(crate) fn closed_because(&self, key: &SandboxKey) -> Option<CloseReason> {
        self.idle.closed.get(key).copied()
    }

    /// Closes what is due: sandboxes idle past their timeout, and the sandboxes of jobs
    /// whose lease ran out.
    pub(crate) fn on_idle_deadlines(&mut self, now: Now) {
        if !self.leading || self.stopping {
            return;
        }
        let expired: Vec<JobId> = self
            .idle
            .leases
            .iter()
            .filter(|(_, t)| now.ms >= **t)
            .map(|(j, _)| j.clone())
            .collect();
        for job in expired {
            self.idle.leases.remove(&job);
            self.close_all_of(&job, CloseReason::LeaseExpired, now);
        }
        if self.idle.next_scan_ms.is_none_or(|t| now.ms < t) {
            return;
        }
        self.idle_scan(now);
    }

    /// Every sandbox's clock against its timeout: closes the idle ones and sets when to look
    /// again.
    fn idle_scan(&mut self, now: Now) {
        self.idle
            .clocks
            .retain(|k, _| self.sandboxes.contains_key(k));
        // Sandboxes with an action not yet settled are in use.
        let busy: HashSet<SandboxKey> = self
            .actions
            .values()
            .filter(|e| {
                matches!(
                    e.action.kind(),
                    ActionKind::SandboxOpen | ActionKind::SandboxExec | ActionKind::SandboxClose
                )
            })
            .map(|e| (e.action.job.clone(), e.action.trajectory.clone()))
            .collect();
        let (default, max) = (
            self.config.idle_timeout_ms,
            self.config.limits.max_idle_timeout_ms,
        );
        let mut due = Vec::new();
        let mut next: Option<u64> = None;
        for (key, s) in &self.sandboxes {
            let clock = self.idle.clocks.entry(key.clone()).or_insert(Clock {
                active_ms: now.ms,
                ..Clock::default()
            });
            let Some(timeout) = timeout_of(clock.asked_timeout_ms, default, max) else {
                continue;
            };
            let mut at = clock.active_ms + timeout;
            if let Some((asked, _)) = clock.closing {
                at = at.max(asked + ASK_AGAIN_MS);
            }
            if s.state == SandboxState::Open && !busy.contains(key) && now.ms >= at {
                due.push(key.clone());
                at = now.ms + ASK_AGAIN_MS;
            } else if now.ms >= at {
                at = now.ms + timeout.min(ASK_AGAIN_MS);
            }
            next = Some(next.map_or(at, |n: u64| n.min(at)));
        }
        self.idle.next_scan_ms = next;
        for key in due {
            self.ask_close(&key, CloseReason::IdleTimeout, now);
        }
    }

    /// The next idle or lease deadline (none while this engine closes nothing: not leading,
    /// or stopping; a wake-up it would not act on would come back at once).
    pub(crate) fn next_idle_ms(&self) -> Option<u64> {
        if !self.leading || self.stopping {
            return None;
        }
        let lease = self.idle.leases.values().min().copied();
        match (lease, self.idle.next_scan_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The id of the scheduler's close of a trajectory's sandbox for `reason`: the same in every
/// scheduler, from the job, the trajectory, the sandbox's open (`incarnation`: its action id;
/// `<trajectory>@<worker>` when the open is not known) and the reason
/// (`tangram-close-<reason>-<16 hex digits>`).
pub fn close_id(
    job: &JobId,
    trajectory: &TrajectoryId,
    incarnation: &str,
    reason: CloseReason,
) -> ActionId {
    let name = reason.as_str();
    let digest = fnv1a(&[job.as_str(), trajectory.as_str(), incarnation, name]);
    ActionId::new(format!("tangram-close-{name}-{digest:016x}")).expect("letters, digits and '-'")
}

/// The idle timeout of a sandbox whose open asked for `asked`, under the fleet's default
/// and maximum (`None`: it has none).
fn timeout_of(asked: Option<u64>, default: u64, max: u64) -> Option<u64> {
    let t = asked.unwrap_or(default);
    (t > 0).then(|| t.min(max))
}

/// FNV-1a over the parts (with a separator), for ids that every scheduler derives alike.
fn fnv1a(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.bytes().chain(std::iter::once(0xff)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}
