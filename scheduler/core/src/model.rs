//! The core's vocabulary: snapshots in, plans out.

use crate::elastic::ElasticModel;
use std::collections::BTreeMap;
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
}

/// The cluster at the start of a cycle. Workers are kept sorted by id so that plans never
/// depend on map iteration order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    workers: Vec<WorkerView>,
    /// Named concurrency-type resources beyond cores and memory (GPUs, connections, a
    /// custom resource a worker advertises), per worker: `(total, free)` units.
    resources: BTreeMap<WorkerId, BTreeMap<String, (u64, u64)>>,
    /// Rate-type resources (requests per second of an API), shared by the whole cluster.
    rates: BTreeMap<String, TokenBucket>,
}

/// A token bucket: `rate_per_s` tokens a second, at most `burst` saved up. One action that
/// names it takes one token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenBucket {
    /// Refill rate, tokens per second.
    pub rate_per_s: f64,
    /// Most tokens held.
    pub burst: f64,
    /// Tokens held at `at_ms`.
    pub tokens: f64,
    /// When `tokens` was measured, on the caller's clock (the `now_ms` given to policies).
    pub at_ms: u64,
}

impl TokenBucket {
    /// Tokens available at `now_ms`.
    pub fn available(&self, now_ms: u64) -> f64 {
        let dt = now_ms.saturating_sub(self.at_ms) as f64 / 1e3;
        (self.tokens + dt * self.rate_per_s).min(self.burst)
    }

    /// Milliseconds from `now_ms` until `n` tokens are available (`None`: never, the bucket
    /// neither holds nor refills that many).
    pub fn ready_in_ms(&self, n: f64, now_ms: u64) -> Option<u64> {
        let have = self.available(now_ms);
        if have >= n {
            Some(0)
        } else if self.rate_per_s > 0.0 && n <= self.burst {
            Some(((n - have) / self.rate_per_s * 1e3).ceil() as u64)
        } else {
            None
        }
    }
}

impl Eq for TokenBucket {}

impl Snapshot {
    /// Builds a snapshot; sorts the workers by id.
    pub fn new(mut workers: Vec<WorkerView>) -> Self {
        workers.sort_by(|a, b| a.id.cmp(&b.id));
        Self {
            workers,
            resources: BTreeMap::new(),
            rates: BTreeMap::new(),
        }
    }

    /// Declares a concurrency-type resource on a worker: `total` units, `free` of them free.
    pub fn with_resource(mut self, worker: &WorkerId, name: &str, total: u64, free: u64) -> Self {
        self.resources
            .entry(worker.clone())
            .or_default()
            .insert(name.to_string(), (total, free.min(total)));
        self
    }

    /// Declares a rate-type resource.
    pub fn with_rate(mut self, name: &str, bucket: TokenBucket) -> Self {
        self.rates.insert(name.to_string(), bucket);
        self
    }

    /// `(total, free)` units of `name` on `worker`.
    pub fn resource(&self, worker: &WorkerId, name: &str) -> Option<(u64, u64)> {
        self.resources.get(worker)?.get(name).copied()
    }

    /// A rate-type resource.
    pub fn rate(&self, name: &str) -> Option<&TokenBucket> {
        self.rates.get(name)
    }

    /// Books `needs` against worker `w` (by index) and the rate buckets, as of `now_ms`.
    pub(crate) fn take_needs(&mut self, w: usize, needs: &Needs, now_ms: u64) {
        if needs.is_empty() {
            return;
        }
        let id = self.workers[w].id.clone();
        for (name, &units) in &needs.units {
            if let Some(r) = self.resources.get_mut(&id).and_then(|m| m.get_mut(name)) {
                r.1 = r.1.saturating_sub(units);
            }
        }
        for name in &needs.rates {
            if let Some(b) = self.rates.get_mut(name) {
                // Settle the refill up to now first: a token taken now cannot be paid back by
                // refill that the burst cap would have thrown away.
                b.tokens = b.available(now_ms) - 1.0;
                b.at_ms = b.at_ms.max(now_ms);
            }
        }
    }
    /// The workers, sorted by id.
    pub fn workers(&self) -> &[WorkerView] {
        &self.workers
    }
    /// The workers, mutable (the order, by id, must not change).
    pub(crate) fn workers_mut(&mut self) -> &mut [WorkerView] {
        &mut self.workers
    }

