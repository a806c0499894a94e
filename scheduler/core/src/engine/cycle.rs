//! One planning cycle: GPU routes, API admission, sandbox constraints, the CPU policy, and
//! launches booked at once (assumed) and handed out as dispatches.

use super::lifecycle::{ActionState, Booking, CpuBooking, SandboxState};
use super::pools::cpu::{CpuHold, CpuPool};
use super::pools::gpu::GpuPool;
use super::pools::{Fleet, Held, Planned, Pool, Waiting};
use super::{Effect, Engine, Now, Observation};
use crate::model::{Launch, Pending, Snapshot};
use std::collections::{BTreeMap, HashMap, HashSet};
use tangram_shared::{
    ActionId, ActionKind, ActionSpec, ChunkRef, Dispatch, GpuRoute, Grant, Rejection, WorkerId,
};

pub(crate) fn chunk_ref(c: crate::gpu::Chunk) -> ChunkRef {
    ChunkRef {
        group: c.group,
        start: c.start,
        len: c.len,
    }
}

pub(crate) fn chunk_of(c: ChunkRef) -> crate::gpu::Chunk {
    crate::gpu::Chunk {
        group: c.group,
        start: c.start,
        len: c.len,
    }
}

impl Engine {
    /// Cores and memory booked per worker by launched actions and held sandboxes (the CPU
    /// pool's part of [`Engine::held`], summed).
    pub(crate) fn used(&self) -> HashMap<&WorkerId, (u32, u64)> {
        let mut used: HashMap<&WorkerId, (u32, u64)> = HashMap::new();
        for (w, h) in self.held().cpu {
            let u = used.entry(w).or_default();
            u.0 += h.cores;
            u.1 += h.mem_mb;
        }
        used
    }

