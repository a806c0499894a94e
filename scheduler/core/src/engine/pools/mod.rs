//! The engine's resource pools behind one interface ([`Pool`]). The engine keeps the action
//! ledger (each action's state and what it holds), the worker fleet and the cycle; a pool
//! keeps its own state, private to it, and is called at the same points whatever it pools:
//! a heartbeat comes in ([`Pool::ingest`]), a worker leaves ([`Pool::forget_worker`]), a
//! trajectory's sandbox goes ([`Pool::forget_trajectory`]), the cycle plans its waiting
//! actions ([`Pool::plan`]), a settled action gives its booking back ([`Pool::release`]),
//! a cordon is set or lifted ([`Pool::accepting`]), and the status report is written
//! ([`Pool::report`]). What a launched action holds of a pool is one variant of the
//! ledger's [`super::lifecycle::Booking`], made from the pool's `Ticket`; the pool sees it
//! again as its own `Booking` type when it plans, releases and reports ([`Held`], one walk
//! of the ledger, hands each pool its own).
//!
//! [`Pools`] makes every call but `plan` on all pools in one place: ingest, accepting,
//! forget_worker, forget_trajectory, release (to the pool the booking names) and report.
//! `plan` is the cycle's, per pool: each plans its own kind of action, into its own ticket
//! type, in the cycle's order (GPU routes, API admission, then sandboxes under the CPU
//! policy).
//!
//! Pools: CPU cores and memory under the CPU policy (`cpu.rs`), API quota (`api.rs`), GPU
//! chunks and replicas under Evict-on-Execution (`gpu.rs`). Per-job shares and caps hang on
//! this interface next. Adding a resource kind: `scheduler/core/README.md`, "Adding a
//! resource kind".

pub(crate) mod api;
pub(crate) mod cpu;
pub(crate) mod gpu;

use super::lifecycle::Booking;
use super::{Now, Observation};
use std::collections::{BTreeMap, HashMap};
use tangram_shared::status::Status;
use tangram_shared::{ActionId, ActionSpec, Heartbeat, JobId, Rejection, TrajectoryId, WorkerId};

/// The engine's pools, one field each. The calls every pool takes alike (a heartbeat, a
/// cordon, a worker or a trajectory gone, a booking given back, the status report) go to
/// them from here, in one order, so a new pool is added to these methods, to [`Held`] and to
/// the cycle's plan, not to each call site.
#[derive(Debug)]
pub(crate) struct Pools {
    /// CPU cores and memory: the workers' capacity, the CPU policy, its wait reasons.
    pub(crate) cpu: cpu::CpuPool,
    /// GPU services: residency, routing, LRU eviction.
    pub(crate) gpu: gpu::GpuPool,
    /// API quota: providers, their pooled quotas and per-trajectory slices.
    pub(crate) api: api::ApiPool,
}

impl Pools {
    /// A worker reported: every pool takes in what it offers; what they observed.
    pub(crate) fn ingest(&mut self, report: &WorkerReport<'_>, now: Now) -> Vec<Observation> {
        let mut seen = self.gpu.ingest(report, now);
        seen.extend(self.api.ingest(report, now));
        seen.extend(self.cpu.ingest(report, now));
        seen
    }

    /// A cordon was set or lifted on the worker reporting `report`.
    pub(crate) fn accepting(&mut self, report: &WorkerReport<'_>) {
        self.cpu.accepting(report);
        self.gpu.accepting(report);
        self.api.accepting(report);
    }

    /// A worker is gone.
    pub(crate) fn forget_worker(&mut self, worker: &WorkerId) {
        self.cpu.forget_worker(worker);
        self.gpu.forget_worker(worker);
        self.api.forget_worker(worker);
    }

    /// A trajectory's sandbox is gone.
    pub(crate) fn forget_trajectory(&mut self, job: &JobId, trajectory: &TrajectoryId) {
        self.cpu.forget_trajectory(job, trajectory);
        self.gpu.forget_trajectory(job, trajectory);
        self.api.forget_trajectory(job, trajectory);
    }

