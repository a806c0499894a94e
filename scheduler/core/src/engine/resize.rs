//! Malleable grants (`tangram-v2`): after each cycle, the elastic execs running on a worker
//! are re-sized together with what was just launched there, so that cores freed by a
//! completion go to the execs still running (re-widening) and a burst of arrivals takes
//! cores from wide ones whose loss costs least (narrowing).
//!
//! Each exec's remaining work is estimated from its model and the time it has run at each
//! size: `done += elapsed / dur(cores)` at every change. The worker's cores for elastic work
//! (its free cores plus those the execs hold) are then shared out to minimise the sum of the
//! remaining durations, the same objective the launch allocation uses. A change is made only
//! when it moves an exec's estimated remaining time by at least [`MIN_GAIN`] and at least
//! [`MIN_STEP_MS`] (each is a message to the worker), and narrowings are applied before
//! widenings so that capacity is never exceeded, even for a moment.

use super::lifecycle::ActionState;
use super::{Effect, Engine, Now};
use crate::elastic::{self, Claim, ElasticModel};
use std::collections::HashMap;
use tangram_shared::{ActionId, ActionSpec, Grant, WorkerId};

/// The smallest relative change of an exec's remaining time worth a re-size.
pub const MIN_GAIN: f64 = 0.02;
/// The smallest absolute change of an exec's remaining time worth a re-size, ms.
pub const MIN_STEP_MS: f64 = 5.0;
/// How strongly shorter remaining work is favoured (see [`weighted_remaining`]).
pub const ALPHA: f64 = 1.0;
/// The least remaining work an exec is estimated to have, as a fraction of its model's.
const LEAST_LEFT: f64 = 0.05;

/// The remaining work of an exec `done` (a fraction of its model's work, past 1 when it
/// overran), as a fraction of its model's work. One that overran its model is expected to
/// run half as long again as it has (durations are heavy-tailed: the longer something has
/// run, the longer it is likely to go on).
pub fn remaining_fraction(done: f64) -> f64 {
    if done < 1.0 {
        (1.0 - done).max(LEAST_LEFT)
    } else {
        0.5 * done
    }
}

/// How far a running exec has got, as the engine estimates it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    /// Cores it has now.
    pub cores: u32,
    /// Since when it has had them (engine clock).
    pub since_ms: u64,
    /// Fraction of its work done before `since_ms`.
    pub done: f64,
    /// Core-milliseconds it held before `since_ms`.
    pub core_ms: f64,
    /// When it started (engine clock).
    pub started_ms: u64,
}

impl Progress {
    /// The cores it held on average from its start to `now_ms`, when it was re-sized (the
    /// learner's observation of a re-sized exec); `None` when it kept its first size.
    pub fn mean_cores(&self, now_ms: u64) -> Option<u32> {
        if self.since_ms == self.started_ms {
            return None;
        }
        let total = self.core_ms + self.cores as f64 * now_ms.saturating_sub(self.since_ms) as f64;
        let wall = now_ms.saturating_sub(self.started_ms).max(1) as f64;
        Some(((total / wall).round() as u32).max(1))
    }

    /// Now at `cores` from `now_ms` (its worker reported another width): the work done and
    /// the core-time held so far are kept at the width it had.
    pub fn rewidth(&mut self, model: &ElasticModel, cores: u32, now_ms: u64) {
        if cores == self.cores {
            return;
        }
        self.done = self.done_at(model, now_ms);
        self.core_ms += self.cores as f64 * now_ms.saturating_sub(self.since_ms) as f64;
        self.since_ms = now_ms;
        self.cores = cores;
    }

    /// The fraction of its model's work done at `now_ms` (past 1 when it overran).
    pub fn done_at(&self, model: &ElasticModel, now_ms: u64) -> f64 {
        let elapsed = now_ms.saturating_sub(self.since_ms) as f64;
        let dur = model.dur_ms(self.cores).max(1e-3);
        self.done + elapsed / dur
    }
}

/// One exec being sized.
struct Sized {
    id: ActionId,
    /// Cores it holds now; 0 for one still queued (its worker had no core left for it).
    cores: u32,
    /// Memory a queued one needs to launch.
    mem_mb: u64,
    min: u32,
    max: u32,
    remaining: ElasticModel,
    done: f64,
}

impl Engine {
    /// An adopted exec's booking was set to the width its worker reports: its progress
    /// estimate runs at that width from `now` (it kept its first width before).
    pub(crate) fn progress_follows_booking(&mut self, id: &ActionId, now: Now) {
        let Some(e) = self.actions.get(id) else {
            return;
        };
        let Some(cores) = e.placed().map(|(_, b)| b.counted_cores()) else {
            return;
        };
        let model = self.model_of(e).unwrap_or_else(ElasticModel::unknown);
        if let Some(p) = self.progress.get_mut(id) {
            p.rewidth(&model, cores, now.ms);
        }
    }

