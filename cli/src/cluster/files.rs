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

impl GpuService {
    /// A service run by the reference replica (`services/reference-replica/replica.py`,
    /// written to `replica`): one GPU a replica, 20 ms to restore, 8 requests at once.
    pub(crate) fn reference(name: &str, replica: &Path) -> Self {
        Self {
            name: name.to_string(),
            driver: "reference".into(),
            command: vec![
                "python3".into(),
                replica.display().to_string(),
                "--service".into(),
                "{service}".into(),
                "--port".into(),
                "{port}".into(),
            ],
            gpus: 1,
            restore_ms: 20,
            slots: 8,
        }
    }
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

/// A Prometheus scrape config, as much of it as `up` writes.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub(crate) struct ScrapeConfig {
    global: ScrapeGlobal,
    scrape_configs: Vec<ScrapeJob>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct ScrapeGlobal {
    scrape_interval: String,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct ScrapeJob {
    job_name: String,
    static_configs: Vec<StaticTargets>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct StaticTargets {
    targets: Vec<String>,
    labels: std::collections::BTreeMap<String, String>,
}

/// A Prometheus scrape config for a cluster `up` started: one job per component kind, each
/// target labelled `deployment: local` as deploy/prometheus.yml does (no `component` label:
/// `tangram_build_info` has its own). Written as JSON, which is YAML too, after a comment.
pub fn prometheus_config(metrics: &[(String, String)]) -> String {
    let mut config = ScrapeConfig {
        global: ScrapeGlobal {
            scrape_interval: "5s".into(),
        },
        scrape_configs: Vec::new(),
    };
    for (job, scheduler) in [("tangram-scheduler", true), ("tangram-worker", false)] {
        let static_configs: Vec<StaticTargets> = metrics
            .iter()
            .filter(|(n, _)| n.starts_with("scheduler") == scheduler)
            .map(|(_, addr)| StaticTargets {
                targets: vec![addr.clone()],
                labels: [("deployment".to_string(), "local".to_string())].into(),
            })
            .collect();
        if !static_configs.is_empty() {
            config.scrape_configs.push(ScrapeJob {
                job_name: job.into(),
                static_configs,
            });
        }
    }
    let targets: Vec<String> = metrics
        .iter()
        .map(|(n, a)| format!("# {n}: {a}\n"))
        .collect();
    format!(
        "# Written by `tangram up`: scrapes this local cluster (JSON, which YAML readers take).\n\
         # The fleet's own config is deploy/prometheus.yml.\n{}{}\n",
        targets.concat(),
        serde_json::to_string_pretty(&config).expect("a scrape config serialises")
    )
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

/// The options with the file's `[up]` values laid over those that came from defaults,
/// merged as the scheduler's and the worker's files are (`tangram_nats::layers::merge`):
/// the options as parsed, then the file, then the options a flag or a variable set. Each of
/// the file's keys is checked on its own first, so an error names the key.
pub(crate) fn layer(
    a: &UpArgs,
    file: &toml::Table,
    from_default: impl Fn(&str) -> bool,
) -> Result<UpArgs, String> {
    let parsed = toml::Table::try_from(a).map_err(|e| e.to_string())?;
    for (key, value) in file {
        let mut with = parsed.clone();
        with.insert(key.clone(), value.clone());
        if let Err(e) = UpArgs::deserialize(toml::Value::Table(with)) {
            let e = e.to_string();
            return Err(if e.contains("unknown field") {
                format!("unknown key up.{key}: {}", e.trim())
            } else {
                format!("up.{key}: {}", e.trim())
            });
        }
    }
    let mut set: toml::Table = parsed
        .iter()
        .filter(|(k, _)| !from_default(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    // `metrics` is `no_metrics` turned round: a file's `metrics` and a `--metrics` flag
    // land on `no_metrics`, so a flag still wins over the file.
    let mut file = file.clone();
    if let Some(on) = file.remove("metrics") {
        let on = on
            .as_bool()
            .ok_or_else(|| "up.metrics: a boolean".to_string())?;
        file.insert("no_metrics".into(), toml::Value::Boolean(!on));
    }
    if a.metrics && !from_default("metrics") {
        set.insert("no_metrics".into(), toml::Value::Boolean(false));
    }
    let mut merged = parsed;
    tangram_nats::layers::merge(&mut merged, file);
    tangram_nats::layers::merge(&mut merged, set);
    UpArgs::deserialize(toml::Value::Table(merged)).map_err(|e| format!("[up]: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scrape_config_has_a_job_per_component_kind_with_every_target() {
        let metrics = [
            ("scheduler".to_string(), "127.0.0.1:9001".to_string()),
            ("cpu-0".to_string(), "127.0.0.1:9002".to_string()),
            ("gpu-0".to_string(), "127.0.0.1:9003".to_string()),
        ];
        let text = prometheus_config(&metrics);
        let body: String = text.lines().filter(|l| !l.starts_with('#')).collect();
        let parsed: ScrapeConfig = serde_json::from_str(&body).unwrap();
        let jobs: Vec<(&str, Vec<&str>)> = parsed
            .scrape_configs
            .iter()
            .map(|j| {
                let t = j
                    .static_configs
                    .iter()
                    .map(|s| s.targets[0].as_str())
                    .collect();
                (j.job_name.as_str(), t)
            })
            .collect();
        assert_eq!(
            jobs,
            [
                ("tangram-scheduler", vec!["127.0.0.1:9001"]),
                ("tangram-worker", vec!["127.0.0.1:9002", "127.0.0.1:9003"]),
            ]
        );
        assert!(parsed.scrape_configs[1].static_configs[1].labels["deployment"] == "local");
    }
}