    /// A launched action settled (or its dispatch failed): its booking goes back to the pool
    /// it names. `Booking::Nothing` gives nothing back.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn release(
        &mut self,
        worker: &WorkerId,
        job: &JobId,
        trajectory: &TrajectoryId,
        booking: &Booking,
        release: &Release,
        now: Now,
    ) {
        match booking {
            Booking::Cpu(b) => {
                let hold = cpu::CpuHold::of_action(b);
                self.cpu
                    .release(worker, job, trajectory, &hold, release, now)
            }
            Booking::Gpu(b) => self.gpu.release(worker, job, trajectory, b, release, now),
            Booking::Api(b) => self.api.release(worker, job, trajectory, b, release, now),
            Booking::Nothing => {}
        }
    }

    /// Every pool writes its part of the status report, from what is held of it.
    pub(crate) fn report(&self, held: &Held<'_>, status: &mut Status) {
        let cpu: Vec<_> = held.cpu.iter().map(|(w, h)| (*w, h)).collect();
        self.cpu.report(&cpu, status);
        self.gpu.report(&held.gpu, status);
        self.api.report(&held.api, status);
    }
}

/// What launched actions (and, of the CPU pool, held sandboxes) hold of each pool, by
/// worker, in the shape each pool's `plan` and `report` take: one walk of the ledger.
#[derive(Debug, Default)]
pub(crate) struct Held<'a> {
    /// Counted cores of launched sandbox actions, and held sandboxes' cores and memory.
    pub(crate) cpu: Vec<(&'a WorkerId, cpu::CpuHold)>,
    /// Reward actions' replica slots.
    pub(crate) gpu: Vec<(&'a WorkerId, &'a gpu::GpuBooking)>,
    /// Api actions' quota.
    pub(crate) api: Vec<(&'a WorkerId, &'a api::ApiBooking)>,
}

impl<'a> Held<'a> {
    /// Sorts each placed action's booking into its pool's list (a sandbox action's counted
    /// cores to the CPU pool's, a reward call's slot to the GPU pool's, an api call's quota to
    /// the API pool's; a booking of nothing counts nowhere), then adds the sandboxes that hold
    /// cores and memory to the CPU pool's.
    pub(crate) fn of(
        placed: impl Iterator<Item = (&'a WorkerId, &'a Booking)>,
        sandboxes: impl Iterator<Item = (&'a WorkerId, cpu::CpuHold)>,
    ) -> Self {
        let mut held = Held::default();
        for (w, b) in placed {
            match b {
                Booking::Cpu(c) => held.cpu.push((w, cpu::CpuHold::of_action(c))),
                Booking::Gpu(g) => held.gpu.push((w, g)),
                Booking::Api(a) => held.api.push((w, a)),
                Booking::Nothing => {}
            }
        }
        held.cpu.extend(sandboxes);
        held
    }
}

/// An action waiting for a pool, as the cycle hands it over (in queue order).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Waiting<'a> {
    pub(crate) id: &'a ActionId,
    pub(crate) job: &'a JobId,
    pub(crate) trajectory: &'a TrajectoryId,
    pub(crate) spec: &'a ActionSpec,
    /// The only worker it may go to (an earlier dispatch there may have been stored).
    pub(crate) pin: Option<&'a WorkerId>,
    /// When it arrived (engine clock).
    pub(crate) arrived_ms: u64,
    /// A sandbox action: what the CPU pool plans it with (its constraint resolved from the
    /// trajectory's sandbox); `None` for every other action.
    pub(crate) cpu: Option<&'a crate::model::Pending>,
}

/// A worker's report, as a pool takes it in.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WorkerReport<'a> {
    /// Its heartbeat.
    pub(crate) hb: &'a Heartbeat,
    /// A new instance (its first report, or a restart): what it reports replaces what the
    /// engine knew of it.
    pub(crate) fresh: bool,
    /// Whether it takes new unpinned work (not draining, not cordoned).
    pub(crate) accepting: bool,
}

