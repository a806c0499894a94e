//! `tangram-rollout`: a small real agentic-RL rollout workload against a running cluster.
//!
//! K trajectories of a coding agent run concurrently. Each opens its sandbox, then for a few
//! turns "thinks" (a delay standing in for LLM generation) and submits a `sandbox_exec` that
//! writes a candidate solution and its unit tests into the sandbox and runs them with
//! python3; then it closes the sandbox. Candidates are correct or buggy by a seeded draw, so
//! the expected test outcome of every exec is known and checked. Ends with a report: actions
//! by kind and outcome, test pass rate, and ACT split into queue, overhead and execution.

use anyhow::Context as _;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tangram_shared::{ActionKind, ActionResult, ActionSpec, CpuRange, Outcome};
use tangram_tests::build::{close, exec, open};
use tangram_tests::Client;
use tokio::sync::Mutex;

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
            tests: include_str!(concat!("../../tasks/", $name, "/test_solution.py")),
            good: include_str!(concat!("../../tasks/", $name, "/good.py")),
            buggy: include_str!(concat!("../../tasks/", $name, "/buggy.py")),
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

#[derive(Debug, Clone)]
struct Args {
    nats_url: String,
    job: String,
    trajectories: usize,
    turns: usize,
    think_ms: u64,
    seed: u64,
    json: bool,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut a = Args {
        nats_url: std::env::var("TANGRAM_NATS_URL")
            .unwrap_or_else(|_| "nats://127.0.0.1:4222".into()),
        job: format!("rollout-{}", std::process::id()),
        trajectories: 8,
        turns: 3,
        think_ms: 300,
        seed: 7,
        json: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--nats-url" => a.nats_url = value()?,
            "--job" => a.job = value()?,
            "--trajectories" => a.trajectories = value()?.parse()?,
            "--turns" => a.turns = value()?.parse()?,
            "--think-ms" => a.think_ms = value()?.parse()?,
            "--seed" => a.seed = value()?.parse()?,
            "--json" => a.json = true,
            "-h" | "--help" => {
                println!("usage: tangram-rollout [--nats-url URL] [--job ID] [--trajectories K] [--turns T] [--think-ms MS] [--seed S] [--json]");
                std::process::exit(0);
            }
            other => anyhow::bail!("unknown argument {other:?} (see --help)"),
        }
    }
    anyhow::ensure!(
        a.trajectories > 0 && a.turns > 0,
        "--trajectories and --turns must be positive"
    );
    Ok(a)
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
    let job = args.job.as_str();
    let traj = format!("t{t}");
    let wait = Duration::from_secs(300);
    let r = client
        .run(&open(&format!("{traj}-open"), job, &traj), wait)
        .await?;
    report.lock().await.results.push(r);
    for turn in 0..args.turns {
        let draw = mix(args.seed ^ ((t as u64) << 20) ^ turn as u64);
        tokio::time::sleep(Duration::from_millis(
            args.think_ms / 2 + draw % args.think_ms.max(1),
        ))
        .await;
        let task = &TASKS[(t + turn) % TASKS.len()];
        let correct = draw % 3 != 0;
        let mut a = exec(
            &format!("{traj}-turn{turn}"),
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
        let r = client.run(&a, wait).await?;
        let passed = matches!(r.outcome, Outcome::Completed { exit_code: 0 });
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
        .run(&close(&format!("{traj}-close"), job, &traj), wait)
        .await?;
    report.lock().await.results.push(r);
    Ok(())
}

fn stats(mut xs: Vec<f64>) -> (f64, f64, f64) {
    if xs.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    xs.sort_by(f64::total_cmp);
    let pick = |p: f64| xs[((xs.len() as f64 - 1.0) * p).round() as usize];
    (
        xs.iter().sum::<f64>() / xs.len() as f64,
        pick(0.5),
        pick(0.99),
    )
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let client = Client::connect(&args.nats_url, &args.job)
        .await
        .with_context(|| format!("connecting to {}", args.nats_url))?;
    if !args.json {
        println!(
            "rollout: job {}, {} trajectories x {} turns, think ~{} ms, seed {}",
            args.job, args.trajectories, args.turns, args.think_ms, args.seed
        );
    }
    let report = Arc::new(Mutex::new(Report::default()));
    let started = Instant::now();
    let mut handles = Vec::new();
    for t in 0..args.trajectories {
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
    let execs: Vec<&ActionResult> = rep
        .results
        .iter()
        .filter(|r| r.kind == Some(ActionKind::SandboxExec))
        .collect();
    let ms =
        |f: fn(&ActionResult) -> u64| execs.iter().map(|r| f(r) as f64 / 1e3).collect::<Vec<_>>();
    let act = stats(ms(|r| r.timing.act_us));
    let queue = stats(ms(|r| r.timing.queued_us));
    let overhead = stats(ms(|r| r.timing.overhead_us));
    let exec_t = stats(ms(|r| r.timing.exec_us));
    let passed = rep.tests.iter().filter(|(_, p)| *p).count();
    let as_expected = rep.tests.iter().filter(|(e, p)| e == p).count();
    let infra = rep
        .results
        .iter()
        .filter(|r| !matches!(r.outcome, Outcome::Completed { .. }))
        .count();

    if args.json {
        let kinds: Vec<String> = by
            .iter()
            .map(|((k, o), n)| format!("{{\"kind\":\"{k}\",\"outcome\":\"{o}\",\"count\":{n}}}"))
            .collect();
        println!(
            "{{\"job\":\"{}\",\"wall_s\":{wall:.3},\"actions\":[{}],\"tests\":{},\"tests_passed\":{passed},\"tests_as_expected\":{as_expected},\
             \"exec_act_ms\":{{\"mean\":{:.1},\"p50\":{:.1},\"p99\":{:.1}}},\"exec_queue_ms_mean\":{:.1},\"exec_overhead_ms_mean\":{:.2},\"exec_exec_ms_mean\":{:.1}}}",
            args.job, kinds.join(","), rep.tests.len(), act.0, act.1, act.2, queue.0, overhead.0, exec_t.0
        );
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
        println!("\nsandbox_exec ACT (ms)     mean      p50      p99");
        for (name, s) in [
            ("act", act),
            ("  queue", queue),
            ("  overhead", overhead),
            ("  execution", exec_t),
        ] {
            println!("  {name:<20} {:>8.1} {:>8.1} {:>8.1}", s.0, s.1, s.2);
        }
        println!("\n{} actions in {wall:.1} s", rep.results.len());
    }
    anyhow::ensure!(infra == 0, "{infra} actions did not complete");
    anyhow::ensure!(
        as_expected == rep.tests.len(),
        "{} execs did not give the expected test outcome",
        rep.tests.len() - as_expected
    );
    Ok(())
}
