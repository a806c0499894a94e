//! The reference policy (`tangram`, after ARL-Tangram) and the baselines it is compared with,
//! all behind [`Policy`], all selectable by name.

use crate::elastic::{self, Claim, ElasticModel};
use crate::fcfs::FcfsFirstFit;
use crate::model::{
    Constraint, Launch, NeverReason, Pending, Plan, Policy, Snapshot, Unplaced, WaitReason,
};
use tangram_shared::Grant;

/// Every policy name, in the order the simulator lists them.
pub const NAMES: [&str; 9] = [
    "tangram",
    "static",
    "fifo-dop-1",
    "fifo-dop-4",
    "fifo-dop-16",
    "first-fit",
    "sjf",
    "equal-split",
    "fcfs-first-fit",
];

/// The policy called `name`.
pub fn by_name(name: &str) -> Option<Box<dyn Policy>> {
    Some(match name {
        "tangram" => Box::new(Tangram::default()),
        "static" => Box::new(Static { cores: 4 }),
        "fifo-dop-1" => Box::new(FixedDop {
            name: "fifo-dop-1",
            dop: 1,
            shortest_first: false,
        }),
        "fifo-dop-4" => Box::new(FixedDop {
            name: "fifo-dop-4",
            dop: 4,
            shortest_first: false,
        }),
        "fifo-dop-16" => Box::new(FixedDop {
            name: "fifo-dop-16",
            dop: 16,
            shortest_first: false,
        }),
        "sjf" => Box::new(FixedDop {
            name: "sjf",
            dop: 4,
            shortest_first: true,
        }),
        "first-fit" => Box::new(KubeFirstFit),
        "equal-split" => Box::new(EqualSplit),
        "fcfs-first-fit" => Box::new(FcfsFirstFit),
        _ => return None,
    })
}

/// A candidate chosen by FCFS selection: the action, its worker, what it reserves.
struct Candidate<'a> {
    pending: &'a Pending,
    worker: usize,
}

/// FCFS candidate selection shared by the action-level policies: scan in `order`; an action
/// is a candidate when its base demand (minimum cores, memory) fits in what the candidates
/// before it left free on an allowed worker. Everything else is explained in `plan`.
/// `cores_of` decides the cores an action reserves at selection (its minimum, or a fixed DoP).
fn select<'a>(
    snapshot: &Snapshot,
    pending: &'a [Pending],
    order: &[usize],
    cores_of: impl Fn(&Pending) -> u32,
    plan: &mut Plan,
) -> (Vec<Candidate<'a>>, Vec<(u32, u64)>) {
    let workers = snapshot.workers();
    let mut free: Vec<(u32, u64)> = workers
        .iter()
        .map(|w| (w.free_cores, w.free_mem_mb))
        .collect();
    let mut out = Vec::new();
    for &i in order {
        let p = &pending[i];
        let need_cores = cores_of(p);
        let need_mem = p.demand.mem_mb;
        let allowed: Vec<usize> = match &p.constraint {
            Constraint::Any => (0..workers.len()).collect(),
            Constraint::OnWorker(id) => match workers.binary_search_by(|w| w.id.cmp(id)) {
                Ok(i) => vec![i],
                Err(_) => {
                    plan.unplaced.push((
                        p.id.clone(),
                        Unplaced::NeverFits(NeverReason::WorkerGone(id.clone())),
                    ));
                    continue;
                }
            },
        };
        if allowed.is_empty() {
            plan.unplaced
                .push((p.id.clone(), Unplaced::MayFitLater(WaitReason::NoWorkers)));
            continue;
        }
        if !allowed
            .iter()
            .any(|&w| workers[w].total_cores >= need_cores && workers[w].total_mem_mb >= need_mem)
        {
            let why = NeverReason::ExceedsEveryWorker {
                cores: need_cores,
                mem_mb: need_mem,
            };
            plan.unplaced.push((p.id.clone(), Unplaced::NeverFits(why)));
            continue;
        }
        // Among allowed workers, the one with the most free cores (spreads elastic work).
        let fit = allowed
            .iter()
            .copied()
            .filter(|&w| workers[w].accepting && free[w].0 >= need_cores && free[w].1 >= need_mem)
            .max_by(|&a, &b| free[a].0.cmp(&free[b].0).then(b.cmp(&a)));
        match fit {
            Some(w) => {
                free[w].0 -= need_cores;
                free[w].1 -= need_mem;
                out.push(Candidate {
                    pending: p,
                    worker: w,
                });
            }
            None => {
                let best = allowed
                    .iter()
                    .filter(|&&w| workers[w].accepting)
                    .map(|&w| free[w].0)
                    .max();
                let why = match best {
                    None => match &p.constraint {
                        Constraint::OnWorker(id) => WaitReason::NotAccepting(id.clone()),
                        Constraint::Any => WaitReason::NoWorkers,
                    },
                    Some(best_free) if best_free < need_cores => WaitReason::Cores {
                        need: need_cores,
                        best_free,
                    },
                    Some(_) => WaitReason::Memory {
                        need_mb: need_mem,
                        best_free_mb: allowed.iter().map(|&w| free[w].1).max().unwrap_or(0),
                    },
                };
                plan.unplaced
                    .push((p.id.clone(), Unplaced::MayFitLater(why)));
            }
        }
    }
    (out, free)
}

