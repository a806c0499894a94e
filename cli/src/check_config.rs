//! `tangram check-config`: a configuration as it takes effect, secrets redacted. `up` (the
//! default) merges its flags, `TANGRAM_UP_*` variables and the `[up]` table of the config
//! file; `--scheduler FILE` and `--worker FILE` ask those binaries (`--check-config`), which
//! merge their file, their `TANGRAM_SCHEDULER_*` / `TANGRAM_WORKER_*` variables and flags.

use std::path::PathBuf;

/// `tangram check-config`'s options.
#[derive(Debug, clap::Args)]
pub(crate) struct CheckArgs {
    /// Check a scheduler's config file instead of `up`'s options.
    #[arg(long, conflicts_with = "worker")]
    scheduler: Option<PathBuf>,
    /// Check a worker's config file instead of `up`'s options.
    #[arg(long)]
    worker: Option<PathBuf>,
    /// `up`'s options, as `tangram up` takes them.
    #[command(flatten)]
    pub(crate) up: crate::cluster::UpArgs,
}

pub(crate) fn check(a: CheckArgs) -> anyhow::Result<()> {
    let (bin, file) = match (&a.scheduler, &a.worker) {
        (Some(f), _) => ("tangram-scheduler", f),
        (None, Some(f)) => ("tangram-worker", f),
        (None, None) => {
            print!("{}", effective_up(a.up));
            return Ok(());
        }
    };
    let status = std::process::Command::new(crate::cluster::sibling(bin)?)
        .arg("--config")
        .arg(file)
        .arg("--check-config")
        .status()?;
    match status.code() {
        Some(0) => Ok(()),
        Some(64) => {
            Err(crate::errors::ConfigError(format!("{} is not valid", file.display())).into())
        }
        _ => anyhow::bail!("{bin} --check-config failed ({status})"),
    }
}

/// `up`'s options as they take effect, with the options it resolves at start (the
/// nats-server binary, the monitoring port) filled in as `up` would.
fn effective_up(mut up: crate::cluster::UpArgs) -> String {
    let mut notes = String::new();
    match crate::nats_server::find(up.nats_server.as_ref()) {
        Ok(found) => up.nats_server = Some(found),
        Err(e) => notes += &format!("# nats_server: not usable: {e:#}\n"),
    }
    if up.nats_monitor_port.is_none() {
        if up.nats_port == 4222 {
            up.nats_monitor_port = Some(8222);
        } else {
            notes += "# nats_monitor_port: a free port, chosen at start\n";
        }
    }
    format!("[up]\n{}{notes}", tangram_nats::layers::effective(&up))
}
