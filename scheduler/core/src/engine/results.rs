//! Dispatch outcomes and results: the transitions out of `Dispatching` and `Running`, and
//! settling (every booking given back exactly once).

use super::lifecycle::{ActionState, Booking, Entry, SandboxState};
use super::pools::gpu::ReplicaAfter;
use super::pools::Release;
use super::{Effect, Engine, Now, Observation};
use tangram_shared::{ActionId, ActionKind, ActionResult, InfraCode, Outcome, WorkerId};

/// The wait before the next attempt after a second failed dispatch store, doubled for each
/// failure after that, up to [`RETRY_MAX_MS`].
const RETRY_FIRST_MS: u64 = 50;
/// The longest wait between dispatch attempts.
const RETRY_MAX_MS: u64 = 2_000;

impl Engine {
    /// The action and its worker and booking, when it is dispatching this very attempt (an
    /// outcome of an earlier attempt, or of an action settled meanwhile, changes nothing).
    fn dispatching(
        &mut self,
        id: &ActionId,
        attempt: u32,
    ) -> Option<(&mut Entry, WorkerId, Booking)> {
        let e = self.actions.get_mut(id)?;
        match &e.state {
            ActionState::Dispatching {
                worker,
                booking,
                attempt: a,
                ..
            } if *a == attempt => {
                let (w, b) = (worker.clone(), booking.clone());
                Some((e, w, b))
            }
            _ => None,
        }
    }

    pub(crate) fn on_dispatch_stored(&mut self, id: &ActionId, attempt: u32, seq: u64, now: Now) {
        let grace = self.config.result_grace_ms;
        let Some((e, worker, booking)) = self.dispatching(id, attempt) else {
            return;
        };
        e.failures = 0;
        let deadline_ms = now.ms + e.action.timeout_ms + grace;
        let stored_on = worker.clone();
        let kind = e.action.kind();
        let queued_s = now.ms.saturating_sub(e.arrived_ms) as f64 / 1e3;
        e.state = ActionState::Running {
            worker,
            booking,
            attempt,
            stored_ms: now.ms,
            stored_seq: seq,
            deadline_ms,
            delivered_ms: None,
            listed_once: false,
            unreported: 0,
            adopted: false,
            pending: None,
        };
        // A malleable policy may re-size an exec only once its dispatch is durable (a
        // re-size must follow it on the worker's subject): plan again now.
        // Only now, with the dispatch durable, is the action acknowledged.
        let delivery = e.delivery;
        if kind == ActionKind::SandboxExec && self.provisioning.malleable() {
            self.dirty = true;
            self.touched.insert(stored_on);
        }
        self.out.push(Effect::Ack(delivery));
        self.out
            .push(Effect::Observe(Observation::Dispatched { kind, queued_s }));
    }

    /// The dispatch was not stored: forget the assumption, give the booking back, and queue
    /// the action again in its arrival position (the next attempt gets a new number).
    pub(crate) fn on_dispatch_failed(&mut self, id: &ActionId, attempt: u32, now: Now) {
        let Some((e, worker, booking)) = self.dispatching(id, attempt) else {
            return;
        };
        e.failures += 1;
        let failures = e.failures;
        let arrived = e.arrived_ms;
        let last_progress_ms = arrived;
        e.state = ActionState::Queued { last_progress_ms };
        // The store may have happened though its acknowledgement was lost: the next attempt
        // goes to the same worker under the same `Nats-Msg-Id`, so JetStream keeps at most
        // one of the two and the worker runs it once.
        if e.pin.is_none() {
            e.pinned_since_ms = Some(now.ms);
        }
        e.pin = Some(worker.clone());
        let (job, trajectory, kind) = (
            e.action.job.clone(),
            e.action.trajectory.clone(),
            e.action.kind(),
        );
        // The next attempt is sized afresh: this one's progress estimate (its width, a
        // re-size that amended the dispatch) does not carry over.
        self.progress.remove(id);
        self.unbook(
            &job,
            &trajectory,
            &worker,
            &booking,
            // The route's restore or evictions may not have reached the worker: the replica
            // counts as evicted, so that the next route restores it rather than trust it
            // resident.
            Release {
                replica: ReplicaAfter::Evicted,
                ..Release::default()
            },
            now,
        );
        let key = (job, trajectory);
        match kind {
            ActionKind::SandboxOpen => {
                self.sandboxes.remove(&key);
            }
            ActionKind::SandboxClose => {
                if let Some(s) = self.sandboxes.get_mut(&key) {
                    s.state = SandboxState::Open;
                }
            }
            _ => {}
        }
        if self.stopping {
            // Nothing more is launched: hand it back to the next scheduler.
            if let Some(e) = self.actions.remove(id) {
                self.out.push(Effect::Nak(e.delivery));
            }
            return;
        }
        // A first failure is retried at once (the store may have gone through); after that
        // the action waits, twice as long each time from 50 ms up to 2 s.
        if failures >= 2 {
            let wait = (RETRY_FIRST_MS << (failures - 2).min(6)).min(RETRY_MAX_MS);
            if let Some(e) = self.actions.get_mut(id) {
                e.state = ActionState::Backoff {
                    until_ms: now.ms + wait,
                    last_progress_ms,
                };
            }
            return;
        }
        self.requeue(id);
    }

