//! `tangram`: bring a local cluster up and down, submit actions, inspect the scheduler,
//! simulate policies, benchmark the scheduling core and the action path.

mod bench;
mod calibrate;
mod check_config;
mod cluster;
mod connect;
mod cordon;
mod creds;
mod errors;
mod fleet;
mod gpu_sim;
mod image_sim;
mod images;
mod inspect;
mod nats_server;
mod picture;
mod pipeline;
mod probe;
mod progress;
mod replay;
mod report;
mod streams;
mod submit;
mod table;
mod upgrade;

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand};
use serde_json::json;
use std::path::PathBuf;
use tangram_core::sim::{self, trace, AiCoding, Workload, WorkloadName};

/// Tangram: action-level resource orchestration for agentic RL.
#[derive(Debug, Parser)]
#[command(name = "tangram", version = tangram_shared::build::VERSION, about)]
struct Cli {
    /// Config file, read by `up` and `check-config` only (other commands ignore it): an
    /// `[up]` table with `up`'s options; flags and environment variables win over it
    /// [default: tangram.toml in the working directory, when present].
    #[arg(long, global = true, env = "TANGRAM_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Start a local cluster on loopback: nats-server, the scheduler, CPU workers, a GPU
    /// worker with declared GPUs and reference replicas, and a search API stand-in.
    Up(cluster::UpArgs),
    /// Stop the cluster `up` started.
    Down {
        /// The cluster's state directory.
        #[arg(long, env = "TANGRAM_STATE_DIR", default_value = ".tangram")]
        state_dir: PathBuf,
    },
    /// Send one action, wait for its result and print it.
    Submit(submit::SubmitArgs),
    /// Workers, pools and their use, queue depth, resident services, providers, recent ACT.
    Status {
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// Redraw every N seconds (2 when no value is given) until interrupted.
        #[arg(long, num_args = 0..=1, default_missing_value = "2", value_name = "SECONDS")]
        watch: Option<f64>,
        /// With --watch: stop after this many reports.
        #[arg(long, requires = "watch")]
        count: Option<u64>,
        #[command(flatten)]
        cluster: connect::ClusterArgs,
    },
    /// Place nothing new on a worker (no new sandboxes, api or reward calls); its open
    /// sandboxes keep running their trajectories' commands.
    Cordon(cordon::Target),
    /// Lift a cordon or a drain.
    Uncordon(cordon::Target),
    /// Cordon a worker and close its sandboxes at a deadline; waits until nothing runs
    /// there, so the worker can be stopped.
    Drain(cordon::DrainArgs),
    /// Sandbox images on workers: `prepull` makes them present ahead of a step.
    Images {
        #[command(subcommand)]
        what: images::ImagesCommand,
    },
    /// The JetStream streams: `upgrade` converts a cluster made by an earlier release.
    Streams {
        #[command(subcommand)]
        what: upgrade::StreamsCommand,
    },
    /// Write a fleet's credentials: one nkey seed per role (operator, scheduler, rollout,
    /// each worker, each named job's rollout) and the servers' authorization.conf. Seeds
    /// already in the directory are kept.
    Creds {
        /// Where: one `<role>.nk` per role, and `authorization.conf`.
        #[arg(long)]
        dir: PathBuf,
        /// Worker ids, comma-separated.
        #[arg(long, default_value = "")]
        workers: String,
        /// Jobs whose rollouts get credentials of their own, comma-separated.
        #[arg(long, default_value = "")]
        jobs: String,
    },
    /// GET a health endpoint (for container health checks): exit 0 on 200, 1 otherwise.
    Probe {
        /// host:port of the endpoint, e.g. 127.0.0.1:9465.
        addr: String,
        /// The path.
        #[arg(default_value = "/readyz")]
        path: String,
    },
    /// One action's whole story from the retained streams: the action as stored, every
    /// dispatch, its result, any dead-letter record, and a timeline with the ACT split.
    Inspect(inspect::InspectArgs),
    /// Recorded runs: list jobs, export one as a simulator trace, replay it into a cluster
    /// with a diff report, list and re-submit dead letters.
    Replay {
        #[command(subcommand)]
        what: replay::ReplayWhat,
    },
    /// Run scheduling policies side by side on one workload, on a virtual clock.
    Simulate(SimulateArgs),
    /// Sweep the settings the paper leaves open and map where our baselines reach its
    /// figures (docs/CALIBRATION.md): tables, heat-map SVGs, `--json`.
    Calibrate(calibrate::CalibrateArgs),
    /// Print a shell completion script: `tangram completions bash > /etc/bash_completion.d/tangram`.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Check a configuration and print it as it takes effect (file, environment variables
    /// and defaults merged), with secrets redacted: `up`'s own, or a scheduler's or worker's.
    CheckConfig(check_config::CheckArgs),
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        what: BenchWhat,
    },
}

