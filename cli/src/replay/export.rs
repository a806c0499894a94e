//! `tangram replay export`: a recorded job as a simulator trace.
//!
//! Each trajectory becomes one trace line; each of its `sandbox_exec`, `reward` and `api`
//! actions that ran becomes a step. A step's think time is the gap between the end of the
//! trajectory's previous step (or the trajectory's first submission) and the step's own
//! submission; the simulator does not model sandbox opens and closes, so their time counts as
//! think time. Durations come from the results' `exec_us`. An exec's one-core time `t1_s` is
//! its duration times its speed-up at the cores it was granted, under an Amdahl model fitted
//! per (job, tool) from the recording's own (cores, duration) pairs; with a single core count
//! in the recording nothing can be fitted and `--amdahl` (default 0: serial) is used.

use super::{by_trajectory, Recorded, Selection};
use serde::Serialize;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;
use tangram_shared::{ActionSpec, Outcome};

/// `tangram replay export`'s options.
#[derive(Debug, clap::Args)]
pub(crate) struct ExportArgs {
    #[command(flatten)]
    sel: Selection,
    /// Where to write the trace [default: standard output].
    #[arg(long, short)]
    out: Option<PathBuf>,
    /// Also write a cluster file (docs/SIMULATOR.md) describing the cluster as its
    /// scheduler reports it now: workers' cores and GPUs, services, providers.
    #[arg(long)]
    cluster_out: Option<PathBuf>,
    /// Amdahl parallel fraction for tools whose recording holds a single core count.
    #[arg(long, default_value_t = 0.0)]
    amdahl: f64,
    #[command(flatten)]
    cluster: crate::connect::ClusterArgs,
}

/// Amdahl speed-up at `m` cores.
fn amdahl(p: f64, m: f64) -> f64 {
    1.0 / ((1.0 - p) + p / m.max(1.0))
}

/// The tool of an exec: its program's file name.
pub fn tool(argv: &[String]) -> String {
    argv.first()
        .map(|a| a.rsplit('/').next().unwrap_or(a).to_string())
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| "exec".into())
}

/// Fits `t = a + b / m` (Amdahl with t1 = a + b, p = b / t1) by least squares over the
/// points (cores, seconds). `None` with fewer than two distinct core counts or no fit.
pub fn fit_amdahl(points: &[(u32, f64)]) -> Option<f64> {
    let mut distinct: Vec<u32> = points.iter().map(|p| p.0).collect();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() < 2 {
        return None;
    }
    let n = points.len() as f64;
    let xs: Vec<f64> = points.iter().map(|p| 1.0 / f64::from(p.0.max(1))).collect();
    let mx = xs.iter().sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = xs.iter().map(|x| (x - mx).powi(2)).sum();
    let sxy: f64 = xs
        .iter()
        .zip(points)
        .map(|(x, p)| (x - mx) * (p.1 - my))
        .sum();
    if sxx <= 0.0 {
        return None;
    }
    let b = sxy / sxx;
    let a = my - b * mx;
    let t1 = a + b;
    (t1 > 0.0).then(|| (b / t1).clamp(0.0, 0.99))
}

/// What the export did.
#[derive(Debug, Default, Serialize, PartialEq)]
pub struct Summary {
    pub trajectories: usize,
    pub steps: BTreeMap<String, usize>,
    /// Actions that never ran (rejected, no result): left out.
    pub skipped: usize,
    /// Fitted Amdahl fraction per (job/tool), or the default when none could be fitted.
    pub amdahl: BTreeMap<String, f64>,
}