    /// Back into the queue in its place by arrival (a queued action that was out of it).
    pub(crate) fn requeue(&mut self, id: &ActionId) {
        let Some(arrived) = self
            .actions
            .get(id)
            .filter(|e| matches!(e.state, ActionState::Queued { .. }))
            .map(|e| e.arrived_ms)
        else {
            return;
        };
        let pos = self
            .queue
            .partition_point(|q| self.actions.get(q).is_some_and(|x| x.arrived_ms <= arrived));
        self.queue.insert(pos, id.clone());
        self.dirty = true;
    }

    /// A failed dispatch whose wait is over goes back into the queue.
    pub(crate) fn end_backoff(&mut self, id: &ActionId) {
        let Some(e) = self.actions.get_mut(id) else {
            return;
        };
        let ActionState::Backoff {
            last_progress_ms, ..
        } = e.state
        else {
            return;
        };
        e.state = ActionState::Queued { last_progress_ms };
        self.requeue(id);
    }

    /// A first result: its ACT goes to the metrics, and a completion's to the status report.
    fn observe_act(&mut self, r: &ActionResult, now: Now) {
        let Some(kind) = r.kind else { return };
        self.out.push(Effect::Observe(Observation::Act {
            kind,
            timing: r.timing,
        }));
        if matches!(r.outcome, Outcome::Completed { .. }) {
            self.push_recent(kind, r.timing, now);
        }
    }

    pub(crate) fn on_result(&mut self, r: ActionResult, now: Now) {
        self.out.push(Effect::Observe(Observation::Result {
            outcome: r.outcome.label(),
            code: r.outcome.code_label(),
        }));
        if let Some(t) = &r.trajectory {
            self.idle_touch(&r.job, t, now);
        }
        let Some(queued) = self.actions.get(&r.id).map(|e| e.state.is_waiting()) else {
            // A late or repeated result of a settled action (or of one this engine never
            // saw): nothing is booked for it.
            if !self.settled_set.contains(&r.id) {
                self.observe_act(&r, now);
                self.settled_unseen(&r, now);
            }
            return;
        };
        self.observe_act(&r, now);
        if queued {
            // Dispatched by an earlier scheduler that stopped before acking the action: the
            // worker ran it; running it again would be a second effect.
            let e = self.actions.remove(&r.id).expect("present");
            self.queue.retain(|q| q != &r.id);
            self.remember_settled(r.id.clone());
            self.out.push(Effect::Ack(e.delivery));
            // Its sandbox changed all the same: an open that succeeded holds its memory on the
            // worker that ran it.
            let key = (e.action.job.clone(), e.action.trajectory.clone());
            match (e.action.kind(), &r.outcome, &r.placement) {
                (ActionKind::SandboxOpen, Outcome::Completed { exit_code: 0 }, Some(p)) => {
                    if !self.sandboxes.contains_key(&key) {
                        self.idle_opened(&key, &e.action, now);
                    }
                    self.sandboxes
                        .entry(key)
                        .or_insert(super::lifecycle::Sandbox {
                            worker: p.worker.clone(),
                            mem_mb: e.action.demand().mem_mb,
                            cores: self.provisioning.trajectory_cores().unwrap_or(0),
                            state: SandboxState::Open,
                            image: super::lifecycle::open_image(&e.action),
                        });
                }
                _ => self.settle_sandbox(&e, &r.outcome, now),
            }
            self.dirty = true;
            return;
        }
        let e = self.settle(&r.id, now).expect("present");
        if matches!(e.state, ActionState::Dispatching { .. }) {
            // The result came before the store's acknowledgement: the dispatch is durable.
            self.out.push(Effect::Ack(e.delivery));
        }
        let Some((worker, booking)) = e.placed() else {
            return;
        };
        if self.provisioning.malleable() {
            self.touched.insert(worker.clone());
        }
        // A re-sized exec is learned at the cores it held on average.
        let resized = self
            .progress
            .remove(&r.id)
            .and_then(|p| p.mean_cores(now.ms));
        if let (Some(k), Outcome::Completed { .. }, Some(p)) =
            (super::learn_key(&e.action), &r.outcome, &r.placement)
        {
            let cores = resized.unwrap_or(p.cores);
            self.learner
                .observe(&k, cores, r.timing.exec_us as f64 / 1e3);
        }
        let (job, trajectory) = (e.action.job.clone(), e.action.trajectory.clone());
        let service_failed = matches!(
            r.outcome,
            Outcome::InfraError {
                code: InfraCode::Service,
                ..
            }
        );
        let release = Release {
            http_status: r.http.as_ref().map(|h| h.status),
            timed_out: matches!(r.outcome, Outcome::TimedOut),
            latency_ms: r.timing.exec_us / 1000,
            gpu_idle_at_ms: now.ms,
            // A replica that answered is on its GPUs whatever its restore estimate said, and
            // a failed one is restarted asleep.
            replica: if service_failed {
                ReplicaAfter::Evicted
            } else if matches!(r.outcome, Outcome::Completed { .. }) {
                ReplicaAfter::Served
            } else {
                ReplicaAfter::Unknown
            },
            restored_ms: r
                .service
                .as_ref()
                .is_some_and(|u| u.restored)
                .then_some(r.timing.overhead_us / 1000),
        };
        self.unbook(&job, &trajectory, worker, booking, release, now);
        self.settle_sandbox(&e, &r.outcome, now);
        self.dirty = true;
    }

