//! The rollout's report read back: each kind's ACT as a table, and two runs compared side by
//! side in a table and a picture that splits each kind's ACT into queued, overhead and exec.

use super::*;

const KINDS: [&str; 5] = [
    "sandbox_open",
    "sandbox_exec",
    "reward",
    "api",
    "sandbox_close",
];

fn column(records: &[serde_json::Value], kind: &str, field: &str) -> Vec<f64> {
    records
        .iter()
        .filter(|r| r["kind"] == kind && r["outcome"] == "completed")
        .filter_map(|r| r[field].as_f64())
        .collect()
}

pub(crate) fn print_act_table(label: &str, records: &[serde_json::Value]) {
    println!(
        "\nACT by kind, ms ({label})     n     mean      p50      p99    queue overhead     exec"
    );
    for kind in KINDS {
        let act = column(records, kind, "act_ms");
        if act.is_empty() {
            continue;
        }
        let (m, p50, p99) = stats(act.clone());
        let mean = |f: &str| stats(column(records, kind, f)).0;
        println!(
            "  {kind:<24} {:>5} {m:>8.1} {p50:>8.1} {p99:>8.1} {:>8.1} {:>8.2} {:>8.1}",
            act.len(),
            mean("queue_ms"),
            mean("overhead_ms"),
            mean("exec_ms")
        );
    }
}

/// Two runs side by side, and a picture of their ACT.
pub(crate) fn compare(a: &str, b: &str, svg: Option<&str>) -> anyhow::Result<()> {
    let load = |p: &str| -> anyhow::Result<serde_json::Value> {
        Ok(serde_json::from_str(
            &std::fs::read_to_string(p).with_context(|| format!("reading {p}"))?,
        )?)
    };
    let (x, y) = (load(a)?, load(b)?);
    let label = |v: &serde_json::Value| v["label"].as_str().unwrap_or("?").to_string();
    let recs = |v: &serde_json::Value| v["actions"].as_array().cloned().unwrap_or_default();
    let (lx, ly) = (label(&x), label(&y));
    let (rx, ry) = (recs(&x), recs(&y));
    println!(
        "\n{:<14} {:>22} {:>22} {:>8}",
        "mean ACT, ms", lx, ly, "ratio"
    );
    for kind in KINDS.iter().copied().chain(std::iter::once("all")) {
        let pick = |r: &[serde_json::Value]| -> Vec<f64> {
            if kind == "all" {
                r.iter()
                    .filter(|r| r["outcome"] == "completed")
                    .filter_map(|r| r["act_ms"].as_f64())
                    .collect()
            } else {
                column(r, kind, "act_ms")
            }
        };
        let (ax, ay) = (pick(&rx), pick(&ry));
        if ax.is_empty() && ay.is_empty() {
            continue;
        }
        let (mx, my) = (stats(ax.clone()), stats(ay.clone()));
        println!(
            "{kind:<14} {:>13.1} (p99 {:>5.0}) {:>13.1} (p99 {:>5.0}) {:>7.2}x",
            mx.0,
            mx.2,
            my.0,
            my.2,
            if mx.0 > 0.0 { my.0 / mx.0 } else { 0.0 }
        );
    }
    println!(
        "\nwall time: {} {:.1} s, {} {:.1} s; tests as expected: {} {}/{}, {} {}/{}",
        lx,
        x["wall_s"].as_f64().unwrap_or(0.0),
        ly,
        y["wall_s"].as_f64().unwrap_or(0.0),
        lx,
        x["tests_as_expected"],
        x["tests"],
        ly,
        y["tests_as_expected"],
        y["tests"]
    );
    if let Some(path) = svg {
        std::fs::write(path, act_picture(&x, &y)?).with_context(|| format!("writing {path}"))?;
        println!("picture: {path}");
    }
    Ok(())
}

/// The parts of ACT, bottom up in the picture: (report field, name, palette index).
const PARTS: [(&str, &str, usize); 3] = [
    ("queue_ms", "queued", 0),
    ("overhead_ms", "overhead", 3),
    ("exec_ms", "exec", 2),
];

/// Both runs side by side, a panel each on one scale: per action kind, the mean ACT as a bar
/// split into time queued, system overhead (a GPU restore, a sandbox start) and execution.
pub(crate) fn act_picture(
    a: &serde_json::Value,
    b: &serde_json::Value,
) -> Result<String, PlotError> {
    let runs = [a, b];
    let recs: Vec<Vec<serde_json::Value>> = runs
        .iter()
        .map(|v| v["actions"].as_array().cloned().unwrap_or_default())
        .collect();
    let kinds: Vec<&str> = KINDS
        .iter()
        .copied()
        .filter(|k| recs.iter().any(|r| !column(r, k, "act_ms").is_empty()))
        .collect();
    let split = |r: &[serde_json::Value]| -> Vec<(String, usize, Vec<f64>)> {
        PARTS
            .iter()
            .map(|(field, name, color)| {
                let means = kinds.iter().map(|k| stats(column(r, k, field)).0).collect();
                (name.to_string(), *color, means)
            })
            .collect()
    };
    let bars: Vec<_> = recs.iter().map(|r| split(r)).collect();
    let top = bars
        .iter()
        .flat_map(|parts| (0..kinds.len()).map(|i| parts.iter().map(|p| p.2[i]).sum::<f64>()))
        .fold(0.0, f64::max);
    let mut f = Figure::new(
        "Rollout workload: mean ACT per action kind, queued + overhead + exec",
        2,
    );
    f.legend = PARTS
        .iter()
        .map(|(_, name, color)| Key::fill(*name, *color))
        .collect();
    for (run, parts) in runs.iter().zip(bars) {
        let mut p = Panel::new(
            run["label"].as_str().unwrap_or("?"),
            "action kind",
            "mean ACT (ms)",
            Body::Bars {
                categories: kinds.iter().map(|k| k.to_string()).collect(),
                parts,
            },
        );
        if top > 0.0 {
            p.y_range = Some((0.0, nice(top)));
        }
        f.panels.push(p);
    }
    f.svg()
}

/// The round number (1, 2 or 5 times a power of ten) at or above `v`.
fn nice(v: f64) -> f64 {
    let p = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|r| r * p)
        .find(|x| *x >= v)
        .unwrap_or(10.0 * p)
}
