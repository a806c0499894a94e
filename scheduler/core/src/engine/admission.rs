//! Admission per job: how many of a job's actions may wait in the scheduler's queue, and how
//! long one may wait.
//!
//! **Queued actions per job.** The scheduler holds at most `max_queued_actions` action
//! messages (the intake gate); past it the intake stops reading the actions stream, and what
//! is behind in the stream waits, whoever's it is. So that one job's backlog cannot fill the
//! gate and hold every other job's actions back in the stream, each job may have at most its
//! cap of actions queued (`max_queued` in its `job_caps`, else the fleet's
//! `max_queued_per_job`). An action that arrives past it is rejected `queue_full`: nothing
//! ran, and it may be submitted again later under a new id (the stream's duplicate window
//! would drop the same id). Closes are always admitted: they free what the job holds, and
//! so is a message delivered before (an earlier leader admitted it, or this one before a
//! failed acknowledgement): it was accepted once.
//!
//! **Queueing deadlines.** An action with `queue_timeout_ms` that has not been started that
//! long after it reached the scheduler is rejected `queue_timeout`. One that was started and
//! came back to the queue (its worker was lost) is not: it may have run. The clock is the
//! scheduler's: after a change of leader it starts again when the action reaches the new
//! one.

use super::lifecycle::ActionState;
use super::{Engine, Now};
use std::collections::{BTreeSet, HashMap};
use tangram_shared::{Action, ActionId, ActionSpec, JobId, RejectCode, Rejection};

/// What admission keeps.
#[derive(Debug, Default)]
pub(crate) struct Admission {
    /// Actions queued per job, and their bytes: counted at each cycle, and up at each
    /// arrival between cycles (actions put back in the queue between cycles, after a failed
    /// dispatch or a lost worker, count from the next cycle).
    queued: HashMap<JobId, (u32, u64)>,
    /// Queueing deadlines: (when, action).
    deadlines: BTreeSet<(u64, ActionId)>,
}

impl Admission {
    /// An action was started: its deadline no longer applies.
    pub(crate) fn forget_deadline(&mut self, at: &(u64, ActionId)) {
        self.deadlines.remove(at);
    }
}

impl Engine {
    /// The most actions `job` may have queued; `None`: no cap.
    fn max_queued(&self, job: &JobId) -> Option<u32> {
        self.caps_of(job)
            .max_queued
            .or(self.config.max_queued_per_job)
    }

    /// Why `action`, arriving now, is not admitted; `None` when it is.
    pub(crate) fn refused_admission(&self, action: &Action) -> Option<Rejection> {
        if matches!(action.spec, ActionSpec::SandboxClose(_)) {
            return None;
        }
        let (queued, bytes) = self
            .admission
            .queued
            .get(&action.job)
            .copied()
            .unwrap_or_default();
        let full = match (
            self.max_queued(&action.job),
            self.config.max_queued_bytes_per_job,
        ) {
            (Some(cap), _) if queued >= cap => format!("{queued} actions queued, its cap is {cap}"),
            (_, Some(cap)) if bytes >= cap => {
                format!("{bytes} bytes of actions queued, the cap per job is {cap}")
            }
            _ => return None,
        };
        Some(Rejection::new(
            RejectCode::QueueFull,
            format!(
                "job {} has {full}; nothing ran: submit it again later, under a new id",
                action.job
            ),
        ))
    }

    /// `action`, of `bytes`, was queued at `now`: counted, and its deadline kept.
    pub(crate) fn admitted(&mut self, action: &Action, bytes: u32, now: Now) {
        let q = self.admission.queued.entry(action.job.clone()).or_default();
        q.0 += 1;
        q.1 += u64::from(bytes);
        if let Some(t) = action.queue_timeout_ms {
            let at = now.ms.saturating_add(t);
            self.admission.deadlines.insert((at, action.id.clone()));
        }
    }

    /// Counts the queue again (after a cycle compacted it).
    pub(crate) fn recount_queued(&mut self) {
        let mut queued: HashMap<JobId, (u32, u64)> = HashMap::new();
        for id in &self.queue {
            if let Some(e) = self.actions.get(id) {
                let q = match queued.get_mut(&e.action.job) {
                    Some(q) => q,
                    None => queued.entry(e.action.job.clone()).or_default(),
                };
                q.0 += 1;
                q.1 += u64::from(e.bytes);
            }
        }
        self.admission.queued = queued;
    }

    /// Rejects what waited past its queueing deadline and was never started, and forgets
    /// deadlines that no longer apply. Returns whether it rejected anything (the queue then
    /// holds ids that are gone until it is compacted).
    pub(crate) fn expire_queued(&mut self, now: Now) -> bool {
        let mut expired = false;
        while let Some((at, id)) = self.admission.deadlines.first().cloned() {
            if at > now.ms {
                break;
            }
            self.admission.deadlines.pop_first();
            let waiting = self
                .actions
                .get(&id)
                .is_some_and(|e| e.attempts == 0 && matches!(e.state, ActionState::Queued { .. }));
            if !waiting {
                continue;
            }
            let waited = self.actions[&id]
                .action
                .queue_timeout_ms
                .unwrap_or_default();
            let reason = format!(
                "not started within its queue_timeout_ms ({waited} ms) of reaching the scheduler; \
                 nothing ran"
            );
            self.reject_queued(&id, Rejection::new(RejectCode::QueueTimeout, reason), now);
            expired = true;
        }
        expired
    }

    /// The next queueing deadline (none while this engine rejects nothing: not leading, or
    /// stopping).
    pub(crate) fn next_queue_deadline_ms(&self) -> Option<u64> {
        if !self.leading || self.stopping || self.backlog_pending {
            return None; // no cycle runs to act on it (the backlog's end plans at once)
        }
        self.admission.deadlines.first().map(|(at, _)| *at)
    }

    /// A deadline passed: the next cycle rejects what it applies to.
    pub(crate) fn on_queue_deadlines(&mut self, now: Now) {
        if self
            .admission
            .deadlines
            .first()
            .is_some_and(|(at, _)| *at <= now.ms)
        {
            self.dirty = true;
        }
    }
}
