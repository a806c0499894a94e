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
    println!(
        "\n{:<8} {:>12} {:>10} {:>10} {:>14} {:>10} {:>10} {:>7} {:>9}",
        "sync",
        "pub+ack p50",
        "3-hop p50",
        "3-hop p99",
        "3-hop (procs)",
        "orch. p50",
        "orch. p99",
        "ratio",
        "(procs)"
    );
    for s in out["settings"].as_array().into_iter().flatten() {
        let (fl, c1) = (&s["floor"], &s["concurrency_1"]);
        println!(
            "{:<8} {:>10.0}us {:>8.0}us {:>8.0}us {:>12.0}us {:>8.0}us {:>8.0}us {:>6.2}x {:>8.2}x{}",
            s["sync"].as_str().unwrap_or(""),
            f(&fl["publish_ack_p50_us"]),
            f(&fl["three_hop_p50_us"]),
            f(&fl["three_hop_p99_us"]),
            f(&fl["three_hop_processes_p50_us"]),
            f(&c1["orchestration_p50_us"]),
            f(&c1["orchestration_p99_us"]),
            f(&c1["orchestration_over_three_hop_p50"]),
            f(&c1["orchestration_over_three_hop_processes_p50"]),
            if c1["target"]["met"] == true {
                ""
            } else {
                "  (target 1.5x missed)"
            }
        );
    }
    println!(
        "\n{:<8} {:>9} {:>10} {:>10} {:>13} {:>10} {:>6} {:>13} {:>9}",
        "sync",
        "in flight",
        "actions/s",
        "writes/s",
        "writes/action",
        "allowance",
        "share",
        "spread allow.",
        "ACT p99"
    );
    for s in out["settings"].as_array().into_iter().flatten() {
        let (fl, tp) = (&s["floor"], &s["throughput"]);
        println!(
            "{:<8} {:>9} {:>10.0} {:>10.0} {:>13.2} {:>8.0}/s {:>5.0}% {:>11.0}/s {:>7.1}ms{}",
            s["sync"].as_str().unwrap_or(""),
            tp["concurrency"],
            f(&tp["actions_per_s"]),
            f(&fl["persisted_writes_per_s"]),
            f(&tp["persisted_writes_per_action"]),
            f(&tp["actions_per_s_the_writes_allow"]),
            f(&tp["share_of_the_writes_allowance"]) * 100.0,
            f(&tp["actions_per_s_the_spread_writes_allow"]),
            f(&tp["act_p99_ms"]),
            if tp["target"]["met"] == true {
                String::new()
            } else {
                format!(
                    "  (target missed: {})",
                    tp["target"]["what"].as_str().unwrap_or("")
                )
            }
        );
    }
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
