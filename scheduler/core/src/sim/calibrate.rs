//! The calibration sweep (docs/CALIBRATION.md): the settings the paper leaves open, swept
//! two at a time, to map where our baselines' ratios to `tangram` reach the paper's figures.
//! Each map is a grid of one figure (a ratio of mean ACTs, a step-time ratio, or the fewest
//! GPUs that match a baseline); the maps say which settings the paper's numbers imply, not
//! which are true.
//!
//! Every cell is a full simulation run through the decision engine, like `tangram simulate`;
//! a cell's `tangram` run is shared by every baseline setting that leaves its workload alone.

use super::K8s;
use super::{simulate, AiCoding, SimReport, Workload};
use crate::policies::Tangram;
use crate::sim_api::{simulate_api, DeepSearch, QuotaMode};
use crate::sim_gpu::{matches_static, simulate_gpu, GpuMode, Mopd};
use std::collections::HashMap;

/// A map: one figure per (x, y).
#[derive(Debug, Clone, PartialEq)]
pub struct Map {
    /// Short name (file names, `--map`).
    pub name: &'static str,
    /// What the map shows.
    pub title: String,
    /// The swept setting along x.
    pub x_label: &'static str,
    /// The swept setting along y.
    pub y_label: &'static str,
    /// x values.
    pub xs: Vec<f64>,
    /// y values.
    pub ys: Vec<f64>,
    /// The figure in each cell, `values[y][x]`; `NaN` where none is defined (no GPU count up
    /// to the baseline's matches it).
    pub values: Vec<Vec<f64>>,
    /// What a cell holds.
    pub value: &'static str,
    /// The paper's figures this map is read against.
    pub targets: Vec<Target>,
    /// The settings held fixed.
    pub fixed: String,
}

/// One of the paper's figures, as a map reads it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Target {
    /// The figure.
    pub value: f64,
    /// How the map labels it.
    pub label: &'static str,
    /// The column it belongs to (a batch size), or every column.
    pub x: Option<f64>,
}

impl Target {
    /// Is `value` at column `x` within `tolerance` (relative) of this figure?
    pub fn near(&self, x: f64, value: f64, tolerance: f64) -> bool {
        self.x.is_none_or(|at| at == x) && (value / self.value - 1.0).abs() <= tolerance
    }
}

/// The maps [`run`] knows, in the order docs/CALIBRATION.md presents them.
pub const MAPS: [&str; 6] = [
    "coding-pods",
    "coding-capacity",
    "coding-start",
    "coding-turns",
    "mopd-gpus",
    "deepsearch-quota",
];

/// How big a sweep: `Full` is the documented one; `Small` is a few cells at small batches,
/// for tests and a quick look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    /// The documented sweep.
    Full,
    /// A few small cells.
    Small,
}

/// The paper's CPU-scalability figures (static / tangram mean ACT, batch 256 to 1,536) and
/// its headline (batch 1,280).
const CODING_TARGETS: [Target; 3] = [
    Target {
        value: 3.1,
        label: "3.1x (B=256)",
        x: Some(256.0),
    },
    Target {
        value: 4.3,
        label: "4.3x (B=1280)",
        x: Some(1280.0),
    },
    Target {
        value: 27.7,
        label: "27.7x (B=1536)",
        x: Some(1536.0),
    },
];

/// The headline figure at batch 1,280, for a map of other settings at that batch.
const HEADLINE: Target = Target {
    value: 4.3,
    label: "4.3x (B=1280)",
    x: None,
};

/// Runs the map called `name`, telling `progress` about each cell as it is done.
pub fn run(name: &str, scale: Scale, progress: &mut dyn FnMut(usize, usize)) -> Option<Map> {
    Some(match name {
        "coding-pods" => coding_pods(scale, progress),
        "coding-capacity" => coding_capacity(scale, progress),
        "coding-start" => coding_start(scale, progress),
        "coding-turns" => coding_turns(scale, progress),
        "mopd-gpus" => mopd_gpus(scale, progress),
        "deepsearch-quota" => deepsearch_quota(scale, progress),
        _ => return None,
    })
}

fn batches(scale: Scale) -> Vec<f64> {
    match scale {
        Scale::Full => vec![256.0, 512.0, 768.0, 1024.0, 1280.0, 1536.0],
        Scale::Small => vec![64.0, 192.0],
    }
}

fn mean_act(r: &SimReport) -> f64 {
    r.summary().mean_act_s
}

