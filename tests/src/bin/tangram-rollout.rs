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
//! FILE` puts two runs (two policies) side by side and draws their ACT.

use anyhow::Context as _;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tangram_shared::{ActionKind, ActionResult, ActionSpec, CpuRange, Outcome};
use tangram_tests::build::{close, exec, open};
use tangram_tests::Client;
use tokio::sync::Mutex;
use tokio::time::Instant;

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
    nkey_file: Option<String>,
    job: String,
    trajectories: usize,
    turns: usize,
    think_ms: u64,
    seed: u64,
    json: bool,
    label: String,
    report: Option<String>,
    reward: bool,
    api: bool,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut a = Args {
        nats_url: std::env::var("TANGRAM_NATS_URL")
            .unwrap_or_else(|_| "nats://127.0.0.1:4222".into()),
        nkey_file: std::env::var("TANGRAM_NKEY_FILE").ok(),
        job: format!("rollout-{}", std::process::id()),
        trajectories: 8,
        turns: 3,
        think_ms: 300,
        seed: 7,
        json: false,
        label: "run".into(),
        report: None,
        reward: true,
        api: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--nats-url" => a.nats_url = value()?,
            "--nkey-file" => a.nkey_file = Some(value()?),
            "--job" => a.job = value()?,
            "--trajectories" => a.trajectories = value()?.parse()?,
            "--turns" => a.turns = value()?.parse()?,
            "--think-ms" => a.think_ms = value()?.parse()?,
            "--seed" => a.seed = value()?.parse()?,
            "--json" => a.json = true,
            "--label" => a.label = value()?,
            "--report" => a.report = Some(value()?),
            "--no-reward" => a.reward = false,
            "--no-api" => a.api = false,
            "--compare" => {
                let x = value()?;
                let y = value()?;
                let mut svg = None;
                if let Some(f) = it.next() {
                    anyhow::ensure!(f == "--svg", "after --compare A B only --svg FILE");
                    svg = Some(it.next().context("--svg needs a file")?);
                }
                compare(&x, &y, svg.as_deref())?;
                std::process::exit(0);
            }
            "-h" | "--help" => {
                println!("usage: tangram-rollout [--nats-url URL] [--nkey-file SEED] [--job ID] [--trajectories K] [--turns T] [--think-ms MS] [--seed S] [--label NAME] [--report FILE] [--no-reward] [--no-api] [--json]\n       tangram-rollout --compare A.json B.json [--svg FILE]");
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
        .run(&open(&format!("{job}-{traj}-open"), job, &traj), wait)
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
        if args.api {
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
        if args.reward {
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
    let creds = match &args.nkey_file {
        Some(f) => tangram_nats::auth::Credentials::from_seed_file(f),
        None => Default::default(),
    };
    let client = Client::connect_with(&args.nats_url, &args.job, &creds)
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
        "job": args.job,
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

fn print_act_table(label: &str, records: &[serde_json::Value]) {
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
fn compare(a: &str, b: &str, svg: Option<&str>) -> anyhow::Result<()> {
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
    let mut rows = Vec::new();
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
        rows.push((kind, mx, my));
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
        std::fs::write(path, bars_svg(&lx, &ly, &rows))
            .with_context(|| format!("writing {path}"))?;
        println!("picture: {path}");
    }
    Ok(())
}

/// Grouped bars: mean ACT per kind for each run, with a tick at p99 (log scale).
/// One row of the comparison: kind, (mean, p50, p99) of each run.
type Row<'a> = (&'a str, (f64, f64, f64), (f64, f64, f64));

fn bars_svg(lx: &str, ly: &str, rows: &[Row<'_>]) -> String {
    use std::fmt::Write as _;
    let (w, h, left, top, bottom) = (760.0, 420.0, 70.0, 50.0, 60.0);
    let ph = h - top - bottom;
    let max = rows
        .iter()
        .map(|r| r.1 .2.max(r.2 .2))
        .fold(1.0_f64, f64::max);
    let (lo, hi) = (0.1_f64.log10(), (max * 1.5).log10());
    let y = |v: f64| top + ph - ph * ((v.max(0.1).log10() - lo) / (hi - lo));
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="24" text-anchor="middle" font-size="15">Rollout workload: mean ACT per action kind (bars), p99 (ticks), log scale</text>"#,
        w / 2.0
    );
    let mut v = 0.1;
    while v <= max * 1.5 {
        let _ = writeln!(
            s,
            r##"<line x1="{left}" x2="{}" y1="{y0:.1}" y2="{y0:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{v} ms</text>"##,
            w - 20.0,
            left - 6.0,
            y(v) + 4.0,
            y0 = y(v)
        );
        v *= 10.0;
    }
    let gw = (w - left - 20.0) / rows.len().max(1) as f64;
    for (i, (kind, a, b)) in rows.iter().enumerate() {
        let x0 = left + gw * i as f64 + gw * 0.15;
        let bw = gw * 0.35;
        for (j, (m, col)) in [(a, "#1f77b4"), (b, "#d62728")].iter().enumerate() {
            let x = x0 + bw * j as f64;
            let _ = writeln!(
                s,
                r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{col}"/><line x1="{x:.1}" x2="{:.1}" y1="{p:.1}" y2="{p:.1}" stroke="black" stroke-width="2"/>"#,
                y(m.0),
                bw - 4.0,
                (top + ph - y(m.0)).max(0.0),
                x + bw - 4.0,
                p = y(m.2)
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{kind}</text>"#,
            x0 + bw,
            top + ph + 18.0
        );
    }
    let _ = writeln!(
        s,
        r##"<rect x="{left}" y="{}" width="12" height="12" fill="#1f77b4"/><text x="{}" y="{}">{lx}</text><rect x="{}" y="{}" width="12" height="12" fill="#d62728"/><text x="{}" y="{}">{ly}</text>"##,
        h - 26.0,
        left + 16.0,
        h - 16.0,
        left + 140.0,
        h - 26.0,
        left + 156.0,
        h - 16.0
    );
    s.push_str("</svg>\n");
    s
}