    /// What is held of each pool, from the ledger: launched actions' bookings, and held
    /// sandboxes' cores and memory.
    pub(crate) fn held(&self) -> Held<'_> {
        let placed = self.actions.values().filter_map(|e| e.placed());
        let sandboxes = self.sandboxes.values().filter(|s| s.holds()).map(|s| {
            let hold = CpuHold {
                cores: s.cores,
                mem_mb: s.mem_mb,
                sandbox: true,
            };
            (&s.worker, hold)
        });
        Held::of(placed, sandboxes)
    }

    /// The cluster as the policy sees it: capacity minus what is booked.
    pub fn snapshot(&self) -> Snapshot {
        let held = self.held();
        let held: Vec<_> = held.cpu.iter().map(|(w, h)| (*w, h)).collect();
        self.pools.cpu.snapshot(&held)
    }

    pub(crate) fn cycle(&mut self, now: Now) {
        // At a term's start nothing is placed until the backlog an earlier leader left is
        // booked (`EngineConfig::await_backlog`).
        if self.stopping || !self.leading || self.backlog_pending {
            return;
        }
        if self.expire_queued(now) {
            let actions = &self.actions;
            self.queue.retain(|id| actions.contains_key(id));
        }
        let mut rejections: Vec<(ActionId, Rejection)> = Vec::new();
        let routes = self.plan_gpu(now, &mut rejections);
        let api = self.plan_api(now, &mut rejections);
        let mut forget = Vec::new();
        let mut dropped = Vec::new();
        let pending = self.plan_sandboxes(&mut rejections, &mut forget, &mut dropped);
        // A lost sandbox's close is answered (rejected: nothing to close) and forgets it.
        for key in forget {
            self.idle_forget(&key);
            self.sandboxes.remove(&key);
        }
        for key in dropped {
            self.close_dropped(&key);
        }
        let cpu = self.plan_cpu(&pending, now);
        rejections.extend(cpu.rejections);
        for (id, rejection) in rejections {
            self.reject_queued(&id, rejection, now);
        }
        // Workers this cycle booked cores or memory on: none may end it over capacity.
        let mut booked_on: HashSet<WorkerId> = HashSet::new();
        for (id, worker, booking) in cpu.launches {
            // What adds to its worker: counted cores, or an open's sandbox (an exec on a
            // `static` sandbox's own cores adds nothing).
            let open = self
                .actions
                .get(&id)
                .is_some_and(|e| e.action.kind() == ActionKind::SandboxOpen);
            if booking.counted_cores > 0 || open {
                booked_on.insert(worker.clone());
            }
            self.launch(id, worker, Ticket::Cpu(booking), now);
        }
        for (id, worker, route) in routes {
            self.launch(id, worker, Ticket::Gpu(route), now);
        }
        for (id, worker, booking) in api {
            self.launch(id, worker, Ticket::Api(booking), now);
        }
        if self.provisioning.malleable() {
            for (id, worker, grant) in self.resize(now) {
                booked_on.insert(worker.clone());
                let counted_cores = grant.cores;
                let ticket = Ticket::Cpu(CpuBooking {
                    grant,
                    counted_cores,
                });
                self.launch(id, worker, ticket, now);
            }
        }
        // Launched and rejected actions leave the queue (once per cycle, not once each).
        let actions = &self.actions;
        self.queue.retain(|id| {
            actions
                .get(id)
                .is_some_and(|e| matches!(e.state, ActionState::Queued { .. }))
        });
        self.recount_queued();
        if cfg!(debug_assertions) {
            self.check_postconditions(&booked_on);
        }
        let running = self.actions.len() - self.queue.len();
        self.out.push(Effect::Observe(Observation::Cycle {
            queued: self.queue.len(),
            running,
            workers: self.workers.len(),
        }));
    }

    /// What every cycle leaves true, checked in debug builds (tests, the simulator's debug
    /// runs, the integration suite's scheduler): the queue holds exactly the queued actions,
    /// once each, in arrival order; an action backing off is out of it; and no worker this
    /// cycle booked on is booked past its cores or memory (a worker may be over capacity
    /// for reasons outside the plan, such as a restart with fewer cores while adopted work
    /// runs; the plan must then not add to it); and each exec's progress estimate runs at
    /// the width it is booked.
    fn check_postconditions(&self, booked_on: &HashSet<WorkerId>) {
        let mut seen: HashSet<&ActionId> = HashSet::new();
        let mut last_arrival = 0;
        for id in &self.queue {
            assert!(seen.insert(id), "{id} is in the queue twice");
            let e = self
                .actions
                .get(id)
                .unwrap_or_else(|| panic!("{id} queued, not in the table"));
            assert!(
                matches!(e.state, ActionState::Queued { .. }),
                "{id} in the queue as {:?}",
                e.state
            );
            assert!(e.arrived_ms >= last_arrival, "{id} out of arrival order");
            last_arrival = e.arrived_ms;
        }
        let queued = self
            .actions
            .values()
            .filter(|e| matches!(e.state, ActionState::Queued { .. }))
            .count();
        assert_eq!(
            queued,
            self.queue.len(),
            "a queued action is missing from the queue"
        );
        let used = self.used();
        for w in booked_on {
            let (Some(state), Some((cores, mem))) = (self.workers.get(w), used.get(w)) else {
                continue;
            };
            assert!(
                *cores <= state.hb.cores && *mem <= state.hb.mem_mb,
                "{w}: {cores} cores and {mem} MiB booked of {} and {}",
                state.hb.cores,
                state.hb.mem_mb
            );
        }
        for (id, p) in &self.progress {
            let booked = self.actions.get(id).and_then(|e| e.placed());
            if let Some((_, b)) = booked {
                assert_eq!(
                    p.cores,
                    b.counted_cores(),
                    "{id}: its progress is estimated at {} cores, it is booked at {}",
                    p.cores,
                    b.counted_cores()
                );
            }
        }
    }

    /// Reward actions: handed to the GPU pool (Evict-on-Execution), which routes them.
    fn plan_gpu(
        &mut self,
        now: Now,
        rejections: &mut Vec<(ActionId, Rejection)>,
    ) -> Vec<(ActionId, WorkerId, GpuRoute)> {
        // The pool is out of the engine while it plans on a read of the ledger.
        let mut pool = std::mem::replace(&mut self.pools.gpu, GpuPool::new(false));
        let waiting = self.waiting_for(|s| matches!(s, ActionSpec::Reward(_)));
        let running = self.gpu_running(&waiting);
        let waiting = self.fair_gpu(waiting, &running);
        // Planned even with nothing waiting: under `static` the pool pins the services at
        // the first cycle after settling in.
        let held = if waiting.is_empty() {
            Vec::new()
        } else {
            self.held().gpu
        };
        let accepting = |w: &WorkerId| self.takes_work(w);
        let mut fleet = self.fleet(&accepting);
        fleet.gpu_room = self.gpu_room(&waiting, &running);
        let planned = pool.plan(&waiting, &held, &fleet, now);
        drop((waiting, held, fleet));
        self.pools.gpu = pool;
        rejections.extend(planned.rejections);
        self.out
            .extend(planned.observations.into_iter().map(Effect::Observe));
        planned.launches
    }

    /// The queued actions whose spec `wanted` picks, as a pool takes them, in queue order.
    pub(crate) fn waiting_for(&self, wanted: impl Fn(&ActionSpec) -> bool) -> Vec<Waiting<'_>> {
        self.queue
            .iter()
            .filter_map(|id| {
                let e = &self.actions[id];
                wanted(&e.action.spec).then_some(Waiting {
                    id,
                    job: &e.action.job,
                    trajectory: &e.action.trajectory,
                    spec: &e.action.spec,
                    pin: e.pin.as_ref(),
                    arrived_ms: e.arrived_ms,
                    cpu: None,
                })
            })
            .collect()
    }

    /// Whether a worker takes new unpinned work: alive, not draining, not cordoned.
    pub(crate) fn takes_work(&self, w: &WorkerId) -> bool {
        self.workers.get(w).is_some_and(|s| !s.hb.draining) && !self.cordons.contains_key(w)
    }

    /// What the pools are told of the fleet when they plan.
    pub(crate) fn fleet<'a>(&'a self, accepting: &'a dyn Fn(&WorkerId) -> bool) -> Fleet<'a> {
        Fleet {
            accepting,
            judges_capacity: self.judges_capacity(),
            settled_in: self.settled_in,
            provisioning: self.provisioning,
            job_weights: &self.config.job_weights,
            trajectories: self
                .config
                .static_trajectories
                .map_or(self.sandboxes.len(), |n| n as usize),
            gpu_room: HashMap::new(),
        }
    }

    /// The sandbox actions, with their constraints, to the CPU pool.
    fn plan_cpu(&mut self, pending: &[Pending], now: Now) -> Planned<CpuBooking> {
        // The pool is out of the engine while it plans on a read of the ledger.
        let mut pool = std::mem::replace(&mut self.pools.cpu, CpuPool::placeholder());
        let by_id: HashMap<&ActionId, &Pending> = pending.iter().map(|p| (&p.id, p)).collect();
        let mut waiting = self.waiting_for(|s| {
            matches!(
                s,
                ActionSpec::SandboxOpen(_)
                    | ActionSpec::SandboxExec(_)
                    | ActionSpec::SandboxClose(_)
            )
        });
        waiting.retain_mut(|w| {
            w.cpu = by_id.get(w.id).copied();
            w.cpu.is_some()
        });
        let waiting = self.fair_cpu(waiting);
        let held = self.held();
        let held: Vec<_> = held.cpu.iter().map(|(w, h)| (*w, h)).collect();
        let accepting = |w: &WorkerId| self.takes_work(w);
        let fleet = self.fleet(&accepting);
        let planned = pool.plan(&waiting, &held, &fleet, now);
        drop((waiting, held, fleet));
        self.pools.cpu = pool;
        planned
    }

    /// Books a launch on `worker` with what a pool's plan gave it, and hands out its
    /// dispatch: the action becomes `Dispatching`.
    fn launch(&mut self, id: ActionId, worker: WorkerId, ticket: Ticket, now: Now) {
        // Addressed to the instance the worker last reported, so that one fenced meanwhile
        // (declared lost) refuses it instead of running an action already settled.
        let instance = self.workers.get(&worker).map(|w| w.hb.instance.clone());
        let (grant, gpu, booking) = match ticket {
            Ticket::Cpu(cpu) => (cpu.grant, None, Booking::Cpu(cpu)),
            Ticket::Gpu(route) => {
                let booking = Booking::Gpu(GpuPool::booking_of(&route));
                (Grant::default(), Some(route), booking)
            }
            Ticket::Api(api) => (Grant::default(), None, Booking::Api(api)),
        };
        let launch = Launch { id, worker, grant };
        let Some(e) = self.actions.get_mut(&launch.id) else {
            return;
        };
        if !matches!(e.state, ActionState::Queued { .. }) {
            return;
        }
        if let Some(t) = e.action.queue_timeout_ms {
            let at = (e.arrived_ms.saturating_add(t), launch.id.clone());
            self.admission.forget_deadline(&at);
        }
        e.attempts += 1;
        let attempt = e.attempts;
        let kind = e.action.kind();
        let dispatch = Dispatch {
            epoch: self.config.epoch,
            attempt,
            action: e.action.clone(),
            grant: launch.grant,
            submitted_at_us: e.submitted_at_us,
            result_encoding: e.encoding,
            gpu: gpu.clone(),
            instance,
        };
        if kind == ActionKind::SandboxExec && self.provisioning.malleable() {
            self.touched.insert(launch.worker.clone());
        }
        let api = match &booking {
            Booking::Api(a) => Some(a.provider.clone()),
            _ => None,
        };
        e.state = ActionState::Dispatching {
            worker: launch.worker.clone(),
            booking,
            attempt,
            since_ms: now.ms,
        };
        let key = (e.action.job.clone(), e.action.trajectory.clone());
        let job = e.action.job.0.clone();
        match kind {
            ActionKind::SandboxOpen => {
                let s = super::lifecycle::Sandbox::opening(
                    &launch.worker,
                    &e.action,
                    launch.grant,
                    self.provisioning,
                );
                let (id, asked) = (e.action.id.clone(), super::idle::asked_timeout(&e.action));
                self.idle_start(&key, Some(id), asked, now);
                self.sandboxes.insert(key, s);
            }
            ActionKind::SandboxClose => {
                if let Some(s) = self.sandboxes.get_mut(&key) {
                    s.state = SandboxState::Closing;
                }
            }
            _ => {}
        }
        if let Some(r) = &gpu {
            self.out.push(Effect::Observe(Observation::GpuRoute {
                service: r.service.clone(),
                restore: r.restore,
                evictions: r.evict.len(),
            }));
        }
        if let Some(provider) = api {
            self.out
                .push(Effect::Observe(Observation::ApiAdmitted { provider, job }));
        }
        self.out.push(Effect::Dispatch {
            worker: launch.worker,
            dispatch: Box::new(dispatch),
        });
    }
}

/// What a pool's plan hands a launch: what the worker is told, from which its booking is
/// made.
enum Ticket {
    /// Cores and memory (a sandbox action).
    Cpu(CpuBooking),
    /// A route to a replica (a reward action).
    Gpu(GpuRoute),
    /// Admitted against a provider's quota (an api action).
    Api(super::ApiBooking),
}

/// Spreads `n` items over `workers` least loaded first (ties by id): the worker for the next.
pub(crate) fn least_loaded(
    workers: &[WorkerId],
    load: &mut BTreeMap<WorkerId, usize>,
) -> Option<WorkerId> {
    let w = workers
        .iter()
        .min_by_key(|w| (load.get(*w).copied().unwrap_or(0), (*w).clone()))?
        .clone();
    *load.entry(w.clone()).or_default() += 1;
    Some(w)
}
