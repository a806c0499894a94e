//! `tangram-worker`: the CPU worker binary.

use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;
use tangram_worker::config::{GrantMode, RawConfig};
use tangram_worker::sandbox::RuntimeKind;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

/// Tangram's CPU worker: runs sandbox actions in hardened Docker containers.
#[derive(Debug, Parser)]
#[command(version = tangram_shared::build::VERSION, about)]
struct Args {
    /// TOML config file.
    #[arg(long, short, env = "TANGRAM_WORKER_CONFIG")]
    config: Option<PathBuf>,
    /// Worker id, unique in the fleet [default: cpu-0].
    #[arg(long, env = "TANGRAM_WORKER_ID")]
    id: Option<String>,
    /// NATS server URL [default: nats://127.0.0.1:4222].
    #[arg(long, env = "TANGRAM_NATS_URL")]
    nats_url: Option<String>,
    /// Cores to grant, as a cpuset list [default: all online CPUs].
    #[arg(long, env = "TANGRAM_WORKER_CORES")]
    cores: Option<String>,
    /// Parking cpuset for idle sandboxes [default: the first granted core].
    #[arg(long, env = "TANGRAM_WORKER_PARKING_CORES")]
    parking_cores: Option<String>,
    /// Memory for sandboxes, in MiB [default: 8192].
    #[arg(long, env = "TANGRAM_WORKER_MEM_MB")]
    mem_mb: Option<u64>,
    /// How cores are granted: cgroup or docker [default: cgroup].
    #[arg(long, env = "TANGRAM_WORKER_GRANT_MODE", value_parser = parse_mode)]
    grant_mode: Option<GrantMode>,
    /// What runs sandboxes: docker, or noop (benchmarks only: commands never run) [default: docker].
    #[arg(long, env = "TANGRAM_WORKER_SANDBOX_RUNTIME")]
    sandbox_runtime: Option<RuntimeKind>,
    /// Heartbeat period in milliseconds [default: 1000].
    #[arg(long, env = "TANGRAM_WORKER_HEARTBEAT_MS")]
    heartbeat_ms: Option<u64>,
    /// Prometheus listen address [default: disabled].
    #[arg(long, env = "TANGRAM_WORKER_METRICS_ADDR")]
    metrics_addr: Option<String>,
    /// Health endpoints (`/healthz`, `/readyz`) on this address [default: disabled].
    #[arg(long, env = "TANGRAM_WORKER_HEALTH_ADDR")]
    health_addr: Option<String>,
    /// Log as JSON lines.
    #[arg(long, env = "TANGRAM_LOG_JSON")]
    log_json: bool,
    /// NATS credentials and TLS.
    #[command(flatten)]
    nats: tangram_nats::auth::CredentialFlags,
    /// Print the configuration as it takes effect (file, `TANGRAM_WORKER_*` variables and
    /// flags merged; secrets redacted) and exit: 0 when it is valid, 64 when not. A pooled
    /// worker's id is taken only when it starts.
    #[arg(long)]
    check_config: bool,
    /// Print the GPU inventory this worker would advertise (NVML, else the config's
    /// declared GPUs) as JSON, and exit.
    #[arg(long)]
    print_gpus: bool,
    /// Benchmarks only: run this many workers in this one process, each with its own NATS
    /// connection, consumers and heartbeats, ids `<id>-0000` upwards. Needs the `noop`
    /// runtime (`tangram bench fleet` uses it to put hundreds of workers on one machine).
    #[arg(long, hide = true)]
    bench_replicas: Option<u32>,
    /// Benchmarks only, with `--bench-replicas`: each replica connects as the worker role of
    /// its own id, with the seed `<dir>/worker-<id>.nk` (`tangram creds` names them so), as a
    /// secured fleet's workers do; TLS settings still come from the configuration.
    #[arg(long, hide = true, requires = "bench_replicas")]
    bench_creds_dir: Option<std::path::PathBuf>,
}

