//! The selection every policy shares: which pending actions are candidates (FCFS on minimum
//! demand), on which worker, with which reason for each one left out; the fixed-size
//! baselines are this selection with a fixed core count.

use crate::elastic::ElasticModel;
use crate::model::{
    Constraint, Launch, NeverReason, Pending, Plan, Snapshot, Unplaced, WaitReason,
};
use std::collections::HashSet;
use tangram_shared::Grant;

/// A candidate chosen by FCFS selection: the action (index into `pending`), its worker, and
/// the cores it took there at selection.
pub(super) struct Candidate<'a> {
    pub(super) index: usize,
    pub(super) pending: &'a Pending,
    pub(super) worker: usize,
    pub(super) cores: u32,
}

/// Decisions by index into `pending`; turned into a [`Plan`] in queue order at the end.
#[derive(Default)]
pub(super) struct Decisions {
    pub(super) launches: Vec<(usize, usize, u32)>,
    pub(super) unplaced: Vec<(usize, Unplaced)>,
}

impl Decisions {
    pub(super) fn launch(&mut self, c: &Candidate<'_>, cores: u32) {
        self.launches.push((c.index, c.worker, cores));
    }

    pub(super) fn into_plan(mut self, snapshot: &Snapshot, pending: &[Pending]) -> Plan {
        self.launches.sort_unstable_by_key(|l| l.0);
        self.unplaced.sort_by_key(|u| u.0);
        let workers = snapshot.workers();
        Plan {
            launches: self
                .launches
                .into_iter()
                .map(|(i, w, cores)| Launch {
                    id: pending[i].id.clone(),
                    worker: workers[w].id.clone(),
                    grant: Grant {
                        cores,
                        mem_mb: pending[i].demand.mem_mb,
                    },
                })
                .collect(),
            unplaced: self
                .unplaced
                .into_iter()
                .map(|(i, u)| (pending[i].id.clone(), u))
                .collect(),
        }
    }
}

/// Which of the allowed workers that have room an action goes to.
#[derive(Debug, Clone, Copy)]
pub(super) enum Pick {
    /// The most free cores (for memory-only actions, the most free memory first), ties to the
    /// lowest id: spreads elastic work and sandbox opens over the fleet.
    MostFree,
    /// The lowest id: packs the fleet from its first worker.
    FirstById,
}

/// The cores an action must find free on a worker to be selected there, and those it takes
/// from that worker's free cores at selection. Actions without a core range need none.
#[derive(Debug, Clone, Copy)]
pub(super) enum Cores {
    /// Its minimum (the policy may share out the rest afterwards).
    Min,
    /// A fixed degree of parallelism, clamped to its range.
    Dop(u32),
    /// Its maximum: a fixed request, Kubernetes style.
    Max,
    /// Needs its minimum, takes all the free cores up to its maximum.
    UpToMax,
}

impl Cores {
    fn need(self, p: &Pending) -> u32 {
        let Some(r) = p.demand.cores else { return 0 };
        match self {
            Cores::Min | Cores::UpToMax => r.min,
            Cores::Dop(dop) => dop.clamp(r.min, r.max),
            Cores::Max => r.max,
        }
    }

    fn take(self, p: &Pending, free: u32) -> u32 {
        match (self, p.demand.cores) {
            (Cores::UpToMax, Some(r)) => free.min(r.max),
            _ => self.need(p),
        }
    }
}

/// Where each pending action may run: `Ok(None)` anywhere, `Ok(Some(w))` only on worker `w`,
/// `Err(())` on a worker that is gone. Resolved once per call (ids are strings).
pub(super) fn resolve(snapshot: &Snapshot, pending: &[Pending]) -> Vec<Result<Option<usize>, ()>> {
    let workers = snapshot.workers();
    pending
        .iter()
        .map(|p| match &p.constraint {
            Constraint::Any => Ok(None),
            Constraint::OnWorker(id) => workers
                .binary_search_by(|w| w.id.cmp(id))
                .map(Some)
                .map_err(|_| ()),
        })
        .collect()
}