/// The baseline's mean ACT over `tangram`'s on `w`, with `tangram`'s run cached by `key`.
fn ratio(w: &Workload, baseline: K8s, key: String, tangram: &mut HashMap<String, f64>) -> f64 {
    let t = *tangram
        .entry(key)
        .or_insert_with(|| mean_act(&simulate(w, &Tangram::default())));
    mean_act(&simulate(w, &baseline)) / t
}

/// The ai-coding workload at `batch`, on `nodes` nodes of 256 cores, `turns` per trajectory,
/// with think times scaled so that a trajectory's sandbox is busy `busy` of its life.
fn coding(batch: usize, nodes: usize, turns: (usize, usize), busy: f64) -> Workload {
    let mut w = AiCoding {
        batch,
        seed: 1,
        jobs: 1,
    }
    .generate_with_turns(turns.0, turns.1);
    w.nodes = vec![256; nodes];
    // The generator's think times make the sandbox busy 47% of the time; a log-normal
    // scaled by a factor keeps its sigma and scales its median.
    let factor = ((1.0 - busy) / busy) / (53.0 / 47.0);
    if (factor - 1.0).abs() > 1e-9 {
        for t in &mut w.trajectories {
            for s in &mut t.steps {
                s.think_ms *= factor;
            }
        }
    }
    w
}

/// The figure `cell(x, y)` for every cell, rows by `ys`, telling `progress` after each.
fn fill(
    xs: &[f64],
    ys: &[f64],
    progress: &mut dyn FnMut(usize, usize),
    mut cell: impl FnMut(f64, f64) -> f64,
) -> Vec<Vec<f64>> {
    let total = xs.len() * ys.len();
    let mut done = 0;
    ys.iter()
        .map(|&y| {
            xs.iter()
                .map(|&x| {
                    let v = cell(x, y);
                    done += 1;
                    progress(done, total);
                    v
                })
                .collect()
        })
        .collect()
}

fn coding_pods(scale: Scale, progress: &mut dyn FnMut(usize, usize)) -> Map {
    let xs = batches(scale);
    let ys = match scale {
        Scale::Full => vec![1.0, 2.0, 4.0, 8.0, 16.0],
        Scale::Small => vec![4.0, 16.0],
    };
    let nodes = if scale == Scale::Full { 15 } else { 2 };
    let mut cache = HashMap::new();
    let values = fill(&xs, &ys, progress, |batch, cores| {
        let w = coding(batch as usize, nodes, (8, 16), 0.47);
        let k = K8s {
            cores: cores as u32,
            start_ms: 0.0,
        };
        ratio(&w, k, format!("{batch}"), &mut cache)
    });
    Map {
        name: "coding-pods",
        title: "ai-coding: static / tangram mean ACT by pod size".into(),
        x_label: "batch (trajectories)",
        y_label: "cores per trajectory pod",
        xs,
        ys,
        values,
        value: "static / tangram mean ACT",
        targets: CODING_TARGETS.to_vec(),
        fixed: format!(
            "{nodes} nodes x 256 cores; 8-16 turns; sandbox busy 47%; pods start at once"
        ),
    }
}

fn coding_capacity(scale: Scale, progress: &mut dyn FnMut(usize, usize)) -> Map {
    let xs = batches(scale);
    let ys = match scale {
        Scale::Full => vec![4.0, 6.0, 8.0, 10.0, 15.0, 20.0],
        Scale::Small => vec![1.0, 2.0],
    };
    let mut cache = HashMap::new();
    let values = fill(&xs, &ys, progress, |batch, nodes| {
        let w = coding(batch as usize, nodes as usize, (8, 16), 0.47);
        let k = K8s {
            cores: 4,
            start_ms: 0.0,
        };
        ratio(&w, k, format!("{batch}/{nodes}"), &mut cache)
    });
    Map {
        name: "coding-capacity",
        title: "ai-coding: static / tangram mean ACT by cluster size".into(),
        x_label: "batch (trajectories)",
        y_label: "CPU nodes of 256 cores",
        xs,
        ys,
        values,
        value: "static / tangram mean ACT",
        targets: CODING_TARGETS.to_vec(),
        fixed: "4-core pods; 8-16 turns; sandbox busy 47%; pods start at once".into(),
    }
}

