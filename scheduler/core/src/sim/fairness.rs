//! Jobs sharing one fleet: each job's mean ACT alone, then beside the others with the pools
//! taking waiting actions in queue order (first come, first served) and in weighted fair
//! order (`engine/shares.rs`), with Jain's index of the weighted core shares.
//!
//! Four scenarios on 128 cores (two nodes of 64; `tangram simulate --workload fairness
//! --batch N` scales trajectories and cores by N / 1280):
//! - `two-jobs-3-1`: two agentic-coding jobs of equal size, weights 3 and 1;
//! - `flood`: an agentic-coding job beside a flooding job (every trajectory submits long,
//!   wide commands back to back from the start, with no think time);
//! - `flood-capped`: the same, the flooding job capped at 64 cores (`[job_caps.flood]
//!   max_cores = 64`);
//! - `four-jobs`: weights 3, 1 and 1 on three coding jobs, and a flooding job of weight 1.
//!
//! A job alone runs on the whole fleet, uncapped.
//!
//! **Shares.** A job's demand is the cores it holds on average when it runs alone (a
//! closed-loop job thinks between commands and wants less than the fleet); its weighted
//! share is the weighted max-min share of the fleet's cores given every job's demand. What
//! it receives is its core-time while every job still runs (from the start to the first
//! job's last completion) over the fleet's. Jain's index is taken over received / share
//! (1: every job got its weighted share).

use super::{AiCoding, Rng, SimAction, SimCall, SimReport, SimStep, SimTrajectory, Workload};
use crate::elastic::Speedup;
use tangram_shared::CpuRange;

/// One job of a scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct FairJob {
    /// Its name.
    pub name: String,
    /// Its weight.
    pub weight: f64,
    /// Its trajectories (their `job` is `name`).
    pub trajectories: Vec<SimTrajectory>,
}

/// Jobs on one fleet.
#[derive(Debug, Clone, PartialEq)]
pub struct FairScenario {
    /// Its name.
    pub name: &'static str,
    /// Cores per node.
    pub nodes: Vec<u32>,
    /// The jobs.
    pub jobs: Vec<FairJob>,
    /// Caps per job.
    pub caps: Vec<(String, crate::engine::JobCaps)>,
}

/// The fleet of every scenario at `scale` 1: 128 cores.
pub fn nodes(scale: f64) -> Vec<u32> {
    let n = ((64.0 * scale).round() as u32).max(1);
    vec![n, n]
}

/// An agentic-coding job of `batch` trajectories ([`AiCoding`]).
pub fn coding(name: &str, weight: f64, batch: usize, seed: u64) -> FairJob {
    let mut trajectories = AiCoding {
        batch,
        seed,
        jobs: 1,
    }
    .generate()
    .trajectories;
    for t in &mut trajectories {
        t.job = name.to_string();
    }
    FairJob {
        name: name.to_string(),
        weight,
        trajectories,
    }
}

/// A flooding job: `batch` trajectories that all start at once and submit `steps` long,
/// wide commands (4 to 12 s on one core, 90% parallel, up to 16 cores) back to back.
pub fn flooding(name: &str, weight: f64, batch: usize, steps: usize, seed: u64) -> FairJob {
    let mut rng = Rng::new(seed ^ 0xf100d);
    let trajectories = (0..batch)
        .map(|i| {
            let steps = (0..steps)
                .map(|_| SimStep {
                    think_ms: 1.0,
                    action: SimAction {
                        call: SimCall::Cpu,
                        tool: "flood".into(),
                        cores: CpuRange { min: 1, max: 16 },
                        t1_ms: 4_000.0 + rng.unit() * 8_000.0,
                        speedup: Speedup::Amdahl(0.9),
                    },
                })
                .collect();
            SimTrajectory::numbered(i, name, rng.unit() * 100.0, steps)
        })
        .collect();
    FairJob {
        name: name.to_string(),
        weight,
        trajectories,
    }
}

