//! The fault suite at any size: `tangram-faults --actions 10000` runs the mixed workload once
//! per fault (the actions split evenly between them), prints a table and one JSON line, and
//! exits 1 unless every acknowledged action was ok (none lost, none duplicated).
//!
//! Flags: `--actions N` (10,000), `--faults a,b` (all: leader-kill, scheduler-restart,
//! nats-kill, nats-pause, worker-kill, worker-partition, two-schedulers, worker-drain),
//! `--trajectories N` (16 at once), `--pause-s N` (20).
//!
//! `--soak` runs the soak instead: the fleet at a steady load for `--duration-s` (3600),
//! `--lanes` rollouts at once (16), sampled every `--sample-s` (10); `--history-bytes N`
//! shrinks the history so that it wraps (`--backlog-bytes N` the backlog); `--picture FILE`
//! draws memory and streams over time; `--rate N` paces publishes, `--noop-sandboxes` puts
//! the CPU workers on the noop runtime. Exits 1 unless nothing was lost, duplicated, refused
//! or left behind and no process grew by more than 5% over the last half.
//!
//! `--nemesis` runs the workload (`--actions`, `--trajectories`) once under a randomised
//! schedule of overlapping faults drawn from `--seed` (a random one when absent, printed),
//! planned over `--span-s` (600), and exits 1 unless nothing was lost, duplicated or left.
//!
//! `--fleet` runs the multi-host faults on one docker-compose fleet instead (`--faults`
//! then names: nats-node-kill, worker-disconnect, leader-container-kill, rolling-restart,
//! scale-2-6-2); it needs Docker and builds the images.

use tangram_tests::faults::compose::{self, ComposeFleet, FleetFault};
use tangram_tests::faults::{run, Fault, Report, Size};

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

/// A flag's value parsed, or `None` when absent; a value that does not parse is an error
/// naming the flag.
fn value<T: std::str::FromStr>(args: &[String], name: &str) -> anyhow::Result<Option<T>> {
    flag(args, name)
        .map(|v| {
            v.parse()
                .map_err(|_| anyhow::anyhow!("{name} takes a number, not {v:?}"))
        })
        .transpose()
}

/// A flag's value parsed, or `default` when absent.
fn number<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> anyhow::Result<T> {
    Ok(value(args, name)?.unwrap_or(default))
}

/// The faults `--faults a,b` names, else all of them.
fn faults<F: Copy>(
    args: &[String],
    all: &[F],
    parse: fn(&str) -> Option<F>,
) -> anyhow::Result<Vec<F>> {
    match flag(args, "--faults") {
        None => Ok(all.to_vec()),
        Some(list) => list
            .split(',')
            .map(|n| parse(n.trim()).ok_or_else(|| anyhow::anyhow!("no fault {n:?}")))
            .collect(),
    }
}

const USAGE: &str = "\
usage: tangram-faults [--actions N] [--faults a,b] [--trajectories N] [--pause-s N] [--fleet]
       tangram-faults --soak [--duration-s N] [--lanes N] [--steps N] [--file-bytes N]
                      [--sample-s N] [--history-bytes N] [--backlog-bytes N]
                      [--picture FILE] [--max-growth F] [--rate N] [--noop-sandboxes]
       tangram-faults --nemesis [--seed N] [--actions N] [--trajectories N] [--span-s N]
       tangram-faults --version

Runs the mixed workload once per fault (the actions split evenly between them), prints a
table and one JSON line, and exits 1 unless every acknowledged action was ok.

  --actions N        actions in all [10000]
  --faults a,b       the faults to run [all]: leader-kill, scheduler-restart, nats-kill,
                     nats-pause, worker-kill, worker-partition, two-schedulers, worker-drain;
                     with --fleet: nats-node-kill, worker-disconnect, leader-container-kill,
                     rolling-restart, scale-2-6-2
  --trajectories N   trajectories at once [16]
  --pause-s N        how long a pause fault lasts, in seconds [20]
  --fleet            run the multi-host faults on a docker-compose fleet (needs Docker)

  --nemesis          one run under a randomised schedule of overlapping faults:
  --seed N           the schedule's seed [random, printed]
  --span-s N         seconds over which faults are planned [600]

  --soak             the fleet at a steady load for a long time instead (needs Docker):
  --duration-s N     how long the load runs [3600]
  --lanes N          rollouts at once, each running trajectories one after another [16]
  --steps N          exec, reward and api steps per trajectory [8]
  --file-bytes N     bytes of the file each exec carries [4096]
  --sample-s N       seconds between readings [10]
  --history-bytes N  shrink the history stream to N bytes, so that it wraps [unchanged]
  --backlog-bytes N  shrink the backlog streams to N bytes [unchanged]
  --picture FILE     write memory and streams over time as SVG
  --max-growth F     the most a process's RSS may grow over the last half [0.05]
  --rate N           pace publishes to N a second across all lanes [as fast as lanes go]
  --noop-sandboxes   CPU workers on the noop runtime: execs leave no mark and only their
                     results are counted; rewards and api calls stay real
";