/// Builds the trace lines (pure).
pub fn to_trace(recs: &[Recorded], default_p: f64) -> (Vec<serde_json::Value>, Summary) {
    let mut summary = Summary::default();
    let mut points: BTreeMap<String, Vec<(u32, f64)>> = BTreeMap::new();
    for r in recs {
        if let (ActionSpec::SandboxExec(e), Some(res)) = (&r.action.spec, &r.result) {
            if let (Some(p), true) = (&res.placement, ran(res)) {
                points
                    .entry(format!("{}/{}", r.action.job, tool(&e.argv)))
                    .or_default()
                    .push((p.cores.max(1), res.timing.exec_us as f64 / 1e6));
            }
        }
    }
    for (k, pts) in &points {
        summary
            .amdahl
            .insert(k.clone(), fit_amdahl(pts).unwrap_or(default_p));
    }
    let t0 = recs.iter().map(|r| r.submitted_us).min().unwrap_or(0);
    let mut lines = Vec::new();
    for (traj, actions) in by_trajectory(recs) {
        let first = actions[0];
        let mut prev_end = first.submitted_us;
        let mut steps = Vec::new();
        for r in actions {
            let Some(res) = r.result.as_ref().filter(|res| ran(res)) else {
                summary.skipped += 1;
                continue;
            };
            let exec_s = (res.timing.exec_us as f64 / 1e6).max(1e-6);
            let action = match &r.action.spec {
                ActionSpec::SandboxExec(e) => {
                    let tool = tool(&e.argv);
                    let p = summary.amdahl[&format!("{}/{tool}", r.action.job)];
                    let cores = res.placement.as_ref().map_or(1, |p| p.cores.max(1));
                    json!({"kind": "sandbox_exec", "tool": tool,
                        "demand": {"cpu": cores},
                        "elastic": {"resource": "cpu", "min": e.cpus.min.max(1),
                            "max": e.cpus.max.max(e.cpus.min.max(1))},
                        "t1_s": exec_s * amdahl(p, f64::from(cores)),
                        "speedup": {"amdahl": p}})
                }
                ActionSpec::Reward(w) => json!({"kind": "reward", "tool": w.service,
                    "service": w.service, "t1_s": exec_s}),
                ActionSpec::Api(a) => json!({"kind": "api", "tool": a.provider,
                    "provider": a.provider, "t1_s": exec_s}),
                ActionSpec::SandboxOpen(_) | ActionSpec::SandboxClose(_) => continue,
            };
            let kind = action["kind"].as_str().unwrap_or_default().to_string();
            *summary.steps.entry(kind).or_default() += 1;
            steps.push(json!({
                "think_s": r.submitted_us.saturating_sub(prev_end) as f64 / 1e6,
                "action": action,
            }));
            prev_end = r
                .finished_us()
                .unwrap_or(r.submitted_us + res.timing.act_us);
        }
        if steps.is_empty() {
            continue;
        }
        summary.trajectories += 1;
        lines.push(json!({
            "job": first.action.job.as_str(),
            "trajectory": traj,
            "start_s": first.submitted_us.saturating_sub(t0) as f64 / 1e6,
            "steps": steps,
        }));
    }
    (lines, summary)
}

/// Whether the action ran (a rejection or an infrastructure failure says nothing of its
/// duration).
fn ran(r: &tangram_shared::ActionResult) -> bool {
    matches!(
        r.outcome,
        Outcome::Completed { .. } | Outcome::TimedOut | Outcome::OutOfMemory { .. }
    )
}

/// The cluster file for the cluster a status describes.
pub fn cluster_file(s: &tangram_shared::status::Status) -> serde_json::Value {
    let nodes: Vec<_> = s
        .workers
        .iter()
        .filter(|w| w.cores > 0 || w.gpus > 0)
        .map(|w| json!({"count": 1, "cpu": w.cores, "mem_mb": w.mem_mb, "gpu": w.gpus}))
        .collect();
    let services: Vec<_> = s
        .services
        .iter()
        .map(|v| json!({"name": v.name, "gpus": v.gpus, "restore_s": v.restore_ms as f64 / 1e3}))
        .collect();
    let providers: Vec<_> = s
        .providers
        .iter()
        .map(|p| {
            json!({"name": p.name, "rate": p.rate_per_s,
                "burst": (p.rate_per_s.round() as u32).max(1), "concurrency": p.concurrency.max(1)})
        })
        .collect();
    json!({"nodes": nodes, "services": services, "providers": providers})
}

