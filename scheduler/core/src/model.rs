//! The core's vocabulary: snapshots in, plans out.

use crate::elastic::ElasticModel;
use std::fmt;
use tangram_shared::{ActionId, Demand, Grant, WorkerId};

/// What the scheduler knows about one worker at the start of a cycle.
///
/// `free_*` already subtracts running actions and dispatched-but-unconfirmed ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerView {
    /// The worker.
    pub id: WorkerId,
    /// Cores it can grant in all.
    pub total_cores: u32,
    /// Cores free now.
    pub free_cores: u32,
    /// Memory it can reserve in all, in MiB.
    pub total_mem_mb: u64,
    /// Memory free now, in MiB.
    pub free_mem_mb: u64,
    /// False when draining or not known to be alive: no new work goes there.
    pub accepting: bool,
    /// Cordoned by an operator: only work pinned to it (commands in its open sandboxes)
    /// goes there.
    pub cordoned: bool,
    /// Sandboxes it holds or is opening: the load image-aware placement weighs against a
    /// pull.
    pub sandboxes: u32,
}

impl WorkerView {
    /// Whether it takes an action with this constraint now.
    pub fn takes(&self, c: &Constraint) -> bool {
        self.accepting && (!self.cordoned || matches!(c, Constraint::OnWorker(_)))
    }
}

/// The cluster at the start of a cycle: cores and memory per worker. GPUs and API quota are
/// not here; the engine books them in `Eoe` and `Quota` (see the crate README). Workers are
/// kept sorted by id so that plans never depend on map iteration order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    workers: Vec<WorkerView>,
}

impl Snapshot {
    /// Builds a snapshot; sorts the workers by id.
    pub fn new(mut workers: Vec<WorkerView>) -> Self {
        workers.sort_by(|a, b| a.id.cmp(&b.id));
        Self { workers }
    }

    /// The workers, sorted by id.
    pub fn workers(&self) -> &[WorkerView] {
        &self.workers
    }
    /// The workers, mutable (the order, by id, must not change).
    pub(crate) fn workers_mut(&mut self) -> &mut [WorkerView] {
        &mut self.workers
    }

    /// The snapshot after `launches` took their grants.
    pub fn after(&self, launches: &[Launch]) -> Snapshot {
        let mut next = self.clone();
        for l in launches {
            if let Ok(i) = next.workers.binary_search_by(|w| w.id.cmp(&l.worker)) {
                let w = &mut next.workers[i];
                w.free_cores = w.free_cores.saturating_sub(l.grant.cores);
                w.free_mem_mb = w.free_mem_mb.saturating_sub(l.grant.mem_mb);
            }
        }
        next
    }

    /// One worker.
    pub fn worker(&self, id: &WorkerId) -> Option<&WorkerView> {
        self.workers
            .binary_search_by(|w| w.id.cmp(id))
            .ok()
            .map(|i| &self.workers[i])
    }
}

/// Where an action may run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Constraint {
    /// Any worker.
    Any,
    /// Only this worker (it holds the trajectory's sandbox).
    OnWorker(WorkerId),
}

/// One queued action, in arrival order.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    /// The action.
    pub id: ActionId,
    /// What it needs.
    pub demand: Demand,
    /// Where it may run.
    pub constraint: Constraint,
    /// How its duration depends on its cores; `None` when unknown (policies then assume
    /// [`ElasticModel::unknown`]).
    pub model: Option<ElasticModel>,
    /// A sandbox open's image, for image-aware placement; `None` for every other action, for
    /// the worker's default image, and when placement ignores images.
    pub image: Option<ImageNeed>,
}

/// What image-aware placement knows of a sandbox open's image. Among the workers with room,
/// the open goes to the one with the least expected cost: the pull (none where the image is
/// held or already being fetched, including by an open placed earlier in the same cycle)
/// plus the load, `load_ms` for each sandbox per core the worker would then hold. When no
/// worker with room holds the image, placement is the policy's usual one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageNeed {
    /// The image, canonical (`registry/repository:tag`): opens naming one image in two
    /// spellings share its holders.
    pub key: String,
    /// Workers holding it or fetching it, sorted by id.
    pub holders: Vec<WorkerId>,
    /// Expected pull on a worker without it, ms.
    pub pull_ms: u64,
    /// The delay one more sandbox per core is expected to cost the trajectory, ms.
    pub load_ms: u64,
}

impl ImageNeed {
    /// Expected cost of opening on a worker: its pull (0 when `held`) plus its load with
    /// this sandbox, ms.
    pub fn cost_ms(&self, held: bool, sandboxes: u32, cores: u32) -> u64 {
        let pull = if held { 0 } else { self.pull_ms };
        let load = self.load_ms.saturating_mul(sandboxes as u64 + 1) / cores.max(1) as u64;
        pull.saturating_add(load)
    }
}

