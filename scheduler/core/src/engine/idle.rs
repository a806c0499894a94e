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
//! the sandbox's open: one close per sandbox, whatever the reasons). A close that has not
//! come back within [`ASK_AGAIN_MS`] is asked again. A close of ours that reaches planning
//! for a sandbox it was not asked for (the trajectory reopened meanwhile) is dropped, and so
//! is an idle close of a sandbox used again since it was asked for. Commands and opens for a
//! sandbox being closed wait for the close (they would race it on the worker) and are then
//! told why.
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
    /// When this engine first knew of it (wall clock, µs): names the closes of one whose
    /// open is unknown.
    pub(crate) created_unix_us: u64,
    /// The idle timeout its open asked for.
    pub(crate) asked_timeout_ms: Option<u64>,
    /// Last used (an action for it arrived or settled), engine ms.
    pub(crate) active_ms: u64,
    /// A close of ours was asked for at this time, and why.
    pub(crate) closing: Option<(u64, CloseReason)>,
    /// Closes of ours dropped before they ran: the next one is named apart (the dropped
    /// one's id is settled).
    pub(crate) dropped: u32,
}

/// The engine's idle clocks, leases and memory of its closes.
#[derive(Debug, Default)]
pub(crate) struct Idle {
    pub(crate) clocks: HashMap<SandboxKey, Clock>,
    /// When each leased job's lease runs out, engine ms, and its last renewal's length.
    pub(crate) leases: HashMap<JobId, (u64, u64)>,
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
        self.idle_start(key, Some(open.id.clone()), asked_timeout(open), now);
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
                created_unix_us: now.unix_us,
                asked_timeout_ms,
                active_ms: now.ms,
                closing: None,
                dropped: 0,
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

    /// A rollout renewed its job's lease: it lasts until the latest any renewal promised.
    pub(crate) fn on_lease(&mut self, job: JobId, ttl_ms: u64, now: Now) {
        let ttl = ttl_ms.clamp(LEASE_MIN_MS, LEASE_MAX_MS);
        let lease = self.idle.leases.entry(job).or_insert((0, ttl));
        if now.ms + ttl >= lease.0 {
            *lease = (now.ms + ttl, ttl);
        }
    }

