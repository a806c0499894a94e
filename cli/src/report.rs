//! What every `tangram simulate` workload prints the same way: a policy's JSON row and the
//! picture.

use anyhow::Context as _;
use serde_json::{json, Map, Value};
use std::path::Path;
use tangram_core::sim::{SimReport, Summary};

/// `a / b`, 0 when `b` is 0.
pub fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// One policy's row of `--json`: ACT statistics, resource-seconds under the report's unit,
/// and ratios to the first policy (`base`). Callers add their workload's own fields.
pub fn policy_json(s: &Summary, base: &Summary) -> Map<String, Value> {
    let split = |x: f64| match s.unit {
        "cpu" => (x, 0.0),
        "gpu" => (0.0, x),
        _ => (0.0, 0.0),
    };
    let row = json!({
        "name": s.name,
        "mean_act_s": s.mean_act_s,
        "p50_act_s": s.p50_act_s,
        "p99_act_s": s.p99_act_s,
        "mean_queue_s": s.mean_queue_s,
        "max_queue_s": s.max_queue_s,
        "mean_exec_s": s.mean_exec_s,
        "mean_overhead_s": s.mean_overhead_s,
        "step_time_s": s.step_time_s,
        "reserved_resource_seconds": {"cpu": split(s.reserved_cpu_s).0, "gpu": split(s.reserved_cpu_s).1},
        "used_resource_seconds": {"cpu": split(s.used_cpu_s).0, "gpu": split(s.used_cpu_s).1},
        "actions": s.actions,
        "vs_first": {
            "mean_act": ratio(s.mean_act_s, base.mean_act_s),
            "p99_act": ratio(s.p99_act_s, base.p99_act_s),
            "step_time": ratio(s.step_time_s, base.step_time_s),
        },
    });
    match row {
        Value::Object(m) => m,
        _ => unreachable!("a JSON object literal"),
    }
}

/// Writes the picture of `reports` (see [`crate::picture::simulation`]) to `path`.
pub fn write_svg(path: &Path, label: &str, reports: &[SimReport]) -> anyhow::Result<()> {
    let svg = crate::picture::simulation(&format!("Tangram simulator: {label}"), reports).svg()?;
    std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))
}
