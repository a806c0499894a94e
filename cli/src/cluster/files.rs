//! What `tangram up` reads and writes besides its flags: the `[up]` table of the config file
//! laid over its defaults, the GPU worker's config file, and the cluster's scrape config.

use super::UpArgs;
use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The GPU worker's config file, as `up` writes it (the worker's own format, CONFIG.md).
#[derive(Debug, Serialize)]
pub(crate) struct GpuWorkerFile {
    pub(crate) id: String,
    pub(crate) nats_url: String,
    pub(crate) sandboxes: bool,
    pub(crate) heartbeat_ms: u64,
    pub(crate) state_dir: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) metrics_addr: Option<String>,
    pub(crate) gpu: GpuSection,
    pub(crate) service: Vec<GpuService>,
    pub(crate) provider: Vec<GpuProvider>,
}

#[derive(Debug, Serialize)]
pub(crate) struct GpuSection {
    pub(crate) nvml: String,
    pub(crate) count: u32,
}

#[derive(Debug, Serialize)]
pub(crate) struct GpuService {
    pub(crate) name: String,
    pub(crate) driver: String,
    pub(crate) command: Vec<String>,
    pub(crate) gpus: u32,
    pub(crate) restore_ms: u64,
    pub(crate) slots: u32,
}

#[derive(Debug, Serialize)]
pub(crate) struct GpuProvider {
    pub(crate) name: String,
    pub(crate) base_url: String,
    pub(crate) credential_file: PathBuf,
    pub(crate) rate_per_s: f64,
    pub(crate) burst: u32,
    pub(crate) concurrency: u32,
    pub(crate) timeout_ms: u64,
    pub(crate) allow: Vec<String>,
}

/// A Prometheus scrape config for a cluster `up` started: one job per component kind, each
/// target labelled `deployment: local` as deploy/prometheus.yml does (no `component` label:
/// `tangram_build_info` has its own).
pub fn prometheus_config(metrics: &[(String, String)]) -> String {
    let mut out = String::from(
        "# Written by `tangram up`: scrapes this local cluster. The fleet's own config is\n# deploy/prometheus.yml.\nglobal:\n  scrape_interval: 5s\nscrape_configs:\n",
    );
    for (job, prefix) in [("tangram-scheduler", "scheduler"), ("tangram-worker", "")] {
        let targets: Vec<&(String, String)> = metrics
            .iter()
            .filter(|(n, _)| n.starts_with("scheduler") == (prefix == "scheduler"))
            .collect();
        if targets.is_empty() {
            continue;
        }
        out += &format!("  - job_name: {job}\n    static_configs:\n");
        for (name, addr) in targets {
            out += &format!(
                "      - targets: [\"{addr}\"]  # {name}\n        labels: {{deployment: local}}\n"
            );
        }
    }
    out
}

/// Lays the config file's `[up]` table under `up`'s options: a value from a flag or an
/// environment variable wins, the file's comes next, then the built-in default.
pub(crate) fn apply_config_file(
    cmd: &mut crate::Command,
    explicit: Option<&Path>,
    matches: &clap::ArgMatches,
) -> anyhow::Result<()> {
    let (a, name) = match cmd {
        crate::Command::Up(a) => (a, "up"),
        crate::Command::CheckConfig(c) => (&mut c.up, "check-config"),
        _ => return Ok(()),
    };
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None if Path::new("tangram.toml").exists() => PathBuf::from("tangram.toml"),
        None => return Ok(()),
    };
    let config = |e: String| crate::errors::ConfigError(format!("{}: {e}", path.display()));
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let table: toml::Table = toml::from_str(&text).map_err(|e| config(e.to_string()))?;
    let Some(up) = table.get("up") else {
        return Ok(());
    };
    let up = up
        .as_table()
        .ok_or_else(|| config("[up] must be a table".into()))?;
    let sub = matches.subcommand_matches(name).context("up's arguments")?;
    *a = layer(a, up, |id| {
        matches!(
            sub.value_source(id),
            None | Some(clap::parser::ValueSource::DefaultValue)
        )
    })
    .map_err(config)?;
    Ok(())
}

/// The options with the file's `[up]` values laid over those that came from defaults (one
/// serde round trip: every key of `UpArgs` is a key of the file, typed as the flag is).
pub(crate) fn layer(
    a: &UpArgs,
    file: &toml::Table,
    from_default: impl Fn(&str) -> bool,
) -> Result<UpArgs, String> {
    let mut merged = toml::Table::try_from(a).map_err(|e| e.to_string())?;
    for (key, value) in file {
        let mut with = merged.clone();
        with.insert(key.clone(), value.clone());
        if let Err(e) = UpArgs::deserialize(toml::Value::Table(with.clone())) {
            let e = e.to_string();
            return Err(if e.contains("unknown field") {
                format!("unknown key up.{key}: {}", e.trim())
            } else {
                format!("up.{key}: {}", e.trim())
            });
        }
        if from_default(key) {
            merged = with;
        }
    }
    UpArgs::deserialize(toml::Value::Table(merged)).map_err(|e| format!("[up]: {e}"))
}