impl Pending {
    /// A pending action with no elasticity model.
    pub fn new(id: ActionId, demand: Demand, constraint: Constraint) -> Self {
        Self {
            id,
            demand,
            constraint,
            model: None,
            image: None,
        }
    }
}

/// A decision to run an action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// The action.
    pub id: ActionId,
    /// The worker.
    pub worker: WorkerId,
    /// What it gets.
    pub grant: Grant,
}

/// Why an action can not run yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitReason {
    /// No worker has registered.
    NoWorkers,
    /// Not enough free cores on any allowed worker.
    Cores {
        /// Cores needed at least.
        need: u32,
        /// Most free cores on an allowed worker taking new work.
        best_free: u32,
    },
    /// Not enough free memory on any allowed worker.
    Memory {
        /// MiB needed.
        need_mb: u64,
        /// Most free MiB on an allowed worker taking new work.
        best_free_mb: u64,
    },
    /// The allowed worker is draining or not known to be alive.
    NotAccepting(WorkerId),
}

/// Why an action can never run as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NeverReason {
    /// Its demand exceeds every worker's whole capacity.
    ExceedsEveryWorker {
        /// Cores needed at least.
        cores: u32,
        /// MiB needed.
        mem_mb: u64,
    },
    /// It must run on a worker that is not in the cluster.
    WorkerGone(WorkerId),
}

/// The structured reason an action was not launched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unplaced {
    /// Blocked until capacity changes; keep it queued, do not retry hot.
    MayFitLater(WaitReason),
    /// Fail fast with this reason.
    NeverFits(NeverReason),
}

impl fmt::Display for Unplaced {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unplaced::MayFitLater(WaitReason::NoWorkers) => write!(f, "no worker has registered"),
            Unplaced::MayFitLater(WaitReason::Cores { need, best_free }) => {
                write!(f, "needs {need} free cores; the best allowed worker has {best_free}")
            }
            Unplaced::MayFitLater(WaitReason::Memory { need_mb, best_free_mb }) => write!(
                f,
                "needs {need_mb} MiB free memory; the best allowed worker has {best_free_mb} MiB"
            ),
            Unplaced::MayFitLater(WaitReason::NotAccepting(w)) => {
                write!(f, "worker {w} takes no new work now")
            }
            Unplaced::NeverFits(NeverReason::ExceedsEveryWorker { cores, mem_mb }) => write!(
                f,
                "needs at least {cores} cores and {mem_mb} MiB; no worker in the fleet has that much"
            ),
            Unplaced::NeverFits(NeverReason::WorkerGone(w)) => {
                write!(f, "must run on worker {w}, which is no longer in the cluster")
            }
        }
    }
}

/// The outcome of one scheduling cycle: every pending action is either launched once or
/// explained once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Actions to start now, in queue order.
    pub launches: Vec<Launch>,
    /// Actions not started, with the reason, in queue order.
    pub unplaced: Vec<(ActionId, Unplaced)>,
}

/// How a policy provisions cores, the one thing besides its plan that the engine asks of it.
/// The action-level modes share one pool; the baselines reserve or partition it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provisioning {
    /// Each action holds cores only while it runs, sized once at launch (`tangram` and the
    /// action-level baselines).
    PerAction,
    /// As [`Provisioning::PerAction`], and running elastic execs are re-sized after every
    /// cycle (`engine/resize.rs`) while GPU replicas follow demand between services
    /// (`Eoe::rebalance`): `tangram-v2`.
    Malleable,
    /// Each trajectory's sandbox holds `cores` cores for its whole life and its execs run on
    /// them; GPU services are pinned to an even split and API rates are sliced per
    /// trajectory (`static`, the paper's Kubernetes baseline).
    PerTrajectory {
        /// Cores per trajectory sandbox.
        cores: u32,
    },
    /// Each job's sandboxes are confined to the job's own share of the workers (`per-task`).
    PerTask,
}

impl Provisioning {
    /// The cores a trajectory's sandbox holds for its life, under per-trajectory provisioning.
    pub fn trajectory_cores(self) -> Option<u32> {
        match self {
            Provisioning::PerTrajectory { cores } => Some(cores),
            _ => None,
        }
    }

    /// Whether running elastic execs are re-sized and GPU replicas follow demand.
    pub fn malleable(self) -> bool {
        self == Provisioning::Malleable
    }
}

/// A scheduling policy. Pure: the same arguments always give the same plan.
pub trait Policy: Send + Sync + fmt::Debug {
    /// The policy's name, as selected in config and the simulator.
    fn name(&self) -> &'static str;
    /// Plans one cycle.
    fn schedule(&self, snapshot: &Snapshot, pending: &[Pending], now_ms: u64) -> Plan;
    /// How this policy provisions cores: what the engine does around its launch plan.
    fn provisioning(&self) -> Provisioning {
        Provisioning::PerAction
    }
    /// A boxed copy (the engine owns its policy; callers may hold theirs by reference).
    fn boxed(&self) -> Box<dyn Policy>;
}
