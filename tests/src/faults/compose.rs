//! The fault suite on the docker-compose fleet (`deploy/fleet.sh`): every component a
//! container on a private network, three clustered NATS servers with R3 streams, a leader
//! scheduler and a standby, CPU workers with ids from the pool, a GPU worker and the search
//! stand-in. The faults are what a multi-host fleet meets: a NATS node killed, a worker
//! cut off the network, the leader's container killed, every worker restarted in turn, the
//! CPU workers scaled out and back in with drains. The same workload and the same counting
//! as the process suite; effects are read from the fleet folder the containers write to.

use super::check::{self, Effects, Report};
use super::workload::Workload;
use super::Size;
use crate::{repo_root, Client};
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A fault on the fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FleetFault {
    /// The server leading the actions stream is SIGKILLed (its container), and started
    /// again five seconds later.
    NatsNodeKill,
    /// A CPU worker's container is disconnected from the fleet's network for six seconds
    /// (past the scheduler's loss threshold), then reconnected.
    WorkerDisconnect,
    /// The leading scheduler's container is SIGKILLed; the standby takes over and the
    /// killed one is started again as the new standby.
    LeaderKill,
    /// Every worker in turn (CPU and GPU): drained with a short deadline, its container
    /// restarted, uncordoned once it is back.
    RollingRestart,
    /// The CPU workers scaled from two to six, then back to two, draining those removed.
    ScaleOutAndIn,
}

impl FleetFault {
    /// Every fault, in the order the suite runs them.
    pub const ALL: [FleetFault; 5] = [
        FleetFault::NatsNodeKill,
        FleetFault::WorkerDisconnect,
        FleetFault::LeaderKill,
        FleetFault::RollingRestart,
        FleetFault::ScaleOutAndIn,
    ];

    /// A short name, for tables, flags and action ids.
    pub fn name(self) -> &'static str {
        match self {
            FleetFault::NatsNodeKill => "nats-node-kill",
            FleetFault::WorkerDisconnect => "worker-disconnect",
            FleetFault::LeaderKill => "leader-container-kill",
            FleetFault::RollingRestart => "rolling-restart",
            FleetFault::ScaleOutAndIn => "scale-2-6-2",
        }
    }

    /// The fault of this name.
    pub fn parse(name: &str) -> Option<FleetFault> {
        FleetFault::ALL.into_iter().find(|f| f.name() == name)
    }
}

/// What the processes in the fleet log: actions' dispatches and results too, so that a
/// lost or duplicated one can be followed.
const FLEET_LOG: &str = "info,tangram_scheduler=debug,tangram_worker=debug";

/// CPU workers the fleet starts with.
const CPU_WORKERS: usize = 2;

/// A fleet brought up by `deploy/fleet.sh`, brought down when dropped.
#[derive(Debug)]
pub struct ComposeFleet {
    dir: tempfile::TempDir,
    project: String,
    prefix: String,
    port: u16,
    /// The three servers' client URLs, comma-separated.
    pub url: String,
}

impl ComposeFleet {
    /// Brings up a fleet with two CPU workers under its own project name, worker ids and
    /// ports. The images must exist (`deploy/build-images.sh`).
    pub fn up(tag: &str) -> anyhow::Result<Self> {
        let port = free_port_run(3)?;
        let fleet = Self {
            dir: tempfile::tempdir()?,
            project: format!("tgfault-{tag}-{}", std::process::id()),
            prefix: format!("{tag}-"),
            port,
            url: (0..3)
                .map(|i| format!("nats://127.0.0.1:{}", port + i))
                .collect::<Vec<_>>()
                .join(","),
        };
        fleet.script(&["up", &CPU_WORKERS.to_string()])?;
        Ok(fleet)
    }

