//! `tangram-rollout`: a small real agentic-RL rollout workload against a running cluster.
//!
//! K trajectories of a coding agent run concurrently. Each opens its sandbox, then for a few
//! turns "thinks" (a delay standing in for LLM generation), looks the task up through the
//! `search` API provider, submits a `sandbox_exec` that writes a candidate solution and its
//! unit tests into the sandbox and runs them with python3, and scores the candidate with the
//! `judge` reward service; then it closes the sandbox. Candidates are correct or buggy by a
//! seeded draw, so the expected test outcome of every exec is known and checked. Ends with a
//! report: actions by kind and outcome, test pass rate, and ACT split into queue, overhead and
//! execution, per kind. `--report FILE` writes it as JSON; `--compare A.json B.json --svg
//! FILE` puts two runs (two policies) side by side and draws each kind's mean ACT split into
//! queued, overhead and exec.

use anyhow::Context as _;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tangram_shared::plot::{Body, Figure, Key, Panel, PlotError};
use tangram_shared::stats::quantile;
use tangram_shared::{ActionKind, ActionResult, ActionSpec, CpuRange, Outcome};
use tangram_tests::build::{close, exec, open};
use tangram_tests::Client;
use tokio::sync::Mutex;
use tokio::time::Instant;

mod compare;
#[cfg(test)]
use compare::act_picture;
use compare::{compare, print_act_table};

struct Task {
    name: &'static str,
    tests: &'static str,
    good: &'static str,
    buggy: &'static str,
}

macro_rules! task {
    ($name:literal) => {
        Task {
            name: $name,
            tests: include_str!(concat!("../../../tasks/", $name, "/test_solution.py")),
            good: include_str!(concat!("../../../tasks/", $name, "/good.py")),
            buggy: include_str!(concat!("../../../tasks/", $name, "/buggy.py")),
        }
    };
}

const TASKS: [Task; 5] = [
    task!("fizzbuzz"),
    task!("primes"),
    task!("reverse_words"),
    task!("word_count"),
    task!("binary_search"),
];

/// A small real rollout against a running cluster, or `--compare` of two reports.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "tangram-rollout", version = tangram_shared::build::VERSION)]
struct Args {
    /// The cluster's NATS server.
    #[arg(
        long,
        env = "TANGRAM_NATS_URL",
        default_value = "nats://127.0.0.1:4222"
    )]
    nats_url: String,
    /// The job's NKey seed file.
    #[arg(long, env = "TANGRAM_NKEY_FILE")]
    nkey_file: Option<String>,
    /// The job (`rollout-<pid>` by default).
    #[arg(long)]
    job: Option<String>,
    /// Concurrent trajectories.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    trajectories: u32,
    /// Turns per trajectory.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    turns: u32,
    /// Mean think time before each turn, ms.
    #[arg(long, default_value_t = 300)]
    think_ms: u64,
    /// Seed of the candidates' draw.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
    /// The run's name in reports and comparisons.
    #[arg(long, default_value = "run")]
    label: String,
    /// Also write the report (JSON) here.
    #[arg(long)]
    report: Option<String>,
    /// No judge (reward) calls.
    #[arg(long)]
    no_reward: bool,
    /// No search (api) calls.
    #[arg(long)]
    no_api: bool,
    /// Compare two reports written by `--report` instead of running.
    #[arg(long, num_args = 2, value_names = ["A", "B"])]
    compare: Option<Vec<String>>,
    /// With `--compare`: draw both runs' ACT, split per kind, here (SVG).
    #[arg(long, requires = "compare")]
    svg: Option<String>,
}

impl Args {
    fn job(&self) -> String {
        self.job
            .clone()
            .unwrap_or_else(|| format!("rollout-{}", std::process::id()))
    }
}

/// splitmix64: a small seeded generator, so a run is reproducible.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[derive(Default)]
struct Report {
    results: Vec<ActionResult>,
    /// (expected pass, actual pass) per exec.
    tests: Vec<(bool, bool)>,
}

