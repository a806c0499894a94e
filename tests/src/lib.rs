//! Test support for Tangram's end-to-end suites.
//!
//! - [`NatsServer`] (`nats.rs`): a real `nats-server` per test on a free loopback port with a
//!   temporary store directory, killed and cleaned up on drop. A missing binary fails loudly
//!   with the install command.
//! - [`Cluster`] (`cluster.rs`): NATS plus the scheduler and N workers, in process, each with
//!   its own cancellation token (or as processes a test can kill).
//! - [`Client`] (`client.rs`): a minimal submitter: publish an action, wait for its result.
//! - [`build`]: actions, tersely; `gpu.rs`: GPU workers with the reference replica.
//! - Here: paths to the repository and the built binaries, free ports, signals, child
//!   processes killed on drop, and polling waits.
#![forbid(unsafe_code)]

pub mod api_server;
pub mod build;
mod client;
mod cluster;
pub mod dockerd;
pub mod faults;
mod gpu;
pub mod gvisor;
pub mod images;
mod nats;
pub mod prometheus;
pub mod registry;

pub use client::Client;
pub use cluster::{init_logging, Cluster, WorkerSpec};
pub use gpu::{gpu_worker_config, reference_replica_command, replica_argv, replica_pids};
pub use nats::NatsServer;

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;
use tokio::time::Instant;

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The pinned nats-server installed by `deploy/install-tools.sh`.
pub fn nats_server_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("TANGRAM_NATS_SERVER") {
        return p.into();
    }
    let p = repo_root().join("tools/bin/nats-server");
    assert!(
        p.exists(),
        "nats-server not found at {}: run `bash deploy/install-tools.sh` first (it installs the pinned version)",
        p.display()
    );
    p
}

/// A binary of the workspace, built by `cargo build` (the test command builds them first).
pub fn built_binary(name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    let p = target.join("debug").join(name);
    assert!(
        p.exists(),
        "{} not found: run `cargo build --bins` first",
        p.display()
    );
    p
}

/// A finished command's stdout and stderr, as one text for assertions and failure messages.
pub fn output_text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

pub use rustix::process::Signal;

/// Sends `signal` to process `pid` (a system call, not a `kill` child process). A process
/// already gone is an error (`ESRCH`); callers that race its exit ignore it.
pub fn signal(pid: u32, signal: Signal) -> std::io::Result<()> {
    let pid = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("no such pid {pid}"),
            )
        })?;
    rustix::process::kill_process(pid, signal).map_err(std::io::Error::from)
}

/// A port free now on loopback.
pub fn free_port() -> u16 {
    tangram_nats::local::free_port().expect("a free port")
}

/// A child process that is killed when the guard drops (a failing test leaves nothing behind).
#[derive(Debug)]
pub struct ChildGuard(pub Child);

impl std::ops::Deref for ChildGuard {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for ChildGuard {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// How often the waits below look again.
pub(crate) const POLL: Duration = Duration::from_millis(50);

/// Polls `check` until it holds or `timeout` passes; returns whether it held. For state that
/// settles asynchronously (a restarted worker removing leftovers), never as a sleep.
pub async fn eventually(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The ids of the running containers of `worker`, narrowed by more `docker ps` filters
/// (`label=tangram.job=j`, `ancestor=image`...).
pub fn running_containers(worker: &str, filters: &[&str]) -> Vec<String> {
    let mut cmd = Command::new("docker");
    cmd.args([
        "ps",
        "-q",
        "--filter",
        &format!("label=tangram.worker={worker}"),
    ]);
    for f in filters {
        cmd.args(["--filter", f]);
    }
    let out = cmd.output().expect("docker ps");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Counts containers labelled for `worker`.
pub fn containers_of(worker: &str) -> usize {
    let out = Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            &format!("label=tangram.worker={worker}"),
        ])
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&out.stdout).lines().count()
}
