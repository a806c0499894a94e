//! A discrete-event simulator: the same policies on a virtual clock, so that policies can be
//! compared at the paper's scale on a small machine. Pure and deterministic: the same
//! workload and policy always give the same report.
//!
//! One simulator for every workload (ai-coding, mopd, deepsearch, mixed traces): the
//! scheduler's decision engine itself on a virtual clock (`run/`), so a figure from
//! `tangram simulate` is what the service would decide. Trajectories are closed loops: a
//! step's action is submitted only after the previous action completed plus the step's think
//! time. Action-level policies see each action as it arrives; a per-trajectory policy
//! (`static`) first has to obtain the trajectory's sandbox with its fixed cores, which the
//! trajectory then holds until its last action completes.

pub mod api;
mod bursty;
pub mod calibrate;
pub mod fairness;
pub mod gpu;
mod images;
mod k8s;
mod run;
pub mod sweep;
mod timeline;
pub mod trace;
pub mod workloads;

pub use bursty::Bursty;
pub use images::{compare_images, image_gain, ImageRun, SimImages, SweImages};
pub use k8s::{by_name, names, K8s, Simulated, SIM_ONLY};
pub use run::SimStats;
pub use timeline::{Timeline, Track, MAX_BINS};
pub use workloads::{UnknownWorkload, WorkloadName, WORKLOADS};

use crate::elastic::Speedup;
use tangram_shared::CpuRange;

/// What an action uses beyond (or instead of) a trajectory's cores.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum SimCall {
    /// A sandbox command: elastic cores on the trajectory's node.
    #[default]
    Cpu,
    /// A reward call on a GPU service (Evict-on-Execution for action-level policies, an even
    /// static split of the GPUs for `static`); takes `t1_ms` on a resident replica.
    Reward {
        /// The service.
        service: String,
    },
    /// An external API call under a provider's quota (pooled for action-level policies, an
    /// even per-trajectory slice of the rate for `static`); answered after `t1_ms`.
    Api {
        /// The provider.
        provider: String,
    },
}

/// One action of a trajectory.
#[derive(Debug, Clone, PartialEq)]
pub struct SimAction {
    /// What it uses.
    pub call: SimCall,
    /// The tool it runs (the learner's key, with the job).
    pub tool: String,
    /// Elastic core range.
    pub cores: CpuRange,
    /// Duration with one core, in milliseconds.
    pub t1_ms: f64,
    /// Speed-up curve.
    pub speedup: Speedup,
}

/// One step: think (LLM generation), then an action.
#[derive(Debug, Clone, PartialEq)]
pub struct SimStep {
    /// Time before the action is submitted, in milliseconds.
    pub think_ms: f64,
    /// The action.
    pub action: SimAction,
}

impl SimStep {
    /// A step that uses no cores: a reward or api call taking `t1_ms` once it runs.
    pub fn call(think_ms: f64, call: SimCall, t1_ms: f64) -> Self {
        Self {
            think_ms,
            action: SimAction {
                call,
                tool: "call".into(),
                cores: CpuRange { min: 1, max: 1 },
                t1_ms,
                speedup: Speedup::Amdahl(0.0),
            },
        }
    }
}

/// One trajectory.
#[derive(Debug, Clone, PartialEq)]
pub struct SimTrajectory {
    /// Its job.
    pub job: String,
    /// Its id.
    pub id: String,
    /// When it starts, in milliseconds.
    pub start_ms: f64,
    /// Its steps, in order.
    pub steps: Vec<SimStep>,
}

impl SimTrajectory {
    /// Trajectory `t<i>` of `job`, starting at `start_ms`.
    pub fn numbered(i: usize, job: &str, start_ms: f64, steps: Vec<SimStep>) -> Self {
        Self {
            job: job.to_string(),
            id: format!("t{i}"),
            start_ms,
            steps,
        }
    }
}

