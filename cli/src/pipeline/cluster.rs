//! The bench's cluster: nats-server with the sync setting under test, the scheduler and one
//! CPU worker on loopback, each a child process stopped when the cluster is dropped.

use super::*;

/// The shipped server config with the sync setting under test: `always`, or no
/// `sync_interval` at all (the server's default).
pub(crate) fn server_conf(sync: &str) -> anyhow::Result<String> {
    let mut conf: String = SERVER_CONF
        .lines()
        .filter(|l| !l.trim_start().starts_with("sync_interval"))
        .map(|l| format!("{l}\n"))
        .collect();
    if sync == "always" {
        let Some(at) = conf.find("jetstream {\n") else {
            bail!("nats/server.conf has no `jetstream {{` block to set sync_interval in");
        };
        conf.insert_str(at + "jetstream {\n".len(), "  sync_interval: always\n");
    }
    Ok(conf)
}

/// A child process killed when dropped.
#[derive(Debug)]
pub(crate) struct Proc {
    pub(crate) name: &'static str,
    pub(crate) child: Child,
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SIGTERM first: the worker removes its sandboxes on a graceful stop.
            let _ = crate::cluster::signal(self.child.id(), rustix::process::Signal::TERM);
            let deadline = Instant::now() + Duration::from_secs(15);
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// nats-server, the scheduler and one CPU worker on loopback, in a temporary directory.
#[derive(Debug)]
pub(super) struct LocalCluster {
    // Dropped in order: the worker first (it removes its sandboxes), the server last.
    procs: Vec<Proc>,
    pub(super) url: String,
    pub(super) worker: String,
    dir: tempfile::TempDir,
}

impl LocalCluster {
    pub(super) fn start(nats: &Path, sync: &str, plan: &Plan) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("tangram-bench-")
            .tempdir()?;
        std::fs::create_dir_all(dir.path().join("store"))?;
        std::fs::write(dir.path().join("server.conf"), server_conf(sync)?)?;
        let port = crate::cluster::free_port()?;
        let url = format!("nats://127.0.0.1:{port}");
        let worker = format!("bench-{}", std::process::id());
        let mut c = LocalCluster {
            procs: Vec::new(),
            url: url.clone(),
            worker: worker.clone(),
            dir,
        };
        let d = c.dir.path().to_path_buf();
        let server = tangram_nats::local::LocalServer {
            bin: nats,
            conf: &d.join("server.conf"),
            store: &d.join("store"),
            port,
            monitor_port: crate::cluster::free_port()?,
        };
        c.spawn("nats", &mut server.command()).with_context(|| {
            format!(
                "nats-server ({}); install it with deploy/install-tools.sh",
                nats.display()
            )
        })?;
        let listening = tangram_nats::local::wait_listening(
            port,
            Duration::from_secs(10),
            Duration::from_millis(50),
        );
        if !listening {
            bail!("nats-server did not start\n{}", c.log_tails());
        }
        let scheduler = SchedulerProcess {
            nats_url: Some(url.clone()),
            ..Default::default()
        };
        let bin = crate::cluster::sibling("tangram-scheduler")?;
        c.spawn("scheduler", &mut scheduler.command(&bin))?;
        let w = WorkerProcess {
            id: Some(worker.clone()),
            nats_url: Some(url.clone()),
            cores: Some(plan.worker_cores.clone()),
            mem_mb: Some((plan.concurrency as u64 + 2) * SANDBOX_MB),
            heartbeat_ms: Some(200),
            sandbox_runtime: (plan.runtime != "docker").then(|| plan.runtime.clone()),
            ..Default::default()
        };
        let bin = crate::cluster::sibling("tangram-worker")?;
        c.spawn("worker", &mut w.command(&bin))?;
        // The worker goes first when the cluster drops.
        c.procs.reverse();
        Ok(c)
    }

    fn spawn(&mut self, name: &'static str, cmd: &mut Command) -> anyhow::Result<()> {
        let log = self.dir.path().join(format!("{name}.log"));
        let child = crate::cluster::spawn_logged(&log, name, cmd)?;
        self.procs.push(Proc { name, child });
        Ok(())
    }

    pub(super) fn log_tails(&self) -> String {
        self.procs
            .iter()
            .map(|p| {
                let text = std::fs::read_to_string(self.dir.path().join(format!("{}.log", p.name)))
                    .unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                format!(
                    "--- {} log (last lines)\n{}",
                    p.name,
                    lines[lines.len().saturating_sub(10)..].join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Waits until the scheduler's status lists `worker`.
pub(super) async fn wait_for_worker(
    client: &async_nats::Client,
    worker: &str,
    within: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let reply = tangram_nats::status::fetch(client, Duration::from_secs(2)).await;
        if let Ok(f) = reply {
            if f.status.workers.iter().any(|w| w.id == worker) {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("the scheduler did not list worker {worker} within {within:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_conf_sets_or_removes_the_sync_interval() {
        let always = server_conf("always").unwrap();
        let default = server_conf("default").unwrap();
        assert_eq!(always.matches("sync_interval").count(), 1, "{always}");
        assert!(always.contains("jetstream {\n  sync_interval: always\n"));
        assert!(!default.contains("sync_interval"), "{default}");
        // Nothing else changes.
        assert_eq!(always.replace("  sync_interval: always\n", ""), default);
    }
}
