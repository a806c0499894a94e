//! The readable table of `tangram bench pipeline`.

use serde_json::Value;

pub(super) fn print_table(out: &Value) {
    let f = |v: &Value| v.as_f64().unwrap_or(0.0);
    println!(
        "pipeline bench: sandbox runtime {}, worker cores {}, load average {} -> {}",
        out["sandbox_runtime"].as_str().unwrap_or(""),
        out["worker_cores"].as_str().unwrap_or(""),
        out["load_avg_before"],
        out["load_avg_after"]
    );
    let mut t = crate::table::new([
        "sync",
        "pub+ack p50",
        "3-hop p50",
        "3-hop p99",
        "3-hop (procs)",
        "orch. p50",
        "orch. p99",
        "ratio",
        "(procs)",
        "",
    ]);
    crate::table::left(&mut t, &[9]);
    let us = |v: &Value| format!("{:.0}us", f(v));
    for s in out["settings"].as_array().into_iter().flatten() {
        let (fl, c1) = (&s["floor"], &s["concurrency_1"]);
        t.add_row([
            s["sync"].as_str().unwrap_or("").to_string(),
            us(&fl["publish_ack_p50_us"]),
            us(&fl["three_hop_p50_us"]),
            us(&fl["three_hop_p99_us"]),
            us(&fl["three_hop_processes_p50_us"]),
            us(&c1["orchestration_p50_us"]),
            us(&c1["orchestration_p99_us"]),
            format!("{:.2}x", f(&c1["orchestration_over_three_hop_p50"])),
            format!(
                "{:.2}x",
                f(&c1["orchestration_over_three_hop_processes_p50"])
            ),
            if c1["target"]["met"] == true {
                String::new()
            } else {
                "(target 1.5x missed)".to_string()
            },
        ]);
    }
    print!("\n{}", crate::table::render(&t, ""));
    let mut t = crate::table::new([
        "sync",
        "in flight",
        "actions/s",
        "writes/s",
        "writes/action",
        "allowance",
        "share",
        "spread allow.",
        "ACT p99",
        "",
    ]);
    crate::table::left(&mut t, &[9]);
    for s in out["settings"].as_array().into_iter().flatten() {
        let (fl, tp) = (&s["floor"], &s["throughput"]);
        t.add_row([
            s["sync"].as_str().unwrap_or("").to_string(),
            tp["concurrency"].to_string(),
            format!("{:.0}", f(&tp["actions_per_s"])),
            format!("{:.0}", f(&fl["persisted_writes_per_s"])),
            format!("{:.2}", f(&tp["persisted_writes_per_action"])),
            format!("{:.0}/s", f(&tp["actions_per_s_the_writes_allow"])),
            format!("{:.0}%", f(&tp["share_of_the_writes_allowance"]) * 100.0),
            format!("{:.0}/s", f(&tp["actions_per_s_the_spread_writes_allow"])),
            format!("{:.1}ms", f(&tp["act_p99_ms"])),
            if tp["target"]["met"] == true {
                String::new()
            } else {
                format!(
                    "(target missed: {})",
                    tp["target"]["what"].as_str().unwrap_or("")
                )
            },
        ]);
    }
    print!("\n{}", crate::table::render(&t, ""));
    for s in out["settings"].as_array().into_iter().flatten() {
        let r = &s["results"];
        println!(
            "{}: {} actions submitted, {} with exactly one result, {} missing, {} duplicated",
            s["sync"].as_str().unwrap_or(""),
            r["submitted"],
            r["exactly_one"],
            r["missing"],
            r["duplicated"]
        );
    }
    println!(
        "(orchestration = result in hand minus the execution the worker reports; 3-hop (procs) = \
         the same chain with each relay in its own process; ratio = orchestration p50 over the \
         3-hop p50, (procs) over the cross-process one; writes/s = pipelined \
         persisted writes to one stream; allowance = writes/s over the writes each action made; spread \
         = the same writes over as many streams as the actions wrote to)"
    );
}
