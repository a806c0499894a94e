//! Workers: heartbeats (inventory, GPUs, services, providers, sandboxes, running actions),
//! liveness, and what the engine does when a worker stops reporting an action or itself.

use super::lifecycle::{
    ActionState, Booking, PendingWidth, Sandbox, SandboxKey, SandboxState, WidthReport,
};
use super::pools::WorkerReport;
use super::{Effect, Engine, Now, Observation, WorkerState};
use std::collections::HashSet;
use tangram_shared::{ActionId, Heartbeat, InfraCode, WorkerId};

/// Fenced worker instances remembered at most (one per worker; when full, the first by
/// id is forgotten).
const MAX_FENCED: usize = 10_000;
/// A fenced instance still heartbeating this long after its fence was asked for gets it
/// asked for again.
const FENCE_AGAIN_MS: u64 = 10_000;
/// Heartbeats in a row that must leave out a running action before it is settled as lost.
const UNREPORTED_LIMIT: u8 = 2;

impl Engine {
    pub(crate) fn on_heartbeat(&mut self, hb: Heartbeat, now: Now) {
        if hb.worker.check().is_err() {
            return;
        }
        match self.fenced.get_mut(&hb.worker) {
            // Declared lost: nothing it reports counts until it rejoins as a new instance.
            Some((fenced, asked_ms)) if *fenced == hb.instance => {
                self.out.push(Effect::Observe(Observation::FencedHeartbeat));
                // Still at it: its fence record may not have been written; ask again.
                if now.ms >= *asked_ms + FENCE_AGAIN_MS {
                    *asked_ms = now.ms;
                    self.out.push(Effect::Fence {
                        worker: hb.worker.clone(),
                        instance: hb.instance.clone(),
                    });
                }
                return;
            }
            Some(_) => {
                self.fenced.remove(&hb.worker);
            }
            None => {}
        }
        // Back: what waited for it is judged on the fleet as it now is.
        if self.departed.remove(&hb.worker).is_some() {
            self.dirty = true;
        }
        let known = self.workers.get(&hb.worker);
        let restarted = known.is_some_and(|w| w.hb.instance != hb.instance);
        let joined = known.is_none();
        if restarted {
            // The new instance removed its predecessor's containers: its sandboxes that it
            // does not list are lost, except those still being opened by a dispatch it will run.
            let listed: HashSet<SandboxKey> = hb
                .sandboxes
                .iter()
                .map(|s| (s.job.clone(), s.trajectory.clone()))
                .collect();
            for (k, s) in self.sandboxes.iter_mut() {
                if s.worker == hb.worker && s.state == SandboxState::Open && !listed.contains(k) {
                    s.state = SandboxState::Lost;
                }
            }
        }
        let fresh = restarted || joined;
        // The engine's view of GPU residency is authoritative while a worker instance lives;
        // a new instance's report replaces it, and the slots its predecessor's actions booked
        // are forgotten.
        if fresh && hb.gpus.is_some() {
            self.forget_gpu_bookings(&hb.worker);
        }
        let report = WorkerReport {
            hb: &hb,
            fresh,
            accepting: !hb.draining && !self.cordons.contains_key(&hb.worker),
        };
        let seen = self.pools.ingest(&report, now);
        self.out.extend(seen.into_iter().map(Effect::Observe));
        if joined {
            // Sandboxes a worker reports (after a scheduler restart) are adopted.
            for s in &hb.sandboxes {
                let key = (s.job.clone(), s.trajectory.clone());
                let adopt = self
                    .sandboxes
                    .get(&key)
                    .is_none_or(|x| x.state == SandboxState::Lost);
                if adopt {
                    let known = Sandbox::known(&hb.worker, s.mem_mb, self.provisioning);
                    self.idle_start(&key, s.open.clone(), s.idle_timeout_ms, now);
                    self.sandboxes.insert(key, known);
                }
            }
        }
        self.reconcile_running(&hb, now);
        self.release_pins(&hb, now);
        self.request_adoption(&hb);
        let images = super::images::from_heartbeat(&hb.images);
        self.workers.insert(
            hb.worker.clone(),
            WorkerState {
                hb,
                last_seen_ms: now.ms,
                images,
            },
        );
        self.dirty = true;
    }

