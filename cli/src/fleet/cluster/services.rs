//! The cluster's services beside the workers: the api provider's stand-in and the GPU
//! workers' configs (declared GPUs, the reference replica, the provider).

use super::*;

impl Cluster {
    /// Starts the search stand-in (the api provider's far end), its own limit above the
    /// quota the scheduler keeps to; its URL and the file holding its token.
    pub(super) fn start_search(
        &mut self,
        rate: f64,
    ) -> anyhow::Result<(String, std::path::PathBuf)> {
        let d = self.dir.path();
        let script = d.join("search.py");
        std::fs::write(&script, crate::cluster::SEARCH_PY)?;
        let token_file = d.join("search.key");
        std::fs::write(&token_file, "fleet-bench-search\n")?;
        let port = crate::cluster::free_port()?;
        let child = crate::cluster::spawn_logged(
            &d.join("search.log"),
            "search",
            Command::new("python3")
                .arg(&script)
                .args(["--port", &port.to_string()])
                .args(["--rate", &(rate * 1.5 + 10.0).to_string()])
                .args(["--burst", "20"])
                .arg("--token-file")
                .arg(&token_file),
        )?;
        self.services.push(Proc {
            name: "search",
            child,
        });
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if started.elapsed() > Duration::from_secs(10) {
                bail!(
                    "the search stand-in did not start\n{}",
                    self.log_tail("search.log")
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok((format!("http://127.0.0.1:{port}"), token_file))
    }

    /// Writes the config of GPU worker `id`: declared GPUs serving the reward service with
    /// the reference replica, and the api provider at `rate` a second. Its path.
    pub(super) fn gpu_worker_config(
        &self,
        id: &str,
        shape: &Shape,
        search_url: &str,
        token_file: &Path,
        rate: f64,
    ) -> anyhow::Result<std::path::PathBuf> {
        use crate::cluster::files::{GpuProvider, GpuSection, GpuService, GpuWorkerFile};
        let d = self.dir.path();
        let replica = d.join("replica.py");
        std::fs::write(&replica, crate::cluster::REPLICA_PY)?;
        let file = GpuWorkerFile {
            id: id.into(),
            nats_url: self.url.clone(),
            sandboxes: false,
            heartbeat_ms: shape.heartbeat_ms,
            state_dir: d.join(id),
            metrics_addr: None,
            gpu: GpuSection {
                nvml: "off".into(),
                count: shape.gpus,
            },
            service: vec![GpuService::reference(REWARD_SERVICE, &replica)],
            provider: vec![GpuProvider {
                name: API_PROVIDER.into(),
                base_url: search_url.into(),
                credential_file: token_file.to_path_buf(),
                rate_per_s: rate,
                burst: 20,
                concurrency: 16,
                timeout_ms: 10_000,
                allow: vec!["GET /search".into()],
            }],
        };
        let path = d.join(format!("{id}.toml"));
        std::fs::write(&path, toml::to_string(&file)?)?;
        Ok(path)
    }
}
