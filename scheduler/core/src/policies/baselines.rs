//! The baselines `tangram` is compared with: fixed degrees of parallelism, per-trajectory and
//! per-task provisioning, Kubernetes-like first fit, equal split.

use super::select::{fixed, fixed_fifo, resolve, select, Candidate, Cores, Decisions, Pick};
use crate::elastic::ElasticModel;
use crate::model::{Pending, Plan, Policy, Provisioning, Snapshot};

/// elastic action gets `dop` cores, clamped to its range.
#[derive(Debug, Clone, Copy)]
pub struct FixedDop {
    name: &'static str,
    dop: u32,
    shortest_first: bool,
}

impl FixedDop {
    /// `fifo-dop-1`.
    pub const FIFO_1: Self = Self::fifo("fifo-dop-1", 1);
    /// `fifo-dop-4`.
    pub const FIFO_4: Self = Self::fifo("fifo-dop-4", 4);
    /// `fifo-dop-16`.
    pub const FIFO_16: Self = Self::fifo("fifo-dop-16", 16);
    /// `sjf`: shortest T1 first, DoP 4.
    pub const SJF: Self = Self {
        name: "sjf",
        dop: 4,
        shortest_first: true,
    };

    const fn fifo(name: &'static str, dop: u32) -> Self {
        Self {
            name,
            dop,
            shortest_first: false,
        }
    }

    /// Its name, as the registry lists it.
    pub const fn name(&self) -> &'static str {
        self.name
    }
}

impl Policy for FixedDop {
    fn boxed(&self) -> Box<dyn Policy> {
        Box::new(*self)
    }
    fn name(&self) -> &'static str {
        self.name
    }

    fn schedule(&self, snapshot: &Snapshot, pending: &[Pending], _now_ms: u64) -> Plan {
        let mut order: Vec<usize> = (0..pending.len()).collect();
        if self.shortest_first {
            let unknown = ElasticModel::unknown().t1_ms;
            let t1: Vec<f64> = pending
                .iter()
                .map(|p| p.model.as_ref().map_or(unknown, |m| m.t1_ms))
                .collect();
            order.sort_by(|&a, &b| t1[a].total_cmp(&t1[b]).then(a.cmp(&b)));
        }
        fixed(
            snapshot,
            pending,
            &order,
            Pick::MostFree,
            Cores::Dop(self.dop),
        )
    }
}

/// Per-trajectory provisioning, the paper's Kubernetes baseline: each trajectory holds a
/// sandbox with `cores` cores for its whole life, and its actions run on them. Scheduled here
/// are the sandboxes (opens carry the cores); execs run at once on their trajectory's cores.
#[derive(Debug, Clone, Copy)]
pub struct Static {
    /// Cores per trajectory sandbox.
    pub cores: u32,
}

impl Static {
    /// Its name in the scheduler's config and the simulator.
    pub const NAME: &'static str = "static";
}

impl Policy for Static {
    fn boxed(&self) -> Box<dyn Policy> {
        Box::new(*self)
    }
    fn name(&self) -> &'static str {
        Self::NAME
    }
    fn schedule(&self, snapshot: &Snapshot, pending: &[Pending], _now_ms: u64) -> Plan {
        fixed_fifo(snapshot, pending, Pick::MostFree, Cores::Min)
    }
    fn provisioning(&self) -> Provisioning {
        Provisioning::PerTrajectory { cores: self.cores }
    }
}

/// Kubernetes-like: a fixed request (the action's maximum), filter workers that have it free,
/// score by least allocated.
#[derive(Debug, Clone, Copy)]
pub struct KubeFirstFit;

impl KubeFirstFit {
    /// Its name in the scheduler's config and the simulator.
    pub const NAME: &'static str = "first-fit";
}

impl Policy for KubeFirstFit {
    fn boxed(&self) -> Box<dyn Policy> {
        Box::new(*self)
    }
    fn name(&self) -> &'static str {
        Self::NAME
    }
    fn schedule(&self, snapshot: &Snapshot, pending: &[Pending], _now_ms: u64) -> Plan {
        fixed_fifo(snapshot, pending, Pick::MostFree, Cores::Max)
    }
}

/// FCFS candidates on minimum demand; each worker's free cores split equally among its
/// candidates (within their ranges; what one cannot use goes to the others).
#[derive(Debug, Clone, Copy)]
pub struct EqualSplit;

impl EqualSplit {
    /// Its name in the scheduler's config and the simulator.
    pub const NAME: &'static str = "equal-split";
}

impl Policy for EqualSplit {
    fn boxed(&self) -> Box<dyn Policy> {
        Box::new(*self)
    }
    fn name(&self) -> &'static str {
        Self::NAME
    }
    fn schedule(&self, snapshot: &Snapshot, pending: &[Pending], _now_ms: u64) -> Plan {
        let mut d = Decisions::default();
        let order: Vec<usize> = (0..pending.len()).collect();
        let where_ = resolve(snapshot, pending);
        let cands = select(
            snapshot,
            pending,
            &where_,
            &order,
            Pick::MostFree,
            Cores::Min,
            &mut d,
        );
        for w in 0..snapshot.workers().len() {
            let group: Vec<&Candidate<'_>> = cands
                .iter()
                .filter(|c| c.worker == w && c.pending.demand.cores.is_some())
                .collect();
            let mut alloc: Vec<u32> = group
                .iter()
                .map(|c| c.pending.demand.cores.unwrap_or_default().min)
                .collect();
            let mut spare = snapshot.workers()[w]
                .free_cores
                .saturating_sub(alloc.iter().sum());
            // Water-filling: each spare core goes to the candidate holding fewest (ties: the
            // earliest), among those below their maximum.
            while spare > 0 {
                let next = (0..group.len())
                    .filter(|&i| alloc[i] < group[i].pending.demand.cores.unwrap_or_default().max)
                    .min_by_key(|&i| (alloc[i], i));
                let Some(i) = next else { break };
                alloc[i] += 1;
                spare -= 1;
            }
            for (i, c) in group.iter().enumerate() {
                d.launch(c, alloc[i]);
            }
        }
        for c in cands.iter().filter(|c| c.pending.demand.cores.is_none()) {
            d.launch(c, 0);
        }
        d.into_plan(snapshot, pending)
    }
}

/// Per-task provisioning: each job gets an isolated share of the nodes (the simulator confines
/// its trajectories there; a service deployment would run one fleet per job), FIFO with a fixed
/// degree of parallelism inside it.
#[derive(Debug, Clone, Copy)]
pub struct PerTask {
    /// Cores per action, clamped to its range.
    pub dop: u32,
}

impl PerTask {
    /// Its name in the scheduler's config and the simulator.
    pub const NAME: &'static str = "per-task";
}

impl Policy for PerTask {
    fn boxed(&self) -> Box<dyn Policy> {
        Box::new(*self)
    }
    fn name(&self) -> &'static str {
        Self::NAME
    }
    /// Inside a job's pool it is FIFO with a fixed DoP; the isolation is in where the
    /// job's sandboxes live.
    fn schedule(&self, snapshot: &Snapshot, pending: &[Pending], now_ms: u64) -> Plan {
        FixedDop {
            name: Self::NAME,
            dop: self.dop,
            shortest_first: false,
        }
        .schedule(snapshot, pending, now_ms)
    }
    fn provisioning(&self) -> Provisioning {
        Provisioning::PerTask
    }
}