#[derive(Debug, clap::Args)]
pub(crate) struct SimulateArgs {
    /// Built-in workload generator: ai-coding, bursty, mopd, deepsearch or swe-images.
    #[arg(long, conflicts_with = "trace")]
    pub(crate) workload: Option<String>,
    /// A JSON-lines trace, one trajectory per line (docs/SIMULATOR.md).
    #[arg(long)]
    pub(crate) trace: Option<PathBuf>,
    /// Policies, comma-separated; ratios are given to the first.
    #[arg(long, default_value = DEFAULT_POLICIES)]
    pub(crate) policies: String,
    /// Trajectories in the batch (built-in workloads).
    #[arg(long, default_value_t = 1280)]
    pub(crate) batch: usize,
    /// RL jobs sharing the cluster (built-in workloads); job k gets a share of the batch
    /// proportional to 2^-k.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) jobs: u32,
    /// Seed (built-in workloads).
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Cluster file (JSON); the workload's default cluster otherwise.
    #[arg(long)]
    pub(crate) cluster: Option<PathBuf>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Elasticity models the scheduler sees: oracle (each action's true model), learned
    /// (fitted online per job and tool), or both (adds `tangram-learned` and `tangram-v2-learned` rows).
    #[arg(long, default_value = "both", value_parser = ["oracle", "learned", "both"])]
    pub(crate) elasticity: String,
    /// Where to write the picture (SVG).
    #[arg(long, default_value = "simulate.svg")]
    pub(crate) svg: PathBuf,
    /// GPU workloads: GPUs in the pooled (Evict-on-Execution) policies' pool; the static
    /// baseline keeps 4 per service.
    #[arg(long, default_value_t = 10)]
    pub(crate) gpus: u32,
    /// Cores each trajectory's sandbox holds under the `static` and `k8s` baselines (the paper's 4; a
    /// replayed trace of a small cluster wants what `tangram up --static-cores` gave).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) static_cores: u32,
    /// Median pod start of the `k8s` baseline, seconds (default: 1.6, docs/CALIBRATION.md).
    #[arg(long, default_value_t = tangram_core::sim::K8s::START_MS / 1e3)]
    pub(crate) pod_start_s: f64,
    /// GPU workloads: also run the first of `tangram` and `tangram-v2` listed at every pool
    /// size from 1 GPU up to the static baseline's, and report the fewest GPUs whose mean ACT is within 10% of static's.
    #[arg(long)]
    pub(crate) gpu_sweep: bool,
    /// swe-images: trajectories per task (one image per task).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) group: u32,
    /// swe-images: a node's image pull throughput, MB/s.
    #[arg(long, default_value_t = 100.0)]
    pub(crate) pull_mb_per_s: f64,
    /// swe-images: what one more sandbox per core costs against a pull, ms (the scheduler's
    /// `[images] load_ms`).
    #[arg(long, default_value_t = tangram_core::EngineConfig::default().image_load_ms)]
    pub(crate) image_load_ms: u64,
}

/// `tangram simulate`'s policies when `--policies` is not given.
pub(crate) const DEFAULT_POLICIES: &str = "tangram,static,fifo-dop-4,first-fit";

impl SimulateArgs {
    /// The policies `--policies` names, in order, blanks dropped.
    pub(crate) fn policy_names(&self) -> impl Iterator<Item = &str> {
        self.policies
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
    }
}

#[derive(Debug, Subcommand)]
enum BenchWhat {
    /// Decision cost of the scheduling core: full re-plan latency and incremental decisions/s.
    Scheduler {
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
        /// Re-plans measured per configuration.
        #[arg(long, default_value_t = 200)]
        iterations: usize,
    },
    /// The action path end to end on a real local cluster (nats-server, the scheduler, one
    /// CPU worker): orchestration per action and actions/s, beside the NATS floors measured on
    /// the same server in the same run, for the server's default sync and for `always`.
    Pipeline(pipeline::PipelineArgs),
    /// The real scheduler (a leader and a standby) and nats-server under hundreds of workers
    /// (real worker processes on the `noop` runtime, many to a process) and tens of thousands
    /// of open sandboxes: actions/s, latency, CPU and memory, the status answer and failover,
    /// for each worker count of a sweep.
    Fleet(fleet::FleetArgs),
    /// How long a sandbox open takes on one real Docker worker, for a held-out mix of open
    /// shapes (memory sizes, an environment, a task image), with the warm pool on and off.
    Opens(fleet::OpensArgs),
    /// How many sandboxes one real Docker worker keeps open and what each costs the host;
    /// opens (pool off and from a full pool), `true` round trips at 10 and at all open, and
    /// closes, at that density.
    Density(fleet::DensityArgs),
    /// One relay of the pipeline bench's cross-process floor chain (the bench starts it).
    #[command(hide = true)]
    Relay {
        #[arg(long)]
        nats_url: String,
        #[arg(long)]
        hop: u8,
    },
}

fn main() -> std::process::ExitCode {
    use clap::{CommandFactory as _, FromArgMatches as _};
    let matches = Cli::command().get_matches();
    let mut cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    if let Err(e) = cluster::apply_config_file(&mut cli.command, cli.config.as_deref(), &matches) {
        errors::report(&e);
        return std::process::ExitCode::from(errors::EXIT_CONFIG);
    }
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => std::process::ExitCode::from(errors::report(&e)),
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Up(args) => cluster::up(args),
        Command::Down { state_dir } => cluster::down(&state_dir),
        Command::Status {
            json,
            watch,
            count,
            cluster,
        } => {
            let (url, creds) = cluster.resolve();
            match watch {
                None => cluster::status(&url, &creds, json),
                Some(every) => watch_status(&url, &creds, json, every, count),
            }
        }
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(
                shell,
                &mut <Cli as clap::CommandFactory>::command(),
                "tangram",
                &mut script,
            );
            use std::io::Write as _;
            // A closed pipe (`| head`) is not an error worth a message.
            let _ = std::io::stdout().write_all(&script);
            Ok(())
        }
        Command::CheckConfig(a) => check_config::check(a),
        Command::Submit(args) => {
            let state = std::env::var_os("TANGRAM_STATE_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(".tangram"));
            if submit::submit(args, &state)? {
                Ok(())
            } else {
                std::process::exit(1)
            }
        }
        Command::Cordon(t) => cordon::set(t, cordon::Op::Cordon),
        Command::Uncordon(t) => cordon::set(t, cordon::Op::Uncordon),
        Command::Drain(a) => cordon::drain(a),
        Command::Images { what } => images::run(what),
        Command::Streams { what } => upgrade::run(what),
        Command::Creds { dir, workers, jobs } => creds::fleet(&dir, &workers, &jobs),
        Command::Probe { addr, path } => {
            match probe::probe(&addr, &path, std::time::Duration::from_secs(3)) {
                Ok(true) => Ok(()),
                Ok(false) => std::process::exit(1),
                Err(e) => {
                    eprintln!("tangram probe: {addr}{path}: {e}");
                    std::process::exit(1)
                }
            }
        }
        Command::Inspect(a) => inspect::inspect(a),
        Command::Replay { what } => replay::replay(what),
        Command::Simulate(args) => simulate(args),
        Command::Calibrate(args) => calibrate::calibrate(args),
        Command::Bench {
            what: BenchWhat::Scheduler { json, iterations },
        } => bench::scheduler(json, iterations),
        Command::Bench {
            what: BenchWhat::Pipeline(args),
        } => pipeline::pipeline(args),
        Command::Bench {
            what: BenchWhat::Opens(args),
        } => fleet::opens(args),
        Command::Bench {
            what: BenchWhat::Density(args),
        } => fleet::density(args),
        Command::Bench {
            what: BenchWhat::Fleet(args),
        } => fleet::fleet(args),
        Command::Bench {
            what: BenchWhat::Relay { nats_url, hop },
        } => pipeline::relay(&nats_url, hop),
    }
}

