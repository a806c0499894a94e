//! GPU workers in tests: a declared inventory and the reference replica as the service.

use crate::repo_root;
use std::path::Path;
use std::process::Command;

/// The reference replica's command for a service, small enough for tests: a 4,096-row
/// embedding table `dim` wide (wider scores more slowly).
pub fn reference_replica_command(dim: u32) -> Vec<String> {
    let script = repo_root().join("services/reference-replica/replica.py");
    replica_argv(script.to_str().expect("utf-8 path"), dim)
}

/// `python3 SCRIPT --service {service} --port {port} --vocab 4096 --dim DIM`.
pub fn replica_argv(script: &str, dim: u32) -> Vec<String> {
    let dim = dim.to_string();
    [
        "python3",
        script,
        "--service",
        "{service}",
        "--port",
        "{port}",
        "--vocab",
        "4096",
        "--dim",
        &dim,
    ]
    .into_iter()
    .map(String::from)
    .collect()
}

/// A GPU worker's validated config: declared GPUs, reference replicas, no sandboxes.
pub fn gpu_worker_config(
    id: &str,
    nats_url: &str,
    gpus: u32,
    services: &[&str],
    state_dir: &Path,
) -> anyhow::Result<tangram_worker::Config> {
    use tangram_worker::services::{Driver, ServiceConfig};
    let raw = tangram_worker::config::RawConfig {
        id: Some(id.into()),
        nats_url: Some(nats_url.into()),
        heartbeat_ms: Some(200),
        shutdown_grace_ms: Some(2000),
        sandboxes: Some(false),
        state_dir: Some(state_dir.display().to_string()),
        gpu: Some(tangram_worker::config::RawGpu {
            nvml: Some(tangram_worker::gpu::NvmlMode::Off),
            groups: None,
            count: Some(gpus),
        }),
        service: Some(
            services
                .iter()
                .map(|name| ServiceConfig {
                    name: name.to_string(),
                    driver: Driver::Reference,
                    command: reference_replica_command(16),
                    image: None,
                    args: Vec::new(),
                    mounts: Vec::new(),
                    gpus: 1,
                    host_mem_mb: 1,
                    restore_ms: 50,
                    slots: 1,
                    start_timeout_ms: 30_000,
                    model: None,
                    env: Default::default(),
                })
                .collect(),
        ),
        ..Default::default()
    };
    Ok(raw.validate()?)
}

/// Pids of reference replica processes serving `service`.
pub fn replica_pids(service: &str) -> Vec<u32> {
    let out = Command::new("pgrep")
        .args(["-f", &format!("replica.py --service {service} ")])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    out.lines().filter_map(|l| l.trim().parse().ok()).collect()
}
