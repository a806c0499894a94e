//! The simulator's GPU side: reward and teacher actions served by the Evict-on-Execution
//! manager ([`crate::gpu::Eoe`], the same code the scheduler runs) or by a static deployment
//! (fixed resident replicas per service, the paper's SGLang baseline), on a virtual clock.
//!
//! Trajectories are closed loops as on the CPU side. A reward action waits in a FIFO queue
//! until its service has a replica with a free slot; routing it may restore the replica
//! (overhead: the service's restore time) and evict idle ones, least recently used first.

use crate::gpu::{Eoe, ServiceSpec};
use crate::sim::{ActionRecord, Rng, SimReport, Timed};
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use tangram_shared::WorkerId;

/// One step of a GPU trajectory: think, then call a service.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuStep {
    /// Time before the call, ms.
    pub think_ms: f64,
    /// The service called.
    pub service: String,
    /// Execution time on a resident replica, ms.
    pub exec_ms: f64,
}

/// One trajectory.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuTrajectory {
    /// Its job.
    pub job: String,
    /// When it starts, ms.
    pub start_ms: f64,
    /// Its steps.
    pub steps: Vec<GpuStep>,
}

/// A GPU workload: trajectories, the services and the nodes' NVLink groups.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuWorkload {
    /// The trajectories.
    pub trajectories: Vec<GpuTrajectory>,
    /// The services.
    pub services: Vec<ServiceSpec>,
    /// Per node, the sizes of its GPU groups.
    pub nodes: Vec<Vec<u8>>,
}

/// How the services are deployed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuMode {
    /// Evict-on-Execution over the first `gpus` GPUs of the cluster (all of them if larger).
    Pooled {
        /// GPUs in the pool.
        gpus: u32,
    },
    /// Each service holds `gpus_per_service` GPUs of resident replicas for the whole run.
    Static {
        /// GPUs per service.
        gpus_per_service: u32,
    },
}

impl GpuWorkload {
    /// GPUs in the cluster.
    pub fn total_gpus(&self) -> u32 {
        self.nodes.iter().flatten().map(|&g| g as u32).sum()
    }

    /// The nodes cut down to the first `gpus` GPUs (groups shrink to the largest chunk size
    /// that still fits, so every remaining group stays aligned).
    fn nodes_limited(&self, gpus: u32) -> Vec<Vec<u8>> {
        let mut left = gpus;
        let mut out = Vec::new();
        for node in &self.nodes {
            let mut groups = Vec::new();
            for &g in node {
                let mut take = (g as u32).min(left) as u8;
                while take > 0 {
                    let chunk = [8u8, 4, 2, 1].into_iter().find(|&c| c <= take).unwrap_or(1);
                    groups.push(chunk);
                    take -= chunk;
                    left -= chunk as u32;
                }
            }
            if !groups.is_empty() {
                out.push(groups);
            }
        }
        out
    }
}

type Ev = Timed<EvKind>;
#[derive(Debug, PartialEq)]
enum EvKind {
    Arrive(usize),
    Done { t: usize, replica: usize },
}

/// Extra figures of a GPU run.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuStats {
    /// Restores performed.
    pub restores: u64,
    /// Evictions performed.
    pub evictions: u64,
    /// GPUs in the pool (or pinned, for static).
    pub gpus: u32,
    /// Actions never served: their service cannot be placed in this pool at all.
    pub unserved: u64,
}