/// `tangram status --watch`: the report redrawn every `every` seconds; a failed fetch is
/// shown and retried, not fatal.
fn watch_status(
    url: &str,
    creds: &tangram_nats::auth::Credentials,
    json: bool,
    every: f64,
    count: Option<u64>,
) -> anyhow::Result<()> {
    use std::io::IsTerminal as _;
    if !(every.is_finite() && every >= 0.1) {
        crate::usage!("--watch takes a period of at least 0.1 s");
    }
    let clear = std::io::stdout().is_terminal() && !json;
    let mut shown = 0u64;
    loop {
        if clear {
            print!("\x1b[2J\x1b[H");
        }
        if let Err(e) = cluster::status(url, creds, json) {
            println!("(status unavailable: {})", errors::causes(&e).join(": "));
        }
        shown += 1;
        if count.is_some_and(|c| shown >= c) {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_secs_f64(every));
    }
}

fn simulate(args: SimulateArgs) -> anyhow::Result<()> {
    let mut notes = Vec::new();
    let (mut workload, label) = match (&args.workload, &args.trace) {
        (Some(w), None) => {
            match WorkloadName::parse(w).map_err(|e| errors::UsageError(e.to_string()))? {
                WorkloadName::AiCoding => (
                    AiCoding {
                        batch: args.batch,
                        seed: args.seed,
                        jobs: args.jobs as usize,
                    }
                    .generate(),
                    format!(
                        "ai-coding, batch {}, seed {}, {} job(s)",
                        args.batch, args.seed, args.jobs
                    ),
                ),
                WorkloadName::Bursty => (
                    sim::Bursty {
                        batch: args.batch,
                        seed: args.seed,
                    }
                    .generate(),
                    format!("bursty, batch {}, seed {}", args.batch, args.seed),
                ),
                WorkloadName::Mopd => return gpu_sim::mopd(&args),
                WorkloadName::DeepSearch => return gpu_sim::deepsearch(&args),
                WorkloadName::SweImages => return image_sim::swe_images(&args),
            }
        }
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            (
                Workload {
                    trajectories: trace::parse_trace(&text)?,
                    nodes: AiCoding::nodes(),
                    ..Default::default()
                },
                format!("trace {}", path.display()),
            )
        }
        _ => crate::usage!("give --workload NAME or --trace FILE"),
    };
    if let Some(path) = &args.cluster {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let (nodes, n) = trace::parse_cluster(&text)?;
        workload.nodes = nodes;
        if args.trace.is_none() {
            notes.extend(n);
        }
        if args.trace.is_some() {
            if let Ok((gpus, services)) = trace::parse_gpu_cluster(&text) {
                workload.gpus = gpus;
                workload.services = services.unwrap_or_default();
            }
            workload.providers = trace::parse_providers(&text)?;
        }
    }
    // Every service and provider a trace names must be declared.
    for t in &workload.trajectories {
        for st in &t.steps {
            match &st.action.call {
                sim::SimCall::Reward { service } if !workload.services.iter().any(|s| &s.name == service) => bail!(
                    "trajectory {} calls service {service:?}, which the cluster file does not declare (services: [{{\"name\", \"gpus\", \"restore_s\", \"slots\"}}] and nodes with \"gpu\")",
                    t.id
                ),
                sim::SimCall::Api { provider } if !workload.providers.iter().any(|p| &p.name == provider) => bail!(
                    "trajectory {} calls provider {provider:?}, which the cluster file does not declare (providers: [{{\"name\", \"rate\", \"burst\", \"concurrency\"}}])",
                    t.id
                ),
                _ => {}
            }
        }
    }
    let names: Vec<&str> = args.policy_names().collect();
    let mut policies: Vec<Box<dyn sim::Simulated>> = Vec::new();
    for n in &names {
        if *n == tangram_core::policies::Static::NAME {
            policies.push(Box::new(tangram_core::policies::Static {
                cores: args.static_cores,
            }));
            continue;
        }
        if *n == sim::K8s::NAME {
            if !(args.pod_start_s.is_finite() && args.pod_start_s >= 0.0) {
                crate::usage!("--pod-start-s must be a number of seconds, 0 or more");
            }
            policies.push(Box::new(sim::K8s {
                cores: args.static_cores,
                start_ms: args.pod_start_s * 1e3,
            }));
            continue;
        }
        match sim::by_name(n) {
            Some(p) => policies.push(p),
            None => crate::usage!(
                "unknown policy {n:?}; available: {}",
                sim::names().collect::<Vec<_>>().join(", ")
            ),
        }
    }
    if policies.is_empty() {
        crate::usage!("--policies is empty");
    }
    let mut reports = Vec::new();
    let spinner = progress::Spinner::start("simulating");
    for (i, p) in policies.iter().enumerate() {
        spinner.set_message(format!("simulating {}", p.label()));
        spinner.set_count(i as u64, policies.len() as u64);
        if args.elasticity != "learned" {
            reports.push(sim::simulate_with(
                &workload,
                p.as_ref(),
                sim::Elasticity::Oracle,
            ));
        }
        if args.elasticity != "oracle" && matches!(p.label(), "tangram" | "tangram-v2") {
            let mut r = sim::simulate_with(&workload, p.as_ref(), sim::Elasticity::Learned);
            r.policy = format!("{}-learned", p.label());
            reports.push(r);
        } else if args.elasticity == "learned" {
            reports.push(sim::simulate_with(
                &workload,
                p.as_ref(),
                sim::Elasticity::Learned,
            ));
        }
    }
    spinner.finish();
    let sums: Vec<_> = reports.iter().map(|r| r.summary()).collect();
    let expected = sim::actions_in(&workload);
    for s in &sums {
        if s.actions < expected {
            notes.push(format!(
                "{} ran {} of the {expected} actions: the rest never fitted (a demand larger than any node; for static, see --static-cores)",
                s.name, s.actions
            ));
        }
    }
    let base = &sums[0];
    let ratio = report::ratio;
    report::write_svg(&args.svg, &label, &reports)?;
    if args.json {
        let policies: Vec<_> = sums.iter().map(|s| report::policy_json(s, base)).collect();
        let out = json!({
            "workload": label,
            "nodes": workload.nodes.len(),
            "cores": workload.nodes.iter().map(|&c| c as u64).sum::<u64>(),
            "trajectories": workload.trajectories.len(),
            "policies": policies,
            "svg": args.svg.display().to_string(),
            "notes": notes,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "{label}: {} trajectories, {} actions, {} nodes / {} cores",
            workload.trajectories.len(),
            sim::actions_in(&workload),
            workload.nodes.len(),
            workload.nodes.iter().map(|&c| c as u64).sum::<u64>()
        );
        let mut t = crate::table::new([
            "policy",
            "mean ACT",
            "p50",
            "p99",
            "queue",
            "exec",
            "step",
            "reserved",
            "used",
            "ACT ratio",
        ]);
        for s in &sums {
            let secs = |v: f64| format!("{v:.3}s");
            t.add_row([
                s.name.to_string(),
                secs(s.mean_act_s),
                secs(s.p50_act_s),
                secs(s.p99_act_s),
                secs(s.mean_queue_s),
                secs(s.mean_exec_s),
                format!("{:.1}s", s.step_time_s),
                format!("{:.0}cs", s.reserved_cpu_s),
                format!("{:.0}cs", s.used_cpu_s),
                format!("{:.2}x", ratio(s.mean_act_s, base.mean_act_s)),
            ]);
        }
        print!("{}", crate::table::render(&t, ""));
        println!(
            "(cs = core-seconds; ACT ratio = mean ACT over {}'s)",
            base.name
        );
        for n in &notes {
            println!("note: {n}");
        }
        println!("picture: {}", args.svg.display());
    }
    Ok(())
}
