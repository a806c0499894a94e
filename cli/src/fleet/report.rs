//! The fleet bench's readable table and its picture of each curve against workers.

use serde_json::Value;
use tangram_shared::plot::{Body, Figure, Key, Line, Panel};

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

pub(super) fn print_table(out: &Value) {
    println!(
        "fleet bench: {} sandboxes, {} actions/s offered for {} s ({}% reward, {}% api of the non-churn turns), {} scheduler group(s), {} cores a worker, heartbeats every {} ms, sync {}, auth: {}; load average {} -> {}",
        out["sandboxes"], out["rate"], out["duration_s"], out["mix"]["reward_pct"],
        out["mix"]["api_pct"], out["groups"], out["cores_per_worker"],
        out["heartbeat_ms"], out["sync"].as_str().unwrap_or(""),
        out["auth"].as_str().unwrap_or(""),
        out["load_avg_before"], out["load_avg_after"]
    );
    let mut t = crate::table::new([
        "workers",
        "opens/s",
        "actions/s",
        "dispatch p50/p99",
        "result p50/p99",
        "reward, api p50",
        "sched CPU/action",
        "sched RSS",
        "µs/heartbeat",
        "status",
        "nats CPU, RSS",
        "failover",
        "lost/dup",
    ]);
    for r in out["rows"].as_array().into_iter().flatten() {
        let s = &r["steady"];
        let st = &r["status"];
        let fo = &r["failover"];
        let grouped = out["groups"].as_u64().is_some_and(|g| g > 1);
        t.add_row([
            if grouped {
                format!("{} (group {})", r["workers"], r["group"])
            } else {
                r["workers"].to_string()
            },
            format!("{:.0}", f(&r["opens"]["per_s"])),
            format!("{:.0}", f(&s["actions_per_s"])),
            format!(
                "{:.1} / {:.1} ms",
                f(&s["stored_to_dispatch_ms"]["p50"]),
                f(&s["stored_to_dispatch_ms"]["p99"])
            ),
            format!(
                "{:.1} / {:.1} ms",
                f(&s["stored_to_result_ms"]["p50"]),
                f(&s["stored_to_result_ms"]["p99"])
            ),
            {
                let k = &s["by_kind_stored_to_result_ms"];
                let p = |kind: &str| {
                    k[kind]["p50"]
                        .as_f64()
                        .map_or("-".to_string(), |v| format!("{v:.1}"))
                };
                format!("{}, {} ms", p("reward"), p("api"))
            },
            format!("{:.0} µs", f(&r["scheduler"]["cpu_us_per_action"])),
            format!("{:.0} MiB", f(&r["scheduler"]["rss_mib"])),
            format!("{:.0}", f(&r["heartbeats"]["scheduler_us_per_heartbeat"])),
            format!(
                "{} KiB, {:.0} ms",
                st["bytes"].as_u64().unwrap_or(0) / 1024,
                f(&st["max_ms"])
            ),
            format!(
                "{:.0}%, {:.0} MiB",
                f(&r["nats"]["cpu_share"]) * 100.0,
                f(&r["nats"]["rss_mib"])
            ),
            if fo.is_null() {
                "-".into()
            } else {
                format!(
                    "{:.1} / {:.1} / {:.1} s",
                    f(&fo["lease_taken_s"]),
                    f(&fo["new_leader_s"]),
                    f(&fo["exec_answered_s"])
                )
            },
            format!("{}/{}", r["results"]["missing"], r["results"]["duplicated"]),
        ]);
    }
    print!("\n{}", crate::table::render(&t, ""));
    println!(
        "dispatch and result: from the action's PubAck; failover, from SIGKILL: the standby holding the lease / its status answering / an exec on an old sandbox answered (submitted at the kill)"
    );
}

/// Each curve against workers, one panel each.
pub(super) fn picture(out: &Value) -> anyhow::Result<String> {
    let rows: Vec<&Value> = out["rows"].as_array().into_iter().flatten().collect();
    let series = |path: &[&str]| -> Vec<(f64, f64)> {
        rows.iter()
            .map(|r| {
                let mut v = *r;
                for p in path {
                    v = &v[*p];
                }
                (f(&r["workers"]), f(v))
            })
            .filter(|(_, y)| y.is_finite())
            .collect()
    };
    let panel = |title: &str, y: &str, lines: Vec<Line>| {
        let mut p = Panel::new(
            title,
            "workers",
            y,
            Body::Lines {
                log_x: true,
                lines: lines.clone(),
            },
        );
        p.keys = lines.iter().map(Key::of).collect();
        p
    };
    let mut fig = Figure::new(
        format!(
            "Fleet bench: {} sandboxes, {} actions/s offered",
            out["sandboxes"], out["rate"]
        ),
        3,
    );
    fig.panels = vec![
        panel(
            "Actions per second",
            "actions/s",
            vec![
                Line::new("sustained", 0, series(&["steady", "actions_per_s"])),
                Line::new("offered", 1, series(&["steady", "offered_per_s"])).dashed(),
            ],
        ),
        panel(
            "Dispatch and result after the action is stored",
            "ms",
            vec![
                Line::new(
                    "dispatch p50",
                    0,
                    series(&["steady", "stored_to_dispatch_ms", "p50"]),
                ),
                Line::new(
                    "dispatch p99",
                    0,
                    series(&["steady", "stored_to_dispatch_ms", "p99"]),
                )
                .dashed(),
                Line::new(
                    "result p50",
                    2,
                    series(&["steady", "stored_to_result_ms", "p50"]),
                ),
                Line::new(
                    "result p99",
                    2,
                    series(&["steady", "stored_to_result_ms", "p99"]),
                )
                .dashed(),
            ],
        ),
        panel(
            "Scheduler CPU per action",
            "µs",
            vec![Line::new(
                "CPU per action",
                0,
                series(&["scheduler", "cpu_us_per_action"]),
            )],
        ),
        panel(
            "Resident memory",
            "MiB",
            vec![
                Line::new("scheduler", 0, series(&["scheduler", "rss_mib"])),
                Line::new("nats-server", 1, series(&["nats", "rss_mib"])),
            ],
        ),
        panel(
            "Status answer",
            "ms / KiB",
            vec![
                Line::new("time, ms", 0, series(&["status", "max_ms"])),
                Line::new(
                    "size, KiB",
                    1,
                    series(&["status", "bytes"])
                        .into_iter()
                        .map(|(x, y)| (x, y / 1024.0))
                        .collect(),
                ),
            ],
        ),
        panel(
            "Failover after SIGKILL",
            "s",
            vec![
                Line::new("lease taken", 2, series(&["failover", "lease_taken_s"])),
                Line::new("new leader", 0, series(&["failover", "new_leader_s"])),
                Line::new("exec answered", 1, series(&["failover", "exec_answered_s"])),
            ],
        ),
    ];
    Ok(fig.svg()?)
}