    /// The result of an action this engine never saw: an earlier leader dispatched it, and
    /// its adoption (a heartbeat's fetch, the backlog scan) may still be on its way. It is
    /// settled: remembered, so that a late adoption is dropped rather than booked and then
    /// settled again as lost; and an open that succeeded holds its sandbox from now (the
    /// worker's heartbeats list it, but they add sandboxes only when a worker joins).
    fn settled_unseen(&mut self, r: &ActionResult, now: Now) {
        self.remember_settled(r.id.clone());
        let Some(t) = &r.trajectory else {
            return;
        };
        let key = (r.job.clone(), t.clone());
        // A close's result, also unseen (both came in the gap between two leaders): the
        // sandbox is gone, as `settle_sandbox` has it.
        if r.kind == Some(ActionKind::SandboxClose) {
            self.idle_forget(&key);
            if self.sandboxes.remove(&key).is_some() {
                self.forget_trajectory(&key.0, &key.1);
                self.dirty = true;
            }
            return;
        }
        let (Some(ActionKind::SandboxOpen), Outcome::Completed { exit_code: 0 }, Some(p)) =
            (r.kind, &r.outcome, &r.placement)
        else {
            return;
        };
        if self.sandboxes.get(&key).is_some_and(|s| s.holds()) {
            return;
        }
        let reported = self.workers.get(&p.worker).and_then(|w| {
            w.hb.sandboxes
                .iter()
                .find(|s| s.job == key.0 && s.trajectory == key.1)
                .map(|s| (s.mem_mb, s.idle_timeout_ms))
        });
        let (mem_mb, asked) =
            reported.unwrap_or_else(|| (tangram_shared::SandboxOpen::default().memory_mb, None));
        let s = super::lifecycle::Sandbox::known(&p.worker, mem_mb, self.provisioning);
        self.idle_start(&key, Some(r.id.clone()), asked, now);
        self.sandboxes.insert(key, s);
        self.dirty = true;
    }