/// What the simulator runs: trajectories on nodes of the given core counts, with GPU
/// services and API providers when reward and api actions appear.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Workload {
    /// The trajectories.
    pub trajectories: Vec<SimTrajectory>,
    /// Cores per node.
    pub nodes: Vec<u32>,
    /// GPU services reward actions name.
    pub services: Vec<crate::gpu::ServiceSpec>,
    /// GPU nodes, as NVLink group sizes.
    pub gpus: Vec<Vec<u8>>,
    /// API providers api actions name.
    pub providers: Vec<crate::quota::ProviderQuota>,
    /// Sandbox images and the pull model (none: every sandbox uses the default image).
    pub images: SimImages,
    /// Jobs' weights (the operator's `job_weights`; default 1).
    pub job_weights: std::collections::BTreeMap<String, f64>,
    /// Pools take waiting actions in queue order, not in weighted fair order between jobs
    /// (the baseline of the fairness comparison, `fairness.rs`).
    pub queue_order: bool,
    /// Caps per job (the operator's `[job_caps.<job>]`).
    pub job_caps: std::collections::BTreeMap<String, crate::engine::JobCaps>,
}

/// Per-action record.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ActionRecord {
    /// Queueing, ms.
    pub queue_ms: f64,
    /// Execution, ms.
    pub exec_ms: f64,
    /// System overhead (a GPU service's restore), ms.
    pub overhead_ms: f64,
    /// Cores (CPU) or GPUs it ran with.
    pub cores: u32,
    /// Its trajectory (an index into [`Workload::trajectories`]).
    pub trajectory: usize,
    /// When it started running, ms.
    pub start_ms: f64,
    /// Core-milliseconds it held (a re-sized exec's at each size; 0 for GPU and api calls).
    pub core_ms: f64,
}

/// What a run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct SimReport {
    /// Policy name.
    pub policy: String,
    /// Every action, in completion order.
    pub actions: Vec<ActionRecord>,
    /// From the first trajectory start to the last trajectory end, ms (the RL step's
    /// rollout phase).
    pub step_time_ms: f64,
    /// Core-milliseconds held: by actions (action-level) or by trajectory sandboxes (static).
    pub reserved_core_ms: f64,
    /// Core-milliseconds of useful work (sum of T1).
    pub used_core_ms: f64,
    /// (time ms, fraction of the pool's cores held), sampled at events.
    pub utilisation: Vec<(f64, f64)>,
    /// Total cores (or GPUs) in the pool.
    pub pool_cores: u32,
    /// The pooled resource: `cpu` (cores), `gpu` or `api`.
    pub unit: &'static str,
    /// GPUs resident per service, restores and evictions, API calls admitted per provider
    /// and job, over time (bounded: see [`Timeline`]).
    pub timeline: Timeline,
}

impl SimReport {
    /// ACTs (queue + execution), ms, sorted.
    pub fn acts_ms(&self) -> Vec<f64> {
        let mut v: Vec<f64> = self
            .actions
            .iter()
            .map(|a| a.queue_ms + a.overhead_ms + a.exec_ms)
            .collect();
        v.sort_by(f64::total_cmp);
        v
    }
}

pub use tangram_shared::stats::quantile;

/// Where the scheduler's elasticity models come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elasticity {
    /// Each action's true model (the paper profiles offline).
    Oracle,
    /// Learned online per (job, tool) from completed actions; nothing known at first.
    Learned,
}

/// Runs `workload` under `policy`, with each action's true elasticity model.
pub fn simulate<S: Simulated + ?Sized>(workload: &Workload, policy: &S) -> SimReport {
    simulate_with(workload, policy, Elasticity::Oracle)
}

/// Runs `workload` under `policy`, with models from `elasticity`: the scheduler's decision
/// engine itself on a virtual clock ([`run`]).
pub fn simulate_with<S: Simulated + ?Sized>(
    workload: &Workload,
    policy: &S,
    elasticity: Elasticity,
) -> SimReport {
    run::run(
        workload,
        policy,
        elasticity,
        Some(crate::EngineConfig::default().image_load_ms),
    )
    .0
}

