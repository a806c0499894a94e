//! `tangram`: bring a local cluster up and down, submit actions, inspect the scheduler,
//! simulate policies, benchmark the scheduling core and the action path.

mod bench;
mod calibrate;
mod check_config;
mod close;
mod cluster;
mod connect;
mod cordon;
mod creds;
mod errors;
mod fair_sim;
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
mod simulate;
mod streams;
mod submit;
mod table;
mod upgrade;

use clap::{Parser, Subcommand};
pub(crate) use simulate::SimulateArgs;
use std::path::PathBuf;

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
    /// Close every sandbox of a job (a crashed rollout's, say): the leading scheduler
    /// closes each, and each close's result reaches the job's results subject.
    Close(close::CloseArgs),
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
        Command::Close(a) => close::close(a),
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
        Command::Simulate(args) => simulate::simulate(args),
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
