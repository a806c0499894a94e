//! Docker as the worker's sandbox runtime.

use super::{
    exec_token, files_archive, files_failed, files_stdin, us_since, with_files_wrapper,
    DockerError, DockerSandboxes, RunLimits,
};
use crate::cgroup::CgroupCpu;
use crate::config::{GrantMode, SandboxConfig};
use crate::containment::Containment;
use crate::metrics as m;
use crate::sandbox::{
    ExecOutput, ExecRequest, RuntimeKind, SandboxError, SandboxHandle, SandboxKey, SandboxRuntime,
};
use futures::future::BoxFuture;
use tangram_shared::SandboxOpen;
use tokio::time::Instant;

impl From<DockerError> for SandboxError {
    fn from(e: DockerError) -> Self {
        match e {
            DockerError::NoImage(image) => SandboxError::NoImage(image),
            DockerError::Pull(super::pull::PullError::Refused(why)) => {
                SandboxError::ImageRefused(why)
            }
            DockerError::Pull(super::pull::PullError::Failed(why)) => SandboxError::Pull(why),
            DockerError::Gone(id) => SandboxError::Gone(id),
            e => SandboxError::Backend(Box::new(e)),
        }
    }
}

/// Hardened Docker containers, granted cores through their cgroup files or Docker's update
/// API (`grant_mode`).
#[derive(Debug, Clone)]
pub struct DockerRuntime {
    docker: DockerSandboxes,
    grant_mode: GrantMode,
}

impl DockerRuntime {
    /// Connects to the local daemon.
    pub async fn connect(
        worker: &str,
        config: SandboxConfig,
        grant_mode: GrantMode,
    ) -> Result<Self, DockerError> {
        Ok(Self {
            docker: DockerSandboxes::connect(worker, config).await?,
            grant_mode,
        })
    }
}