async fn trajectory(
    client: Client,
    args: Args,
    t: usize,
    report: Arc<Mutex<Report>>,
) -> anyhow::Result<()> {
    let job = args.job();
    let job = job.as_str();
    let traj = format!("t{t}");
    let wait = Duration::from_secs(300);
    let r = client
        .run(&open(&format!("{job}-{traj}-open"), job, &traj), wait)
        .await?;
    report.lock().await.results.push(r);
    for turn in 0..args.turns {
        let draw = mix(args.seed ^ ((t as u64) << 20) ^ turn as u64);
        tokio::time::sleep(Duration::from_millis(
            args.think_ms / 2 + draw % args.think_ms.max(1),
        ))
        .await;
        let task = &TASKS[(t + turn as usize) % TASKS.len()];
        let correct = !draw.is_multiple_of(3);
        let mut a = exec(
            &format!("{job}-{traj}-turn{turn}"),
            job,
            &traj,
            &["python3", "-m", "unittest", "-q", "test_solution"],
            1,
            2,
        );
        a.timeout_ms = 60_000;
        if let ActionSpec::SandboxExec(e) = &mut a.spec {
            e.cpus = CpuRange { min: 1, max: 2 };
            e.files.insert("test_solution.py".into(), task.tests.into());
            e.files.insert(
                "solution.py".into(),
                if correct { task.good } else { task.buggy }.into(),
            );
        }
        if !args.no_api {
            let q = tangram_tests::build::api(
                &format!("{job}-{traj}-search{turn}"),
                job,
                &traj,
                "search",
                "/search",
            );
            let mut q = q;
            if let ActionSpec::Api(api) = &mut q.spec {
                api.query.insert("q".into(), task.name.replace('_', " "));
            }
            let r = client.run(&q, wait).await?;
            report.lock().await.results.push(r);
        }
        let r = client.run(&a, wait).await?;
        let passed = matches!(r.outcome, Outcome::Completed { exit_code: 0 });
        if !args.no_reward {
            let code = if correct { task.good } else { task.buggy };
            let s = tangram_tests::build::reward(
                &format!("{job}-{traj}-judge{turn}"),
                job,
                &traj,
                "judge",
                &[code],
            );
            let rr = client.run(&s, wait).await?;
            report.lock().await.results.push(rr);
        }
        if !args.json {
            println!(
                "  {traj} turn {turn}: {:<13} {:<6} -> {} in {:.0} ms",
                task.name,
                if correct { "good" } else { "buggy" },
                if passed { "tests pass" } else { "tests fail" },
                r.timing.act_us as f64 / 1e3
            );
        }
        let mut rep = report.lock().await;
        rep.tests.push((correct, passed));
        rep.results.push(r);
    }
    let r = client
        .run(&close(&format!("{job}-{traj}-close"), job, &traj), wait)
        .await?;
    report.lock().await.results.push(r);
    Ok(())
}

