//! The side of each policy that the GPU and API workloads compare, and the GPU pool-size
//! sweep (`tangram simulate --workload mopd --gpu-sweep`): which pooled pool size first
//! matches the static deployment's mean ACT. The CLI prints what these return.

use super::api::QuotaMode;
use super::gpu::{matches_static, simulate_gpu, simulate_gpu_with, GpuMode, GpuStats};
use super::gpu::{GpuWorkload, MATCH_TOLERANCE};
use super::Summary;

/// A policy listed for a GPU or API workload that has no side there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoSide {
    /// The policy as listed.
    pub policy: String,
}

/// The engine policy that decides a pooled run listed as `name`: `tangram-v2` itself (it also
/// re-balances GPU replicas), `tangram` for anything else.
pub fn pooled_policy(name: &str) -> &'static str {
    if name == "tangram-v2" {
        "tangram-v2"
    } else {
        "tangram"
    }
}

/// How `policy` deploys the GPU services of a GPU workload: the pooled policies share `gpus`
/// under Evict-on-Execution, `static` pins `per_service` GPUs to each service.
pub fn gpu_mode(policy: &str, gpus: u32, per_service: u32) -> Result<GpuMode, NoSide> {
    match policy {
        "tangram" | "tangram-v2" => Ok(GpuMode::Pooled { gpus }),
        "static" => Ok(GpuMode::Static {
            gpus_per_service: per_service,
        }),
        other => Err(NoSide {
            policy: other.to_string(),
        }),
    }
}

/// How `policy` shares an API provider's quota: pooled, or sliced per trajectory (`static`).
pub fn quota_mode(policy: &str) -> Result<QuotaMode, NoSide> {
    match policy {
        "tangram" | "tangram-v2" => Ok(QuotaMode::Pooled),
        "static" => Ok(QuotaMode::PerTrajectory),
        other => Err(NoSide {
            policy: other.to_string(),
        }),
    }
}

/// One pool size of the sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepRow {
    /// GPUs in the pool.
    pub gpus: u32,
    /// The run's summary.
    pub summary: Summary,
    /// Its GPU counters.
    pub stats: GpuStats,
    /// Whether it matched static's mean ACT ([`matches_static`]).
    pub matches_static: bool,
}

/// The sweep's result.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSweep {
    /// Static's mean ACT, the target.
    pub static_mean_act_s: f64,
    /// How close counts as a match.
    pub tolerance: f64,
    /// From 1 GPU up.
    pub rows: Vec<SweepRow>,
    /// The fewest GPUs that matched, if any did.
    pub fewest: Option<u32>,
}

/// Rows still run past the first match, to show the curve flattening.
pub const ROWS_PAST_MATCH: u32 = 4;

/// Runs `pooled` on 1, 2, ... GPUs (up to static's GPU count or the cluster's) until
/// [`ROWS_PAST_MATCH`] rows past the first that matches static at `per_service` GPUs per
/// service.
pub fn gpu_sweep(w: &GpuWorkload, pooled: &str, per_service: u32) -> GpuSweep {
    let static_total = crate::gpu::static_gpus(per_service, w.services.iter().map(|s| s.gpus));
    let (st, _) = simulate_gpu(
        w,
        GpuMode::Static {
            gpus_per_service: per_service,
        },
        "static",
    );
    let target = st.summary().mean_act_s;
    let mut rows = Vec::new();
    let mut fewest = None;
    for g in 1..=static_total.min(w.total_gpus()) {
        let (r, stats) = simulate_gpu_with(w, GpuMode::Pooled { gpus: g }, pooled, pooled);
        let summary = r.summary();
        let ok = matches_static(summary.mean_act_s, &stats, target);
        if ok && fewest.is_none() {
            fewest = Some(g);
        }
        rows.push(SweepRow {
            gpus: g,
            summary,
            stats,
            matches_static: ok,
        });
        if fewest.is_some_and(|f| g >= f + ROWS_PAST_MATCH) {
            break;
        }
    }
    GpuSweep {
        static_mean_act_s: target,
        tolerance: MATCH_TOLERANCE,
        rows,
        fewest,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::gpu::Mopd;

    #[test]
    fn each_listed_policy_has_its_side_and_others_are_refused() {
        assert_eq!(
            gpu_mode("tangram-v2", 12, 4),
            Ok(GpuMode::Pooled { gpus: 12 })
        );
        assert_eq!(
            gpu_mode("static", 12, 4),
            Ok(GpuMode::Static {
                gpus_per_service: 4
            })
        );
        assert_eq!(quota_mode("static"), Ok(QuotaMode::PerTrajectory));
        assert_eq!(
            quota_mode("k8s"),
            Err(NoSide {
                policy: "k8s".into()
            })
        );
        assert_eq!(pooled_policy("tangram-v2"), "tangram-v2");
        assert_eq!(pooled_policy("static"), "tangram");
    }

    #[test]
    fn the_sweep_stops_a_few_rows_past_its_first_match_and_matches_from_there() {
        let w = Mopd { batch: 64, seed: 7 }.generate();
        let s = gpu_sweep(&w, "tangram", Mopd::STATIC_GPUS_PER_TEACHER);
        let f = s
            .fewest
            .expect("a small batch matches static well under its 36 GPUs");
        assert_eq!(s.rows.last().unwrap().gpus, f + ROWS_PAST_MATCH);
        assert!(s.rows[(f - 1) as usize].matches_static);
        assert!(!s.rows[..(f - 1) as usize].iter().any(|r| r.matches_static));
        let gpus: Vec<u32> = s.rows.iter().map(|r| r.gpus).collect();
        assert_eq!(gpus, (1..=f + ROWS_PAST_MATCH).collect::<Vec<_>>());
    }
}
