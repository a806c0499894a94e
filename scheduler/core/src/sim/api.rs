//! The simulator's API side: DeepSearch-style trajectories calling a rate-limited search
//! provider, then an LLM judge on GPUs. The provider's quota is either pooled across all
//! trajectories ([`crate::quota::Quota`], the scheduler's own code) or sliced evenly per
//! trajectory (the per-trajectory limiters frameworks use today, the paper's baseline).

use crate::gpu::ServiceSpec;
use crate::quota::ProviderQuota;
use crate::sim::{Rng, SimCall, SimReport, SimStep, SimTrajectory, Workload};

/// What a step calls.
#[derive(Debug, Clone, PartialEq)]
pub enum ApiCall {
    /// One request to the search provider, answered after `latency_ms`.
    Search {
        /// The provider's latency, ms.
        latency_ms: f64,
    },
    /// One judge call on the GPU service.
    Judge {
        /// Execution on a resident replica, ms.
        exec_ms: f64,
    },
}

/// One step: think, then call.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiStep {
    /// Generation time before the call, ms.
    pub think_ms: f64,
    /// The call.
    pub call: ApiCall,
}

/// One trajectory.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiTrajectory {
    /// Its job.
    pub job: String,
    /// When it starts, ms.
    pub start_ms: f64,
    /// Its steps.
    pub steps: Vec<ApiStep>,
}

/// A DeepSearch-style workload.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiWorkload {
    /// The trajectories.
    pub trajectories: Vec<ApiTrajectory>,
    /// The search provider's quota.
    pub provider: ProviderQuota,
    /// The judge service.
    pub judge: ServiceSpec,
    /// GPUs for the judge (NVLink groups per node); the judge is deployed on all of them.
    pub gpus: Vec<Vec<u8>>,
}

/// How the provider's quota is shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaMode {
    /// One pool for every trajectory (Tangram).
    Pooled,
    /// Each trajectory gets rate / N and a burst of 1 of its own; the provider's
    /// concurrency cap still holds for everyone (the provider enforces it), first come first
    /// served.
    PerTrajectory,
}

impl ApiWorkload {
    /// The same trajectories as the simulator's general workload.
    fn to_workload(&self) -> Workload {
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
                            let (call, t1_ms) = match s.call {
                                ApiCall::Search { latency_ms } => (
                                    SimCall::Api {
                                        provider: self.provider.name.clone(),
                                    },
                                    latency_ms,
                                ),
                                ApiCall::Judge { exec_ms } => (
                                    SimCall::Reward {
                                        service: self.judge.name.clone(),
                                    },
                                    exec_ms,
                                ),
                            };
                            SimStep::call(s.think_ms, call, t1_ms)
                        })
                        .collect();
                    SimTrajectory::numbered(i, &t.job, t.start_ms, steps)
                })
                .collect(),
            services: vec![self.judge.clone()],
            gpus: self.gpus.clone(),
            providers: vec![self.provider.clone()],
            ..Default::default()
        }
    }
}

/// Runs the workload with the quota shared as `mode` says, through the scheduler's decision
/// engine: `Pooled` is the `tangram` policy (one pooled quota, the judge under
/// Evict-on-Execution), `PerTrajectory` the `static` baseline (rate / N per trajectory, the
/// judge pinned on the GPUs).
pub fn simulate_api(w: &ApiWorkload, mode: QuotaMode, name: &str) -> SimReport {
    simulate_api_with(w, mode, "tangram", name)
}

/// [`simulate_api`] with `pooled` (`tangram` or `tangram-v2`) deciding the pooled mode.
pub fn simulate_api_with(w: &ApiWorkload, mode: QuotaMode, pooled: &str, name: &str) -> SimReport {
    let policy = match mode {
        QuotaMode::Pooled => pooled,
        QuotaMode::PerTrajectory => "static",
    };
    let policy = crate::by_name(policy).expect("a built-in policy");
    let workload = w.to_workload();
    let (mut report, _) =
        crate::sim::run_stats(&workload, policy.as_ref(), crate::sim::Elasticity::Oracle);
    report.policy = name.to_string();
    report.unit = "api";
    report.pool_cores = w.provider.concurrency;
    report.reserved_core_ms = 0.0;
    // One unit of work per search call.
    report.used_core_ms = w
        .trajectories
        .iter()
        .flat_map(|t| &t.steps)
        .filter(|s| matches!(s.call, ApiCall::Search { .. }))
        .count() as f64;
    report
}

