//! `tangram-scheduler`: the scheduler service binary.

use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;
use tangram_scheduler::config::{load_file, RawConfig};
use tokio_util::sync::CancellationToken;

/// Tangram's scheduler: consumes actions from NATS JetStream and dispatches them to workers.
#[derive(Debug, Parser)]
#[command(version = tangram_shared::build::VERSION, about)]
struct Args {
    /// TOML config file.
    #[arg(long, short, env = "TANGRAM_SCHEDULER_CONFIG")]
    config: Option<PathBuf>,
    /// NATS server URL [default: nats://127.0.0.1:4222].
    #[arg(long, env = "TANGRAM_NATS_URL")]
    nats_url: Option<String>,
    /// Prometheus listen address, e.g. 127.0.0.1:9464 [default: disabled].
    #[arg(long, env = "TANGRAM_SCHEDULER_METRICS_ADDR")]
    metrics_addr: Option<String>,
    /// Health endpoints (`/healthz`, `/readyz`) on this address, e.g. 127.0.0.1:9465.
    #[arg(long, env = "TANGRAM_SCHEDULER_HEALTH_ADDR")]
    health_addr: Option<String>,
    /// Largest action message accepted, in bytes [default: 1048576].
    #[arg(long, env = "TANGRAM_MAX_ACTION_BYTES")]
    max_action_bytes: Option<u64>,
    /// Scheduling policy [default: tangram-v2]; also tangram (the paper's), static, per-task,
    /// fifo-dop-1|4|16, first-fit, sjf, equal-split, fcfs-first-fit.
    #[arg(long, env = "TANGRAM_SCHEDULER_POLICY")]
    policy: Option<String>,
    /// Cores each trajectory's sandbox holds under the `static` policy [default: 4].
    #[arg(long, env = "TANGRAM_SCHEDULER_STATIC_CORES")]
    static_cores: Option<u32>,
    /// This scheduler's id in the leader lease [default: <host>-<pid>].
    #[arg(long, env = "TANGRAM_SCHEDULER_ID")]
    id: Option<String>,
    /// Leader lease lifetime in ms: a standby takes over this long after the leader's last
    /// renewal [default: 2000].
    #[arg(long, env = "TANGRAM_SCHEDULER_LEASE_TTL_MS")]
    lease_ttl_ms: Option<u64>,
    /// Replicas of the streams and the KV bucket it creates: 1 on one server, 3 on a
    /// cluster [default: 1]. Existing streams are left as stored.
    #[arg(long, env = "TANGRAM_STREAM_REPLICAS")]
    stream_replicas: Option<usize>,
    /// Log as JSON lines.
    #[arg(long, env = "TANGRAM_LOG_JSON")]
    log_json: bool,
    /// NATS credentials and TLS.
    #[command(flatten)]
    nats: tangram_nats::auth::CredentialFlags,
    /// Print the configuration as it takes effect (file, `TANGRAM_SCHEDULER_*` variables and
    /// flags merged; secrets redacted) and exit: 0 when it is valid, 64 when not.
    #[arg(long)]
    check_config: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let flags = RawConfig {
        nats_url: args.nats_url,
        metrics_addr: args.metrics_addr,
        health_addr: args.health_addr,
        max_action_bytes: args.max_action_bytes,
        policy: args.policy,
        static_cores: args.static_cores,
        id: args.id,
        lease_ttl_ms: args.lease_ttl_ms,
        streams: args
            .stream_replicas
            .map(|r| tangram_nats::streams::StreamSettings {
                replicas: Some(r),
                ..Default::default()
            }),
        nats: Some(args.nats.into()),
        ..Default::default()
    };
    // flags and env (clap merges those two) > file > defaults.
    let merged = load_file(args.config.as_ref()).map(|file| file.merge(flags));
    if args.check_config {
        return match merged {
            Ok(raw) => {
                print!("{}", tangram_scheduler::config::effective(&raw));
                match raw.validate() {
                    Ok(_) => ExitCode::SUCCESS,
                    Err(e) => {
                        eprintln!("tangram-scheduler: invalid configuration: {e}");
                        ExitCode::from(64)
                    }
                }
            }
            Err(e) => {
                eprintln!("tangram-scheduler: invalid configuration: {e}");
                ExitCode::from(64)
            }
        };
    }
    let config = match merged.and_then(RawConfig::validate) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("tangram-scheduler: invalid configuration: {e}");
            return ExitCode::from(64);
        }
    };
    init_tracing(args.log_json);
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tangram-scheduler: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async {
        if let Some(addr) = config.metrics_addr {
            tangram_scheduler::metrics::install(addr)?;
        }
        let shutdown = CancellationToken::new();
        let signal = shutdown.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            signal.cancel();
        });
        tangram_scheduler::run(config, shutdown).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tangram-scheduler: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_tracing(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    if json {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .json()
            .init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
