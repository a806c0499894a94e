//! The reference policy (`tangram`, after ARL-Tangram).

use super::select::{model_of, resolve, select, Candidate, Cores, Decisions, Pick};
use crate::elastic::{self, Claim, ElasticModel};
use crate::model::{Pending, Plan, Policy, Snapshot, Unplaced, WaitReason};

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

impl Tangram {
    /// Its name in the scheduler's config and the simulator.
    pub const NAME: &'static str = "tangram";
}

impl Policy for Tangram {
    fn boxed(&self) -> Box<dyn Policy> {
        Box::new(*self)
    }
    fn name(&self) -> &'static str {
        Self::NAME
    }

    /// Runs passes until one launches nothing: units a pass leaves idle after its evictions
    /// go to actions further back in the queue, so a plan is complete (re-planning on the
    /// post-plan snapshot launches nothing new).
    fn schedule(&self, snapshot: &Snapshot, pending: &[Pending], _now_ms: u64) -> Plan {
        let where_ = resolve(snapshot, pending);
        let mut all = Decisions::default();
        let mut snap = snapshot.clone();
        let mut order: Vec<usize> = (0..pending.len()).collect();
        for _ in 0..=pending.len() {
            let mut pass = Decisions::default();
            self.pass(&snap, pending, &where_, &order, &mut pass);
            if pass.launches.is_empty() {
                all.unplaced.extend(pass.unplaced);
                break;
            }
            let mut waiting = Vec::with_capacity(pass.unplaced.len());
            for (i, u) in pass.unplaced {
                match u {
                    Unplaced::NeverFits(_) => all.unplaced.push((i, u)),
                    Unplaced::MayFitLater(_) => waiting.push((i, u)),
                }
            }
            for &(i, w, cores) in &pass.launches {
                let view = &mut snap.workers_mut()[w];
                view.free_cores -= cores;
                view.free_mem_mb -= pending[i].demand.mem_mb;
            }
            all.launches.extend(pass.launches);
            // Nothing more can start when no worker has a core or any memory left.
            if snap
                .workers()
                .iter()
                .all(|w| w.free_cores == 0 && w.free_mem_mb == 0)
                || snap.workers().iter().all(|w| w.free_cores == 0)
                    && waiting
                        .iter()
                        .all(|&(i, _)| pending[i].demand.cores.is_some())
            {
                all.unplaced.extend(waiting);
                break;
            }
            order = waiting.iter().map(|&(i, _)| i).collect();
            if order.is_empty() {
                break;
            }
        }
        all.into_plan(snapshot, pending)
    }
}

impl Tangram {
    /// Steps 3 and 4: allocate `units` among `claims`, then greedy tail eviction. Returns how
    /// many claims (a prefix) launch, and their allocation.
    fn allocate_and_evict(&self, claims: &[Claim<'_>], units: u32) -> (usize, Vec<u32>) {
        // Estimated total completion time without the last claim: the others' durations, and
        // for it, waiting until the first of them finishes, then running with what that frees.
        let without_estimate = |kept: &[u32], last: &Claim<'_>| -> f64 {
            let used: u32 = kept.iter().sum();
            let mut total = 0.0;
            let mut first = (f64::INFINITY, 0);
            for (c, &x) in claims.iter().zip(kept) {
                let d = c.model.dur_ms(x);
                total += d;
                if d < first.0 {
                    first = (d, x);
                }
            }
            let later = (first.1 + units - used).clamp(last.min, last.max);
            total + first.0 + last.model.dur_ms(later)
        };
        let fallback = || {
            (
                claims.len(),
                claims.iter().map(|c| c.min).collect::<Vec<_>>(),
            )
        };
        if claims.iter().all(|c| c.model.is_convex(c.min, c.max)) {
            // Convex: one greedy, kept alive across evictions, and the durations it implies
            // updated only where a drop moved units (duration evaluations dominate the cost).
            let Some(mut g) = elastic::Greedy::new(claims, units) else {
                return fallback();
            };
            g.take_touched();
            let mut durs: Vec<f64> = claims
                .iter()
                .zip(g.alloc())
                .map(|(c, &x)| c.model.dur_ms(x))
                .collect();
            let mut total: f64 = durs.iter().sum();
            let mut evictions = 0;
            while g.alloc().len() > 1 && evictions < self.depth {
                let n = g.alloc().len();
                let last = &claims[n - 1];
                let mut trial = g.clone();
                trial.drop_last();
                if trial.free() >= last.min {
                    break; // it would run beside the others anyway: nothing to gain
                }
                let mut trial_durs = durs[..n - 1].to_vec();
                let mut trial_total = total - durs[n - 1];
                for j in trial.take_touched() {
                    let d = claims[j].model.dur_ms(trial.alloc()[j]);
                    trial_total += d - trial_durs[j];
                    trial_durs[j] = d;
                }
                // The held-back action starts when the first of the others finishes, with the
                // units that frees plus any left over.
                let (first, first_ms) = trial_durs
                    .iter()
                    .enumerate()
                    .min_by(|a, b| a.1.total_cmp(b.1))
                    .map(|(j, &d)| (j, d))
                    .unwrap_or((0, 0.0));
                let later = (trial.alloc()[first] + trial.free()).clamp(last.min, last.max);
                let without_total = trial_total + first_ms + last.model.dur_ms(later);
                if without_total < total {
                    g = trial;
                    durs = trial_durs;
                    total = trial_total;
                    evictions += 1;
                } else {
                    break;
                }
            }
            return (g.alloc().len(), g.alloc().to_vec());
        }
        // Some profiled table is not convex: exact DP for every prefix tried.
        let Some(mut alloc) = elastic::allocate_dp(claims, units) else {
            return fallback();
        };
        let mut n = claims.len();
        let mut evictions = 0;
        while n > 1 && evictions < self.depth {
            let last = &claims[n - 1];
            let Some(without) = elastic::allocate_dp(&claims[..n - 1], units) else {
                break;
            };
            if units - without.iter().sum::<u32>() >= last.min {
                break;
            }
            if without_estimate(&without, last) < elastic::total_ms(&claims[..n], &alloc) {
                n -= 1;
                alloc = without;
                evictions += 1;
            } else {
                break;
            }
        }
        (n, alloc)
    }

    fn pass(
        &self,
        snapshot: &Snapshot,
        pending: &[Pending],
        where_: &[Result<Option<usize>, ()>],
        order: &[usize],
        out: &mut Decisions,
    ) {
        let cands = select(
            snapshot,
            pending,
            where_,
            order,
            Pick::MostFree,
            Cores::Min,
            out,
        );
        let nworkers = snapshot.workers().len();
        let mut per_worker: Vec<Vec<&Candidate<'_>>> = vec![Vec::new(); nworkers];
        for c in &cands {
            if c.pending.demand.cores.is_some() {
                per_worker[c.worker].push(c);
            } else {
                out.launch(c, 0);
            }
        }
        for (w, group) in per_worker.iter().enumerate() {
            if group.is_empty() {
                continue;
            }
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
            let (n, alloc) = self.allocate_and_evict(&claims, units);
            let used: u32 = alloc.iter().sum();
            for (i, c) in group.iter().enumerate() {
                if i < n {
                    out.launch(c, alloc[i]);
                } else {
                    let r = c.pending.demand.cores.unwrap_or_default();
                    let why = WaitReason::Cores {
                        need: r.min,
                        best_free: units - used,
                    };
                    out.unplaced.push((c.index, Unplaced::MayFitLater(why)));
                }
            }
        }
    }
}
