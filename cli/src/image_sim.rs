//! `tangram simulate --workload swe-images`: sandboxes from per-task images that no node
//! holds at the start, each policy run twice, with image-aware placement and with placement
//! that ignores images, side by side.

use crate::{progress, report, SimulateArgs};
use serde_json::json;
use tangram_core::sim::{self, SimReport, SweImages};

pub(crate) fn swe_images(args: &SimulateArgs) -> anyhow::Result<()> {
    if !(args.pull_mb_per_s.is_finite() && args.pull_mb_per_s > 0.0) {
        crate::usage!("--pull-mb-per-s must be a positive number");
    }
    if args.cluster.is_some() {
        crate::usage!("swe-images runs on ai-coding's cluster; --cluster is not taken");
    }
    let gen = SweImages {
        batch: args.batch,
        group: args.group as usize,
        seed: args.seed,
        pull_mb_per_s: args.pull_mb_per_s,
    };
    let w = gen.generate();
    let label = format!(
        "swe-images, batch {}, group {}, seed {}, {} images, pulls at {} MB/s, load {} ms",
        args.batch,
        args.group,
        args.seed,
        w.images.images.len(),
        args.pull_mb_per_s,
        args.image_load_ms
    );
    let names: Vec<&str> = args.policy_names().collect();
    let mut policies = Vec::new();
    for n in &names {
        let Some(policy) = tangram_core::by_name(n) else {
            crate::usage!(
                "unknown policy {n:?}; swe-images takes the action-level policies: {}",
                tangram_core::policies::NAMES.join(", ")
            );
        };
        if policy.provisioning().trajectory_cores().is_some() {
            // The default list's `static` is left out; one named is refused.
            if args.policies.is_none() {
                continue;
            }
            crate::usage!("{n}: swe-images compares action-level placement; static has none");
        }
        policies.push((*n, policy));
    }
    if policies.is_empty() {
        crate::usage!("--policies is empty");
    }
    let policies: Vec<(&str, &dyn tangram_core::Policy)> =
        policies.iter().map(|(n, p)| (*n, p.as_ref())).collect();
    let spinner = progress::Spinner::start("simulating");
    let runs = sim::compare_images(&w, &policies, args.image_load_ms, |done, total, n| {
        spinner.set_message(format!("simulating {n}"));
        spinner.set_count(done as u64, total as u64);
    });
    spinner.finish();
    let reports: Vec<SimReport> = runs.iter().map(|r| r.report.clone()).collect();
    report::write_svg(&args.svg, &label, &reports)?;
    let sums: Vec<_> = runs.iter().map(|r| &r.summary).collect();
    let base = &sums[0];
    let gain = |i: usize| sim::image_gain(&runs, i);
    if args.json {
        let policies: Vec<_> = sums
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let mut o = report::policy_json(s, base);
                let st = &runs[i].stats;
                o.insert("image_aware".into(), json!(runs[i].aware));
                o.insert("pulls".into(), json!(st.pulls));
                o.insert("pulled_gb".into(), json!(st.pulled_mb / 1e3));
                o.insert(
                    "mean_open_wait_s".into(),
                    json!(runs[i].mean_open_wait_s(w.trajectories.len())),
                );
                if let Some(g) = gain(i) {
                    o.insert("mean_act_gain_over_ignoring_images".into(), json!(g));
                }
                o
            })
            .collect();
        let out = json!({
            "workload": label,
            "nodes": w.nodes.len(),
            "trajectories": w.trajectories.len(),
            "images": w.images.images.len(),
            "image_gb": w.images.images.iter().map(|(_, mb)| mb).sum::<f64>() / 1e3,
            "policies": policies,
            "svg": args.svg.display().to_string(),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "{label}: {} trajectories on {} nodes, {:.0} GB of images",
        w.trajectories.len(),
        w.nodes.len(),
        w.images.images.iter().map(|(_, mb)| mb).sum::<f64>() / 1e3
    );
    println!(
        "{:<24} {:>9} {:>9} {:>9} {:>9} {:>7} {:>9} {:>10} {:>8}",
        "policy", "mean ACT", "p50", "p99", "step", "pulls", "pulled", "open wait", "gain"
    );
    for (i, s) in sums.iter().enumerate() {
        let st = &runs[i].stats;
        println!(
            "{:<24} {:>8.3}s {:>8.3}s {:>8.3}s {:>8.1}s {:>7} {:>7.0}GB {:>9.1}s {:>8}",
            runs[i].name,
            s.mean_act_s,
            s.p50_act_s,
            s.p99_act_s,
            s.step_time_s,
            st.pulls,
            st.pulled_mb / 1e3,
            runs[i].mean_open_wait_s(w.trajectories.len()),
            gain(i).map_or_else(String::new, |g| format!("{g:.2}x")),
        );
    }
    println!("(open wait = mean per trajectory; gain = mean ACT ignoring images over image-aware)");
    println!("picture: {}", args.svg.display());
    Ok(())
}