fn launch(plan: &mut Plan, snapshot: &Snapshot, c: &Candidate<'_>, cores: u32) {
    plan.launches.push(Launch {
        id: c.pending.id.clone(),
        worker: snapshot.workers()[c.worker].id.clone(),
        grant: Grant {
            cores,
            mem_mb: c.pending.demand.mem_mb,
        },
    });
}

/// Restores queue order in a plan whose parts were produced per worker.
fn in_queue_order(mut plan: Plan, pending: &[Pending]) -> Plan {
    let pos: std::collections::HashMap<&tangram_shared::ActionId, usize> = pending
        .iter()
        .enumerate()
        .map(|(i, p)| (&p.id, i))
        .collect();
    plan.launches
        .sort_by_key(|l| pos.get(&l.id).copied().unwrap_or(usize::MAX));
    plan.unplaced
        .sort_by_key(|(id, _)| pos.get(id).copied().unwrap_or(usize::MAX));
    plan
}

fn model_of(p: &Pending) -> ElasticModel {
    p.model.clone().unwrap_or_else(ElasticModel::unknown)
}

/// The paper's policy: FCFS candidate selection on minimum demand; per worker, the free
/// cores are shared among that worker's elastic candidates to minimise the sum of their
/// durations (greedy for convex models, DP otherwise); then greedy tail eviction: the latest
/// candidate is held back when the estimated total completion time improves without it. At
/// most `depth` evictions per worker and cycle. Held-back actions keep their queue position.
#[derive(Debug, Clone, Copy)]
pub struct Tangram {
    /// Most tail evictions tried per worker and cycle.
    pub depth: usize,
}

impl Default for Tangram {
    fn default() -> Self {
        Self { depth: 8 }
    }
}

