//! Running the same test under Docker's default runtime (runc) and under gVisor (runsc).
//!
//! gVisor comes from Debian's `runsc` package; `deploy/install-runsc.sh` (which
//! `deploy/test.sh` runs) installs it and registers it with the Docker daemon. A test under
//! gVisor fails, with that command in its message, when the daemon does not have it: it
//! never passes by running under runc instead.

use crate::Cluster;
use std::process::Command;

/// Which OCI runtime a test's sandboxes run under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    /// Docker's default.
    Runc,
    /// gVisor, as `[sandbox] runtime = "runsc"`.
    Gvisor,
}

impl Runtime {
    /// The worker's `[sandbox] runtime` for this runtime.
    pub fn sandbox_runtime(self) -> anyhow::Result<Option<String>> {
        match self {
            Runtime::Runc => Ok(None),
            Runtime::Gvisor => {
                require()?;
                Ok(Some("runsc".into()))
            }
        }
    }

    /// A secured-by-default test cluster with one sandbox worker, `worker`, whose sandboxes
    /// run under this runtime (cores 0-1, 4 GiB).
    pub async fn cluster(self, worker: &str) -> anyhow::Result<Cluster> {
        let runtime = self.sandbox_runtime()?;
        let mut cluster = Cluster::start(&[]).await?;
        cluster.start_sandbox_worker(
            worker,
            tangram_worker::config::RawSandbox {
                runtime,
                ..Default::default()
            },
        )?;
        Ok(cluster)
    }
}

/// Fails unless the Docker daemon has a `runsc` runtime.
pub fn require() -> anyhow::Result<()> {
    let out = Command::new("docker")
        .args(["info", "--format", "{{json .Runtimes}}"])
        .output()?;
    let runtimes: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    anyhow::ensure!(
        runtimes.get("runsc").is_some(),
        "the Docker daemon has no runsc runtime (it has {runtimes}); run \
         `bash deploy/install-runsc.sh` (deploy/test.sh does) to install gVisor and register it"
    );
    Ok(())
}