/// What a pool is told of the fleet and the engine's setup when it plans.
pub(crate) struct Fleet<'a> {
    /// Whether a worker takes new unpinned work now (alive, not draining, not cordoned).
    pub(crate) accepting: &'a dyn Fn(&WorkerId) -> bool,
    /// Whether an action may be rejected for want of capacity (settled in, no worker that
    /// may come back).
    pub(crate) judges_capacity: bool,
    /// Whether the engine has heard from the fleet long enough to know it.
    pub(crate) settled_in: bool,
    /// How the policy provisions: per-trajectory provisioning slices shared resources.
    pub(crate) provisioning: crate::model::Provisioning,
    /// Jobs' weights for fair shares.
    pub(crate) job_weights: &'a BTreeMap<String, f64>,
    /// Trajectories a per-trajectory slice is cut for.
    pub(crate) trajectories: usize,
    /// Reward calls each capped job may still start now (`max_gpu_calls` less those it has
    /// running); a job not listed is not capped.
    pub(crate) gpu_room: HashMap<JobId, u32>,
}

/// One cycle's plan of a pool.
#[derive(Debug)]
pub(crate) struct Planned<B> {
    /// Actions to launch now, in the order decided: where, holding what.
    pub(crate) launches: Vec<(ActionId, WorkerId, B)>,
    /// Actions that can never be served as they are.
    pub(crate) rejections: Vec<(ActionId, Rejection)>,
    /// When something waiting can go next (a token comes), if the pool knows.
    pub(crate) wake_ms: Option<u64>,
    /// What to count.
    pub(crate) observations: Vec<super::Observation>,
}

impl<B> Default for Planned<B> {
    fn default() -> Self {
        Self {
            launches: Vec::new(),
            rejections: Vec::new(),
            wake_ms: None,
            observations: Vec::new(),
        }
    }
}

/// How a settled action's booking is given back.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Release {
    /// The provider's HTTP status, for the adaptive rate.
    pub(crate) http_status: Option<u16>,
    /// The call timed out (counts as overload).
    pub(crate) timed_out: bool,
    /// The call's latency, ms.
    pub(crate) latency_ms: u64,
    /// The replica counts as idle from then (0: never used by this action).
    pub(crate) gpu_idle_at_ms: u64,
    /// What the call showed of its replica.
    pub(crate) replica: gpu::ReplicaAfter,
    /// The replica was restored for the call, taking this long (ms).
    pub(crate) restored_ms: Option<u64>,
}

/// A shared resource pool. See the module docs.
pub(crate) trait Pool {
    /// What a launched action holds of this pool until it settles.
    type Booking;
    /// What the plan hands a launch: what the worker must be told, from which the engine
    /// records the booking.
    type Ticket;

    /// A worker reported: take in what it says of this pool's resource.
    fn ingest(&mut self, report: &WorkerReport<'_>, now: Now) -> Vec<Observation>;
    /// A worker's acceptance of new work changed (a cordon was set or lifted).
    fn accepting(&mut self, _report: &WorkerReport<'_>) {}
    /// A worker is gone (lost, or replaced by a new instance): what it offered leaves.
    fn forget_worker(&mut self, worker: &WorkerId);
    /// A trajectory's sandbox is gone: anything held for the trajectory goes with it.
    fn forget_trajectory(&mut self, job: &JobId, trajectory: &TrajectoryId);
    /// Plans one cycle: which of `waiting` start now, where, holding what. `held` is what
    /// launched actions hold of this pool, by worker (from the engine's ledger).
    fn plan(
        &mut self,
        waiting: &[Waiting<'_>],
        held: &[(&WorkerId, &Self::Booking)],
        fleet: &Fleet<'_>,
        now: Now,
    ) -> Planned<Self::Ticket>;
    /// A launched action settled (or its dispatch failed): its booking on `worker` comes
    /// back.
    #[allow(clippy::too_many_arguments)]
    fn release(
        &mut self,
        worker: &WorkerId,
        job: &JobId,
        trajectory: &TrajectoryId,
        booking: &Self::Booking,
        release: &Release,
        now: Now,
    );
    /// Its part of the status report.
    fn report(&self, held: &[(&WorkerId, &Self::Booking)], status: &mut Status);
}