/// Checks the command line: `--help` prints the usage, an unknown flag is a usage error.
fn check_args(args: &[String]) -> Result<(), String> {
    let mut i = 1;
    while i < args.len() {
        match args[i].as_str() {
            "--actions" | "--faults" | "--trajectories" | "--pause-s" | "--duration-s"
            | "--lanes" | "--steps" | "--file-bytes" | "--sample-s" | "--history-bytes"
            | "--backlog-bytes" | "--picture" | "--max-growth" | "--seed" | "--span-s"
            | "--rate" => {
                if i + 1 >= args.len() {
                    return Err(format!("{} needs a value", args[i]));
                }
                i += 2
            }
            "--fleet" | "--soak" | "--nemesis" | "--noop-sandboxes" => i += 1,
            other => return Err(format!("unexpected argument {other:?}")),
        }
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        print!("{USAGE}");
        return Ok(());
    }
    if args.iter().any(|a| a == "--version" || a == "-V") {
        println!("tangram-faults {}", tangram_shared::build::VERSION);
        return Ok(());
    }
    if let Err(bad) = check_args(&args) {
        eprintln!("tangram-faults: {bad}\n\n{USAGE}");
        std::process::exit(2);
    }
    let actions: usize = number(&args, "--actions", 10_000)?;
    let trajectories: usize = number(&args, "--trajectories", 16)?;
    let pause_s: u64 = number(&args, "--pause-s", 20)?;
    if args.iter().any(|a| a == "--fleet") {
        return fleet(&args, actions, trajectories).await;
    }
    if args.iter().any(|a| a == "--soak") {
        return soak(&args).await;
    }
    if args.iter().any(|a| a == "--nemesis") {
        let seed: u64 = value(&args, "--seed")?.unwrap_or_else(|| fastrand::u64(..));
        let span_s: f64 = number(&args, "--span-s", 600.0)?;
        eprintln!("nemesis: seed {seed}, about {actions} actions, faults over {span_s} s ...");
        let r = tangram_tests::faults::nemesis::run(
            seed,
            Size {
                pause_s,
                ..Size::about(actions, trajectories)
            },
            span_s,
        )
        .await?;
        let mut counts = std::collections::BTreeMap::new();
        for p in &r.struck {
            *counts.entry(format!("{:?}", p.strike)).or_insert(0) += 1;
        }
        eprintln!("struck: {counts:?}");
        let clean = r.clean();
        finish_one(&r.report);
        println!(
            "left: {} running, {} cores, {} sandboxes, {} containers",
            r.left_running, r.left_cores, r.left_sandboxes, r.leaked_containers
        );
        println!("{}", serde_json::to_string(&r)?);
        if !clean {
            std::process::exit(1);
        }
        return Ok(());
    }
    let faults = faults(&args, &Fault::ALL, Fault::parse)?;
    let per = actions / faults.len().max(1);
    let mut reports: Vec<Report> = Vec::new();
    for f in &faults {
        let size = Size {
            pause_s,
            ..Size::about(per, trajectories)
        };
        eprintln!("{}: about {per} actions ...", f.name());
        reports.push(run(*f, size).await?);
    }
    finish(reports)
}

async fn fleet(args: &[String], actions: usize, trajectories: usize) -> anyhow::Result<()> {
    let faults = faults(args, &FleetFault::ALL, FleetFault::parse)?;
    let per = actions / faults.len().max(1);
    eprintln!("bringing up the fleet ...");
    let fleet = tokio::task::spawn_blocking(|| ComposeFleet::up("faults")).await??;
    let mut reports = Vec::new();
    for f in &faults {
        eprintln!("{}: about {per} actions ...", f.name());
        reports.push(compose::run(&fleet, *f, Size::about(per, trajectories)).await?);
    }
    drop(fleet);
    finish(reports)
}

async fn soak(args: &[String]) -> anyhow::Result<()> {
    use tangram_tests::faults::soak::{self, SoakConfig};
    let cfg = SoakConfig {
        duration: std::time::Duration::from_secs_f64(number(args, "--duration-s", 3600.0)?),
        lanes: number(args, "--lanes", 16)?,
        steps: number(args, "--steps", 8)?,
        file_bytes: number(args, "--file-bytes", 4096)?,
        sample_every: std::time::Duration::from_secs_f64(number(args, "--sample-s", 10.0)?),
        history_bytes: value(args, "--history-bytes")?,
        backlog_bytes: value(args, "--backlog-bytes")?,
        picture: flag(args, "--picture").map(Into::into),
        rate: value(args, "--rate")?,
        noop_sandboxes: args.iter().any(|a| a == "--noop-sandboxes"),
    };
    let max_growth = number(args, "--max-growth", 0.05)?;
    eprintln!("soak: {:?} with {} lanes ...", cfg.duration, cfg.lanes);
    let report = soak::run(cfg).await?;
    print!("{}", report.table());
    println!("{}", serde_json::to_string(&report)?);
    if !report.passed(max_growth) {
        std::process::exit(1);
    }
    Ok(())
}

/// The table's lines for one report.
fn finish_one(r: &Report) {
    println!(
        "{:<22} {:>7} {:>7} {:>6} {:>11} {:>13} {:>9.1} {:>9.1}",
        r.fault,
        r.total.acked,
        r.total.ok,
        r.total.lost,
        r.total.duplicated,
        r.total.worker_lost_after_effect,
        r.longest_stall_s,
        r.total_s
    );
}

fn finish(reports: Vec<Report>) -> anyhow::Result<()> {
    println!(
        "{:<22} {:>7} {:>7} {:>6} {:>11} {:>13} {:>9} {:>9}",
        "fault", "acked", "ok", "lost", "duplicated", "wl-after-eff", "stall s", "seconds"
    );
    for r in &reports {
        println!(
            "{:<22} {:>7} {:>7} {:>6} {:>11} {:>13} {:>9.1} {:>9.1}",
            r.fault,
            r.total.acked,
            r.total.ok,
            r.total.lost,
            r.total.duplicated,
            r.total.worker_lost_after_effect,
            r.longest_stall_s,
            r.total_s
        );
    }
    let clean = reports.iter().all(Report::clean);
    println!(
        "{}",
        serde_json::json!({ "suite": "faults", "clean": clean, "runs": reports })
    );
    if !clean {
        for r in reports.iter().filter(|r| !r.clean()) {
            eprintln!("{}: {:#?}", r.fault, r.examples);
        }
        std::process::exit(1);
    }
    Ok(())
}