impl Policy for Tangram {
    fn name(&self) -> &'static str {
        "tangram"
    }

    /// Runs passes until one launches nothing: units a pass leaves idle after its evictions
    /// go to actions further back in the queue, so a plan is complete (re-planning on the
    /// post-plan snapshot launches nothing new).
    fn schedule(&self, snapshot: &Snapshot, pending: &[Pending], now_ms: u64) -> Plan {
        let mut plan = Plan::default();
        let mut snap = snapshot.clone();
        let mut queue: Vec<Pending> = pending.to_vec();
        for _ in 0..=pending.len() {
            let pass = self.pass(&snap, &queue, now_ms);
            if pass.launches.is_empty() {
                plan.unplaced.extend(pass.unplaced);
                break;
            }
            snap = snap.after(&pass.launches);
            let waiting: std::collections::HashSet<&tangram_shared::ActionId> = pass
                .unplaced
                .iter()
                .filter(|(_, u)| matches!(u, Unplaced::MayFitLater(_)))
                .map(|(id, _)| id)
                .collect();
            plan.unplaced.extend(
                pass.unplaced
                    .iter()
                    .filter(|(_, u)| matches!(u, Unplaced::NeverFits(_)))
                    .cloned(),
            );
            queue.retain(|p| waiting.contains(&p.id));
            plan.launches.extend(pass.launches);
        }
        in_queue_order(plan, pending)
    }
}

impl Tangram {
    fn pass(&self, snapshot: &Snapshot, pending: &[Pending], _now_ms: u64) -> Plan {
        let mut plan = Plan::default();
        let order: Vec<usize> = (0..pending.len()).collect();
        let (cands, _) = select(
            snapshot,
            pending,
            &order,
            |p| p.demand.cores.map_or(0, |c| c.min),
            &mut plan,
        );
        let nworkers = snapshot.workers().len();
        let mut per_worker: Vec<Vec<&Candidate<'_>>> = vec![Vec::new(); nworkers];
        for c in &cands {
            if c.pending.demand.cores.is_some() {
                per_worker[c.worker].push(c);
            } else {
                launch(&mut plan, snapshot, c, 0);
            }
        }
        for (w, group) in per_worker.iter().enumerate() {
            if group.is_empty() {
                continue;
            }
            // Units: the worker's free cores minus what non-elastic candidates took (none
            // take cores today) — the full free count.
            let units = snapshot.workers()[w].free_cores;
            let models: Vec<ElasticModel> = group.iter().map(|c| model_of(c.pending)).collect();
            let claims: Vec<Claim<'_>> = group
                .iter()
                .zip(&models)
                .map(|(c, m)| {
                    let r = c.pending.demand.cores.unwrap_or_default();
                    Claim {
                        min: r.min,
                        max: r.max.min(units.max(r.min)),
                        model: m,
                    }
                })
                .collect();
            let mut n = claims.len();
            let mut alloc = elastic::allocate(&claims[..n], units)
                .unwrap_or_else(|| claims.iter().map(|c| c.min).collect());
            let mut evictions = 0;
            while n > 1 && evictions < self.depth {
                let last = &claims[n - 1];
                let Some(without) = elastic::allocate(&claims[..n - 1], units) else {
                    break;
                };
                let used: u32 = without.iter().sum();
                if units - used >= last.min {
                    break; // it would run beside the others anyway: nothing to gain
                }
                let with_total = elastic::total_ms(&claims[..n], &alloc);
                // Estimate for the held-back action: it starts when the first of the others
                // finishes, with the units that frees (plus any left over).
                let (first_ms, first_units) = claims[..n - 1]
                    .iter()
                    .zip(&without)
                    .map(|(c, &x)| (c.model.dur_ms(x), x))
                    .min_by(|a, b| a.0.total_cmp(&b.0))
                    .unwrap_or((0.0, 0));
                let later = (first_units + units - used).clamp(last.min, last.max);
                let without_total = elastic::total_ms(&claims[..n - 1], &without)
                    + first_ms
                    + last.model.dur_ms(later);
                if without_total < with_total {
                    n -= 1;
                    alloc = without;
                    evictions += 1;
                } else {
                    break;
                }
            }
            for (i, c) in group.iter().enumerate() {
                if i < n {
                    launch(&mut plan, snapshot, c, alloc[i]);
                } else {
                    let r = c.pending.demand.cores.unwrap_or_default();
                    let used: u32 = alloc.iter().sum();
                    let why = WaitReason::Cores {
                        need: r.min,
                        best_free: units - used,
                    };
                    plan.unplaced
                        .push((c.pending.id.clone(), Unplaced::MayFitLater(why)));
                }
            }
        }
        in_queue_order(plan, pending)
    }
}

