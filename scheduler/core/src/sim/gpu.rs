//! The simulator's GPU side: the `mopd` workload (teacher calls on GPU services) and its two
//! deployments, run by the scheduler's decision engine on a virtual clock
//! ([`crate::sim`]): Evict-on-Execution on a shared pool (`tangram`), or the `static`
//! baseline's fixed resident replicas per service (the paper's SGLang baseline).
//!
//! A reward action waits until its service has a replica with a free slot; routing it may
//! restore the replica (overhead: the service's restore time) and evict idle ones, least
//! recently used first.

use crate::gpu::ServiceSpec;
use crate::sim::{Rng, SimCall, SimReport, SimStep, SimTrajectory, Workload};

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

impl GpuWorkload {
    /// The same trajectories as the simulator's general workload: reward steps on `gpus`.
    fn to_workload(&self, gpus: Vec<Vec<u8>>) -> Workload {
        Workload {
            trajectories: self
                .trajectories
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let steps = t
                        .steps
                        .iter()
                        .map(|s| {
                            let call = SimCall::Reward {
                                service: s.service.clone(),
                            };
                            SimStep::call(s.think_ms, call, s.exec_ms)
                        })
                        .collect();
                    SimTrajectory::numbered(i, &t.job, t.start_ms, steps)
                })
                .collect(),
            services: self.services.clone(),
            gpus,
            ..Default::default()
        }
    }
}

/// Runs the workload with the services deployed as `mode` says, through the scheduler's
/// decision engine: `Pooled` is the `tangram` policy (Evict-on-Execution) on the first `gpus`
/// GPUs; `Static` is the `static` baseline, which pins an even split of the GPUs, here
/// `gpus_per_service` times the services. The report's resource unit is GPUs: reserved
/// GPU-ms are the GPUs held by resident replicas over time, used GPU-ms the execution time
/// each action took of its replica (its share of the replica's slots).
pub fn simulate_gpu(w: &GpuWorkload, mode: GpuMode, name: &str) -> (SimReport, GpuStats) {
    simulate_gpu_with(w, mode, "tangram", name)
}

/// [`simulate_gpu`] with `pooled` (`tangram` or `tangram-v2`) deciding the pooled mode.
pub fn simulate_gpu_with(
    w: &GpuWorkload,
    mode: GpuMode,
    pooled: &str,
    name: &str,
) -> (SimReport, GpuStats) {
    let (policy, gpus) = match mode {
        GpuMode::Pooled { gpus } => (pooled, w.nodes_limited(gpus)),
        GpuMode::Static { gpus_per_service } => (
            "static",
            w.nodes_limited(crate::gpu::static_gpus(
                gpus_per_service,
                w.services.iter().map(|s| s.gpus),
            )),
        ),
    };
    let policy = crate::by_name(policy).expect("a built-in policy");
    let (mut report, stats) = crate::sim::run_stats(
        &w.to_workload(gpus),
        policy.as_ref(),
        crate::sim::Elasticity::Oracle,
    );
    report.policy = name.to_string();
    report.unit = "gpu";
    report.pool_cores = stats.gpus;
    report.reserved_core_ms = stats.gpu_reserved_ms;
    report.used_core_ms = stats.gpu_used_ms;
    report.utilisation = stats.gpu_utilisation.clone();
    let gpu = GpuStats {
        restores: stats.restores,
        evictions: stats.evictions,
        gpus: stats.gpus,
        unserved: stats.unserved,
    };
    (report, gpu)
}

/// How close to static's mean ACT a pooled run must come to "match" it: within 10%.
pub const MATCH_TOLERANCE: f64 = 0.10;

/// Whether a pooled run (its mean ACT and counters) served every call with a mean ACT within
/// [`MATCH_TOLERANCE`] of `target_s` (static's mean ACT): the rule of `--gpu-sweep` and of
/// the calibration maps.
pub fn matches_static(mean_act_s: f64, stats: &GpuStats, target_s: f64) -> bool {
    stats.unserved == 0 && mean_act_s <= target_s * (1.0 + MATCH_TOLERANCE)
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
    fn tangram_v2_rebalances_teachers_and_beats_tangram_on_a_tight_pool() {
        let w = Mopd {
            batch: 768,
            seed: 1,
        }
        .generate();
        let pool = GpuMode::Pooled { gpus: 6 };
        let (v2, v2_stats) = simulate_gpu_with(&w, pool, "tangram-v2", "v2");
        let (t, t_stats) = simulate_gpu(&w, pool, "tangram");
        let (v2, t) = (v2.summary(), t.summary());
        assert_eq!(v2.actions, t.actions);
        assert!(
            v2.mean_act_s < 0.9 * t.mean_act_s,
            "{} vs {}",
            v2.mean_act_s,
            t.mean_act_s
        );
        assert!(v2.p99_act_s <= t.p99_act_s);
        // It gets there by moving replicas between teachers.
        assert!(v2_stats.evictions > 0 && t_stats.evictions > 0);
    }

    #[test]
    fn the_timeline_follows_each_teachers_gpus_and_counts_restores_and_evictions() {
        use crate::sim::Track;
        let w = Mopd {
            batch: 300,
            seed: 3,
        }
        .generate();
        let (r, stats) = simulate_gpu(&w, GpuMode::Pooled { gpus: 4 }, "tangram");
        let t = &r.timeline;
        let resident: Vec<Vec<(f64, f64)>> = Mopd::services()
            .iter()
            .map(|s| t.series(&Track::Resident(s.name.clone())))
            .collect();
        // Every teacher was resident at some point, and together they never hold more
        // than the pool.
        assert!(resident.iter().all(|s| s.iter().any(|p| p.1 > 0.0)));
        let bins = resident.iter().map(Vec::len).max().unwrap();
        for i in 0..bins {
            let sum: f64 = resident.iter().filter_map(|s| s.get(i)).map(|p| p.1).sum();
            assert!(
                sum <= 4.0 + 1e-9,
                "bin {i}: {sum} GPUs resident in a pool of 4"
            );
        }
        let total =
            |track: Track| -> f64 { t.series(&track).iter().map(|p| p.1 * t.bin_ms / 1e3).sum() };
        assert!((total(Track::Restores) - stats.restores as f64).abs() < 1e-6);
        assert!((total(Track::Evictions) - stats.evictions as f64).abs() < 1e-6);
        // Static pins its replicas: flat at 1 GPU per teacher, no restores.
        let (s, _) = simulate_gpu(
            &w,
            GpuMode::Static {
                gpus_per_service: 1,
            },
            "static",
        );
        let flat = s.timeline.series(&Track::Resident("teacher-0".into()));
        assert!(flat.iter().all(|p| (p.1 - 1.0).abs() < 1e-9), "{flat:?}");
        assert!(s.timeline.series(&Track::Restores).is_empty());
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