/// Mean, p50 and p99 of `xs` (zeros when empty).
fn stats(mut xs: Vec<f64>) -> (f64, f64, f64) {
    if xs.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    xs.sort_by(f64::total_cmp);
    (
        xs.iter().sum::<f64>() / xs.len() as f64,
        quantile(&xs, 0.5),
        quantile(&xs, 0.99),
    )
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = <Args as clap::Parser>::parse();
    if let Some(ab) = &args.compare {
        return compare(&ab[0], &ab[1], args.svg.as_deref());
    }
    let job = args.job();
    let creds = match &args.nkey_file {
        Some(f) => tangram_nats::auth::Credentials::from_seed_file(f),
        None => Default::default(),
    };
    let client = Client::connect_with(&args.nats_url, &job, &creds)
        .await
        .with_context(|| format!("connecting to {}", args.nats_url))?;
    if !args.json {
        println!(
            "rollout: job {}, {} trajectories x {} turns, think ~{} ms, seed {}",
            job, args.trajectories, args.turns, args.think_ms, args.seed
        );
    }
    let report = Arc::new(Mutex::new(Report::default()));
    let started = Instant::now();
    let mut handles = Vec::new();
    for t in 0..args.trajectories as usize {
        handles.push(tokio::spawn(trajectory(
            client.clone(),
            args.clone(),
            t,
            report.clone(),
        )));
    }
    for h in handles {
        h.await??;
    }
    let wall = started.elapsed().as_secs_f64();
    let rep = report.lock().await;
    let mut by: BTreeMap<(String, String), usize> = BTreeMap::new();
    for r in &rep.results {
        let kind = r
            .kind
            .map(ActionKind::as_str)
            .unwrap_or("unknown")
            .to_string();
        *by.entry((kind, r.outcome.label().to_string())).or_default() += 1;
    }
    let passed = rep.tests.iter().filter(|(_, p)| *p).count();
    let as_expected = rep.tests.iter().filter(|(e, p)| e == p).count();
    let failed = rep
        .results
        .iter()
        .filter(|r| !matches!(r.outcome, Outcome::Completed { .. }))
        .count();
    let records: Vec<serde_json::Value> = rep
        .results
        .iter()
        .map(|r| {
            serde_json::json!({
                "kind": r.kind.map(ActionKind::as_str).unwrap_or("unknown"),
                "outcome": r.outcome.label(),
                "act_ms": r.timing.act_us as f64 / 1e3,
                "queue_ms": r.timing.queued_us as f64 / 1e3,
                "overhead_ms": r.timing.overhead_us as f64 / 1e3,
                "exec_ms": r.timing.exec_us as f64 / 1e3,
            })
        })
        .collect();
    let out = serde_json::json!({
        "label": args.label,
        "job": job,
        "trajectories": args.trajectories,
        "turns": args.turns,
        "wall_s": wall,
        "tests": rep.tests.len(),
        "tests_passed": passed,
        "tests_as_expected": as_expected,
        "actions": records,
    });
    if let Some(path) = &args.report {
        std::fs::write(path, serde_json::to_string_pretty(&out)?)
            .with_context(|| format!("writing {path}"))?;
    }
    if args.json {
        println!("{}", serde_json::to_string(&out)?);
    } else {
        println!("\nactions by kind and outcome");
        for ((k, o), n) in &by {
            println!("  {k:<14} {o:<12} {n}");
        }
        println!(
            "\ntests: {passed}/{} passed; {as_expected}/{} as expected (correct candidates pass, buggy ones fail)",
            rep.tests.len(),
            rep.tests.len()
        );
        print_act_table(&args.label, &records);
        println!("\n{} actions in {wall:.1} s", rep.results.len());
    }
    if failed > 0 {
        // What went wrong, one line each, for whoever reads a failed run's log.
        for r in rep
            .results
            .iter()
            .filter(|r| !matches!(r.outcome, Outcome::Completed { .. }))
        {
            eprintln!("not completed: {} ({:?}): {:?}", r.id, r.kind, r.outcome);
        }
    }
    anyhow::ensure!(failed == 0, "{failed} actions did not complete");
    anyhow::ensure!(
        as_expected == rep.tests.len(),
        "{} execs did not give the expected test outcome",
        rep.tests.len() - as_expected
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;
    use serde_json::json;

    #[test]
    fn arguments_parse_with_defaults_and_compare_takes_two_reports() {
        let a =
            Args::try_parse_from(["tangram-rollout", "--trajectories", "2", "--no-api"]).unwrap();
        assert_eq!(
            (a.trajectories, a.turns, a.think_ms, a.seed),
            (2, 3, 300, 7)
        );
        assert!(a.no_api && !a.no_reward && a.compare.is_none());
        let c = Args::try_parse_from([
            "tangram-rollout",
            "--compare",
            "a.json",
            "b.json",
            "--svg",
            "x.svg",
        ])
        .unwrap();
        assert_eq!(c.compare.unwrap(), ["a.json", "b.json"]);
        assert_eq!(c.svg.as_deref(), Some("x.svg"));
        assert!(Args::try_parse_from(["tangram-rollout", "--svg", "x.svg"]).is_err());
        assert!(Args::try_parse_from(["tangram-rollout", "--turns", "0"]).is_err());
        assert!(Args::try_parse_from(["tangram-rollout", "--compare", "a.json"]).is_err());
    }

    fn record(kind: &str, q: f64, o: f64, e: f64) -> serde_json::Value {
        json!({"kind": kind, "outcome": "completed", "act_ms": q + o + e, "queue_ms": q, "overhead_ms": o, "exec_ms": e})
    }

    #[test]
    fn the_picture_splits_each_kinds_act_into_queued_overhead_and_exec() {
        let a = json!({"label": "tangram", "actions": [
            record("sandbox_exec", 10.0, 0.0, 200.0),
            record("sandbox_exec", 30.0, 0.0, 400.0),
            record("reward", 5.0, 150.0, 600.0),
        ]});
        let b = json!({"label": "static", "actions": [
            record("sandbox_exec", 900.0, 0.0, 300.0),
            record("reward", 0.0, 0.0, 600.0),
        ]});
        let svg = act_picture(&a, &b).unwrap();
        for want in [
            ">queued<",
            ">overhead<",
            ">exec<",
            ">tangram<",
            ">static<",
            ">sandbox_exec<",
            ">reward<",
        ] {
            let squeezed: String = svg.split_whitespace().collect::<Vec<_>>().join("");
            assert!(squeezed.contains(want), "{want} missing");
        }
        // One bar segment per non-zero part: tangram exec (queued, exec), reward (all
        // three); static exec (queued, exec), reward (exec); plus the legend's three boxes.
        let filled = |c: &str| svg.matches(&format!(r#"fill="{c}" stroke="none""#)).count();
        assert_eq!(filled("#1F77B4"), 3 + 1, "queued");
        assert_eq!(filled("#FF7F0E"), 1 + 1, "overhead");
        assert_eq!(filled("#2CA02C"), 4 + 1, "exec");
        assert_eq!(stats(vec![3.0, 1.0, 2.0]), (2.0, 2.0, 3.0));
    }
}