/// Runs the workload with the services deployed as `mode` says. The report's resource unit
/// is GPUs: reserved GPU-ms are the GPUs held by resident replicas over time, used GPU-ms the
/// execution time each action took of its replica (its share of the replica's slots).
pub fn simulate_gpu(w: &GpuWorkload, mode: GpuMode, name: &str) -> (SimReport, GpuStats) {
    let mut eoe = Eoe::new(w.services.iter().cloned());
    let nodes = match mode {
        GpuMode::Pooled { gpus } => w.nodes_limited(gpus),
        GpuMode::Static { .. } => w.nodes.clone(),
    };
    for (i, groups) in nodes.iter().enumerate() {
        eoe.set_node(
            &WorkerId::new(format!("g{i:03}")).expect("valid id"),
            groups,
            true,
        );
    }
    let pool: u32 = match mode {
        GpuMode::Pooled { .. } => nodes.iter().flatten().map(|&g| g as u32).sum(),
        GpuMode::Static { gpus_per_service } => {
            let _short = eoe.pin(gpus_per_service);
            eoe.gpus().1
        }
    };
    let slots: BTreeMap<&str, u32> = w
        .services
        .iter()
        .map(|s| (s.name.as_str(), s.slots))
        .collect();
    let mut heap = BinaryHeap::new();
    let mut seq = 0u64;
    let mut next = vec![0usize; w.trajectories.len()];
    let mut due = vec![0f64; w.trajectories.len()];
    for (i, t) in w.trajectories.iter().enumerate() {
        if let Some(s) = t.steps.first() {
            heap.push(Ev {
                at_ms: t.start_ms + s.think_ms,
                seq,
                kind: EvKind::Arrive(i),
            });
            seq += 1;
        }
    }
    // Waiting actions per service, FIFO; services are tried in the order of their oldest.
    let mut waiting: BTreeMap<String, VecDeque<usize>> = BTreeMap::new();
    let mut report = SimReport {
        policy: name.to_string(),
        actions: Vec::new(),
        step_time_ms: 0.0,
        reserved_core_ms: 0.0,
        used_core_ms: 0.0,
        utilisation: Vec::new(),
        pool_cores: pool,
        unit: "gpu",
    };
    let mut stats = GpuStats {
        restores: 0,
        evictions: 0,
        gpus: pool,
        unserved: 0,
    };
    let first = w
        .trajectories
        .iter()
        .map(|t| t.start_ms)
        .fold(f64::INFINITY, f64::min);
    let mut last_end = 0f64;
    let mut last_t = if first.is_finite() { first } else { 0.0 };
    let mut held = if matches!(mode, GpuMode::Static { .. }) {
        pool
    } else {
        0
    };
    while let Some(ev) = heap.pop() {
        let now = ev.at_ms;
        report.reserved_core_ms += held as f64 * (now - last_t);
        last_t = now;
        let mut batch = vec![ev];
        while heap.peek().is_some_and(|e| e.at_ms <= now) {
            batch.push(heap.pop().expect("peeked"));
        }
        for ev in batch {
            match ev.kind {
                EvKind::Arrive(t) => {
                    due[t] = now;
                    let svc = &w.trajectories[t].steps[next[t]].service;
                    waiting.entry(svc.clone()).or_default().push_back(t);
                }
                EvKind::Done { t, replica } => {
                    eoe.finish(replica, now as u64);
                    next[t] += 1;
                    let tr = &w.trajectories[t];
                    if let Some(s) = tr.steps.get(next[t]) {
                        heap.push(Ev {
                            at_ms: now + s.think_ms,
                            seq,
                            kind: EvKind::Arrive(t),
                        });
                        seq += 1;
                    } else {
                        last_end = last_end.max(now);
                    }
                }
            }
        }
        // Route: oldest waiting action first, per service until that service is busy.
        let mut order: Vec<(f64, String)> = waiting
            .iter()
            .filter_map(|(s, q)| q.front().map(|&t| (due[t], s.clone())))
            .collect();
        order.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        for (_, svc) in order {
            let q = waiting.get_mut(&svc).expect("listed");
            while let Some(&t) = q.front() {
                match eoe.route_with_backlog(&svc, now as u64, q.len() as u32) {
                    Ok(r) => {
                        q.pop_front();
                        let step = &w.trajectories[t].steps[next[t]];
                        let overhead = (r.ready_at_ms as f64 - now).max(0.0);
                        stats.restores += r.restore as u64;
                        stats.evictions += r.evict.len() as u64;
                        report.actions.push(ActionRecord {
                            queue_ms: now - due[t],
                            exec_ms: step.exec_ms,
                            overhead_ms: overhead,
                            cores: r.chunk.len as u32,
                        });
                        report.used_core_ms +=
                            step.exec_ms * r.chunk.len as f64 / slots[svc.as_str()].max(1) as f64;
                        heap.push(Ev {
                            at_ms: now + overhead + step.exec_ms,
                            seq,
                            kind: EvKind::Done {
                                t,
                                replica: r.replica,
                            },
                        });
                        seq += 1;
                    }
                    Err(crate::gpu::Unrouted::Busy { .. }) => break,
                    Err(_) => {
                        // Never servable here: the trajectory stops, and the run says so.
                        stats.unserved += q.len() as u64;
                        q.clear();
                    }
                }
            }
        }
        waiting.retain(|_, q| !q.is_empty());
        if matches!(mode, GpuMode::Pooled { .. }) {
            held = eoe.gpus().1;
        }
        if pool > 0 {
            report.utilisation.push((now, held as f64 / pool as f64));
        }
    }
    report.step_time_ms = if first.is_finite() {
        last_end - first
    } else {
        0.0
    };
    (report, stats)
}

