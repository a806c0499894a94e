//! Adoption: actions a new leader finds already running. A heartbeat that lists an action
//! this engine does not know (dispatched by an earlier leader, whose term ended before the
//! result) makes the shell fetch its dispatch; a redelivered action whose dispatch is stored
//! already arrives with it; and at the start of a term, every dispatch left in the dispatch
//! backlog without a stored result is adopted (`AdoptStored`), so that one whose worker is
//! gone for good is settled at its deadline rather than never. Either way the action becomes `Running` on the worker that has
//! it, booking its grant, with a deadline, and is never dispatched a second time.

use super::lifecycle::{
    ActionState, Booking, CpuBooking, Entry, PendingWidth, Sandbox, SandboxState, WidthReport,
};
use super::PendingResize;
use super::{Delivery, Effect, Engine, Now, Observation};
use tangram_shared::{ActionId, ActionKind, Dispatch, Heartbeat, WorkerId};

/// Where an adopted dispatch was found.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Found {
    /// Fetched for an action a heartbeat listed, or stored for a redelivered action
    /// message: taken to have reached its worker.
    Fetched,
    /// In the dispatch backlog at a term's start: delivered once the worker's heartbeats
    /// are past `seq`. `resize`: a re-size stored after it that the worker had not taken.
    Backlog {
        seq: u64,
        resize: Option<PendingResize>,
    },
}

impl Engine {
    /// Asks for the dispatch of each listed action that is neither known nor settled.
    pub(crate) fn request_adoption(&mut self, hb: &Heartbeat) {
        for id in &hb.running {
            if self.actions.contains_key(id)
                || self.settled_set.contains(id)
                || self.adopting.contains(id)
            {
                continue;
            }
            self.adopting.insert(id.clone());
            self.out.push(Effect::FetchDispatch {
                worker: hb.worker.clone(),
                id: id.clone(),
            });
        }
    }

    /// The fetch found nothing: forget the request (a later heartbeat asks again).
    pub(crate) fn on_adopt_failed(&mut self, id: &ActionId) {
        self.adopting.remove(id);
    }

    /// Takes over a running action from its stored dispatch. `delivery` is the action
    /// message held for it, if any: it is acked, since the dispatch is durable. One found in
    /// the backlog rather than listed by its worker counts as delivered only once the
    /// worker's heartbeats say so.
    pub(crate) fn adopt(
        &mut self,
        worker: WorkerId,
        dispatch: Dispatch,
        delivery: Option<Delivery>,
        found: Found,
        now: Now,
    ) {
        let (stored_seq, resize) = match found {
            Found::Fetched => (None, None),
            Found::Backlog { seq, resize } => (Some(seq), resize),
        };
        let id = dispatch.action.id.clone();
        self.adopting.remove(&id);
        if self.actions.contains_key(&id) || self.settled_set.contains(&id) {
            // Adopted from a heartbeat's fetch first: the backlog still says what re-size
            // is on its way.
            if let Some(r) = resize {
                self.book_pending_resize(&id, dispatch.attempt, r, now);
            }
            if let Some(d) = delivery {
                self.out.push(Effect::Ack(d));
            }
            return;
        }
        let kind = dispatch.action.kind();
        // An exec an earlier leader re-sized holds what its worker last reported, not its
        // dispatch's grant (a worker not heard from yet corrects it with its next report).
        // A re-size still in the backlog is what it holds until the worker takes it in (see
        // `PendingWidth`).
        let mut grant = dispatch.grant;
        let (cores, pending) = self.adopted_width(&worker, &id, grant.cores, resize);
        grant.cores = cores;
        // Cores count against the worker as a launch would count them: execs, unless the
        // sandbox holds its cores itself (`static`).
        let counted_cores =
            if kind == ActionKind::SandboxExec && self.provisioning.trajectory_cores().is_none() {
                grant.cores
            } else {
                0
            };
        let deadline_ms = now.ms + dispatch.action.timeout_ms + self.config.result_grace_ms;
        self.adopt_sandbox(&worker, &dispatch, now);
        self.actions.insert(
            id,
            Entry {
                encoding: dispatch.result_encoding,
                submitted_at_us: dispatch.submitted_at_us,
                // No message is held for an action adopted from a heartbeat (0 is never a
                // stream sequence).
                delivery: delivery.unwrap_or(0),
                arrived_ms: now.ms,
                model: None,
                attempts: dispatch.attempt,
                failures: 0,
                pin: None,
                pinned_since_ms: None,
                bytes: 0,
                state: ActionState::Running {
                    worker,
                    // The replica slot and the provider's quota are not booked again: the
                    // earlier leader booked them, and the result gives back nothing here.
                    booking: match kind {
                        ActionKind::Reward | ActionKind::Api => Booking::Nothing,
                        _ => Booking::Cpu(CpuBooking {
                            grant,
                            counted_cores,
                        }),
                    },
                    attempt: dispatch.attempt,
                    stored_ms: now.ms,
                    stored_seq: stored_seq.unwrap_or(0),
                    deadline_ms,
                    delivered_ms: stored_seq.is_none().then_some(now.ms),
                    listed_once: stored_seq.is_none(),
                    unreported: 0,
                    adopted: true,
                    pending,
                },
                action: dispatch.action,
            },
        );
        if let Some(d) = delivery {
            self.out.push(Effect::Ack(d));
        }
        self.out.push(Effect::Observe(Observation::Adopted(kind)));
        self.dirty = true;
    }