impl SandboxRuntime for DockerRuntime {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Docker
    }

    fn images(&self) -> Vec<tangram_shared::ImageReport> {
        self.docker.images()
    }

    fn prepull<'a>(&'a self, image: &'a str) -> BoxFuture<'a, Result<Option<u64>, SandboxError>> {
        Box::pin(async move {
            let pulled = self.docker.ensure_image(image).await?;
            // Counted as a use, so the disk budget's collection keeps what was just asked
            // for ahead of images nobody used lately.
            self.docker.used(image);
            Ok(pulled)
        })
    }

    fn validate(&self) -> BoxFuture<'_, Result<(), SandboxError>> {
        Box::pin(async move {
            self.docker.check_runtime().await?;
            let image = self.docker.default_image();
            if self.docker.has_image(image).await? {
                self.docker.refresh_images().await;
                Ok(())
            } else {
                Err(SandboxError::NoImage(image.to_string()))
            }
        })
    }

    fn recover(&self) -> BoxFuture<'_, Result<usize, SandboxError>> {
        Box::pin(async move {
            let leftovers = self.docker.leftovers().await?;
            for l in &leftovers {
                self.docker.remove(&l.id).await?;
            }
            Ok(leftovers.len())
        })
    }

    fn start<'a>(
        &'a self,
        key: &'a SandboxKey,
        open: &'a SandboxOpen,
        parking_cores: &'a str,
    ) -> BoxFuture<'a, Result<SandboxHandle, SandboxError>> {
        Box::pin(async move {
            let created = self
                .docker
                .create(&key.job, &key.trajectory, open, parking_cores)
                .await?;
            let cgroup = match self.grant_mode {
                GrantMode::Docker => None,
                GrantMode::Cgroup => match CgroupCpu::for_pid(created.pid) {
                    Ok(c) => Some(c),
                    Err(e) => {
                        let _ = self.docker.remove(&created.id).await;
                        return Err(SandboxError::Cgroup(e));
                    }
                },
            };
            // Under gVisor the host processes in the sandbox's cgroups are gVisor's own (its
            // kernel and the stubs running the sandboxed code): a kill from outside would take
            // the whole sandbox down. Commands are killed from inside, and out-of-memory is
            // read from the command's exit.
            let containment = match Containment::for_pid(created.pid) {
                _ if self.docker.gvisor() => None,
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::warn!(error = %e, sandbox = %created.id,
                        "sandbox cgroups not found: timeouts kill from inside the sandbox, \
                         and out-of-memory kills are reported as plain SIGKILL");
                    None
                }
            };
            Ok(SandboxHandle {
                id: created.id,
                cgroup,
                containment,
                pull_us: created.pull_us,
                env: crate::sandbox::env_list(&open.env),
            })
        })
    }

    fn grant<'a>(
        &'a self,
        sandbox: &'a SandboxHandle,
        cpus: &'a str,
        quota_us: i64,
        widening: bool,
    ) -> BoxFuture<'a, Result<(), SandboxError>> {
        Box::pin(async move {
            let t = Instant::now();
            let (mode, r) = match &sandbox.cgroup {
                Some(cg) => (
                    "cgroup",
                    cg.apply(cpus, quota_us, widening).map_err(|e| {
                        // Its cgroup is gone with it: the container stopped.
                        if e.kind() == std::io::ErrorKind::NotFound {
                            SandboxError::Gone(sandbox.id.clone())
                        } else {
                            SandboxError::Grant(Box::new(e))
                        }
                    }),
                ),
                None => (
                    "docker",
                    self.docker
                        .update_cpus(&sandbox.id, cpus, quota_us)
                        .await
                        .map_err(|e| match e {
                            DockerError::Gone(id) => SandboxError::Gone(id),
                            e => SandboxError::Grant(Box::new(e)),
                        }),
                ),
            };
            m::grant(
                mode,
                if widening { "grant" } else { "park" },
                t.elapsed().as_secs_f64(),
            );
            r
        })
    }

    fn exec<'a>(
        &'a self,
        sandbox: &'a SandboxHandle,
        req: ExecRequest<'a>,
    ) -> BoxFuture<'a, Result<ExecOutput, SandboxError>> {
        Box::pin(async move {
            let id = &sandbox.id;
            // Files ride on the command's own exec when its stdin is free; otherwise they take
            // an exec of their own first.
            let inline_files = !req.files.is_empty() && req.stdin.is_none();
            let mut token = String::new();
            let (argv, stdin) = if inline_files {
                let archive = files_archive(req.files)
                    .map_err(|e| SandboxError::Files(format!("packing files: {e}")))?;
                token = exec_token()
                    .map_err(|e| SandboxError::Files(format!("making the exec's token: {e}")))?;
                (
                    with_files_wrapper(req.argv),
                    Some(files_stdin(&token, &archive)),
                )
            } else {
                self.docker
                    .write_files(id, req.files)
                    .await
                    .map_err(|e| match e {
                        DockerError::Gone(id) => SandboxError::Gone(id),
                        e => SandboxError::Files(format!("writing files: {e}")),
                    })?;
                (req.argv.to_vec(), req.stdin.map(<[u8]>::to_vec))
            };
            let containment = sandbox.containment.as_ref();
            let ooms_before = containment.and_then(Containment::oom_kills);
            let t = Instant::now();
            let mut out = self
                .docker
                .run(
                    id,
                    &argv,
                    req.env,
                    stdin.as_deref(),
                    RunLimits {
                        timeout: req.timeout,
                        cap: req.output_limit_bytes,
                        containment,
                    },
                )
                .await?;
            out.exec_us = us_since(t);
            let ooms_after = containment.and_then(Containment::oom_kills);
            out.oom_killed |= matches!((ooms_before, ooms_after), (Some(b), Some(a)) if a > b);
            // Only the wrapper's own failure, which names this exec's token: a command that
            // prints the mark and exits 125 completed with exit code 125.
            if inline_files && files_failed(out.exit_code, &out.stderr, &token) {
                let stderr = String::from_utf8_lossy(&out.stderr);
                return Err(SandboxError::Files(format!(
                    "{} (is workdir_mb large enough?)",
                    stderr.trim().replace(&token, "token")
                )));
            }
            Ok(out)
        })
    }

    fn resize<'a>(
        &'a self,
        sandbox: &'a SandboxHandle,
        memory_mb: u64,
    ) -> BoxFuture<'a, Result<(), SandboxError>> {
        Box::pin(async move {
            let t = Instant::now();
            let r = self.docker.update_memory(&sandbox.id, memory_mb).await;
            m::grant("docker", "resize", t.elapsed().as_secs_f64());
            Ok(r?)
        })
    }

    fn stop<'a>(&'a self, sandbox: &'a SandboxHandle) -> BoxFuture<'a, ()> {
        Box::pin(
            self.docker
                .kill_tree(&sandbox.id, sandbox.containment.as_ref()),
        )
    }

    fn remove<'a>(&'a self, sandbox: &'a SandboxHandle) -> BoxFuture<'a, Result<(), SandboxError>> {
        Box::pin(async move { Ok(self.docker.remove(&sandbox.id).await?) })
    }
}