    /// What a sandbox action's outcome means for its sandbox.
    fn settle_sandbox(&mut self, e: &Entry, outcome: &Outcome, now: Now) {
        let key = (e.action.job.clone(), e.action.trajectory.clone());
        match (e.action.kind(), outcome) {
            (ActionKind::SandboxOpen, Outcome::Completed { exit_code: 0 }) => {
                if let (Some(image), Some((worker, _))) =
                    (super::lifecycle::open_image(&e.action), e.placed())
                {
                    if let Some(w) = self.workers.get_mut(worker) {
                        w.images.entry(image).or_insert(0);
                    }
                }
                if let Some(s) = self.sandboxes.get_mut(&key) {
                    s.state = SandboxState::Open;
                } else if let Some((worker, booking)) = e.placed() {
                    // Its reservation is gone (a launch and an adoption both make one; a
                    // close or a lost exec of the trajectory settled meanwhile removed it),
                    // but the worker has the sandbox: record it (heartbeats add sandboxes
                    // only when a worker joins).
                    self.idle_opened(&key, &e.action, now);
                    self.sandboxes.insert(
                        key,
                        super::lifecycle::Sandbox {
                            worker: worker.clone(),
                            mem_mb: booking
                                .cpu()
                                .map_or(0, |c| c.grant.mem_mb)
                                .max(e.action.demand().mem_mb),
                            cores: self.provisioning.trajectory_cores().unwrap_or(0),
                            state: SandboxState::Open,
                            image: super::lifecycle::open_image(&e.action),
                        },
                    );
                }
            }
            (ActionKind::SandboxOpen, _) | (ActionKind::SandboxClose, _) => {
                self.idle_forget(&key);
                self.sandboxes.remove(&key);
                self.forget_trajectory(&key.0, &key.1);
            }
            (
                ActionKind::SandboxExec,
                Outcome::InfraError {
                    code: InfraCode::SandboxLost,
                    ..
                },
            ) => {
                self.idle_forget(&key);
                self.sandboxes.remove(&key);
            }
            _ => {}
        }
    }

    /// Takes an unsettled action out of the table (queue position included) and remembers
    /// its id. Its booking is the caller's to give back.
    pub(crate) fn settle(&mut self, id: &ActionId, _now: Now) -> Option<Entry> {
        let e = self.actions.remove(id)?;
        if matches!(e.state, ActionState::Queued { .. }) {
            self.queue.retain(|q| q != id);
        }
        self.remember_settled(id.clone());
        Some(e)
    }

    /// A trajectory's sandbox is gone: every pool drops what it held for the trajectory.
    fn forget_trajectory(
        &mut self,
        job: &tangram_shared::JobId,
        trajectory: &tangram_shared::TrajectoryId,
    ) {
        self.pools.forget_trajectory(job, trajectory);
    }

    /// Gives a booking back to its pool (a GPU slot, API quota; cores and memory are counted
    /// from the ledger, so they free themselves when the entry leaves or is requeued).
    pub(crate) fn unbook(
        &mut self,
        job: &tangram_shared::JobId,
        trajectory: &tangram_shared::TrajectoryId,
        worker: &WorkerId,
        booking: &Booking,
        release: Release,
        now: Now,
    ) {
        self.pools
            .release(worker, job, trajectory, booking, &release, now);
    }

    /// Settles a launched action the worker will not report: publishes an infrastructure
    /// error on its behalf (with the result's own `Nats-Msg-Id`, so a worker's result stored
    /// first wins) and gives its booking back.
    pub(crate) fn settle_lost(&mut self, id: &ActionId, code: InfraCode, reason: String, now: Now) {
        let Some(e) = self.settle(id, now) else {
            return;
        };
        let attempt = match &e.state {
            ActionState::Dispatching { attempt, .. } | ActionState::Running { attempt, .. } => {
                *attempt
            }
            ActionState::Queued { .. } | ActionState::Backoff { .. } => e.attempts,
        };
        if matches!(e.state, ActionState::Dispatching { .. }) {
            self.out.push(Effect::Ack(e.delivery));
        }
        if let Some((worker, booking)) = e.placed() {
            self.unbook(
                &e.action.job,
                &e.action.trajectory,
                worker,
                booking,
                Release::default(),
                now,
            );
        }
        let outcome = Outcome::InfraError { code, reason };
        let mut result = ActionResult::new(
            id.clone(),
            e.action.job.clone(),
            outcome.clone(),
            now.unix_us / 1000,
        )
        .for_action(&e.action, attempt);
        result.timing =
            tangram_shared::Timing::new(now.unix_us.saturating_sub(e.submitted_at_us), 0, 0);
        self.settle_sandbox(&e, &outcome, now);
        self.out.push(Effect::PublishResult {
            result: Box::new(result),
            encoding: e.encoding,
        });
        self.dirty = true;
    }
}
