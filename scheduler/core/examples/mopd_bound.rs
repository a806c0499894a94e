//! How few GPUs could any pooled policy use on `mopd`? Two relaxations of the problem the
//! scheduler solves, on the same generated workload (`cargo run --release -p tangram-core
//! --example mopd_bound`):
//!
//! - **pooled slots**: every GPU's 8 slots serve any teacher (no replicas, no restores), calls
//!   served oldest first. Only the total capacity binds.
//! - **ideal replicas**: a replica serves one teacher, as in the real system, but moves between
//!   teachers at once and for free: each teacher holds exactly the replicas its calls in
//!   flight need (ceil(calls / 8)), and a waiting call takes a spare GPU the moment one exists.
//!   Two dispatch rules: the oldest call first, or the teacher with the most calls waiting
//!   first.
//!
//! Mean ACT is reported over the calls' mean execution time (what the static deployment of
//! 36 GPUs achieves, since no call waits there). The ideal-replicas figures are not a proof
//! that no policy does better (another dispatch rule might); they show what free, instant
//! replica moves buy under two natural rules, before any restore is paid.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use tangram_core::sim_gpu::{GpuWorkload, Mopd};

/// A time in ms that orders totally (the workload's times are finite).
#[derive(Debug, PartialEq, Clone, Copy)]
struct Ms(f64);
impl Eq for Ms {}
impl PartialOrd for Ms {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Ms {
    fn cmp(&self, o: &Self) -> Ordering {
        self.0.total_cmp(&o.0)
    }
}

/// What happens to trajectory `.2` at time `.0`: its call arrives (`false`) or ends (`true`).
type Event = Reverse<(Ms, bool, usize)>;

/// How calls get capacity: `admit(service)` says whether a call of `service` may start now,
/// booking what it takes; `release` gives it back when the call ends.
trait Capacity {
    fn admit(&mut self, service: usize) -> bool;
    fn release(&mut self, service: usize);
}

/// Every GPU's slots shared by all teachers.
struct PooledSlots {
    free: usize,
}

impl Capacity for PooledSlots {
    fn admit(&mut self, _: usize) -> bool {
        let ok = self.free > 0;
        self.free -= usize::from(ok);
        ok
    }
    fn release(&mut self, _: usize) {
        self.free += 1;
    }
}

/// Replicas of one teacher each, re-assigned at once and for free.
struct IdealReplicas {
    gpus: usize,
    slots: usize,
    in_flight: Vec<usize>,
}

impl IdealReplicas {
    fn held(&self, s: usize) -> usize {
        self.in_flight[s].div_ceil(self.slots)
    }
}

impl Capacity for IdealReplicas {
    fn admit(&mut self, s: usize) -> bool {
        let used: usize = (0..self.in_flight.len()).map(|k| self.held(k)).sum();
        let ok = self.in_flight[s] < self.held(s) * self.slots || used < self.gpus;
        self.in_flight[s] += usize::from(ok);
        ok
    }
    fn release(&mut self, s: usize) {
        self.in_flight[s] -= 1;
    }
}

fn teacher(name: &str) -> usize {
    name.trim_start_matches("teacher-")
        .parse()
        .expect("teacher-<k>")
}

/// Which waiting call is offered capacity first.
#[derive(Clone, Copy)]
enum Order {
    /// The oldest.
    Oldest,
    /// The oldest of the teacher with the most calls waiting (a spare GPU goes where the
    /// queue is longest).
    LongestQueue,
}

/// Mean ACT in ms: trajectories think, call, wait for capacity (in `order`), run.
fn mean_act_ms(w: &GpuWorkload, cap: &mut dyn Capacity, order: Order) -> f64 {
    let mut events: BinaryHeap<Event> = BinaryHeap::new();
    for (i, t) in w.trajectories.iter().enumerate() {
        events.push(Reverse((Ms(t.start_ms + t.steps[0].think_ms), false, i)));
    }
    let mut step = vec![0usize; w.trajectories.len()];
    let mut arrived = vec![0.0f64; w.trajectories.len()];
    let mut waiting: Vec<usize> = Vec::new();
    let (mut total, mut calls) = (0.0, 0usize);
    while let Some(Reverse((Ms(now), ends, i))) = events.pop() {
        let t = &w.trajectories[i];
        if ends {
            cap.release(teacher(&t.steps[step[i]].service));
            total += now - arrived[i];
            calls += 1;
            step[i] += 1;
            if let Some(next) = t.steps.get(step[i]) {
                events.push(Reverse((Ms(now + next.think_ms), false, i)));
            }
        } else {
            arrived[i] = now;
            waiting.push(i);
        }
        if let Order::LongestQueue = order {
            let mut queued = [0usize; Mopd::TEACHERS];
            for &j in &waiting {
                queued[teacher(&w.trajectories[j].steps[step[j]].service)] += 1;
            }
            // Stable: within a teacher, oldest first.
            waiting.sort_by_key(|&j| {
                Reverse(queued[teacher(&w.trajectories[j].steps[step[j]].service)])
            });
        }
        waiting.retain(|&j| {
            let s = &w.trajectories[j].steps[step[j]];
            let start = cap.admit(teacher(&s.service));
            if start {
                events.push(Reverse((Ms(now + s.exec_ms), true, j)));
            }
            !start
        });
    }
    total / calls as f64
}

fn main() {
    let sizes = [8usize, 9, 10, 11, 12];
    println!("mean ACT over the no-wait mean (static's), mopd B=2048");
    println!(
        "{:<6} {:<16} {}",
        "seed",
        "relaxation",
        sizes.map(|g| format!("{g:>7} GPUs")).join("")
    );
    for seed in 1..=3u64 {
        let w = Mopd { batch: 2048, seed }.generate();
        let free = mean_act_ms(&w, &mut PooledSlots { free: usize::MAX }, Order::Oldest);
        let row =
            |f: &dyn Fn(usize) -> f64| sizes.map(|g| format!("{:>11.3}x", f(g) / free)).join("");
        let pooled = row(&|g| mean_act_ms(&w, &mut PooledSlots { free: 8 * g }, Order::Oldest));
        let ideal = |order: Order| {
            row(&|g| {
                let mut c = IdealReplicas {
                    gpus: g,
                    slots: Mopd::SLOTS as usize,
                    in_flight: vec![0; Mopd::TEACHERS],
                };
                mean_act_ms(&w, &mut c, order)
            })
        };
        let (oldest, longest) = (ideal(Order::Oldest), ideal(Order::LongestQueue));
        println!("{seed:<6} {:<16} {pooled}", "pooled slots");
        println!("{seed:<6} {:<16} {oldest}", "ideal, oldest");
        println!("{seed:<6} {:<16} {longest}", "ideal, longest q");
    }
}
