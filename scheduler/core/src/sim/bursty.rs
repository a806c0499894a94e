//! `bursty`: an independent workload, different in shape from `ai-coding`, to check that a
//! policy's gain is not an artefact of one generator. Several jobs whose batches arrive in
//! waves, heavy-tailed (Pareto) action durations, power-law speed-ups with two core ranges,
//! and all three resource kinds: sandbox commands, reward calls on GPU services, and calls of
//! a rate-limited API. Not calibrated to any figure: its parameters are stated here and in
//! docs/SIMULATOR.md.

use super::{Rng, SimAction, SimCall, SimStep, SimTrajectory, Workload};
use crate::elastic::Speedup;
use crate::gpu::ServiceSpec;
use crate::quota::ProviderQuota;
use tangram_shared::CpuRange;

/// The generator.
#[derive(Debug, Clone)]
pub struct Bursty {
    /// Trajectories in all (split between the jobs 3:2:1).
    pub batch: usize,
    /// Seed.
    pub seed: u64,
}

/// Waves of arrivals per job, and the gap between waves.
const WAVES: usize = 4;
const WAVE_GAP_MS: f64 = 15_000.0;
/// A wave arrives within this long.
const WAVE_SPREAD_MS: f64 = 500.0;
/// Pareto shape and scale of an action's duration at 4 cores, and the cap.
const PARETO_SHAPE: f64 = 1.6;
const PARETO_SCALE_MS: f64 = 250.0;
const DURATION_CAP_MS: f64 = 60_000.0;

impl Bursty {
    /// Its cluster: 8 nodes of 64 cores.
    pub fn nodes() -> Vec<u32> {
        vec![64; 8]
    }

    /// Two judge services on 1 GPU each (8 calls at once per replica, 300 ms restores).
    pub fn services() -> Vec<ServiceSpec> {
        ["judge-small", "judge-large"]
            .iter()
            .map(|n| ServiceSpec {
                name: (*n).into(),
                gpus: 1,
                restore_ms: 300,
                slots: 8,
            })
            .collect()
    }

    /// A search API: 100 requests/s, burst 20, 64 in flight.
    pub fn provider() -> ProviderQuota {
        ProviderQuota {
            name: "search".into(),
            rate_per_s: 100.0,
            burst: 20,
            concurrency: 64,
            slow_ms: None,
        }
    }

    /// Generates the workload.
    pub fn generate(&self) -> Workload {
        let mut rng = Rng::new(self.seed ^ 0xb0257);
        let shares = [("swe", 3usize), ("codegen", 2), ("research", 1)];
        let parts: usize = shares.iter().map(|s| s.1).sum();
        let mut trajectories = Vec::with_capacity(self.batch);
        let mut i = 0;
        for (job, share) in shares {
            let n = self.batch * share / parts;
            for k in 0..n {
                let wave = k % WAVES;
                let start_ms = wave as f64 * WAVE_GAP_MS + rng.unit() * WAVE_SPREAD_MS;
                let turns = 4 + (rng.next_u64() % 9) as usize;
                let steps = (0..turns).map(|_| self.step(&mut rng, job)).collect();
                trajectories.push(SimTrajectory::numbered(i, job, start_ms, steps));
                i += 1;
            }
        }
        Workload {
            trajectories,
            nodes: Self::nodes(),
            services: Self::services(),
            gpus: vec![vec![8], vec![8]],
            providers: vec![Self::provider()],
            ..Default::default()
        }
    }

    fn step(&self, rng: &mut Rng, job: &str) -> SimStep {
        // Pareto by inversion, capped.
        let heavy = |rng: &mut Rng| {
            (PARETO_SCALE_MS / rng.unit().max(1e-9).powf(1.0 / PARETO_SHAPE)).min(DURATION_CAP_MS)
        };
        let think_ms = rng.lognormal(1_500.0, 0.8);
        let pick = rng.unit();
        // The research job calls the API most, the others run commands most.
        let (exec_share, reward_share) = if job == "research" {
            (0.3, 0.2)
        } else {
            (0.75, 0.15)
        };
        if pick < exec_share {
            let (a, max, tool) = match rng.next_u64() % 3 {
                0 => (0.3, 8, "compile"),
                1 => (0.6, 8, "test"),
                _ => (0.85, 32, "build"),
            };
            let speedup = Speedup::Power(a);
            let t1_ms = heavy(rng) * speedup.at(4);
            SimStep {
                think_ms,
                action: SimAction {
                    call: SimCall::Cpu,
                    tool: tool.into(),
                    cores: CpuRange { min: 1, max },
                    t1_ms,
                    speedup,
                },
            }
        } else if pick < exec_share + reward_share {
            let service = if rng.unit() < 0.7 {
                "judge-small"
            } else {
                "judge-large"
            };
            let t1 = rng.lognormal(
                if service == "judge-small" {
                    300.0
                } else {
                    900.0
                },
                0.3,
            );
            SimStep::call(
                think_ms,
                SimCall::Reward {
                    service: service.into(),
                },
                t1,
            )
        } else {
            SimStep::call(
                think_ms,
                SimCall::Api {
                    provider: "search".into(),
                },
                rng.lognormal(600.0, 0.5),
            )
        }
    }
}