/// Shared action-level FIFO (or shortest-first) with a fixed degree of parallelism: every
/// elastic action gets `dop` cores, clamped to its range.
#[derive(Debug, Clone, Copy)]
pub struct FixedDop {
    name: &'static str,
    dop: u32,
    shortest_first: bool,
}

impl Policy for FixedDop {
    fn name(&self) -> &'static str {
        self.name
    }

    fn schedule(&self, snapshot: &Snapshot, pending: &[Pending], _now_ms: u64) -> Plan {
        let mut plan = Plan::default();
        let mut order: Vec<usize> = (0..pending.len()).collect();
        if self.shortest_first {
            order.sort_by(|&a, &b| {
                model_of(&pending[a])
                    .t1_ms
                    .total_cmp(&model_of(&pending[b]).t1_ms)
                    .then(a.cmp(&b))
            });
        }
        let dop = self.dop;
        let cores_of = move |p: &Pending| p.demand.cores.map_or(0, |r| dop.clamp(r.min, r.max));
        let (cands, _) = select(snapshot, pending, &order, cores_of, &mut plan);
        for c in &cands {
            launch(&mut plan, snapshot, c, cores_of(c.pending));
        }
        in_queue_order(plan, pending)
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

impl Policy for Static {
    fn name(&self) -> &'static str {
        "static"
    }
    fn schedule(&self, snapshot: &Snapshot, pending: &[Pending], _now_ms: u64) -> Plan {
        let mut plan = Plan::default();
        let order: Vec<usize> = (0..pending.len()).collect();
        let cores_of = |p: &Pending| p.demand.cores.map_or(0, |r| r.min);
        let (cands, _) = select(snapshot, pending, &order, cores_of, &mut plan);
        for c in &cands {
            launch(&mut plan, snapshot, c, cores_of(c.pending));
        }
        plan
    }
    fn per_trajectory_cores(&self) -> Option<u32> {
        Some(self.cores)
    }
}

/// Kubernetes-like: a fixed request (the action's maximum), filter workers that have it free,
/// score by least allocated.
#[derive(Debug, Clone, Copy)]
pub struct KubeFirstFit;

impl Policy for KubeFirstFit {
    fn name(&self) -> &'static str {
        "first-fit"
    }
    fn schedule(&self, snapshot: &Snapshot, pending: &[Pending], _now_ms: u64) -> Plan {
        let mut plan = Plan::default();
        let order: Vec<usize> = (0..pending.len()).collect();
        let cores_of = |p: &Pending| p.demand.cores.map_or(0, |r| r.max);
        let (cands, _) = select(snapshot, pending, &order, cores_of, &mut plan);
        for c in &cands {
            launch(&mut plan, snapshot, c, cores_of(c.pending));
        }
        plan
    }
}

/// FCFS candidates on minimum demand; each worker's free cores split equally among its
/// candidates (within their ranges; what one cannot use goes to the others).
#[derive(Debug, Clone, Copy)]
pub struct EqualSplit;

impl Policy for EqualSplit {
    fn name(&self) -> &'static str {
        "equal-split"
    }
    fn schedule(&self, snapshot: &Snapshot, pending: &[Pending], _now_ms: u64) -> Plan {
        let mut plan = Plan::default();
        let order: Vec<usize> = (0..pending.len()).collect();
        let (cands, _) = select(
            snapshot,
            pending,
            &order,
            |p| p.demand.cores.map_or(0, |c| c.min),
            &mut plan,
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
                launch(&mut plan, snapshot, c, alloc[i]);
            }
        }
        for c in cands.iter().filter(|c| c.pending.demand.cores.is_none()) {
            launch(&mut plan, snapshot, c, 0);
        }
        in_queue_order(plan, pending)
    }
}