/// Parameters of the `deepsearch` generator.
///
/// Calibrated to the paper's published characteristics: batch 2048, agentic web search with
/// an LLM judge as reward (GRPO). Each trajectory makes 4 to 12 search calls, each after a
/// generation time (log-normal, median 6 s, sigma 0.6), the search answering in a log-normal
/// median 0.8 s (sigma 0.5); then one judge call (0.6 s on a resident replica). The default
/// provider allows 200 requests/s, burst 50, 256 concurrent connections (enough that the
/// rate, not the connections, is the limit); the judge has 8 GPUs (one node).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeepSearch {
    /// Trajectories.
    pub batch: usize,
    /// Seed.
    pub seed: u64,
}

impl DeepSearch {
    /// The default provider.
    pub fn provider() -> ProviderQuota {
        ProviderQuota {
            name: "search".into(),
            rate_per_s: 200.0,
            burst: 50,
            concurrency: 256,
            slow_ms: None,
        }
    }

    /// Generates the workload.
    pub fn generate(&self) -> ApiWorkload {
        let mut rng = Rng::new(self.seed ^ 0x0064_7365_6172_6368);
        let trajectories = (0..self.batch)
            .map(|_| {
                let calls = 4 + (rng.next_u64() % 9) as usize;
                let mut steps: Vec<ApiStep> = (0..calls)
                    .map(|_| ApiStep {
                        think_ms: rng.lognormal(6_000.0, 0.6),
                        call: ApiCall::Search {
                            latency_ms: rng.lognormal(800.0, 0.5),
                        },
                    })
                    .collect();
                steps.push(ApiStep {
                    think_ms: rng.lognormal(6_000.0, 0.6),
                    call: ApiCall::Judge {
                        exec_ms: rng.lognormal(600.0, 0.25),
                    },
                });
                ApiTrajectory {
                    job: "deepsearch".into(),
                    start_ms: 0.0,
                    steps,
                }
            })
            .collect();
        ApiWorkload {
            trajectories,
            provider: Self::provider(),
            judge: ServiceSpec {
                name: "judge".into(),
                gpus: 1,
                restore_ms: 200,
                slots: 16,
            },
            gpus: vec![vec![8]],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_pooled_quota_beats_per_trajectory_slices() {
        let w = DeepSearch {
            batch: 400,
            seed: 2,
        }
        .generate();
        let a = simulate_api(&w, QuotaMode::Pooled, "tangram");
        assert_eq!(a, simulate_api(&w, QuotaMode::Pooled, "tangram"));
        let b = simulate_api(&w, QuotaMode::PerTrajectory, "static");
        let calls: usize = w.trajectories.iter().map(|t| t.steps.len()).sum();
        assert_eq!(a.actions.len(), calls);
        assert_eq!(b.actions.len(), calls);
        // Pooled quota lets a trajectory borrow what others leave idle.
        assert!(
            a.step_time_ms < b.step_time_ms,
            "{} vs {}",
            a.step_time_ms,
            b.step_time_ms
        );
    }

    #[test]
    fn the_timeline_counts_admitted_calls_per_job_under_the_quota() {
        use crate::sim::Track;
        let w = DeepSearch {
            batch: 400,
            seed: 2,
        }
        .generate();
        let searches = w
            .trajectories
            .iter()
            .flat_map(|t| &t.steps)
            .filter(|s| matches!(s.call, ApiCall::Search { .. }))
            .count() as f64;
        for mode in [QuotaMode::Pooled, QuotaMode::PerTrajectory] {
            let r = simulate_api(&w, mode, "x");
            let t = &r.timeline;
            assert_eq!(t.quota_per_s.get("search"), Some(&200.0));
            let track = Track::Admitted {
                provider: "search".into(),
                job: "deepsearch".into(),
            };
            let rate = t.series(&track);
            assert!(!rate.is_empty(), "{mode:?}");
            let admitted: f64 = rate.iter().map(|p| p.1 * t.bin_ms / 1e3).sum();
            assert!(
                (admitted - searches).abs() < 1e-6,
                "{admitted} vs {searches}"
            );
            // The bucket's burst aside, no bin admits more than the rate.
            let burst = w.provider.burst as f64;
            let peak = rate.iter().map(|p| p.1).fold(0.0, f64::max);
            assert!(peak <= 200.0 + burst, "{mode:?}: {peak}/s");
        }
    }
}