    /// Queued actions pinned to this worker by a failed store: once the worker has reported
    /// for two redelivery windows after it without listing the action, the store did not
    /// happen (a stored dispatch is delivered and listed within one), so the action may go
    /// to any worker. Without this, a pinned open waited forever on a full worker while
    /// others were free.
    fn release_pins(&mut self, hb: &Heartbeat, now: Now) {
        let listed: HashSet<&ActionId> = hb.running.iter().chain(&hb.finished).collect();
        let window = 2 * (tangram_shared::DISPATCH_REDELIVERY_MS + self.grace_ms(hb));
        for (id, e) in self.actions.iter_mut() {
            let due = e
                .pinned_since_ms
                .is_some_and(|since| now.ms >= since + window);
            if due
                && e.state.is_waiting()
                && e.pin.as_ref() == Some(&hb.worker)
                && !listed.contains(id)
            {
                e.pin = None;
                e.pinned_since_ms = None;
                self.dirty = true;
            }
        }
    }

    /// The heartbeat's `running` list against the running set: an action the worker has not
    /// listed (as running, or as finished lately) in [`UNREPORTED_LIMIT`] heartbeats in a row
    /// and that never settled is resolved as lost: it holds no capacity past that. Omissions
    /// count once a heartbeat has listed it, or else once the worker has taken in the dispatch
    /// stream past it (with no sequence, a grace after the store) and a redelivery window has
    /// passed since: a delivery lost in transit comes back after later ones, within the
    /// consumer's ack wait.
    fn reconcile_running(&mut self, hb: &Heartbeat, now: Now) {
        // Finished lately counts as reported: its result is on its way (or the result
        // deadline settles it).
        let listed: HashSet<&ActionId> = hb.running.iter().chain(&hb.finished).collect();
        let grace = self.grace_ms(hb);
        let window = tangram_shared::DISPATCH_REDELIVERY_MS + grace;
        let mut lost = Vec::new();
        let mut resized = Vec::new();
        for (id, e) in self.actions.iter_mut() {
            let ActionState::Running {
                worker,
                booking,
                stored_ms,
                stored_seq,
                delivered_ms,
                listed_once,
                unreported,
                adopted,
                pending,
                ..
            } = &mut e.state
            else {
                continue;
            };
            if worker != &hb.worker {
                continue;
            }
            // An adopted exec an earlier leader re-sized: book what the worker says it holds,
            // or a re-size still on its way to it (see `PendingWidth`).
            let width = adopted
                .then(|| PendingWidth::settle(pending, WidthReport::of(hb, id)))
                .flatten();
            if let (Some(cores), Some(cpu)) = (width, booking.cpu_mut()) {
                if cpu.set_cores(cores) {
                    resized.push(id.clone());
                }
            }
            // Evidence that the dispatch reached the worker: its sequence is behind what the
            // worker has taken in. Without sequences, a grace after the store stands in.
            let delivered = if *stored_seq > 0 && hb.dispatch_seq > 0 {
                hb.dispatch_seq >= *stored_seq
            } else {
                now.ms >= *stored_ms + grace
            };
            let listed = listed.contains(id);
            if delivered || listed {
                delivered_ms.get_or_insert(now.ms);
            }
            if listed {
                *listed_once = true;
                *unreported = 0;
            } else if *listed_once || delivered_ms.is_some_and(|t| now.ms >= t + window) {
                *unreported += 1;
                if *unreported >= UNREPORTED_LIMIT {
                    lost.push(id.clone());
                }
            }
        }
        for id in &resized {
            self.progress_follows_booking(id, now);
            self.dirty = true;
        }
        lost.sort();
        for id in lost {
            let reason = format!(
                "worker {} no longer reports this action and no result came for it",
                hb.worker
            );
            self.settle_lost(&id, InfraCode::WorkerLost, reason, now);
        }
    }

    /// Every pool is told whether a worker takes new work, after a cordon changed.
    pub(crate) fn refresh_node(&mut self, worker: &WorkerId) {
        let Some(w) = self.workers.get(worker) else {
            return;
        };
        let report = WorkerReport {
            hb: &w.hb,
            fresh: false,
            accepting: !w.hb.draining && !self.cordons.contains_key(worker),
        };
        self.pools.accepting(&report);
    }

    /// A new instance's replicas replace the old ones: slots booked by actions of the old
    /// instance belong to replicas that are gone, and must not be given back to the new ones.
    fn forget_gpu_bookings(&mut self, worker: &WorkerId) {
        for e in self.actions.values_mut() {
            match &mut e.state {
                ActionState::Dispatching {
                    worker: w, booking, ..
                }
                | ActionState::Running {
                    worker: w, booking, ..
                } if w == worker && matches!(booking, Booking::Gpu(_)) => {
                    *booking = Booking::Nothing;
                }
                _ => {}
            }
        }
    }

