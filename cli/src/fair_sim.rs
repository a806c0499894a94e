//! `tangram simulate --workload fairness`: jobs sharing one fleet, each job's mean ACT alone
//! and beside the others in queue order and in weighted fair order, with Jain's index
//! (`tangram_core::sim::fairness`).

use crate::simulate::SimulateArgs;
use crate::table;
use serde_json::json;
use tangram_core::sim::fairness::{compare, nodes, scenarios, FairnessReport};

/// The policies compared when `--policies` is not given.
const POLICIES: &str = "tangram-v2,tangram";

pub(crate) fn fairness(args: &SimulateArgs) -> anyhow::Result<()> {
    let load_before = crate::pipeline::loadavg();
    let names: Vec<&str> = match &args.policies {
        Some(_) => args.policy_names().collect(),
        None => POLICIES.split(',').collect(),
    };
    let scale = args.batch as f64 / 1280.0;
    let cores: u32 = nodes(scale).iter().sum();
    let mut reports: Vec<FairnessReport> = Vec::new();
    for scenario in scenarios(args.seed, scale) {
        for name in &names {
            match compare(&scenario, name) {
                Some(r) => reports.push(r),
                None => crate::usage!("unknown policy {name:?}"),
            }
        }
    }
    if args.json {
        let rows: Vec<_> = reports
            .iter()
            .map(|r| {
                json!({
                    "scenario": r.scenario,
                    "policy": r.policy,
                    "queue_order_jain": r.queue_order_jain,
                    "fair_order_jain": r.fair_order_jain,
                    "jobs": r.jobs.iter().map(|j| json!({
                        "job": j.job,
                        "weight": j.weight,
                        "demand_cores": j.demand_cores,
                        "fair_share": j.fair_share,
                        "alone_mean_act_s": j.alone_s,
                        "queue_order_mean_act_s": j.queue_order_s,
                        "fair_order_mean_act_s": j.fair_s,
                        "queue_order_share": j.queue_order_share,
                        "fair_order_share": j.fair_order_share,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let out = json!({
            "workload": "fairness",
            "seed": args.seed,
            "cores": cores,
            "scale": scale,
            "load_avg_before": load_before,
            "load_avg_after": crate::pipeline::loadavg(),
            "scenarios": rows,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "fairness, {cores} cores, seed {}: each job's mean ACT alone and beside the others \
         (slowdown); demand: the cores it holds alone; got: its part of the fleet's core-time \
         while all run; share: its weighted max-min share given the demands",
        args.seed
    );
    for r in &reports {
        println!(
            "\n{} under {}: Jain's index {:.3} in queue order, {:.3} in fair order",
            r.scenario, r.policy, r.queue_order_jain, r.fair_order_jain
        );
        let mut t = table::new([
            "job",
            "weight",
            "demand",
            "alone",
            "queue order",
            "fair order",
            "got (queue)",
            "got (fair)",
            "share",
        ]);
        for j in &r.jobs {
            let slow = |s: f64| {
                if j.alone_s > 0.0 {
                    format!("{s:.2}s ({:.2}x)", s / j.alone_s)
                } else {
                    format!("{s:.2}s")
                }
            };
            t.add_row([
                j.job.clone(),
                format!("{}", j.weight),
                format!("{:.0}", j.demand_cores),
                format!("{:.2}s", j.alone_s),
                slow(j.queue_order_s),
                slow(j.fair_s),
                format!("{:.1}%", j.queue_order_share * 100.0),
                format!("{:.1}%", j.fair_order_share * 100.0),
                format!("{:.1}%", j.fair_share * 100.0),
            ]);
        }
        print!("{}", table::render(&t, "  "));
    }
    let after = crate::pipeline::loadavg();
    println!("\nload average before {load_before:?}, after {after:?}");
    Ok(())
}