    /// The snapshot after `launches` took their grants at `now_ms`; `pending` supplies the
    /// named resources and rate tokens each launched action takes (granted exactly as
    /// declared).
    pub fn after(&self, launches: &[Launch], pending: &[Pending], now_ms: u64) -> Snapshot {
        let mut next = self.clone();
        for l in launches {
            if let Ok(i) = next.workers.binary_search_by(|w| w.id.cmp(&l.worker)) {
                let w = &mut next.workers[i];
                w.free_cores = w.free_cores.saturating_sub(l.grant.cores);
                w.free_mem_mb = w.free_mem_mb.saturating_sub(l.grant.mem_mb);
            }
            let Some(p) = pending.iter().find(|p| p.id == l.id) else {
                continue;
            };
            if let Ok(w) = next.workers.binary_search_by(|w| w.id.cmp(&l.worker)) {
                next.take_needs(w, &p.needs, now_ms);
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
    /// Named resources beyond cores and memory.
    pub needs: Needs,
}

/// What an action needs beyond cores and memory: units of named concurrency-type resources
/// on its worker (held while it runs), and one token from each named rate-type resource.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Needs {
    /// Units per concurrency-type resource.
    pub units: BTreeMap<String, u64>,
    /// Rate-type resources it takes a token from.
    pub rates: Vec<String>,
}

impl Needs {
    /// True when it needs nothing beyond cores and memory.
    pub fn is_empty(&self) -> bool {
        self.units.is_empty() && self.rates.is_empty()
    }
}

impl Pending {
    /// A pending action with no elasticity model and no other needs.
    pub fn new(id: ActionId, demand: Demand, constraint: Constraint) -> Self {
        Self {
            id,
            demand,
            constraint,
            model: None,
            needs: Needs::default(),
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
        /// Most free cores on an allowed worker.
        best_free: u32,
    },
    /// Not enough free memory on any allowed worker.
    Memory {
        /// MiB needed.
        need_mb: u64,
        /// Most free MiB on an allowed worker.
        best_free_mb: u64,
    },
    /// The allowed worker is draining or not known to be alive.
    NotAccepting(WorkerId),
    /// Not enough free units of a named resource on any allowed worker.
    Resource {
        /// The resource.
        name: String,
        /// Units needed.
        need: u64,
        /// Most free on an allowed worker.
        best_free: u64,
    },
    /// A rate-type resource has no token now.
    Rate {
        /// The resource.
        name: String,
        /// Until a token is there.
        ready_in_ms: u64,
    },
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
    /// No allowed worker has this named resource in the amount needed, or the rate-type
    /// resource does not exist or could never hold a token.
    NoSuchResource(String),
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
            Unplaced::MayFitLater(WaitReason::Resource { name, need, best_free }) => {
                write!(f, "needs {need} {name}; the best allowed worker has {best_free} free")
            }
            Unplaced::MayFitLater(WaitReason::Rate { name, ready_in_ms }) => {
                write!(f, "{name} is at its rate limit; next token in {ready_in_ms} ms")
            }
            Unplaced::NeverFits(NeverReason::NoSuchResource(name)) => {
                write!(f, "needs {name}, which no allowed worker or rate limit in the cluster can provide")
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

/// A scheduling policy. Pure: the same arguments always give the same plan.
pub trait Policy: Send + Sync + fmt::Debug {
    /// The policy's name, as selected in config and the simulator.
    fn name(&self) -> &'static str;
    /// Plans one cycle.
    fn schedule(&self, snapshot: &Snapshot, pending: &[Pending], now_ms: u64) -> Plan;
    /// Cores each trajectory holds for its whole life, for per-trajectory provisioning
    /// baselines (`static`); `None` for action-level policies.
    fn per_trajectory_cores(&self) -> Option<u32> {
        None
    }
    /// True for per-task provisioning: each job's trajectories are confined to the job's own
    /// share of the nodes.
    fn per_task_pools(&self) -> bool {
        false
    }
    /// A boxed copy (the engine owns its policy; callers may hold theirs by reference).
    fn boxed(&self) -> Box<dyn Policy>;
}