    /// Runs `deploy/fleet.sh` with this fleet's settings; its output, or an error with it.
    pub fn script(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new("bash")
            .arg(repo_root().join("deploy/fleet.sh"))
            .args(args)
            .env("TANGRAM_FLEET_DIR", self.dir.path())
            .env("TANGRAM_FLEET_PROJECT", &self.project)
            .env("TANGRAM_FLEET_PORT", self.port.to_string())
            .env("TANGRAM_FLEET_ID_PREFIX", &self.prefix)
            .env("TANGRAM_FLEET_LOG", FLEET_LOG)
            .env("TANGRAM_FLEET_DRAIN_S", "5")
            .env("TANGRAM_FLEET_REBUILD", "1")
            .env("TANGRAM_FLEET_EFFECTS", "1")
            .env("TANGRAM_IMAGE_TAG", "fleet-test")
            .env(
                "TANGRAM_BIN_DIR",
                crate::built_binary("tangram").parent().unwrap(),
            )
            .output()
            .context("running deploy/fleet.sh")?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        anyhow::ensure!(
            out.status.success(),
            "fleet.sh {args:?} failed ({}):\n{text}",
            out.status
        );
        Ok(text)
    }

    fn docker(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new("docker").args(args).output()?;
        anyhow::ensure!(
            out.status.success(),
            "docker {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// The container of a service's `n`th replica.
    pub fn container(&self, service: &str, n: usize) -> String {
        format!("{}_{service}_{n}", self.project)
    }

    /// The fleet's network.
    pub fn network(&self) -> String {
        format!("{}_fleet", self.project)
    }

    /// A worker id with this fleet's prefix (`cpu-1` -> `<tag>-cpu-1`).
    pub fn id(&self, short: &str) -> String {
        format!("{}{short}", self.prefix)
    }

    fn creds(&self, role: &str) -> tangram_nats::auth::Credentials {
        tangram_nats::auth::Credentials::from_seed_file(
            self.dir.path().join("creds").join(format!("{role}.nk")),
        )
    }

    fn effects(&self) -> PathBuf {
        self.dir.path().join("effects")
    }

    /// The worker id a CPU worker container holds (from its health endpoint).
    fn worker_in(&self, container: &str) -> anyhow::Result<String> {
        let body = self.docker(&[
            "exec",
            container,
            "/usr/local/bin/tangram",
            "probe",
            "127.0.0.1:9475",
            "/healthz",
        ])?;
        let v: serde_json::Value = serde_json::from_str(&body)?;
        Ok(v["worker"]
            .as_str()
            .context("no worker in the health body")?
            .to_string())
    }

    /// The last `n` lines of each container's log that are not debug lines.
    pub fn log_tail(&self, n: usize) -> String {
        let text = self
            .script(&["logs", "--tail", &n.to_string()])
            .unwrap_or_default();
        text.lines()
            .filter(|l| !l.contains("DEBUG"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The fleet's log lines that name one of `ids`.
    fn log_lines_naming(&self, ids: &[String], max: usize) -> Vec<String> {
        let text = self.script(&["logs"]).unwrap_or_default();
        text.lines()
            .filter(|l| super::fleet::names_any(l, ids))
            .take(max)
            .map(str::to_string)
            .collect()
    }
}

impl Drop for ComposeFleet {
    fn drop(&mut self) {
        if let Ok(dir) = std::env::var("TANGRAM_FAULT_LOGS") {
            if let Ok(logs) = self.script(&["logs"]) {
                let _ = std::fs::create_dir_all(&dir);
                let _ = std::fs::write(Path::new(&dir).join(format!("{}.log", self.project)), logs);
            }
        }
        let _ = self.script(&["down"]);
    }
}

/// The first of `n` consecutive free loopback ports.
fn free_port_run(n: u16) -> anyhow::Result<u16> {
    for _ in 0..50 {
        let first = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        if first > 65_000 {
            continue;
        }
        if (1..n).all(|i| std::net::TcpListener::bind(("127.0.0.1", first + i)).is_ok()) {
            return Ok(first);
        }
    }
    anyhow::bail!("no run of {n} free ports found")
}

/// Runs the workload on `fleet` while `fault` strikes; returns the counts.
pub async fn run(fleet: &ComposeFleet, fault: FleetFault, size: Size) -> anyhow::Result<Report> {
    let job = format!("fleet-{}", fault.name());
    let control = Client::connect_with(&fleet.url, &job, &fleet.creds("operator")).await?;
    let workload = Workload::start_with(
        &fleet.url,
        &fleet.creds("rollout"),
        &job,
        &format!("{}-", fault.name()),
        size,
    )
    .await?;
    let started = tokio::time::Instant::now();
    workload
        .wait_progress(0.25, Duration::from_secs(300))
        .await?;
    let struck_at = started.elapsed();
    strike(fleet, &control, fault).await?;
    let recovered_at = started.elapsed();
    let finished = workload.finish(Duration::from_secs(600)).await?;
    let effects = fleet.effects();
    let api: Vec<String> = std::fs::read_to_string(effects.join("search.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect();
    let effects = Effects::read(
        Some(&effects.join("sandbox/log")),
        &effects.join("replica.log"),
        api,
    );
    let mut report = check::classify(fault.name(), &effects, &control, finished.submitted).await?;
    if !report.clean() {
        report.evidence = fleet.log_lines_naming(&report.flagged, super::EVIDENCE_LINES);
    }
    Ok(report.timed(started, struck_at, recovered_at, finished.longest_stall))
}

async fn strike(fleet: &ComposeFleet, control: &Client, fault: FleetFault) -> anyhow::Result<()> {
    match fault {
        FleetFault::NatsNodeKill => {
            let info = control
                .js
                .get_stream(tangram_shared::subject::ACTIONS_STREAM)
                .await?
                .info()
                .await?
                .clone();
            let leader = info
                .cluster
                .and_then(|c| c.leader)
                .context("the actions stream has no leader")?;
            fleet.docker(&["kill", &fleet.container(&leader, 1)])?;
            tokio::time::sleep(Duration::from_secs(5)).await;
            fleet.script(&["compose", "start", &leader])?;
        }
        FleetFault::WorkerDisconnect => {
            let c = fleet.container("cpu-worker", 1);
            fleet.docker(&["network", "disconnect", &fleet.network(), &c])?;
            tokio::time::sleep(Duration::from_secs(6)).await;
            fleet.docker(&["network", "connect", &fleet.network(), &c])?;
        }
        FleetFault::LeaderKill => {
            let leader = control.leader().await?.context("no leader to kill")?;
            let other = if leader.id == "scheduler-a" {
                "scheduler-b"
            } else {
                "scheduler-a"
            };
            fleet.docker(&["kill", &fleet.container(&leader.id, 1)])?;
            control
                .wait_for_leader(other, Duration::from_secs(15))
                .await?;
            fleet.script(&["compose", "start", &leader.id])?;
        }
        FleetFault::RollingRestart => {
            let mut containers: Vec<(String, String)> = (1..=CPU_WORKERS)
                .map(|n| {
                    let c = fleet.container("cpu-worker", n);
                    fleet.worker_in(&c).map(|id| (c, id))
                })
                .collect::<anyhow::Result<_>>()?;
            containers.push((fleet.container("gpu-worker", 1), fleet.id("gpu-1")));
            for (c, id) in containers {
                fleet.script(&["drain", &id, "--deadline-s", "3"])?;
                fleet.docker(&["restart", "-t", "40", &c])?;
                control
                    .wait_for_workers(&[id.as_str()], Duration::from_secs(60))
                    .await?;
                fleet.script(&["uncordon", &id])?;
            }
        }
        FleetFault::ScaleOutAndIn => {
            fleet.script(&["scale", "6"])?;
            tokio::time::sleep(Duration::from_secs(5)).await;
            fleet.script(&["scale", &CPU_WORKERS.to_string()])?;
        }
    }
    Ok(())
}