/// Parameters of the `mopd` generator: multi-teacher on-policy distillation.
///
/// Calibrated to the paper's published characteristics: 9 teacher services of uneven
/// popularity (Zipf, exponent 1: the most popular gets about 35% of the calls, the least
/// about 4%); a call takes about 0.62 s on a resident replica (log-normal, median 0.6 s,
/// sigma 0.25); restoring a teacher from host memory takes 0.2 s; the static baseline is
/// 4 GPUs per teacher (36); the cluster is 5 nodes x 8 GPUs. Each trajectory belongs to one
/// task domain and so calls one teacher, 2 to 4 times, after generating for a log-normal
/// think time (median 21 s, sigma 0.5); a replica is 1 GPU and batches 8 calls at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mopd {
    /// Trajectories (the RL batch).
    pub batch: usize,
    /// Seed.
    pub seed: u64,
}

impl Mopd {
    /// Teachers.
    pub const TEACHERS: usize = 9;
    /// GPUs per teacher replica.
    pub const GPUS_PER_TEACHER: u8 = 1;
    /// Calls one replica batches at once.
    pub const SLOTS: u32 = 8;
    /// The paper's static deployment: 4 GPUs per teacher (here 4 replicas), 36 in all.
    pub const STATIC_GPUS_PER_TEACHER: u32 = 4;

    /// The services: `teacher-0` (most popular) to `teacher-8`.
    pub fn services() -> Vec<ServiceSpec> {
        (0..Self::TEACHERS)
            .map(|i| ServiceSpec {
                name: format!("teacher-{i}"),
                gpus: Self::GPUS_PER_TEACHER,
                restore_ms: 200,
                slots: Self::SLOTS,
            })
            .collect()
    }

    /// The default cluster: 5 nodes x 8 GPUs in one NVLink group each.
    pub fn nodes() -> Vec<Vec<u8>> {
        vec![vec![8]; 5]
    }

    /// Generates the workload.
    pub fn generate(&self) -> GpuWorkload {
        let mut rng = Rng::new(self.seed ^ 0x6d6f_7064);
        let weights: Vec<f64> = (1..=Self::TEACHERS).map(|k| 1.0 / k as f64).collect();
        let total: f64 = weights.iter().sum();
        let trajectories = (0..self.batch)
            .map(|_| {
                let mut u = rng.unit() * total;
                let mut teacher = Self::TEACHERS - 1;
                for (i, wt) in weights.iter().enumerate() {
                    if u < *wt {
                        teacher = i;
                        break;
                    }
                    u -= wt;
                }
                let turns = 2 + (rng.next_u64() % 3) as usize;
                GpuTrajectory {
                    job: "mopd".into(),
                    start_ms: 0.0,
                    steps: (0..turns)
                        .map(|_| GpuStep {
                            think_ms: rng.lognormal(21_000.0, 0.5),
                            service: format!("teacher-{teacher}"),
                            exec_ms: rng.lognormal(600.0, 0.25),
                        })
                        .collect(),
                }
            })
            .collect();
        GpuWorkload {
            trajectories,
            services: Self::services(),
            nodes: Self::nodes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_report_and_static_never_restores() {
        let w = Mopd {
            batch: 300,
            seed: 3,
        }
        .generate();
        let a = simulate_gpu(&w, GpuMode::Pooled { gpus: 4 }, "tangram");
        let b = simulate_gpu(&w, GpuMode::Pooled { gpus: 4 }, "tangram");
        assert_eq!(a, b);
        let s = simulate_gpu(
            &w,
            GpuMode::Static {
                gpus_per_service: 1,
            },
            "static",
        );
        assert_eq!(s.1.restores, 0);
        assert_eq!(s.1.gpus, 9);
        assert!(a.1.restores >= 9, "every teacher is restored at least once");
        let n: usize = w.trajectories.iter().map(|t| t.steps.len()).sum();
        assert_eq!(a.0.actions.len(), n);
        assert_eq!(s.0.actions.len(), n);
        assert!(s.0.actions.iter().all(|r| r.overhead_ms == 0.0));
    }

    #[test]
    fn fewer_gpus_never_help() {
        let w = Mopd {
            batch: 600,
            seed: 1,
        }
        .generate();
        let mean = |g| {
            let r = simulate_gpu(&w, GpuMode::Pooled { gpus: g }, "t")
                .0
                .summary();
            r.mean_act_s
        };
        assert!(mean(2) > mean(12));
    }
}