    /// The width an adopted exec holds on `worker`: what the worker last reported of it
    /// (`resized`), else `ran` (what it was known to run at); a re-size of it found in the
    /// backlog instead, while the worker has not taken it in, which is returned too.
    fn adopted_width(
        &self,
        worker: &WorkerId,
        id: &ActionId,
        ran: u32,
        resize: Option<PendingResize>,
    ) -> (u32, Option<PendingWidth>) {
        let report = self
            .workers
            .get(worker)
            .map_or_else(WidthReport::default, |w| WidthReport::of(&w.hb, id));
        let before = report.reported.unwrap_or(ran);
        let mut pending = resize.map(|r| PendingWidth {
            cores: r.cores,
            seq: r.seq,
            before,
            epoch: r.epoch,
        });
        let cores = PendingWidth::settle(&mut pending, report).unwrap_or(before);
        (cores, pending)
    }

    /// An adopted exec's re-size found in the backlog after its adoption (a heartbeat's
    /// fetch came first): booked as at adoption.
    fn book_pending_resize(
        &mut self,
        id: &ActionId,
        attempt: u32,
        resize: PendingResize,
        now: Now,
    ) {
        let Some(ActionState::Running {
            worker,
            booking,
            attempt: a,
            adopted: true,
            ..
        }) = self.actions.get(id).map(|e| &e.state)
        else {
            return;
        };
        if *a != attempt {
            return;
        }
        let Some(before) = booking.cpu().map(|c| c.grant.cores) else {
            return;
        };
        let (cores, pending) = self.adopted_width(worker, id, before, Some(resize));
        if let Some(ActionState::Running {
            booking,
            pending: p,
            ..
        }) = self.actions.get_mut(id).map(|e| &mut e.state)
        {
            *p = pending;
            if let Some(cpu) = booking.cpu_mut() {
                cpu.set_cores(cores);
            }
            self.progress_follows_booking(id, now);
            self.dirty = true;
        }
    }

    /// What an adopted sandbox action means for its sandbox, as its launch would have meant:
    /// an open reserves the sandbox's memory (and `static`'s cores) on its worker from now,
    /// not from its result, so that nothing else is placed into that room meanwhile; a close
    /// marks the sandbox closing. A sandbox already known (listed by the worker) stays.
    fn adopt_sandbox(&mut self, worker: &WorkerId, dispatch: &Dispatch, now: Now) {
        let key = (
            dispatch.action.job.clone(),
            dispatch.action.trajectory.clone(),
        );
        match dispatch.action.kind() {
            ActionKind::SandboxOpen => {
                if self.sandboxes.get(&key).is_some_and(|s| s.holds()) {
                    return;
                }
                let mut grant = dispatch.grant;
                grant.mem_mb = grant.mem_mb.max(dispatch.action.demand().mem_mb);
                let s = Sandbox::opening(worker, &dispatch.action, grant, self.provisioning);
                self.idle_opened(&key, &dispatch.action, now);
                self.sandboxes.insert(key, s);
            }
            ActionKind::SandboxClose => {
                if let Some(s) = self.sandboxes.get_mut(&key) {
                    s.state = SandboxState::Closing;
                }
            }
            _ => {}
        }
    }
}