fn coding_start(scale: Scale, progress: &mut dyn FnMut(usize, usize)) -> Map {
    let (xs, ys, batch, nodes) = match scale {
        Scale::Full => (
            vec![0.0, 0.8, 1.6, 5.0, 10.0, 20.0],
            vec![0.2, 0.3, 0.47, 0.6, 0.8],
            1280,
            15,
        ),
        Scale::Small => (vec![0.0, 5.0], vec![0.47, 0.8], 64, 2),
    };
    let mut cache = HashMap::new();
    let values = fill(&xs, &ys, progress, |start_s, busy| {
        let w = coding(batch, nodes, (8, 16), busy);
        let k = K8s {
            cores: 4,
            start_ms: start_s * 1e3,
        };
        ratio(&w, k, format!("{busy}"), &mut cache)
    });
    Map {
        name: "coding-start",
        title: format!("ai-coding B={batch}: k8s / tangram mean ACT by pod start and busy share"),
        x_label: "median pod start (s)",
        y_label: "sandbox busy share of a trajectory",
        xs,
        ys,
        values,
        value: "k8s / tangram mean ACT",
        targets: vec![HEADLINE],
        fixed: format!("{nodes} nodes x 256 cores; 4-core pods; 8-16 turns"),
    }
}

fn coding_turns(scale: Scale, progress: &mut dyn FnMut(usize, usize)) -> Map {
    let xs = batches(scale);
    let (ys, nodes) = match scale {
        Scale::Full => (vec![3.0, 6.0, 12.0, 24.0], 15),
        Scale::Small => (vec![3.0, 12.0], 2),
    };
    let mut cache = HashMap::new();
    let values = fill(&xs, &ys, progress, |batch, turns| {
        // Turns uniform in [2/3, 4/3] of the mean (8 to 16 for 12).
        let t = turns as usize;
        let w = coding(batch as usize, nodes, (t * 2 / 3, t * 4 / 3), 0.47);
        let k = K8s::default();
        ratio(&w, k, format!("{batch}/{turns}"), &mut cache)
    });
    Map {
        name: "coding-turns",
        title: "ai-coding: k8s / tangram mean ACT by trajectory length".into(),
        x_label: "batch (trajectories)",
        y_label: "mean turns per trajectory",
        xs,
        ys,
        values,
        value: "k8s / tangram mean ACT",
        targets: CODING_TARGETS.to_vec(),
        fixed: format!(
            "{nodes} nodes x 256 cores; 4-core pods starting in 1.6 s (median); sandbox busy 47%"
        ),
    }
}