/// [`simulate_with`], with the run's counters (GPU restores and evictions, rejections, GPU
/// time).
pub fn run_stats<S: Simulated + ?Sized>(
    workload: &Workload,
    policy: &S,
    elasticity: Elasticity,
) -> (SimReport, SimStats) {
    run::run(
        workload,
        policy,
        elasticity,
        Some(crate::EngineConfig::default().image_load_ms),
    )
}

/// [`run_stats`] with image-aware placement weighing `Some(load_ms)` per sandbox per core
/// against a pull (the engine's `image_load_ms`), or ignoring images (`None`), for the
/// side-by-side of a workload with [`SimImages`].
pub fn run_images<S: Simulated + ?Sized>(
    workload: &Workload,
    policy: &S,
    elasticity: Elasticity,
    image_load_ms: Option<u64>,
) -> (SimReport, SimStats) {
    run::run(workload, policy, elasticity, image_load_ms)
}

/// A small seeded generator (splitmix64), so workloads are reproducible without a
/// dependency.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeds it.
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x5851_f42d_4c95_7f2d)
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Log-normal with the given median and sigma.
    pub fn lognormal(&mut self, median: f64, sigma: f64) -> f64 {
        // Box-Muller.
        let u1 = self.unit().max(1e-12);
        let u2 = self.unit();
        let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        median * (sigma * z).exp()
    }
}

/// Parameters of the `ai-coding` generator.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AiCoding {
    /// Concurrent trajectories (the RL batch).
    pub batch: usize,
    /// Seed.
    pub seed: u64,
    /// RL jobs sharing the cluster (1: one job named `ai-coding`). With more, job `k` gets a
    /// share of the trajectories proportional to `2^-k` (uneven, as real jobs are).
    pub jobs: usize,
}

/// Cores each `static` sandbox gets in the baseline (a common per-pod request) is also the DoP
/// at which the generator's ~1 s action durations are defined.
pub use crate::policies::STATIC_CORES;

impl AiCoding {
    /// The paper's cluster for AI coding: 15 nodes of 256 cores.
    pub fn nodes() -> Vec<u32> {
        vec![256; 15]
    }

    /// Generates the workload. Calibration (from the paper's published characteristics):
    /// actions take about 1 s at the baseline's 4 cores (log-normal, median 0.8 s); their
    /// parallelism is mixed (Amdahl parallel fraction 0, 0.5, 0.9 or 0.98, elastic range
    /// [1, 16]); think time between actions is drawn so that a sandbox is busy about 47% of
    /// a trajectory's life under per-trajectory provisioning; 8 to 16 turns per trajectory;
    /// trajectories start within the first 2 s of the step.
    pub fn generate(&self) -> Workload {
        self.generate_with_turns(8, 16)
    }

