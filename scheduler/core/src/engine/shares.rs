//! Weighted shares between jobs: which job's waiting actions a pool considers first.
//!
//! Every pool plans its waiting actions in an order, and the first in that order take what
//! is free. In queue order (first come, first served) a job that submitted ten thousand
//! actions a moment before another holds that other job back until its whole backlog has
//! run. So each pool takes its waiting actions in **weighted fair order**: the next action
//! is the oldest of the job whose share of the pool, held and already ordered ahead,
//! divided by its weight, is the least (ties to the older action). A job's own actions stay
//! in its queue order, and with one job waiting the order is the queue's.
//!
//! A job's share of the CPU pool is its dominant share: the larger of its fraction of the
//! fleet's cores (its running commands, and under `static` its sandboxes) and its fraction
//! of the fleet's memory (its sandboxes). Of the GPU pool, the reward calls it
//! has running. API quota has its own weighted shares (`pools/api.rs`). Weights are the
//! operator's `job_weights` (default 1), the same weights API quota is shared by.
//!
//! Fair order decides who gets what frees up; it takes nothing back from what a job already
//! holds. Widening under `tangram-v2` follows [`entitlements`]: on a worker where another
//! job wants cores, a job's commands widen only up to its weighted max-min share of that
//! worker's cores, and queued commands join the re-sizing in fair order.

use super::lifecycle::Booking;
use super::pools::Waiting;
use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap, VecDeque};
use tangram_shared::{ActionId, ActionSpec, JobId, WorkerId};

/// A job's weight from `weights` (the operator's `job_weights`): its own, else 1. A weight
/// that is not a positive finite number counts as 1 (the configuration refuses such).
pub(crate) fn weight_of(weights: &std::collections::BTreeMap<String, f64>, job: &JobId) -> f64 {
    weights
        .get(job.as_str())
        .copied()
        .filter(|w| w.is_finite() && *w > 0.0)
        .unwrap_or(1.0)
}

/// A job's place in the heap: least `share / weight` first, then its oldest waiting action.
struct Turn {
    key: f64,
    head: usize,
    job: usize,
}