/// The four scenarios (see the module docs), generated from `seed`, with their trajectories
/// and cores times `scale` (1: the sizes above).
pub fn scenarios(seed: u64, scale: f64) -> Vec<FairScenario> {
    let n = |k: f64| ((k * scale).round() as usize).max(1);
    let cap = crate::engine::JobCaps {
        max_cores: Some(((64.0 * scale).round() as u32).max(1)),
        ..Default::default()
    };
    // One flooding job and one coding job beside it, in three scenarios.
    let flood = flooding("flood", 1.0, n(256.0), 6, seed + 2);
    let calm = coding("calm", 1.0, n(64.0), seed + 3);
    let scenario = |name, jobs, caps| FairScenario {
        name,
        nodes: nodes(scale),
        jobs,
        caps,
    };
    vec![
        scenario(
            "two-jobs-3-1",
            vec![
                coding("a", 3.0, n(128.0), seed),
                coding("b", 1.0, n(128.0), seed + 1),
            ],
            Vec::new(),
        ),
        scenario("flood", vec![flood.clone(), calm.clone()], Vec::new()),
        scenario(
            "flood-capped",
            vec![flood.clone(), calm],
            vec![("flood".into(), cap)],
        ),
        scenario(
            "four-jobs",
            vec![
                flood,
                coding("a", 3.0, n(64.0), seed + 4),
                coding("b", 1.0, n(64.0), seed + 5),
                coding("c", 1.0, n(64.0), seed + 6),
            ],
            Vec::new(),
        ),
    ]
}

/// One job's figures in a scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct JobFairness {
    /// The job.
    pub job: String,
    /// Its weight.
    pub weight: f64,
    /// Cores it holds on average alone (its demand).
    pub demand_cores: f64,
    /// Its weighted max-min share of the fleet's cores given every job's demand, as a
    /// fraction of the fleet.
    pub fair_share: f64,
    /// Mean ACT alone on the fleet, s.
    pub alone_s: f64,
    /// Mean ACT beside the others, queue order, s.
    pub queue_order_s: f64,
    /// Mean ACT beside the others, weighted fair order, s.
    pub fair_s: f64,
    /// Its share of the core-time while every job runs, queue order.
    pub queue_order_share: f64,
    /// The same, weighted fair order.
    pub fair_order_share: f64,
}

/// A scenario's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct FairnessReport {
    /// The scenario.
    pub scenario: &'static str,
    /// The policy.
    pub policy: String,
    /// Per job, in the scenario's order.
    pub jobs: Vec<JobFairness>,
    /// Jain's index of received / weighted share, queue order.
    pub queue_order_jain: f64,
    /// The same, weighted fair order.
    pub fair_order_jain: f64,
}

/// Jain's fairness index of `xs`: `(Σx)² / (n Σx²)`, 1 when all are equal.
pub fn jain(xs: &[f64]) -> f64 {
    let sum: f64 = xs.iter().sum();
    let squares: f64 = xs.iter().map(|x| x * x).sum();
    if squares <= 0.0 {
        return 1.0;
    }
    sum * sum / (xs.len() as f64 * squares)
}

fn workload(s: &FairScenario, jobs: &[&FairJob], queue_order: bool) -> Workload {
    let nodes = &s.nodes;
    Workload {
        job_caps: s.caps.iter().cloned().collect(),
        trajectories: jobs
            .iter()
            .flat_map(|j| j.trajectories.iter().cloned())
            .collect(),
        nodes: nodes.to_vec(),
        job_weights: jobs.iter().map(|j| (j.name.clone(), j.weight)).collect(),
        queue_order,
        ..Default::default()
    }
}

/// Per job of `w` (by name): mean ACT, ms, and core-ms inside `[0, window_ms]`.
fn per_job(w: &Workload, r: &SimReport, window_ms: f64) -> Vec<(String, f64, f64)> {
    let mut out: Vec<(String, f64, f64, usize)> = Vec::new();
    for a in &r.actions {
        let job = &w.trajectories[a.trajectory].job;
        let k = match out.iter().position(|(j, ..)| j == job) {
            Some(k) => k,
            None => {
                out.push((job.clone(), 0.0, 0.0, 0));
                out.len() - 1
            }
        };
        out[k].1 += a.queue_ms + a.overhead_ms + a.exec_ms;
        out[k].3 += 1;
        // It runs after its overhead (a replica's restore).
        let start = a.start_ms + a.overhead_ms;
        let inside = ((start + a.exec_ms).min(window_ms) - start).max(0.0);
        if a.exec_ms > 0.0 {
            out[k].2 += a.core_ms * inside / a.exec_ms;
        }
    }
    out.into_iter()
        .map(|(j, act, core, n)| (j, act / n.max(1) as f64, core))
        .collect()
}