    /// [`AiCoding::generate`] with `min..=max` turns per trajectory (the calibration sweep's
    /// trajectory length).
    pub fn generate_with_turns(&self, min: usize, max: usize) -> Workload {
        let (min, max) = (min.max(1), max.max(min.max(1)));
        let mut rng = Rng::new(self.seed);
        let jobs = self.jobs.max(1);
        // Job k's share is proportional to 2^-k; trajectory i goes to the job whose
        // cumulative share covers i / batch.
        let weights: Vec<f64> = (0..jobs).map(|k| 0.5f64.powi(k as i32)).collect();
        let total: f64 = weights.iter().sum();
        let batch = self.batch.max(1) as f64;
        let job_name = |i: usize| -> String {
            if jobs == 1 {
                return "ai-coding".into();
            }
            let x = i as f64 / batch * total;
            let mut acc = 0.0;
            for (k, w) in weights.iter().enumerate() {
                acc += w;
                if x < acc {
                    return format!("ai-coding-{k}");
                }
            }
            format!("ai-coding-{}", jobs - 1)
        };
        // (parallel fraction, share, tool): lint and single-file scripts are serial, unit
        // tests partly parallel, builds and parallel test runners scale well.
        let fractions = [
            (0.0, 0.3, "lint"),
            (0.5, 0.2, "unit-test"),
            (0.9, 0.3, "pytest-xdist"),
            (0.98, 0.2, "build"),
        ];
        let trajectories = (0..self.batch)
            .map(|i| {
                let turns = min + (rng.next_u64() % (max - min + 1) as u64) as usize;
                let steps = (0..turns)
                    .map(|_| {
                        let mut pick = rng.unit();
                        let (p, _, tool) = *fractions
                            .iter()
                            .find(|(_, w, _)| {
                                pick -= w;
                                pick < 0.0
                            })
                            .unwrap_or(&fractions[3]);
                        let speedup = Speedup::Amdahl(p);
                        let exec_at_static = rng.lognormal(800.0, 0.6);
                        let t1_ms = exec_at_static * speedup.at(STATIC_CORES);
                        // Busy 47%: mean think = mean exec * 53/47.
                        let think_ms = rng.lognormal(800.0 * 53.0 / 47.0, 0.6);
                        SimStep {
                            think_ms,
                            action: SimAction {
                                call: SimCall::Cpu,
                                tool: tool.into(),
                                cores: CpuRange { min: 1, max: 16 },
                                t1_ms,
                                speedup,
                            },
                        }
                    })
                    .collect();
                SimTrajectory {
                    job: job_name(i),
                    id: format!("t{i}"),
                    start_ms: rng.unit() * 2000.0,
                    steps,
                }
            })
            .collect();
        Workload {
            trajectories,
            nodes: Self::nodes(),
            ..Default::default()
        }
    }
}

/// Summary statistics of a report, in seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Policy.
    pub name: String,
    /// Mean ACT.
    pub mean_act_s: f64,
    /// Median ACT.
    pub p50_act_s: f64,
    /// 99th percentile ACT.
    pub p99_act_s: f64,
    /// Mean queueing.
    pub mean_queue_s: f64,
    /// Longest queueing of any action (the bound on waiting).
    pub max_queue_s: f64,
    /// Mean execution.
    pub mean_exec_s: f64,
    /// Mean overhead (GPU restores; CPU actions are charged none).
    pub mean_overhead_s: f64,
    /// Step time (rollout phase).
    pub step_time_s: f64,
    /// Core-seconds (or GPU-seconds, see `unit`) held.
    pub reserved_cpu_s: f64,
    /// Core-seconds (or GPU-seconds) of useful work.
    pub used_cpu_s: f64,
    /// `cpu` or `gpu`.
    pub unit: &'static str,
    /// Actions simulated.
    pub actions: usize,
}

impl SimReport {
    /// Summarises the run.
    pub fn summary(&self) -> Summary {
        let acts = self.acts_ms();
        let n = self.actions.len().max(1) as f64;
        Summary {
            name: self.policy.clone(),
            mean_act_s: acts.iter().sum::<f64>() / n / 1e3,
            p50_act_s: quantile(&acts, 0.5) / 1e3,
            p99_act_s: quantile(&acts, 0.99) / 1e3,
            mean_queue_s: self.actions.iter().map(|a| a.queue_ms).sum::<f64>() / n / 1e3,
            max_queue_s: self.actions.iter().map(|a| a.queue_ms).fold(0.0, f64::max) / 1e3,
            mean_exec_s: self.actions.iter().map(|a| a.exec_ms).sum::<f64>() / n / 1e3,
            mean_overhead_s: self.actions.iter().map(|a| a.overhead_ms).sum::<f64>() / n / 1e3,
            step_time_s: self.step_time_ms / 1e3,
            reserved_cpu_s: self.reserved_core_ms / 1e3,
            used_cpu_s: self.used_core_ms / 1e3,
            unit: self.unit,
            actions: self.actions.len(),
        }
    }
}

/// Counts actions per trajectory (for checks).
pub fn actions_in(workload: &Workload) -> usize {
    workload.trajectories.iter().map(|t| t.steps.len()).sum()
}