    /// NATS answered: silence until now is evidence. After a gap in the confirmations, the
    /// silence during it is nobody's evidence: every worker's grace starts again and result
    /// deadlines move back by the gap.
    pub(crate) fn on_reachable(&mut self, now: Now) {
        let every = self.config.reachable_every_ms;
        if let Some(prev) = self.reachable_ms {
            let gap = now.ms.saturating_sub(prev);
            if every > 0 && gap > 2 * every {
                for w in self.workers.values_mut() {
                    w.last_seen_ms = w.last_seen_ms.max(now.ms);
                }
                for e in self.actions.values_mut() {
                    if let ActionState::Running { deadline_ms, .. } = &mut e.state {
                        *deadline_ms = deadline_ms.saturating_add(gap);
                    }
                }
                self.leases_restart(now);
                self.out
                    .push(Effect::Observe(Observation::Unreachable { gap_ms: gap }));
            }
        }
        self.reachable_ms = Some(now.ms);
        self.dirty = true;
    }

    pub(crate) fn on_tick(&mut self, now: Now) {
        self.on_drain_deadlines(now);
        self.on_idle_deadlines(now);
        self.on_queue_deadlines(now);
        // Judged at the last confirmation that NATS answered, when there is one: a worker is
        // lost only if it had been silent past its grace while NATS was known to work.
        let judged_at = self.reachable_ms.unwrap_or(now.ms).min(now.ms);
        let lost: Vec<WorkerId> = self
            .workers
            .iter()
            .filter(|(_, w)| judged_at.saturating_sub(w.last_seen_ms) > self.grace_ms(&w.hb))
            .map(|(id, _)| id.clone())
            .collect();
        for worker in lost {
            self.worker_lost(&worker, now);
        }
        // Deadlines: a running action with no result long past its timeout.
        let mut overdue: Vec<(ActionId, WorkerId)> = Vec::new();
        // Failed dispatches whose wait is over go back into the queue.
        let mut backed_off: Vec<(u64, ActionId)> = Vec::new();
        for (id, e) in self.actions.iter_mut() {
            match &mut e.state {
                ActionState::Queued { last_progress_ms }
                    if now.ms >= *last_progress_ms + self.config.progress_every_ms =>
                {
                    *last_progress_ms = now.ms;
                    self.out.push(Effect::Progress(e.delivery));
                }
                ActionState::Backoff {
                    until_ms,
                    last_progress_ms,
                } => {
                    if now.ms >= *until_ms {
                        backed_off.push((*until_ms, id.clone()));
                    }
                    if now.ms >= *last_progress_ms + self.config.progress_every_ms {
                        *last_progress_ms = now.ms;
                        self.out.push(Effect::Progress(e.delivery));
                    }
                }
                ActionState::Running {
                    worker,
                    deadline_ms,
                    ..
                } if judged_at >= *deadline_ms => overdue.push((id.clone(), worker.clone())),
                _ => {}
            }
        }
        backed_off.sort();
        for (_, id) in backed_off {
            self.end_backoff(&id);
        }
        overdue.sort();
        for (id, worker) in overdue {
            let reason = format!(
                "no result from worker {worker} within the action's timeout plus {} s",
                self.config.result_grace_ms / 1000
            );
            self.settle_lost(&id, InfraCode::WorkerLost, reason, now);
        }
        // Actions a rate limit held back may go now.
        if self.wake_at.is_some_and(|t| t <= now.ms) {
            self.wake_at = None;
            self.dirty = true;
        }
    }

    /// A worker went silent past its grace: its sandboxes are lost, its GPUs and providers
    /// leave the pool, and everything launched there is settled with an infrastructure error.
    pub(crate) fn worker_lost(&mut self, worker: &WorkerId, now: Now) {
        self.out.push(Effect::Observe(Observation::WorkerLost));
        self.departed.insert(worker.clone(), now.ms);
        if let Some(w) = self.workers.remove(worker) {
            // Fenced: should it come back, it must drop what it holds and rejoin as a new
            // instance, since everything it held is settled or lost here.
            if self.fenced.len() >= MAX_FENCED {
                if let Some(oldest) = self.fenced.keys().next().cloned() {
                    self.fenced.remove(&oldest);
                }
            }
            self.fenced
                .insert(worker.clone(), (w.hb.instance.clone(), now.ms));
            self.out.push(Effect::Fence {
                worker: worker.clone(),
                instance: w.hb.instance,
            });
        }
        for s in self.sandboxes.values_mut() {
            if &s.worker == worker {
                s.state = SandboxState::Lost;
            }
        }
        self.pools.forget_worker(worker);
        let mut ids: Vec<ActionId> = self
            .actions
            .iter()
            .filter(|(_, e)| e.placed().is_some_and(|(w, _)| w == worker))
            .map(|(id, _)| id.clone())
            .collect();
        ids.sort();
        for id in ids {
            let reason =
                format!("worker {worker} stopped sending heartbeats while running this action");
            self.settle_lost(&id, InfraCode::WorkerLost, reason, now);
        }
        self.dirty = true;
    }
}
