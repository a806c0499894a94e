//! Where a cluster is and who is asking: the options every command that talks to a cluster
//! shares, and how they resolve to a NATS URL and credentials. A leaf of the CLI: it knows
//! no command.

use clap::Args;
use std::path::{Path, PathBuf};

/// Where the cluster is and who is asking (shared by `status`, `cordon`, `drain`...).
#[derive(Debug, Args)]
pub(crate) struct ClusterArgs {
    /// NATS URL [default: the cluster `up` started, else nats://127.0.0.1:4222].
    #[arg(long, env = "TANGRAM_NATS_URL")]
    pub(crate) nats_url: Option<String>,
    /// The cluster's state directory.
    #[arg(long, env = "TANGRAM_STATE_DIR", default_value = ".tangram")]
    pub(crate) state_dir: PathBuf,
    /// nkey seed file [default: <state-dir>/creds/operator.nk when it exists].
    #[arg(long, env = "TANGRAM_NKEY_FILE")]
    pub(crate) nkey_file: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) tls: TlsArgs,
}

/// TLS toward NATS, as the scheduler and workers take it (a fleet whose servers have a
/// `tls {}` block; DEPLOY.md).
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct TlsArgs {
    /// CA certificate(s) to verify the NATS server with (PEM); requires TLS.
    #[arg(long, global = true, env = "TANGRAM_TLS_CA")]
    pub(crate) tls_ca: Option<PathBuf>,
    /// Client certificate (PEM), for NATS servers that verify clients (`verify: true`).
    #[arg(long, global = true, env = "TANGRAM_TLS_CERT", requires = "tls_key")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// The client certificate's key (PEM).
    #[arg(long, global = true, env = "TANGRAM_TLS_KEY", requires = "tls_cert")]
    pub(crate) tls_key: Option<PathBuf>,
}

impl ClusterArgs {
    /// The NATS URL and the credentials these name.
    pub(crate) fn resolve(&self) -> (String, tangram_nats::auth::Credentials) {
        (
            nats_url(self.nats_url.clone(), &self.state_dir),
            credentials(self.nkey_file.clone(), &self.tls, &self.state_dir),
        )
    }
}

/// Credentials for the CLI: `--nkey-file` / `TANGRAM_NKEY_FILE`, else the operator seed of
/// the cluster `up` started in `state` (`<state>/creds/operator.nk`), else none.
/// TLS settings come from `tls` (`--tls-ca`, `--tls-cert`, `--tls-key` or their variables).
pub fn credentials(
    explicit: Option<PathBuf>,
    tls: &TlsArgs,
    state: &Path,
) -> tangram_nats::auth::Credentials {
    let file = explicit
        .or_else(|| std::env::var_os("TANGRAM_NKEY_FILE").map(PathBuf::from))
        .or_else(|| {
            let f = state.join("creds").join("operator.nk");
            f.exists().then_some(f)
        });
    let mut creds = match file {
        Some(f) => tangram_nats::auth::Credentials::from_seed_file(f),
        None => tangram_nats::auth::Credentials::default(),
    };
    creds.tls_ca = tls.tls_ca.clone();
    creds.tls_cert = tls.tls_cert.clone();
    creds.tls_key = tls.tls_key.clone();
    creds
}

/// The NATS URL: the flag, else the recorded cluster's, else the default.
pub fn nats_url(explicit: Option<String>, state: &Path) -> String {
    explicit
        .or_else(|| {
            let text = std::fs::read_to_string(state.join("running.json")).ok()?;
            // Only its URL is read here (`cluster::Running` is the whole record).
            #[derive(serde::Deserialize)]
            struct Recorded {
                nats_url: String,
            }
            Some(serde_json::from_str::<Recorded>(&text).ok()?.nats_url)
        })
        .unwrap_or_else(|| "nats://127.0.0.1:4222".into())
}

/// Wall time, Unix milliseconds: a drain's deadline is wall time, shared with the
/// scheduler and the worker.
#[allow(clippy::disallowed_methods)] // the wire's timestamps are wall time
pub(crate) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