impl PartialEq for Turn {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Turn {}
impl PartialOrd for Turn {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Turn {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key
            .total_cmp(&other.key)
            .then(self.head.cmp(&other.head))
    }
}

/// `items` (in queue order) in weighted fair order (see the module docs): `job` says whose
/// each is, `cost` what it takes of the pool, `held` what each job holds already and
/// `weight` each job's weight, all shares in the same unit. Stable within a job; `items`
/// unchanged when they belong to one job.
pub(crate) fn fair_order<T>(
    items: Vec<T>,
    job: impl Fn(&T) -> &JobId,
    cost: impl Fn(&T) -> f64,
    held: impl Fn(&JobId) -> f64,
    weight: impl Fn(&JobId) -> f64,
) -> Vec<T> {
    let Some(first) = items.first() else {
        return items;
    };
    let first = job(first).clone();
    if items.iter().all(|i| *job(i) == first) {
        return items;
    }
    let mut jobs: Vec<(JobId, f64, f64)> = Vec::new();
    let mut index: HashMap<JobId, usize> = HashMap::new();
    let mut queues: Vec<VecDeque<(usize, T)>> = Vec::new();
    for (at, item) in items.into_iter().enumerate() {
        let j = job(&item);
        let k = match index.get(j) {
            Some(&k) => k,
            None => {
                let k = jobs.len();
                let w = weight(j);
                let w = if w.is_finite() && w > 0.0 { w } else { 1.0 };
                jobs.push((j.clone(), held(j), w));
                index.insert(j.clone(), k);
                queues.push(VecDeque::new());
                k
            }
        };
        queues[k].push_back((at, item));
    }
    let mut heap: BinaryHeap<Reverse<Turn>> = queues
        .iter()
        .enumerate()
        .map(|(k, q)| {
            Reverse(Turn {
                key: jobs[k].1 / jobs[k].2,
                head: q.front().expect("not empty").0,
                job: k,
            })
        })
        .collect();
    let mut out = Vec::with_capacity(queues.iter().map(VecDeque::len).sum());
    while let Some(Reverse(turn)) = heap.pop() {
        let k = turn.job;
        let (_, item) = queues[k].pop_front().expect("a job in the heap has a head");
        jobs[k].1 += cost(&item).max(0.0);
        out.push(item);
        if let Some((head, _)) = queues[k].front() {
            heap.push(Reverse(Turn {
                key: jobs[k].1 / jobs[k].2,
                head: *head,
                job: k,
            }));
        }
    }
    out
}

/// Weighted max-min shares of `capacity` between jobs wanting `demand` each, with
/// `weight` each (water-filling): no job gets more than it wants, what one does not want
/// goes to the others in proportion to their weights, and whole units left over go to the
/// jobs furthest below their weighted share.
pub(crate) fn entitlements(capacity: u32, wants: &[(JobId, u32, f64)]) -> HashMap<JobId, u32> {
    let mut out: HashMap<JobId, u32> = HashMap::new();
    let mut open: Vec<usize> = (0..wants.len()).filter(|&i| wants[i].1 > 0).collect();
    let mut left = capacity as f64;
    let mut share = vec![0.0f64; wants.len()];
    let weight = |i: usize| {
        let w = wants[i].2;
        if w.is_finite() && w > 0.0 {
            w
        } else {
            1.0
        }
    };
    while !open.is_empty() && left > 1e-9 {
        let total: f64 = open.iter().map(|&i| weight(i)).sum();
        let per = left / total;
        // Jobs that want less than their slice take what they want and leave the round.
        let (sated, hungry): (Vec<usize>, Vec<usize>) = open
            .iter()
            .partition(|&&i| wants[i].1 as f64 - share[i] <= per * weight(i));
        if sated.is_empty() {
            for &i in &hungry {
                share[i] += per * weight(i);
            }
            left = 0.0;
        } else {
            for &i in &sated {
                left -= wants[i].1 as f64 - share[i];
                share[i] = wants[i].1 as f64;
            }
        }
        open = hungry;
    }
    let mut given: u32 = 0;
    for (i, (job, _, _)) in wants.iter().enumerate() {
        let n = share[i].floor() as u32;
        given += n;
        *out.entry(job.clone()).or_default() += n;
    }
    // Whole cores the floors left go, one each, to the largest fractions.
    let mut rest: Vec<usize> = (0..wants.len())
        .filter(|&i| share[i] < wants[i].1 as f64)
        .collect();
    rest.sort_by(|&a, &b| {
        (share[b] - share[b].floor())
            .total_cmp(&(share[a] - share[a].floor()))
            .then(a.cmp(&b))
    });
    for i in rest {
        if given >= capacity {
            break;
        }
        *out.entry(wants[i].0.clone()).or_default() += 1;
        given += 1;
    }
    out
}

impl super::Engine {
    /// Whether `waiting` holds more than one job's actions and fair order applies.
    fn shared(&self, waiting: &[Waiting<'_>]) -> bool {
        self.config.fair_share
            && waiting
                .first()
                .is_some_and(|first| waiting.iter().any(|w| w.job != first.job))
    }

    /// The CPU pool's waiting actions in weighted fair order by dominant share (cores or
    /// memory of the fleet that takes work).
    pub(crate) fn fair_cpu<'a>(&self, waiting: Vec<Waiting<'a>>) -> Vec<Waiting<'a>> {
        if !self.shared(&waiting) {
            return waiting;
        }
        let (cores, mem) = self
            .workers
            .iter()
            .filter(|(id, _)| self.takes_work(id))
            .fold((0u64, 0u64), |(c, m), (_, w)| {
                (c + u64::from(w.hb.cores), m + w.hb.mem_mb)
            });
        let (cores, mem) = (cores.max(1) as f64, mem.max(1) as f64);
        let used = self.job_use();
        let weights = &self.config.job_weights;
        fair_order(
            waiting,
            |w| w.job,
            |w| {
                let demand = w.cpu.map(|p| &p.demand);
                let c = demand.and_then(|d| d.cores).map_or(0, |r| r.min) as f64;
                let m = demand.map_or(0, |d| d.mem_mb) as f64;
                (c / cores).max(m / mem)
            },
            |job| {
                used.get(job).map_or(0.0, |u| {
                    (f64::from(u.cores) / cores).max(u.mem_mb as f64 / mem)
                })
            },
            |job| weight_of(weights, job),
        )
    }

