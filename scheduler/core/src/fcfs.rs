//! FCFS first-fit: the foundation policy, a stand-in until the elastic policy lands.
//!
//! Scans the queue in arrival order; each action goes to the first allowed worker (by id)
//! that has its minimum cores and its memory free, and gets as many cores as it can use up to
//! its maximum. Actions that do not fit are skipped, not blocking the ones behind them.

use crate::model::{
    Constraint, Launch, NeverReason, Pending, Plan, Policy, Snapshot, Unplaced, WaitReason,
};
use tangram_shared::Grant;

/// See the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub struct FcfsFirstFit;

impl Policy for FcfsFirstFit {
    fn boxed(&self) -> Box<dyn Policy> {
        Box::new(self.clone())
    }
    fn name(&self) -> &'static str {
        "fcfs-first-fit"
    }

    fn schedule(&self, snapshot: &Snapshot, pending: &[Pending], now_ms: u64) -> Plan {
        let workers = snapshot.workers();
        let mut book = crate::policies::ExtraBook::new(snapshot, now_ms);
        // Free capacity as this cycle books it, indexed like `workers`.
        let mut free: Vec<(u32, u64)> = workers
            .iter()
            .map(|w| (w.free_cores, w.free_mem_mb))
            .collect();
        let mut plan = Plan::default();

        for p in pending {
            let need_cores = p.demand.cores.map_or(0, |c| c.min);
            let need_mem = p.demand.mem_mb;
            let allowed: Vec<usize> = match &p.constraint {
                Constraint::Any => (0..workers.len()).collect(),
                Constraint::OnWorker(id) => match workers.binary_search_by(|w| w.id.cmp(id)) {
                    Ok(i) => vec![i],
                    Err(_) => {
                        let why = Unplaced::NeverFits(NeverReason::WorkerGone(id.clone()));
                        plan.unplaced.push((p.id.clone(), why));
                        continue;
                    }
                },
            };
            if allowed.is_empty() {
                plan.unplaced
                    .push((p.id.clone(), Unplaced::MayFitLater(WaitReason::NoWorkers)));
                continue;
            }
            let could_ever = allowed.iter().any(|&i| {
                workers[i].total_cores >= need_cores && workers[i].total_mem_mb >= need_mem
            });
            if !could_ever {
                let why = Unplaced::NeverFits(NeverReason::ExceedsEveryWorker {
                    cores: need_cores,
                    mem_mb: need_mem,
                });
                plan.unplaced.push((p.id.clone(), why));
                continue;
            }
            let extra = !p.needs.is_empty();
            let range = match allowed.as_slice() {
                [one] => *one..*one + 1,
                _ => 0..workers.len(),
            };
            if extra {
                if let Some(why) = book.never(p, range.clone()) {
                    plan.unplaced.push((p.id.clone(), Unplaced::NeverFits(why)));
                    continue;
                }
                if let Some(why) = book.rate_wait(p) {
                    plan.unplaced
                        .push((p.id.clone(), Unplaced::MayFitLater(why)));
                    continue;
                }
            }
            let fit = allowed.iter().copied().find(|&i| {
                workers[i].accepting
                    && free[i].0 >= need_cores
                    && free[i].1 >= need_mem
                    && (!extra || book.fits(p, i))
            });
            match fit {
                Some(i) => {
                    if extra {
                        book.book(p, i);
                    }
                    let cores = match p.demand.cores {
                        Some(range) => free[i].0.min(range.max),
                        None => 0,
                    };
                    free[i].0 -= cores;
                    free[i].1 -= need_mem;
                    plan.launches.push(Launch {
                        id: p.id.clone(),
                        worker: workers[i].id.clone(),
                        grant: Grant {
                            cores,
                            mem_mb: need_mem,
                        },
                    });
                }
                None => {
                    let accepting: Vec<usize> = allowed
                        .iter()
                        .copied()
                        .filter(|&i| workers[i].accepting)
                        .collect();
                    let core_mem_ok = accepting
                        .iter()
                        .any(|&i| free[i].0 >= need_cores && free[i].1 >= need_mem);
                    let unit_wait = if extra && core_mem_ok {
                        book.unit_wait(p, range.clone())
                    } else {
                        None
                    };
                    let why = if let Some(w) = unit_wait {
                        w
                    } else if accepting.is_empty() {
                        match &p.constraint {
                            Constraint::OnWorker(id) => WaitReason::NotAccepting(id.clone()),
                            Constraint::Any => WaitReason::NoWorkers,
                        }
                    } else if accepting.iter().all(|&i| free[i].0 < need_cores) {
                        WaitReason::Cores {
                            need: need_cores,
                            best_free: accepting.iter().map(|&i| free[i].0).max().unwrap_or(0),
                        }
                    } else {
                        WaitReason::Memory {
                            need_mb: need_mem,
                            best_free_mb: accepting.iter().map(|&i| free[i].1).max().unwrap_or(0),
                        }
                    };
                    plan.unplaced
                        .push((p.id.clone(), Unplaced::MayFitLater(why)));
                }
            }
        }
        plan
    }
}