fn parse_mode(s: &str) -> Result<GrantMode, String> {
    match s {
        "cgroup" => Ok(GrantMode::Cgroup),
        "docker" => Ok(GrantMode::Docker),
        _ => Err(format!("{s:?} is not a grant mode; use cgroup or docker")),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let flags = RawConfig {
        id: args.id,
        nats_url: args.nats_url,
        cores: args.cores,
        parking_cores: args.parking_cores,
        mem_mb: args.mem_mb,
        grant_mode: args.grant_mode,
        sandbox_runtime: args.sandbox_runtime,
        metrics_addr: args.metrics_addr,
        health_addr: args.health_addr,
        heartbeat_ms: args.heartbeat_ms,
        nats: Some(args.nats.into()),
        ..Default::default()
    };
    let file = tangram_worker::config::load_layered(args.config.as_deref());
    if args.check_config {
        return match file.map(|f| f.merge(flags)) {
            Ok(raw) => {
                print!("{}", tangram_worker::config::effective(&raw));
                let mut raw = raw;
                if raw.pool.is_some() && raw.id.is_none() {
                    // Checked with a stand-in: the real id is claimed from the pool at start.
                    raw.id = Some("pool-check".into());
                }
                match raw.validate() {
                    Ok(_) => ExitCode::SUCCESS,
                    Err(e) => {
                        eprintln!("tangram-worker: invalid configuration: {e}");
                        ExitCode::from(64)
                    }
                }
            }
            Err(e) => {
                eprintln!("tangram-worker: invalid configuration: {e}");
                ExitCode::from(64)
            }
        };
    }
    // flags and env (clap merges those two) > file > defaults. A pooled worker claims its
    // id first and holds the claim until it exits.
    let config = match file
        .and_then(|f| f.merge(flags).claim_from_pool())
        .and_then(|(raw, claim)| Ok((raw.validate()?, claim)))
    {
        Ok((c, claim)) => {
            if let Some(claim) = claim {
                eprintln!("tangram-worker: took id {} from the pool", claim.id);
                // Held for the life of the process: the kernel frees the id when it ends.
                std::mem::forget(claim);
            }
            c
        }
        Err(e) => {
            eprintln!(
                "tangram-worker: invalid configuration: {:#}",
                anyhow::Error::new(e)
            );
            return ExitCode::from(64);
        }
    };
    if args.print_gpus {
        return match tangram_worker::gpu::discover(
            &tangram_worker::gpu::NvmlDiscovery,
            config.nvml,
            &config.gpu_groups,
        ) {
            Ok(inv) => {
                println!("{}", serde_json::json!({ "gpus": inv }));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("tangram-worker: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    if args.log_json {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .json()
            .init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tangram-worker: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let replicas = args.bench_replicas.unwrap_or(1);
    if replicas > 1 && config.sandbox_runtime != RuntimeKind::Noop {
        eprintln!(
            "tangram-worker: --bench-replicas runs many workers in one process for benchmarks \
             and needs --sandbox-runtime noop"
        );
        return ExitCode::from(64);
    }
    let result = rt.block_on(async {
        if let Some(addr) = config.metrics_addr {
            tangram_worker::metrics::install(addr)?;
        }
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        // The signal watcher ends with the worker: whichever finishes first cancels the other.
        let signals = TaskTracker::new();
        signals.spawn(
            async move {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                    _ = token.cancelled() => {}
                }
                token.cancel();
            }
            .instrument(tracing::info_span!("signals")),
        );
        signals.close();
        let result = if replicas > 1 {
            run_replicas(config, replicas, args.bench_creds_dir, shutdown.clone()).await
        } else {
            tangram_worker::run(config, shutdown.clone()).await
        };
        shutdown.cancel();
        signals.wait().await;
        result
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tangram-worker: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs `n` workers made from `config` until `shutdown`, each with its own seed from
/// `creds` when given; the first error ends them all.
async fn run_replicas(
    config: tangram_worker::Config,
    n: u32,
    creds: Option<std::path::PathBuf>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let mut workers = tokio::task::JoinSet::new();
    for i in 0..n {
        let mut c = config.clone();
        let id = format!("{}-{i:04}", config.id.as_str());
        c.id = tangram_shared::WorkerId::new(id.clone())?;
        c.state_dir = config.state_dir.join(&id);
        if let Some(dir) = &creds {
            let own = tangram_nats::auth::Credentials::from_seed_file(
                dir.join(format!("worker-{id}.nk")),
            );
            c.credentials.nkey_file = own.nkey_file;
            c.credentials.inbox_prefix = own.inbox_prefix;
        }
        let stop = shutdown.clone();
        workers.spawn(
            async move { tangram_worker::run(c, stop).await }
                .instrument(tracing::info_span!("replica", id = %id)),
        );
    }
    let mut first_error = None;
    while let Some(done) = workers.join_next().await {
        let r = done.map_err(anyhow::Error::from).and_then(|r| r);
        if let Err(e) = r {
            shutdown.cancel();
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}