    /// Queued commands (ids of queued `sandbox_exec`s, in queue order) in weighted fair
    /// order by the cores each job holds, for the re-sizing (`resize.rs`).
    pub(crate) fn fair_queued_execs<'a>(&self, queued: Vec<&'a ActionId>) -> Vec<&'a ActionId> {
        let items: Vec<(&'a ActionId, &JobId, u32)> = queued
            .iter()
            .map(|id| {
                let e = &self.actions[*id];
                let min = e.action.demand().cores.map_or(0, |r| r.min);
                (*id, &e.action.job, min)
            })
            .collect();
        let Some(first) = items.first().map(|i| i.1) else {
            return queued;
        };
        if !self.config.fair_share || items.iter().all(|i| i.1 == first) {
            return queued;
        }
        let used = self.job_use();
        let weights = &self.config.job_weights;
        fair_order(
            items,
            |i| i.1,
            |i| f64::from(i.2),
            |j| used.get(j).map_or(0.0, |u| f64::from(u.cores)),
            |j| weight_of(weights, j),
        )
        .into_iter()
        .map(|i| i.0)
        .collect()
    }

    /// The GPU pool's waiting reward calls in weighted fair order by the calls each job has
    /// running.
    pub(crate) fn fair_gpu<'a>(
        &self,
        waiting: Vec<Waiting<'a>>,
        running: &HashMap<&JobId, u32>,
    ) -> Vec<Waiting<'a>> {
        if !self.shared(&waiting) {
            return waiting;
        }
        let weights = &self.config.job_weights;
        fair_order(
            waiting,
            |w| w.job,
            |_| 1.0,
            |job| f64::from(running.get(job).copied().unwrap_or(0)),
            |job| weight_of(weights, job),
        )
    }

    /// Reward calls running, per job (none counted when neither fair order nor a cap needs
    /// them: one job waiting, no caps).
    pub(crate) fn gpu_running(&self, waiting: &[Waiting<'_>]) -> HashMap<&JobId, u32> {
        if !self.any_caps() && !self.shared(waiting) {
            return HashMap::new();
        }
        let mut running: HashMap<&JobId, u32> = HashMap::new();
        for e in self.actions.values() {
            if let Some((_, Booking::Gpu(_))) = e.placed() {
                *running.entry(&e.action.job).or_default() += 1;
            }
        }
        running
    }

    /// How many more reward calls each job with a `max_gpu_calls` cap among `waiting` may
    /// start now.
    pub(crate) fn gpu_room(
        &self,
        waiting: &[Waiting<'_>],
        running: &HashMap<&JobId, u32>,
    ) -> HashMap<JobId, u32> {
        let mut room = HashMap::new();
        if !self.any_caps() || waiting.is_empty() {
            return room;
        }
        for w in waiting {
            if room.contains_key(w.job) {
                continue;
            }
            if let Some(cap) = self.caps_of(w.job).max_gpu_calls {
                let now = running.get(w.job).copied().unwrap_or(0);
                room.insert(w.job.clone(), cap.saturating_sub(now));
            }
        }
        room
    }
}

impl super::Engine {
    /// How many more cores each job may widen into on each of `workers` under `tangram-v2`
    /// while more than one job wants that worker's cores: its [`entitlements`] share of the
    /// worker's cores, less what it holds there. A worker where fewer than two jobs want
    /// cores has no entry (widening there is the policy's alone): a command runs where its
    /// sandbox is, so only the jobs with commands on a worker compete for its cores.
    pub(crate) fn fair_headroom(
        &self,
        workers: &std::collections::BTreeSet<WorkerId>,
    ) -> HashMap<(WorkerId, JobId), u32> {
        let mut out = HashMap::new();
        if !self.config.fair_share {
            return out;
        }
        // Per worker and job: (what it holds, what it wants).
        let mut by_worker: HashMap<&WorkerId, HashMap<&JobId, (u32, u32)>> = HashMap::new();
        for e in self.actions.values() {
            let ActionSpec::SandboxExec(_) = &e.action.spec else {
                continue;
            };
            let (worker, held, more) = match e.placed() {
                Some((w, b)) => {
                    let held = b.counted_cores();
                    let max = e.action.demand().cores.map_or(held, |r| r.max);
                    (w, held, max.saturating_sub(held))
                }
                None => {
                    let key = (e.action.job.clone(), e.action.trajectory.clone());
                    let Some(s) = self.sandboxes.get(&key) else {
                        continue;
                    };
                    (&s.worker, 0, e.action.demand().cores.map_or(0, |r| r.min))
                }
            };
            if !workers.contains(worker) || held + more == 0 {
                continue;
            }
            let u = by_worker
                .entry(worker)
                .or_default()
                .entry(&e.action.job)
                .or_default();
            u.0 += held;
            u.1 += held + more;
        }
        let weights = &self.config.job_weights;
        for (worker, jobs) in by_worker {
            if jobs.len() < 2 {
                continue;
            }
            let cores = self.workers.get(worker).map_or(0, |w| w.hb.cores);
            let mut wants: Vec<(JobId, u32, f64)> = jobs
                .iter()
                .map(|(j, (_, want))| {
                    // A job never wants more than its cores cap lets it hold.
                    let want = match self.caps_of(j).max_cores {
                        Some(cap) => (*want).min(cap),
                        None => *want,
                    };
                    ((*j).clone(), want, weight_of(weights, j))
                })
                .collect();
            wants.sort_by(|a, b| a.0.cmp(&b.0));
            let shares = entitlements(cores, &wants);
            for (job, _, _) in wants {
                let held = jobs.get(&job).map_or(0, |u| u.0);
                let share = shares.get(&job).copied().unwrap_or(0);
                out.insert((worker.clone(), job), share.saturating_sub(held));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(s: &str) -> JobId {
        JobId::new(s).unwrap()
    }

    #[test]
    fn one_jobs_actions_keep_their_queue_order() {
        let items = vec![(job("a"), 3), (job("a"), 1), (job("a"), 2)];
        let out = fair_order(items.clone(), |i| &i.0, |_| 1.0, |_| 0.0, |_| 1.0);
        assert_eq!(out, items);
    }

    #[test]
    fn equal_jobs_alternate_from_the_oldest_and_a_job_holding_more_waits() {
        let items: Vec<(JobId, u32)> = [("a", 0), ("a", 1), ("a", 2), ("b", 3), ("b", 4)]
            .into_iter()
            .map(|(j, n)| (job(j), n))
            .collect();
        let order = |held_a: f64| -> Vec<u32> {
            fair_order(
                items.clone(),
                |i| &i.0,
                |_| 1.0,
                |j| if j.as_str() == "a" { held_a } else { 0.0 },
                |_| 1.0,
            )
            .into_iter()
            .map(|i| i.1)
            .collect()
        };
        assert_eq!(order(0.0), vec![0, 3, 1, 4, 2]);
        // a already holds two: b's go first.
        assert_eq!(order(2.0), vec![3, 4, 0, 1, 2]);
    }

    #[test]
    fn max_min_shares_follow_weights_and_give_what_one_leaves_to_the_others() {
        let w = |v: &[(&str, u32, f64)]| -> Vec<(JobId, u32, f64)> {
            v.iter().map(|(j, n, w)| (job(j), *n, *w)).collect()
        };
        let s = entitlements(16, &w(&[("a", 100, 3.0), ("b", 100, 1.0)]));
        assert_eq!((s[&job("a")], s[&job("b")]), (12, 4));
        // b wants only 2: a gets the rest.
        let s = entitlements(16, &w(&[("a", 100, 1.0), ("b", 2, 1.0)]));
        assert_eq!((s[&job("a")], s[&job("b")]), (14, 2));
        // Three equal jobs share 16: 6, 5, 5 (whole cores, none lost or given twice).
        let s = entitlements(16, &w(&[("a", 9, 1.0), ("b", 9, 1.0), ("c", 9, 1.0)]));
        let mut got: Vec<u32> = s.values().copied().collect();
        got.sort_unstable();
        assert_eq!(got, vec![5, 5, 6]);
        // Wanting less than there is: everyone gets what they want.
        let s = entitlements(16, &w(&[("a", 3, 1.0), ("b", 4, 9.0)]));
        assert_eq!((s[&job("a")], s[&job("b")]), (3, 4));
    }
}