/// When the first job to finish did: every job runs until then.
fn all_running_until(w: &Workload, r: &SimReport) -> f64 {
    let mut last: Vec<(String, f64)> = Vec::new();
    for a in &r.actions {
        let job = &w.trajectories[a.trajectory].job;
        let end = a.start_ms + a.overhead_ms + a.exec_ms;
        match last.iter_mut().find(|(j, _)| j == job) {
            Some((_, t)) => *t = t.max(end),
            None => last.push((job.clone(), end)),
        }
    }
    last.iter().map(|(_, t)| *t).fold(f64::INFINITY, f64::min)
}

/// Runs `scenario` under `policy`: each job alone, then all of them in queue order and in
/// weighted fair order. `None` for a policy name the simulator does not know.
pub fn compare(scenario: &FairScenario, policy: &str) -> Option<FairnessReport> {
    let sim = super::by_name(policy)?;
    let shared = |queue_order: bool| {
        let jobs: Vec<&FairJob> = scenario.jobs.iter().collect();
        let w = workload(scenario, &jobs, queue_order);
        let r = super::simulate(&w, sim.as_ref());
        let window = all_running_until(&w, &r);
        let rows = per_job(&w, &r, window);
        let first = r
            .actions
            .iter()
            .map(|a| a.start_ms)
            .fold(f64::INFINITY, f64::min);
        let fleet = f64::from(scenario.nodes.iter().sum::<u32>());
        let total = (fleet * (window - first)).max(1e-9);
        rows.into_iter()
            .map(|(j, act, core)| (j, act, core / total))
            .collect::<Vec<_>>()
    };
    let fifo = shared(true);
    let fair = shared(false);
    let find = |rows: &[(String, f64, f64)], job: &str| {
        rows.iter()
            .find(|(j, ..)| j == job)
            .map_or((0.0, 0.0), |(_, act, share)| (*act, *share))
    };
    let cores: u32 = scenario.nodes.iter().sum();
    let alone: Vec<(f64, f64)> = scenario
        .jobs
        .iter()
        .map(|j| {
            // Alone means on the whole fleet: no cap.
            let mut w = workload(scenario, &[j], false);
            w.job_caps.clear();
            let r = super::simulate(&w, sim.as_ref());
            let (act, core_ms) = per_job(&w, &r, f64::INFINITY)
                .first()
                .map_or((0.0, 0.0), |r| (r.1, r.2));
            let first = r
                .actions
                .iter()
                .map(|a| a.start_ms)
                .fold(f64::INFINITY, f64::min);
            let span = (all_running_until(&w, &r) - first).max(1.0);
            (act, core_ms / span)
        })
        .collect();
    let wants: Vec<(tangram_shared::JobId, u32, f64)> = scenario
        .jobs
        .iter()
        .zip(&alone)
        .map(|(j, (_, demand))| {
            let id = tangram_shared::JobId::new(j.name.clone()).expect("a valid job name");
            (id, demand.ceil() as u32, j.weight)
        })
        .collect();
    let shares = crate::engine::shares::entitlements(cores, &wants);
    let jobs: Vec<JobFairness> = scenario
        .jobs
        .iter()
        .zip(&alone)
        .zip(&wants)
        .map(|((j, (alone_ms, demand)), (id, _, _))| {
            let (fifo_ms, fifo_share) = find(&fifo, &j.name);
            let (fair_ms, fair_share) = find(&fair, &j.name);
            JobFairness {
                job: j.name.clone(),
                weight: j.weight,
                demand_cores: *demand,
                fair_share: shares.get(id).copied().unwrap_or(0) as f64 / cores.max(1) as f64,
                alone_s: alone_ms / 1e3,
                queue_order_s: fifo_ms / 1e3,
                fair_s: fair_ms / 1e3,
                queue_order_share: fifo_share,
                fair_order_share: fair_share,
            }
        })
        .collect();
    let index = |share: fn(&JobFairness) -> f64| {
        let xs: Vec<f64> = jobs
            .iter()
            .map(|j| share(j) / j.fair_share.max(1e-9))
            .collect();
        jain(&xs)
    };
    Some(FairnessReport {
        scenario: scenario.name,
        policy: policy.to_string(),
        queue_order_jain: index(|j| j.queue_order_share),
        fair_order_jain: index(|j| j.fair_order_share),
        jobs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jains_index_is_one_for_equal_shares_and_one_over_n_for_one_taking_all() {
        assert!((jain(&[2.0, 2.0, 2.0]) - 1.0).abs() < 1e-12);
        assert!((jain(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
    }
}