/// The fewest pooled GPUs whose mean ACT matches `target_s` ([`matches_static`]),
/// between `from` and `max` (none: not even `max` matches), by bisection: it assumes that
/// more GPUs never make the mean worse, which holds up to noise (`tangram simulate
/// --gpu-sweep` scans every size instead). Bisection matters here: an overloaded pool is
/// the slowest run, and a scan from below would run every one of them.
pub fn fewest_gpus(
    w: &crate::sim_gpu::GpuWorkload,
    target_s: f64,
    from: u32,
    max: u32,
) -> Option<u32> {
    let matches = |g: u32| {
        let (r, stats) = simulate_gpu(w, GpuMode::Pooled { gpus: g }, "tangram");
        matches_static(mean_act(&r), &stats, target_s)
    };
    let (mut lo, mut hi) = (from.max(1), max);
    if lo > hi || !matches(hi) {
        return None;
    }
    // Invariant: `hi` matches; every size below `lo` was found not to.
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if matches(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Some(hi)
}

fn mopd_gpus(scale: Scale, progress: &mut dyn FnMut(usize, usize)) -> Map {
    let (xs, ys, batch) = match scale {
        Scale::Full => (
            vec![7.0, 10.5, 14.0, 21.0, 28.0, 42.0],
            vec![1.0, 2.0, 4.0],
            2048,
        ),
        Scale::Small => (vec![21.0], vec![1.0, 2.0], 256),
    };
    let values = fill(&xs, &ys, progress, |think_s, teacher| {
        let mut w = Mopd { batch, seed: 1 }.generate();
        let factor = think_s * 1e3 / 21_000.0;
        for t in &mut w.trajectories {
            for s in &mut t.steps {
                s.think_ms *= factor;
            }
        }
        for s in &mut w.services {
            s.gpus = teacher as u8;
        }
        let per_service = Mopd::STATIC_GPUS_PER_TEACHER;
        let (st, _) = simulate_gpu(
            &w,
            GpuMode::Static {
                gpus_per_service: per_service,
            },
            "static",
        );
        let max = (per_service * w.services.len() as u32).min(w.total_gpus());
        fewest_gpus(&w, mean_act(&st), teacher as u32, max).map_or(f64::NAN, f64::from)
    });
    Map {
        name: "mopd-gpus",
        title: format!("mopd B={batch}: fewest pooled GPUs matching static's 36"),
        x_label: "median think time between teacher calls (s)",
        y_label: "GPUs per teacher replica",
        xs,
        ys,
        values,
        value: "fewest GPUs within 10% of static's mean ACT",
        targets: vec![Target {
            value: 10.0,
            label: "10 GPUs",
            x: None,
        }],
        fixed: "9 teachers (Zipf popularity); static 4 GPUs per teacher; 8 slots per replica; 0.2 s restore".into(),
    }
}

fn deepsearch_quota(scale: Scale, progress: &mut dyn FnMut(usize, usize)) -> Map {
    let (xs, ys) = match scale {
        Scale::Full => (
            vec![25.0, 50.0, 100.0, 200.0, 400.0],
            vec![512.0, 1024.0, 2048.0],
        ),
        Scale::Small => (vec![20.0, 200.0], vec![128.0]),
    };
    let values = fill(&xs, &ys, progress, |rate, batch| {
        let mut w = DeepSearch {
            batch: batch as usize,
            seed: 1,
        }
        .generate();
        w.provider.rate_per_s = rate;
        let pooled = simulate_api(&w, QuotaMode::Pooled, "tangram");
        let sliced = simulate_api(&w, QuotaMode::PerTrajectory, "static");
        sliced.step_time_ms / pooled.step_time_ms
    });
    Map {
        name: "deepsearch-quota",
        title: "deepsearch: static / tangram step time by quota and batch".into(),
        x_label: "search quota (requests/s)",
        y_label: "batch (trajectories)",
        xs,
        ys,
        values,
        value: "static / tangram step time",
        targets: vec![Target {
            value: 1.5,
            label: "1.5x",
            x: None,
        }],
        fixed: "4-12 searches per trajectory, 6 s median think, 0.8 s median search latency; burst 50; 256 connections".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policies::Static;

    #[test]
    fn a_pod_that_starts_at_once_is_the_static_baseline() {
        let w = coding(48, 1, (4, 6), 0.47);
        let st = simulate(&w, &Static { cores: 4 });
        let k = simulate(
            &w,
            &K8s {
                cores: 4,
                start_ms: 0.0,
            },
        );
        assert_eq!(st.actions, k.actions);
        assert_eq!(st.step_time_ms, k.step_time_ms);
    }

    #[test]
    fn a_pod_start_adds_queueing_to_first_actions_and_leaves_execution_alone() {
        let w = coding(48, 1, (4, 6), 0.47);
        let st = simulate(&w, &Static { cores: 4 }).summary();
        let k = simulate(
            &w,
            &K8s {
                cores: 4,
                start_ms: 5_000.0,
            },
        )
        .summary();
        assert!(k.mean_act_s > st.mean_act_s, "{k:?} vs {st:?}");
        // Execs are untouched (the same durations, summed in another order).
        assert!(
            (k.mean_exec_s - st.mean_exec_s).abs() < 1e-9,
            "{} vs {}",
            k.mean_exec_s,
            st.mean_exec_s
        );
        // One action in 4 to 6 is a first one; a start beyond the think time delays it by at
        // most the start itself (p99 of the draw is about 3.2 times the median).
        let added = (k.mean_act_s - st.mean_act_s) * k.actions as f64;
        assert!(added <= 48.0 * 5.0 * 3.5, "{added} s added in all");
    }

    #[test]
    fn the_gpu_bisection_finds_the_smallest_matching_pool() {
        let w = Mopd {
            batch: 200,
            seed: 2,
        }
        .generate();
        let (st, _) = simulate_gpu(
            &w,
            GpuMode::Static {
                gpus_per_service: 4,
            },
            "static",
        );
        let target = mean_act(&st);
        let g = fewest_gpus(&w, target, 1, 36).expect("36 pooled GPUs match 36 pinned");
        let at = |g| mean_act(&simulate_gpu(&w, GpuMode::Pooled { gpus: g }, "t").0);
        assert!(at(g) <= target * 1.1);
        if g > 1 {
            assert!(at(g - 1) > target * 1.1, "{g} is not the first");
        }
    }

    #[test]
    fn small_maps_have_a_value_per_cell_and_report_progress() {
        for name in MAPS {
            let mut calls = 0;
            let m = run(name, Scale::Small, &mut |_, _| calls += 1).expect("known map");
            assert_eq!(m.values.len(), m.ys.len(), "{name}");
            assert!(m.values.iter().all(|r| r.len() == m.xs.len()), "{name}");
            assert_eq!(calls, m.xs.len() * m.ys.len(), "{name}");
            assert!(
                m.values.iter().flatten().all(|v| v.is_nan() || *v > 0.0),
                "{name}: {:?}",
                m.values
            );
            assert!(
                m.values.iter().flatten().any(|v| v.is_finite()),
                "{name}: no cell has a figure: {:?}",
                m.values
            );
        }
        assert!(run("nope", Scale::Small, &mut |_, _| {}).is_none());
    }
}