/// FCFS candidate selection, the one place that decides feasibility and writes the reasons
/// for every policy: scan in `order`; an action is a candidate when its base demand (the
/// cores `cores` says it needs, its memory) fits in what the candidates before it left free
/// on an allowed worker that takes new work; `pick` chooses among such workers. Everything
/// else is explained in `out`, as never fitting (pinned worker gone, more than any allowed
/// worker has in all) or as waiting (no workers, not accepting, cores, memory). A sandbox
/// open with an [`ImageNeed`](crate::model::ImageNeed) goes where its expected pull plus
/// load is least, when a worker with room holds its image.
pub(super) fn select<'a>(
    snapshot: &Snapshot,
    pending: &'a [Pending],
    where_: &[Result<Option<usize>, ()>],
    order: &[usize],
    pick: Pick,
    cores: Cores,
    out: &mut Decisions,
) -> Vec<Candidate<'a>> {
    let workers = snapshot.workers();
    let mut free: Vec<(u32, u64)> = workers
        .iter()
        .map(|w| (w.free_cores, w.free_mem_mb))
        .collect();
    let mut cands = Vec::new();
    // Image-aware placement: sandboxes per worker, and where this cycle's opens put images.
    let mut sandboxes: Vec<u32> = workers.iter().map(|w| w.sandboxes).collect();
    let mut fetched: HashSet<(&str, usize)> = HashSet::new();
    for &i in order {
        let p = &pending[i];
        let need_cores = cores.need(p);
        let need_mem = p.demand.mem_mb;
        let allowed = match where_[i] {
            Err(()) => {
                let Constraint::OnWorker(id) = &p.constraint else {
                    unreachable!("only pinned actions can lose their worker")
                };
                out.unplaced
                    .push((i, Unplaced::NeverFits(NeverReason::WorkerGone(id.clone()))));
                continue;
            }
            Ok(Some(w)) => w..w + 1,
            Ok(None) => 0..workers.len(),
        };
        if allowed.is_empty() {
            out.unplaced
                .push((i, Unplaced::MayFitLater(WaitReason::NoWorkers)));
            continue;
        }
        if !allowed
            .clone()
            .any(|w| workers[w].total_cores >= need_cores && workers[w].total_mem_mb >= need_mem)
        {
            let why = NeverReason::ExceedsEveryWorker {
                cores: need_cores,
                mem_mb: need_mem,
            };
            out.unplaced.push((i, Unplaced::NeverFits(why)));
            continue;
        }
        let mut room = allowed.clone().filter(|&w| {
            workers[w].takes(&p.constraint) && free[w].0 >= need_cores && free[w].1 >= need_mem
        });
        let local = p.image.as_ref().and_then(|img| {
            let held = |w: usize| {
                img.holders.binary_search(&workers[w].id).is_ok()
                    || fetched.contains(&(img.key.as_str(), w))
            };
            let room: Vec<usize> = room.clone().collect();
            if !room.iter().any(|&w| held(w)) {
                return None;
            }
            room.into_iter().min_by_key(|&w| {
                let cost = img.cost_ms(held(w), sandboxes[w], workers[w].total_cores);
                (
                    cost,
                    std::cmp::Reverse(free[w].1),
                    std::cmp::Reverse(free[w].0),
                    w,
                )
            })
        });
        let fit = match pick {
            _ if local.is_some() => local,
            Pick::FirstById => room.next(),
            Pick::MostFree => room.max_by(|&a, &b| {
                let by_cores = free[a].0.cmp(&free[b].0);
                // Memory-only actions (sandbox opens) spread by free memory, so that a burst
                // of opens does not pile onto the first worker while cores are all free.
                let primary = if need_cores == 0 {
                    free[a].1.cmp(&free[b].1).then(by_cores)
                } else {
                    by_cores
                };
                primary.then(b.cmp(&a))
            }),
        };
        match fit {
            Some(w) => {
                if let Some(img) = &p.image {
                    sandboxes[w] += 1;
                    fetched.insert((&img.key, w));
                }
                let took = cores.take(p, free[w].0);
                free[w].0 -= took;
                free[w].1 -= need_mem;
                cands.push(Candidate {
                    index: i,
                    pending: p,
                    worker: w,
                    cores: took,
                });
            }
            None => {
                // Only workers taking new work count as having room later.
                let open = || allowed.clone().filter(|&w| workers[w].takes(&p.constraint));
                let why = match open().map(|w| free[w].0).max() {
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
                        best_free_mb: open().map(|w| free[w].1).max().unwrap_or(0),
                    },
                };
                out.unplaced.push((i, Unplaced::MayFitLater(why)));
            }
        }
    }
    cands
}

/// Runs a fixed-grant policy: select in `order`, launch every candidate with the cores it
/// took at selection.
pub(super) fn fixed(
    snapshot: &Snapshot,
    pending: &[Pending],
    order: &[usize],
    pick: Pick,
    cores: Cores,
) -> Plan {
    let mut d = Decisions::default();
    let where_ = resolve(snapshot, pending);
    for c in select(snapshot, pending, &where_, order, pick, cores, &mut d) {
        d.launch(&c, c.cores);
    }
    d.into_plan(snapshot, pending)
}

/// [`fixed`] in arrival order.
pub(super) fn fixed_fifo(
    snapshot: &Snapshot,
    pending: &[Pending],
    pick: Pick,
    cores: Cores,
) -> Plan {
    let order: Vec<usize> = (0..pending.len()).collect();
    fixed(snapshot, pending, &order, pick, cores)
}

pub(super) fn model_of(p: &Pending) -> ElasticModel {
    p.model.clone().unwrap_or_else(ElasticModel::unknown)
}
