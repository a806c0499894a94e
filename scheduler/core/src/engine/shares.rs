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
//! of the fleet's memory (its sandboxes and commands). Of the GPU pool, the reward calls it
//! has running. API quota has its own weighted shares (`pools/api.rs`). Weights are the
//! operator's `job_weights` (default 1), the same weights API quota is shared by.
//!
//! Fair order decides who gets what frees up; it takes nothing back from what a job already
//! holds. Widening under `tangram-v2` follows [`entitlements`]: a job whose share is
//! wanted by another widens only up to its weighted max-min share of the fleet's cores.

use super::lifecycle::Booking;
use super::pools::Waiting;
use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap, VecDeque};
use tangram_shared::{ActionSpec, JobId};

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

    /// The GPU pool's waiting reward calls in weighted fair order by the calls each job has
    /// running, less those of a job at its cap of calls running at once (`max_gpu_calls`),
    /// which wait.
    pub(crate) fn fair_gpu<'a>(&self, waiting: Vec<Waiting<'a>>) -> Vec<Waiting<'a>> {
        let capped = self.any_caps();
        if !capped && !self.shared(&waiting) {
            return waiting;
        }
        let mut running: HashMap<&JobId, f64> = HashMap::new();
        for e in self.actions.values() {
            if let Some((_, Booking::Gpu(_))) = e.placed() {
                *running.entry(&e.action.job).or_default() += 1.0;
            }
        }
        let waiting = if capped {
            let mut room: HashMap<&JobId, Option<u32>> = HashMap::new();
            waiting
                .into_iter()
                .filter(|w| {
                    let left = room.entry(w.job).or_insert_with(|| {
                        self.caps_of(w.job).max_gpu_calls.map(|cap| {
                            let now = running.get(w.job).copied().unwrap_or(0.0) as u32;
                            cap.saturating_sub(now)
                        })
                    });
                    match left {
                        None => true,
                        Some(0) => false,
                        Some(n) => {
                            *n -= 1;
                            true
                        }
                    }
                })
                .collect()
        } else {
            waiting
        };
        if !self.shared(&waiting) {
            return waiting;
        }
        let weights = &self.config.job_weights;
        fair_order(
            waiting,
            |w| w.job,
            |_| 1.0,
            |job| running.get(job).copied().unwrap_or(0.0),
            |job| weight_of(weights, job),
        )
    }
}

impl super::Engine {
    /// How many more cores each job may widen into under `tangram-v2` while more than one
    /// job wants cores: its [`entitlements`] share of the fleet's cores, less what it holds.
    /// `None` when fewer than two jobs want cores (widening is then the policy's alone).
    pub(crate) fn fair_headroom(&self) -> Option<HashMap<JobId, u32>> {
        if !self.config.fair_share {
            return None;
        }
        let used = self.job_use();
        // What each job wants: what it holds, widened to the most its elastic commands
        // take, and the least its queued commands need.
        let mut wants: HashMap<&JobId, u32> = HashMap::new();
        for (job, u) in &used {
            wants.insert(job, u.cores);
        }
        for e in self.actions.values() {
            let ActionSpec::SandboxExec(_) = &e.action.spec else {
                continue;
            };
            let Some(range) = e.action.demand().cores else {
                continue;
            };
            let more = match e.placed() {
                Some((_, b)) if b.counted_cores() > 0 => {
                    range.max.saturating_sub(b.counted_cores())
                }
                Some(_) => 0,
                None => range.min,
            };
            *wants.entry(&e.action.job).or_default() += more;
        }
        // A job never wants more than its cores cap lets it hold.
        for (job, n) in wants.iter_mut() {
            if let Some(cap) = self.caps_of(job).max_cores {
                *n = (*n).min(cap);
            }
        }
        if wants.values().filter(|&&w| w > 0).count() < 2 {
            return None;
        }
        let cores: u32 = self
            .workers
            .iter()
            .filter(|(id, _)| self.takes_work(id))
            .map(|(_, w)| w.hb.cores)
            .sum();
        let weights = &self.config.job_weights;
        let mut wants: Vec<(JobId, u32, f64)> = wants
            .into_iter()
            .map(|(j, n)| (j.clone(), n, weight_of(weights, j)))
            .collect();
        wants.sort_by(|a, b| a.0.cmp(&b.0));
        let shares = entitlements(cores, &wants);
        Some(
            wants
                .into_iter()
                .map(|(job, _, _)| {
                    let held = used.get(&job).map_or(0, |u| u.cores);
                    let share = shares.get(&job).copied().unwrap_or(0);
                    (job, share.saturating_sub(held))
                })
                .collect(),
        )
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