    /// Re-sizes the elastic execs of every worker (see the module docs). Called at the end of
    /// a cycle when the policy is malleable.
    pub(crate) fn resize(&mut self, now: Now) -> Vec<(ActionId, WorkerId, Grant)> {
        let mut by_worker: HashMap<WorkerId, Vec<Sized>> = HashMap::new();
        let mut touched = std::mem::take(&mut self.touched);
        // Workers with an exec waiting for a core are re-sized too.
        for id in &self.queue {
            let Some(e) = self.actions.get(id) else {
                continue;
            };
            if matches!(e.state, ActionState::Queued { .. })
                && matches!(e.action.spec, ActionSpec::SandboxExec(_))
            {
                let key = (e.action.job.clone(), e.action.trajectory.clone());
                if let Some(s) = self.sandboxes.get(&key) {
                    touched.insert(s.worker.clone());
                }
            }
        }
        if touched.is_empty() {
            return Vec::new();
        }
        // Jobs with a cores cap widen only into what their cap leaves, shared out in turn.
        let mut headroom: Option<HashMap<tangram_shared::JobId, u32>> =
            self.any_caps().then(|| {
                let used = self.job_use();
                let mut jobs: HashMap<tangram_shared::JobId, u32> = HashMap::new();
                for e in self.actions.values() {
                    let j = &e.action.job;
                    if !jobs.contains_key(j) {
                        let u = used.get(j).copied().unwrap_or_default();
                        if let Some(left) = self.cores_left(j, u) {
                            jobs.insert(j.clone(), left);
                        }
                    }
                }
                jobs
            });
        // On a worker where more than one job wants cores, a running exec widens only into
        // what is left of its job's weighted share there (`shares.rs`). A queued one is not
        // held to it: clamping those too made both jobs of the simulator's capped-flood
        // scenario slower (2.56x and 2.09x their ACT alone, against 2.12x and 1.70x).
        let mut fair = self.fair_headroom(&touched);
        // The widest an exec on `worker` holding `cores` may become; less than `min` (and
        // nothing taken) when its job's cap leaves it no room.
        let mut widest =
            |worker: &WorkerId, job: &tangram_shared::JobId, cores: u32, min: u32, max: u32| {
                let mut max = max;
                if let Some(left) = fair
                    .get_mut(&(worker.clone(), job.clone()))
                    .filter(|_| cores > 0)
                {
                    max = max.min(cores + *left).max(cores);
                    *left -= max - cores;
                }
                match headroom.as_mut().and_then(|h| h.get_mut(job)) {
                    Some(left) => {
                        let max = max.min(cores + *left).max(cores);
                        if max < min {
                            return max;
                        }
                        *left -= max - cores;
                        max
                    }
                    None => max,
                }
            };
        // Running elastic execs on the workers being re-sized, in id order, so that a job's
        // headroom is shared out the same way every time.
        let mut running: Vec<&ActionId> = self
            .actions
            .iter()
            .filter(|(_, e)| {
                matches!(e.action.spec, ActionSpec::SandboxExec(_))
                    && e.placed().is_some_and(|(w, _)| touched.contains(w))
            })
            .map(|(id, _)| id)
            .collect();
        running.sort_unstable();
        for id in running {
            let e = &self.actions[id];
            let Some((worker, booking)) = e.placed() else {
                continue;
            };
            if !touched.contains(worker) {
                continue;
            }
            let ActionSpec::SandboxExec(_) = &e.action.spec else {
                continue;
            };
            let Some(range) = e.action.demand().cores else {
                continue;
            };
            if range.max <= range.min || booking.counted_cores() == 0 {
                continue;
            }
            let since = match &e.state {
                // A dispatch handed out in an earlier cycle may not be stored yet: it is left
                // as it is until it is (a re-size follows its dispatch on the worker's
                // subject, but only a stored one is known to be ahead of it).
                ActionState::Dispatching { since_ms, .. }
                    if self.out.iter().any(|fx| {
                        matches!(fx, Effect::Dispatch { dispatch, .. } if dispatch.action.id == *id)
                    }) =>
                {
                    *since_ms
                }
                ActionState::Dispatching { .. } => continue,
                ActionState::Running { stored_ms, .. } => *stored_ms,
                ActionState::Queued { .. } | ActionState::Backoff { .. } => continue,
            };
            let model = self.model_of(e).unwrap_or_else(ElasticModel::unknown);
            let p = *self.progress.entry(id.clone()).or_insert(Progress {
                cores: booking.counted_cores(),
                since_ms: since,
                done: 0.0,
                core_ms: 0.0,
                started_ms: since,
            });
            let done = p.done_at(&model, now.ms);
            let max = widest(
                worker,
                &e.action.job,
                booking.counted_cores(),
                range.min,
                range.max,
            );
            by_worker.entry(worker.clone()).or_default().push(Sized {
                id: id.clone(),
                cores: booking.counted_cores(),
                mem_mb: 0,
                min: range.min,
                max,
                remaining: ElasticModel {
                    t1_ms: model.t1_ms * remaining_fraction(done),
                    speedup: model.speedup,
                },
                done,
            });
        }
        let actions = &self.actions;
        self.progress
            .retain(|id, _| actions.get(id).is_some_and(|e| e.placed().is_some()));
        // Execs still queued for want of a core on their sandbox's worker join the sizing
        // there, in weighted fair order between jobs: narrowing the running ones can make
        // room for them now. (Rejected or launched this cycle: the queue is pruned after
        // the cycle.)
        let queued: Vec<&ActionId> = self
            .queue
            .iter()
            .filter(|id| {
                self.actions.get(*id).is_some_and(|e| {
                    matches!(e.state, ActionState::Queued { .. })
                        && matches!(e.action.spec, ActionSpec::SandboxExec(_))
                })
            })
            .collect();
        for id in self.fair_queued_execs(queued) {
            let e = &self.actions[id];
            let (Some(range), key) = (
                e.action.demand().cores,
                (e.action.job.clone(), e.action.trajectory.clone()),
            ) else {
                continue;
            };
            let Some(s) = self.sandboxes.get(&key) else {
                continue;
            };
            if s.state != super::lifecycle::SandboxState::Open
                || self.workers.get(&s.worker).is_none_or(|w| w.hb.draining)
            {
                continue;
            }
            let Some(execs) = by_worker.get_mut(&s.worker) else {
                continue; // nothing running there to narrow
            };
            let max = widest(&s.worker, &e.action.job, 0, range.min, range.max);
            if max < range.min {
                continue; // its job's cap leaves it no room
            }
            let model = self.model_of(e).unwrap_or_else(ElasticModel::unknown);
            execs.push(Sized {
                id: id.clone(),
                cores: 0,
                mem_mb: e.action.demand().mem_mb,
                min: range.min,
                max,
                remaining: model,
                done: 0.0,
            });
        }
        let used = self.used();
        let free: HashMap<WorkerId, (u32, u64)> = self
            .workers
            .iter()
            .map(|(id, w)| {
                let (c, m) = used.get(id).copied().unwrap_or_default();
                let free = (w.hb.cores.saturating_sub(c), w.hb.mem_mb.saturating_sub(m));
                (id.clone(), free)
            })
            .collect();
        let mut launches = Vec::new();
        let mut workers: Vec<WorkerId> = by_worker.keys().cloned().collect();
        workers.sort();
        for w in workers {
            let (free_cores, mut free_mem) = free.get(&w).copied().unwrap_or_default();
            let mut execs = by_worker.remove(&w).expect("listed");
            // Running first, by id (deterministic); then queued ones in arrival order as long
            // as every minimum still fits.
            let queued_from = execs
                .iter()
                .position(|s| s.cores == 0)
                .unwrap_or(execs.len());
            execs[..queued_from].sort_by(|a, b| a.id.cmp(&b.id));
            let held: u32 = execs.iter().map(|s| s.cores).sum();
            let units = held + free_cores;
            let mut mins: u32 = execs[..queued_from].iter().map(|s| s.min).sum();
            let mut keep = queued_from;
            for (i, s) in execs.iter().enumerate().skip(queued_from) {
                if mins + s.min > units || s.mem_mb > free_mem {
                    break;
                }
                mins += s.min;
                keep = i + 1;
            }
            execs.truncate(keep);
            let target = {
                let weighted = weighted_remaining(&execs);
                let claims: Vec<Claim<'_>> = execs
                    .iter()
                    .zip(&weighted)
                    .map(|(s, m)| Claim {
                        min: s.min,
                        max: s.max,
                        model: m,
                    })
                    .collect();
                match elastic::allocate(&claims, units) {
                    Some(t) => t,
                    None => continue,
                }
            };
            let worth = |s: &Sized, to: u32| {
                let (a, b) = (s.remaining.dur_ms(s.cores), s.remaining.dur_ms(to));
                let delta = (a - b).abs();
                delta >= MIN_STEP_MS && delta >= MIN_GAIN * a.max(b)
            };
            // Narrow first, then launch the queued ones into what that freed, then widen
            // into what is left, largest gain first.
            // Making room for one that waits is worth any narrowing the allocation asks for.
            let room_for_queued = execs
                .iter()
                .zip(&target)
                .any(|(s, &to)| s.cores == 0 && to >= s.min);
            let mut spare = units - held;
            for (s, &to) in execs.iter().zip(&target) {
                if s.cores > 0 && to < s.cores && (room_for_queued || worth(s, to)) {
                    spare += s.cores - to;
                    self.regrant(&w, s, to, now);
                }
            }
            for (s, &to) in execs.iter().zip(&target) {
                let to = to.min(spare);
                if s.cores == 0 && to >= s.min && s.mem_mb <= free_mem {
                    spare -= to;
                    free_mem -= s.mem_mb;
                    let grant = Grant {
                        cores: to,
                        mem_mb: s.mem_mb,
                    };
                    launches.push((s.id.clone(), w.clone(), grant));
                }
            }
            let mut widen: Vec<(&Sized, u32, f64)> = execs
                .iter()
                .zip(&target)
                .filter(|(s, &to)| s.cores > 0 && to > s.cores && worth(s, to))
                .map(|(s, &to)| (s, to, s.remaining.dur_ms(s.cores) - s.remaining.dur_ms(to)))
                .collect();
            widen.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.id.cmp(&b.0.id)));
            for (s, to, _) in widen {
                let to = to.min(s.cores + spare);
                if to > s.cores && worth(s, to) {
                    spare -= to - s.cores;
                    self.regrant(&w, s, to, now);
                }
            }
        }
        launches
    }

    /// Books `s` at `cores` and tells its worker: a dispatch not yet handed out this cycle
    /// is amended in place, one already out gets a [`Effect::Regrant`].
    fn regrant(&mut self, worker: &WorkerId, s: &Sized, cores: u32, now: Now) {
        let Some(e) = self.actions.get_mut(&s.id) else {
            return;
        };
        let (booking, attempt) = match &mut e.state {
            ActionState::Dispatching {
                booking, attempt, ..
            } => (booking, *attempt),
            ActionState::Running {
                booking,
                attempt,
                adopted,
                pending,
                ..
            } => {
                // Its size is this leader's from now: a report still showing an earlier
                // size must not undo it (and an earlier leader's re-size, of an older epoch,
                // is dropped by the worker if it comes after this one).
                *adopted = false;
                *pending = None;
                (booking, *attempt)
            }
            ActionState::Queued { .. } | ActionState::Backoff { .. } => return,
        };
        let Some(cpu) = booking.cpu_mut() else {
            return;
        };
        cpu.set_cores(cores);
        let grant = cpu.grant;
        let old = self.progress.get(&s.id).copied();
        self.progress.insert(
            s.id.clone(),
            Progress {
                cores,
                since_ms: now.ms,
                done: s.done,
                core_ms: old.map_or(0.0, |o| {
                    o.core_ms + o.cores as f64 * now.ms.saturating_sub(o.since_ms) as f64
                }),
                started_ms: old.map_or(now.ms, |o| o.started_ms),
            },
        );
        let pending = self.out.iter_mut().find_map(|fx| match fx {
            Effect::Dispatch { dispatch, .. } if dispatch.action.id == s.id => Some(dispatch),
            _ => None,
        });
        match pending {
            Some(d) => d.grant = grant,
            None => {
                self.regrant_seq += 1;
                self.out.push(Effect::Regrant {
                    worker: worker.clone(),
                    regrant: tangram_shared::Regrant {
                        epoch: self.config.epoch,
                        id: s.id.clone(),
                        attempt,
                        grant,
                        seq: self.regrant_seq,
                    },
                });
            }
        }
    }
}

/// The models the allocation minimises the sum of: each exec's remaining work, weighted by
/// its rank from the longest (the shortest of `n` counts `n^ALPHA` times, the longest once).
/// Finishing a short exec sooner frees its cores for the others sooner, so the sum of
/// completion times gains more from it than its own duration says (after heSRPT's
/// observation that the optimal malleable allocation favours the smaller jobs).
fn weighted_remaining(execs: &[Sized]) -> Vec<ElasticModel> {
    let mut order: Vec<usize> = (0..execs.len()).collect();
    let at_max = |i: usize| execs[i].remaining.dur_ms(execs[i].max);
    order.sort_by(|&a, &b| at_max(b).total_cmp(&at_max(a)).then(a.cmp(&b)));
    let mut weighted: Vec<ElasticModel> = execs.iter().map(|s| s.remaining.clone()).collect();
    for (rank, &i) in order.iter().enumerate() {
        weighted[i].t1_ms *= ((rank + 1) as f64).powf(ALPHA);
    }
    weighted
}