    /// Renewals could not reach this engine for a while (it did not lead, or NATS did not
    /// answer): every lease runs at least its length from now, as if renewed.
    pub(crate) fn leases_restart(&mut self, now: Now) {
        for (at, ttl) in self.idle.leases.values_mut() {
            *at = (*at).max(now.ms + *ttl);
        }
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
            created_unix_us: now.unix_us,
            active_ms: now.ms,
            ..Clock::default()
        });
        if clock
            .closing
            .is_some_and(|(at, _)| now.ms < at + ASK_AGAIN_MS)
        {
            return false;
        }
        // Asked again: with the reason first given (the id is the same either way).
        let reason = clock.closing.map_or(reason, |(_, r)| r);
        let id = close_id(&key.0, &key.1, &incarnation_of(clock, &key.1, &worker));
        clock.closing = Some((now.ms, reason));
        self.idle_due_by(now.ms + ASK_AGAIN_MS);
        self.out.push(Effect::Submit(Box::new(Action {
            queue_timeout_ms: None,
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

    /// Whether a close of ours reaching planning for the sandbox at `key` should be dropped
    /// rather than run, and why: it names another sandbox than the one there now (the
    /// trajectory reopened meanwhile), or it is an idle close of a sandbox used since.
    pub(crate) fn stale_close(&self, key: &SandboxKey, close: &Action) -> Option<&'static str> {
        let ActionSpec::SandboxClose(SandboxClose {
            reason: Some(reason),
        }) = &close.spec
        else {
            return None; // a rollout's own
        };
        let (Some(clock), Some(s)) = (self.idle.clocks.get(key), self.sandboxes.get(key)) else {
            return Some("the sandbox it was for is gone");
        };
        if close_id(&key.0, &key.1, &incarnation_of(clock, &key.1, &s.worker)) != close.id {
            return Some("the sandbox it was for is gone (the trajectory opened another)");
        }
        match clock.closing {
            Some((asked, _)) if *reason == CloseReason::IdleTimeout && clock.active_ms >= asked => {
                Some("the sandbox was used again after it was found idle")
            }
            _ => None,
        }
    }

    /// A close of ours was dropped ([`Engine::stale_close`]): what waited for it goes on.
    pub(crate) fn close_dropped(&mut self, key: &SandboxKey) {
        if let Some(c) = self.idle.clocks.get_mut(key) {
            c.closing = None;
            c.dropped += 1;
        }
        self.dirty = true;
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
            .filter(|(_, (t, _))| now.ms >= *t)
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
        // Sandboxes with an action not yet settled are in use; those with a close among them
        // have theirs on its way.
        let mut busy: HashSet<SandboxKey> = HashSet::new();
        let mut closing: HashSet<SandboxKey> = HashSet::new();
        for e in self.actions.values() {
            let kind = e.action.kind();
            if matches!(
                kind,
                ActionKind::SandboxOpen | ActionKind::SandboxExec | ActionKind::SandboxClose
            ) {
                let key = (e.action.job.clone(), e.action.trajectory.clone());
                if kind == ActionKind::SandboxClose {
                    closing.insert(key.clone());
                }
                busy.insert(key);
            }
        }
        let (default, max) = (
            self.config.idle_timeout_ms,
            self.config.limits.max_idle_timeout_ms,
        );
        let mut due = Vec::new();
        let mut again = Vec::new();
        let mut next: Option<u64> = None;
        let mut earliest = |at: u64| next = Some(next.map_or(at, |n: u64| n.min(at)));
        for (key, s) in &self.sandboxes {
            let clock = self.idle.clocks.entry(key.clone()).or_insert(Clock {
                created_unix_us: now.unix_us,
                active_ms: now.ms,
                ..Clock::default()
            });
            // A close of ours that has not come back (its publish failed, or it is lost) is
            // asked again, whatever its reason.
            if let Some((asked, _)) = clock.closing {
                if closing.contains(key) {
                    // On its way; settles or is dropped.
                } else if now.ms >= asked + ASK_AGAIN_MS {
                    again.push(key.clone());
                    earliest(now.ms + ASK_AGAIN_MS);
                } else {
                    earliest(asked + ASK_AGAIN_MS);
                }
                continue;
            }
            let Some(timeout) = timeout_of(clock.asked_timeout_ms, default, max) else {
                continue;
            };
            let mut at = clock.active_ms + timeout;
            if s.state == SandboxState::Open && !busy.contains(key) && now.ms >= at {
                due.push(key.clone());
                at = now.ms + ASK_AGAIN_MS;
            } else if now.ms >= at {
                at = now.ms + timeout.min(ASK_AGAIN_MS);
            }
            earliest(at);
        }
        self.idle.next_scan_ms = next;
        for key in again {
            self.ask_close(&key, CloseReason::IdleTimeout, now);
        }
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
        let lease = self.idle.leases.values().map(|(t, _)| *t).min();
        match (lease, self.idle.next_scan_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The id of the scheduler's close of a sandbox: the same in every scheduler, from the job,
/// the trajectory and the sandbox's `incarnation` (its open's action id; for a sandbox whose
/// open is not known, `<trajectory>@<worker>@<when this scheduler first knew of it>`), so
/// that one sandbox gets one close whoever asks and why (`tangram-close-<16 hex digits>`).
pub fn close_id(job: &JobId, trajectory: &TrajectoryId, incarnation: &str) -> ActionId {
    let digest = fnv1a(&[job.as_str(), trajectory.as_str(), incarnation]);
    ActionId::new(format!("tangram-close-{digest:016x}")).expect("letters, digits and '-'")
}

/// A sandbox's incarnation, for [`close_id`].
fn incarnation_of(
    clock: &Clock,
    trajectory: &TrajectoryId,
    worker: &tangram_shared::WorkerId,
) -> String {
    let base = clock.open.as_ref().map_or_else(
        || format!("{trajectory}@{worker}@{}", clock.created_unix_us),
        |o| o.to_string(),
    );
    match clock.dropped {
        0 => base,
        n => format!("{base}#{n}"),
    }
}

/// The idle timeout an open asks for, if it is an open and asks for one.
pub(crate) fn asked_timeout(open: &Action) -> Option<u64> {
    match &open.spec {
        ActionSpec::SandboxOpen(o) => o.idle_timeout_ms,
        _ => None,
    }
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