/// `tangram replay export`.
pub(crate) fn export(a: ExportArgs) -> anyhow::Result<()> {
    let (url, creds) = a.cluster.resolve();
    if !(0.0..1.0).contains(&a.amdahl) {
        anyhow::bail!("--amdahl must be in [0, 1)");
    }
    let spinner = crate::progress::Spinner::start("reading the streams");
    let (recs, notes) = super::runtime()?.block_on(async {
        let client = crate::errors::connect(&url, "tangram-replay", &creds).await?;
        let js = async_nats::jetstream::new(client);
        super::load(&js, &a.sel).await
    })?;
    spinner.finish();
    let (lines, summary) = to_trace(&recs, a.amdahl);
    let mut text = String::new();
    text.push_str(&format!(
        "# tangram replay export: job {}, {} actions read\n",
        a.sel.job,
        recs.len()
    ));
    for l in &lines {
        text.push_str(&serde_json::to_string(l)?);
        text.push('\n');
    }
    match &a.out {
        Some(p) => std::fs::write(p, &text)?,
        None => print!("{text}"),
    }
    if let Some(p) = &a.cluster_out {
        let status = crate::cluster::fetch_status(&url, &creds, std::time::Duration::from_secs(5))?;
        std::fs::write(
            p,
            serde_json::to_string_pretty(&cluster_file(&status))? + "\n",
        )?;
    }
    for n in &notes {
        eprintln!("note: {n}");
    }
    eprintln!(
        "exported {} trajectories ({}), {} actions that did not run left out; amdahl {}",
        summary.trajectories,
        summary
            .steps
            .iter()
            .map(|(k, n)| format!("{n} {k}"))
            .collect::<Vec<_>>()
            .join(", "),
        summary.skipped,
        summary
            .amdahl
            .iter()
            .map(|(k, p)| format!("{k}={p:.2}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tangram_shared::{
        Action, ActionId, ActionResult, JobId, Placement, Reward, SandboxExec, SandboxOpen, Timing,
        TrajectoryId, WorkerId,
    };

    fn rec(id: &str, traj: &str, spec: ActionSpec, at_s: f64, cores: u32, exec_s: f64) -> Recorded {
        let action = Action {
            queue_timeout_ms: None,
            id: ActionId::new(id).unwrap(),
            job: JobId::new("j").unwrap(),
            trajectory: TrajectoryId::new(traj).unwrap(),
            timeout_ms: 60_000,
            spec,
        };
        let submitted_us = (at_s * 1e6) as u64;
        let mut r = ActionResult::new(
            action.id.clone(),
            action.job.clone(),
            Outcome::Completed { exit_code: 0 },
            ((at_s + exec_s + 0.5) * 1e3) as u64,
        );
        r.timing = Timing::new(500_000, 0, (exec_s * 1e6) as u64);
        r.placement = Some(Placement {
            worker: WorkerId::new("w").unwrap(),
            cores,
            cpuset: String::new(),
        });
        Recorded {
            action,
            submitted_us,
            result: Some(r),
        }
    }

    fn exec(max: u32) -> ActionSpec {
        ActionSpec::SandboxExec(SandboxExec {
            argv: vec!["/usr/bin/python3".into(), "-c".into(), "1".into()],
            cpus: tangram_shared::CpuRange { min: 1, max },
            ..Default::default()
        })
    }

    #[test]
    fn amdahl_fit_recovers_the_fraction_and_refuses_one_core_count() {
        // t1 = 8 s, p = 0.75: t(m) = 2 + 6 / m.
        let pts: Vec<_> = [1u32, 2, 4, 8]
            .iter()
            .map(|&m| (m, 2.0 + 6.0 / f64::from(m)))
            .collect();
        assert!((fit_amdahl(&pts).unwrap() - 0.75).abs() < 1e-9);
        assert_eq!(fit_amdahl(&[(4, 1.0), (4, 2.0)]), None);
        assert_eq!(tool(&["/usr/bin/python3".into()]), "python3");
    }

    #[test]
    fn think_gaps_run_from_the_previous_step_end_and_opens_count_as_think() {
        let open = ActionSpec::SandboxOpen(SandboxOpen::default());
        let reward = ActionSpec::Reward(Reward {
            service: "judge".into(),
            inputs: vec!["x".into()],
            options: Default::default(),
        });
        let mut recs = vec![
            rec("o", "t1", open, 10.0, 0, 1.5),
            rec("e1", "t1", exec(4), 12.5, 4, 2.0), // 2 + 6/4 = 3.5? use pairs below
            rec("r1", "t1", reward, 16.0, 0, 0.25),
            rec("e2", "t2", exec(4), 11.0, 1, 8.0),
        ];
        // e1 ran 3.5 s on 4 cores, e2 8 s on 1 core: t = 2 + 6/m, p = 0.75.
        recs[1] = rec("e1", "t1", exec(4), 12.5, 4, 3.5);
        let (lines, s) = to_trace(&recs, 0.0);
        assert_eq!(s.trajectories, 2);
        assert_eq!(s.steps["sandbox_exec"], 2);
        assert_eq!(s.steps["reward"], 1);
        assert!(
            (s.amdahl["j/python3"] - 0.75).abs() < 1e-9,
            "{:?}",
            s.amdahl
        );
        let t1 = &lines[0];
        assert_eq!(t1["trajectory"], "t1");
        assert_eq!(t1["start_s"], 0.0);
        let steps = t1["steps"].as_array().unwrap();
        // The open (10.0 .. 12.0) is not a step: its time is the exec's think time.
        assert!((steps[0]["think_s"].as_f64().unwrap() - 2.5).abs() < 1e-9);
        assert!((steps[0]["action"]["t1_s"].as_f64().unwrap() - 8.0).abs() < 1e-9);
        // e1 finished at 12.5 + 3.5 + 0.5 = 16.5 s; the reward was submitted at 16.0:
        // overlap counts as no think.
        assert_eq!(steps[1]["think_s"], 0.0);
        assert_eq!(steps[1]["action"]["service"], "judge");
        assert_eq!(lines[1]["start_s"], 1.0);
        // The trace parses back.
        let text: String = lines.iter().map(|l| l.to_string() + "\n").collect();
        let parsed = tangram_core::sim::trace::parse_trace(&text).unwrap();
        assert_eq!(parsed.len(), 2);
        assert_eq!(parsed[0].steps.len(), 2);
    }

    #[test]
    fn actions_that_never_ran_are_left_out() {
        let mut r = rec("e", "t", exec(2), 1.0, 1, 1.0);
        r.result.as_mut().unwrap().outcome = Outcome::Rejected {
            code: tangram_shared::RejectCode::NoSandbox,
            reason: "no".into(),
        };
        let (lines, s) = to_trace(&[r], 0.0);
        assert!(lines.is_empty());
        assert_eq!(s.skipped, 1);
    }
}
