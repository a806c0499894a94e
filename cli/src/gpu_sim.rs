//! `tangram simulate --workload mopd`: GPU services under Evict-on-Execution (`tangram`) and
//! static deployment (`static`, 4 GPUs per service), side by side.

use crate::{report, SimulateArgs};
use anyhow::{bail, Context as _};
use serde_json::json;
use tangram_core::sim::sweep::{gpu_mode, gpu_sweep, pooled_policy, quota_mode};
use tangram_core::sim::{trace, SimReport, Summary};
use tangram_core::sim_api::{simulate_api_with, DeepSearch};
use tangram_core::sim_gpu::{simulate_gpu_with, GpuMode, GpuStats, GpuWorkload, Mopd};

pub(crate) fn mopd(args: &SimulateArgs) -> anyhow::Result<()> {
    let mut w: GpuWorkload = Mopd {
        batch: args.batch,
        seed: args.seed,
    }
    .generate();
    if let Some(path) = &args.cluster {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let (nodes, services) = trace::parse_gpu_cluster(&text)?;
        w.nodes = nodes;
        if let Some(s) = services {
            let have: Vec<&str> = s.iter().map(|s| s.name.as_str()).collect();
            if let Some(missing) = w.services.iter().find(|x| !have.contains(&x.name.as_str())) {
                bail!(
                    "the cluster file's services must include every mopd teacher; {:?} is missing",
                    missing.name
                );
            }
            w.services = s;
        }
    }
    let label = format!("mopd, batch {}, seed {}", args.batch, args.seed);
    let per_service = Mopd::STATIC_GPUS_PER_TEACHER;
    let static_total =
        tangram_core::gpu::static_gpus(per_service, w.services.iter().map(|s| s.gpus));
    let mut runs: Vec<(SimReport, GpuStats)> = Vec::new();
    for name in args.policy_names() {
        let Ok(mode) = gpu_mode(name, args.gpus, per_service) else {
            crate::usage!("policy {name:?} has no GPU side; mopd compares tangram (Evict-on-Execution over --gpus) and static (4 GPUs per teacher)")
        };
        let label = match mode {
            GpuMode::Pooled { gpus } => format!("{name}@{gpus}gpu"),
            GpuMode::Static { .. } => format!("{name}@{static_total}gpu"),
        };
        runs.push(simulate_gpu_with(&w, mode, pooled_policy(name), &label));
    }
    if runs.is_empty() {
        crate::usage!("--policies is empty");
    }
    let sums: Vec<Summary> = runs.iter().map(|r| r.0.summary()).collect();
    let base = &sums[0];
    let ratio = report::ratio;

    // The sweep: the fewest pooled GPUs within tolerance of static's mean ACT, for the
    // first pooled policy listed.
    let pooled = pooled_policy(
        args.policy_names()
            .find(|p| p.starts_with("tangram"))
            .unwrap_or("tangram"),
    );
    let sweep_run = args.gpu_sweep.then(|| gpu_sweep(&w, pooled, per_service));
    let fewest = sweep_run.as_ref().and_then(|s| s.fewest);
    let mut sweep = Vec::new();
    if let Some(run) = &sweep_run {
        for r in &run.rows {
            let s = &r.summary;
            sweep.push(json!({
                "gpus": r.gpus, "mean_act_s": s.mean_act_s, "p99_act_s": s.p99_act_s,
                "mean_queue_s": s.mean_queue_s, "mean_overhead_s": s.mean_overhead_s,
                "restore_share_of_act": ratio(s.mean_overhead_s, s.mean_act_s),
                "restores": r.stats.restores, "unserved": r.stats.unserved,
                "matches_static": r.matches_static,
            }));
        }
        sweep.push(json!({"static_mean_act_s": run.static_mean_act_s, "tolerance": run.tolerance}));
    }

    let reports: Vec<SimReport> = runs.iter().map(|r| r.0.clone()).collect();
    report::write_svg(&args.svg, &label, &reports)?;
    if args.json {
        let policies: Vec<_> = sums
            .iter()
            .zip(&runs)
            .map(|(s, (_, st))| {
                let mut row = report::policy_json(s, base);
                row.insert("gpus".into(), st.gpus.into());
                row.insert(
                    "restore_share_of_act".into(),
                    ratio(s.mean_overhead_s, s.mean_act_s).into(),
                );
                row.insert("restores".into(), st.restores.into());
                row.insert("evictions".into(), st.evictions.into());
                row
            })
            .collect();
        let out = json!({
            "workload": label,
            "gpus": w.total_gpus(),
            "trajectories": w.trajectories.len(),
            "policies": policies,
            "gpu_sweep": sweep,
            "fewest_gpus_matching_static": fewest,
            "svg": args.svg.display().to_string(),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    let calls: usize = w.trajectories.iter().map(|t| t.steps.len()).sum();
    println!(
        "{label}: {} trajectories, {calls} teacher calls, {} services, cluster {} GPUs",
        w.trajectories.len(),
        w.services.len(),
        w.total_gpus()
    );
    println!(
        "{:<16} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>10} {:>9}",
        "policy",
        "mean ACT",
        "p50",
        "p99",
        "queue",
        "restore",
        "exec",
        "restore%",
        "restores",
        "GPU-s held",
        "ACT ratio"
    );
    for (s, (_, st)) in sums.iter().zip(&runs) {
        println!(
            "{:<16} {:>8.3}s {:>8.3}s {:>8.3}s {:>8.3}s {:>8.3}s {:>8.3}s {:>8.1}% {:>8} {:>10.0} {:>8.2}x",
            s.name,
            s.mean_act_s,
            s.p50_act_s,
            s.p99_act_s,
            s.mean_queue_s,
            s.mean_overhead_s,
            s.mean_exec_s,
            100.0 * ratio(s.mean_overhead_s, s.mean_act_s),
            st.restores,
            s.reserved_cpu_s,
            ratio(s.mean_act_s, base.mean_act_s)
        );
    }
    if let Some(run) = &sweep_run {
        println!(
            "\n{pooled} pool size sweep (static mean ACT as the target, within {:.0}%):",
            run.tolerance * 100.0
        );
        println!(
            "{:>5} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "GPUs", "mean ACT", "p99", "queue", "restore", "matches"
        );
        for r in &run.rows {
            let s = &r.summary;
            println!(
                "{:>5} {:>8.3}s {:>8.3}s {:>8.3}s {:>8.3}s {:>9}",
                r.gpus,
                s.mean_act_s,
                s.p99_act_s,
                s.mean_queue_s,
                s.mean_overhead_s,
                if r.matches_static { "yes" } else { "no" }
            );
        }
        match fewest {
            Some(g) => println!("fewest GPUs matching static's mean ACT: {g}"),
            None => println!("no pool size up to static's GPU count matched static's mean ACT"),
        }
    }
    println!("picture: {}", args.svg.display());
    Ok(())
}

/// `tangram simulate --workload deepsearch`: the search provider's quota pooled (`tangram`)
/// or sliced per trajectory (`static`), side by side; the judge on GPUs is the same in both.
pub(crate) fn deepsearch(args: &SimulateArgs) -> anyhow::Result<()> {
    let mut w = DeepSearch {
        batch: args.batch,
        seed: args.seed,
    }
    .generate();
    if let Some(path) = &args.cluster {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        if let Some(p) = trace::parse_providers(&text)?
            .into_iter()
            .find(|p| p.name == "search")
        {
            w.provider = p;
        }
    }
    let label = format!(
        "deepsearch, batch {}, seed {}, search quota {}/s burst {} concurrency {}",
        args.batch, args.seed, w.provider.rate_per_s, w.provider.burst, w.provider.concurrency
    );
    let mut reports = Vec::new();
    for name in args.policy_names() {
        let Ok(mode) = quota_mode(name) else {
            crate::usage!("policy {name:?} has no quota side; deepsearch compares tangram (pooled quota) and static (per-trajectory slices)")
        };
        reports.push(simulate_api_with(&w, mode, pooled_policy(name), name));
    }
    if reports.is_empty() {
        crate::usage!("--policies is empty");
    }
    let sums: Vec<Summary> = reports.iter().map(SimReport::summary).collect();
    let base = &sums[0];
    let ratio = report::ratio;
    report::write_svg(&args.svg, &label, &reports)?;
    if args.json {
        let policies: Vec<_> = sums
            .iter()
            .map(|s| {
                let mut row = report::policy_json(s, base);
                row.insert("api_calls".into(), (s.used_cpu_s * 1e3).into());
                row
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({"workload": label, "trajectories": w.trajectories.len(), "policies": policies, "svg": args.svg.display().to_string()})
            )?
        );
        return Ok(());
    }
    println!("{label}: {} trajectories", w.trajectories.len());
    println!(
        "{:<10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>11}",
        "policy", "mean ACT", "p50", "p99", "queue", "exec", "step", "step ratio"
    );
    for s in &sums {
        println!(
            "{:<10} {:>8.3}s {:>8.3}s {:>8.3}s {:>8.3}s {:>8.3}s {:>8.1}s {:>10.2}x",
            s.name,
            s.mean_act_s,
            s.p50_act_s,
            s.p99_act_s,
            s.mean_queue_s,
            s.mean_exec_s,
            s.step_time_s,
            ratio(s.step_time_s, base.step_time_s)
        );
    }
    println!("(ACT over search and judge calls; step = rollout phase, first start to last trajectory end)");
    println!("picture: {}", args.svg.display());
    Ok(())
}
