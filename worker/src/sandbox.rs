//! The sandbox runtime seam: what the worker needs from whatever runs its sandboxes.
//!
//! The worker decides (admission, core grants, timing, outcomes); a runtime only carries the
//! decisions out. Two implement it: Docker ([`crate::docker::DockerRuntime`], the only real
//! one) and [`InMemorySandboxes`], which runs nothing. The in-memory runtime is the fake the
//! worker's unit tests drive, and, as `sandbox_runtime = "noop"`, the benchmark-only runtime
//! that measures orchestration with execution taken out. It must never serve real workloads:
//! commands do not run at all.
//!
//! A runtime has the shape every executor has: it fingerprints itself ([`SandboxRuntime::kind`]),
//! validates its host ([`SandboxRuntime::validate`]), recovers from an earlier run
//! ([`SandboxRuntime::recover`]), starts sandboxes, runs and waits for commands, stops them, and
//! removes sandboxes.

use crate::cgroup::CgroupCpu;
use crate::containment::Containment;
use futures::future::BoxFuture;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tangram_shared::SandboxOpen;

/// Which runtime runs sandboxes (`sandbox_runtime` in the worker's config).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RuntimeKind {
    /// Hardened Docker containers: the only runtime for real work.
    Docker,
    /// Benchmark-only: sandboxes exist in memory and every command "exits 0" at once without
    /// running. Measures orchestration alone; never use it for real workloads.
    Noop,
}

impl RuntimeKind {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            RuntimeKind::Docker => "docker",
            RuntimeKind::Noop => "noop",
        }
    }
}

impl std::str::FromStr for RuntimeKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "docker" => Ok(RuntimeKind::Docker),
            "noop" => Ok(RuntimeKind::Noop),
            _ => Err(format!(
                "{s:?} is not a sandbox runtime; use docker or noop"
            )),
        }
    }
}

/// A sandbox's owner: one per trajectory of a job.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SandboxKey {
    /// Job id.
    pub job: String,
    /// Trajectory id.
    pub trajectory: String,
}

/// A started sandbox, as the runtime knows it.
#[derive(Debug, Clone)]
pub struct SandboxHandle {
    /// The runtime's id for it (a container id for Docker).
    pub id: String,
    /// Its CPU controls, when grants write the cgroup files directly.
    pub cgroup: Option<CgroupCpu>,
    /// Its cgroups as seen from the host, for the kill that needs no exec and for the
    /// out-of-memory counter; `None` where they cannot be found (the runtime then falls back
    /// to killing from inside, and cannot tell an out-of-memory kill from another SIGKILL).
    pub containment: Option<Containment>,
    /// How long pulling its image took, µs (0: the image was there).
    pub pull_us: u64,
    /// The open's environment as `KEY=VALUE`, applied to every command run in it (under the
    /// command's own, [`exec_env`]): a claimed warm sandbox was created before its open.
    pub env: Vec<String>,
}

/// An open's or a command's environment as Docker takes it.
pub fn env_list(env: &BTreeMap<String, String>) -> Vec<String> {
    env.iter().map(|(k, v)| format!("{k}={v}")).collect()
}

/// The environment of one command: the sandbox's, then `TANGRAM_CPUS`, then the command's
/// own, a later value of a name replacing an earlier one.
pub fn exec_env(
    sandbox: &[String],
    cpus: usize,
    command: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(sandbox.len() + 1 + command.len());
    let layers = sandbox
        .iter()
        .cloned()
        .chain(std::iter::once(format!("TANGRAM_CPUS={cpus}")))
        .chain(env_list(command));
    for kv in layers {
        let name = kv.split('=').next().unwrap_or_default().to_string();
        out.retain(|e| e.split('=').next() != Some(name.as_str()));
        out.push(kv);
    }
    out
}

/// One command to run in a sandbox.
#[derive(Debug, Clone, Copy)]
pub struct ExecRequest<'a> {
    /// The command.
    pub argv: &'a [String],
    /// `KEY=VALUE` pairs.
    pub env: &'a [String],
    /// Text on the command's stdin.
    pub stdin: Option<&'a [u8]>,
    /// Files written under `/work` before the command starts.
    pub files: &'a BTreeMap<String, String>,
    /// After this the command's whole process tree is killed.
    pub timeout: Duration,
    /// Stdout and stderr are each cut at this many bytes.
    pub output_limit_bytes: usize,
}

/// What one command did.
#[derive(Debug, Default)]
pub struct ExecOutput {
    /// Exit code, when the command ended by itself.
    pub exit_code: Option<i64>,
    /// True when the timeout fired and the process tree was killed.
    pub timed_out: bool,
    /// Captured stdout, up to the cap.
    pub stdout: Vec<u8>,
    /// Captured stderr, up to the cap.
    pub stderr: Vec<u8>,
    /// True when either stream was cut.
    pub truncated: bool,
    /// True when the kernel's out-of-memory killer killed a process of the sandbox while
    /// the command ran (the sandbox's memory limit was reached).
    pub oom_killed: bool,
    /// True when the sandbox did not outlive the command (under gVisor, running out of
    /// memory ends the whole sandbox): the worker forgets it, and the trajectory's next
    /// command is told `sandbox_lost`.
    pub sandbox_lost: bool,
    /// How long the command itself ran (files written first are not counted), µs.
    pub exec_us: u64,
}

/// A sandbox runtime failed (a command's non-zero exit is an outcome, not one of these).
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The image is not present (no registry is reachable, so it cannot be pulled).
    #[error("image {0:?} is not present on this worker; build or load it first (deploy/build-sandbox-image.sh builds the default)")]
    NoImage(String),
    /// The image is absent and may not be pulled, or its registry does not have it.
    #[error("{0}")]
    ImageRefused(String),
    /// The image is absent and its pull failed (registry unreachable, credentials refused,
    /// too slow).
    #[error("{0}")]
    Pull(String),
    /// The sandbox is gone.
    #[error("sandbox {0} no longer exists")]
    Gone(String),
    /// The action's files could not be written into the sandbox.
    #[error("{0}")]
    Files(String),
    /// The sandbox's CPU cgroup could not be found.
    #[error("finding the sandbox's cgroup: {0}")]
    Cgroup(#[source] std::io::Error),
    /// Granting or parking cores failed.
    #[error("setting the sandbox's cores: {0}")]
    Grant(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// Any other failure of the runtime.
    #[error("{0}")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// What runs sandboxes. Object-safe, so the worker holds one as `Arc<dyn SandboxRuntime>`.
pub trait SandboxRuntime: Send + Sync + std::fmt::Debug {
    /// Which runtime this is.
    fn kind(&self) -> RuntimeKind;

    /// Checks the host can run sandboxes (the default image is present).
    fn validate(&self) -> BoxFuture<'_, Result<(), SandboxError>>;

    /// Removes whatever an earlier run of this worker left (its cores and grants are unknown
    /// now); returns how many sandboxes went.
    fn recover(&self) -> BoxFuture<'_, Result<usize, SandboxError>>;

    /// Starts a sandbox for `key`, parked on `parking_cores`.
    fn start<'a>(
        &'a self,
        key: &'a SandboxKey,
        open: &'a SandboxOpen,
        parking_cores: &'a str,
    ) -> BoxFuture<'a, Result<SandboxHandle, SandboxError>>;

    /// Grants `cpus` with `quota_us` per CFS period (`widening`), or parks the sandbox again.
    fn grant<'a>(
        &'a self,
        sandbox: &'a SandboxHandle,
        cpus: &'a str,
        quota_us: i64,
        widening: bool,
    ) -> BoxFuture<'a, Result<(), SandboxError>>;

    /// Runs one command and waits for it (or its timeout).
    fn exec<'a>(
        &'a self,
        sandbox: &'a SandboxHandle,
        request: ExecRequest<'a>,
    ) -> BoxFuture<'a, Result<ExecOutput, SandboxError>>;

    /// Sets the sandbox's memory limit to `memory_mb` (a claimed warm sandbox takes its
    /// open's). Runtimes without limits accept it.
    fn resize<'a>(
        &'a self,
        _sandbox: &'a SandboxHandle,
        _memory_mb: u64,
    ) -> BoxFuture<'a, Result<(), SandboxError>> {
        Box::pin(async { Ok(()) })
    }

    /// Kills every command running in the sandbox; the sandbox itself stays.
    fn stop<'a>(&'a self, sandbox: &'a SandboxHandle) -> BoxFuture<'a, ()>;

    /// Removes the sandbox; one already gone is not an error.
    fn remove<'a>(&'a self, sandbox: &'a SandboxHandle) -> BoxFuture<'a, Result<(), SandboxError>>;

    /// The warm pool in front of this runtime, if there is one ([`crate::warm::WarmPool`]).
    fn warm(&self) -> Option<tangram_shared::WarmPoolReport> {
        None
    }

    /// The sandbox images this runtime holds, as last listed (none where it has no images).
    fn images(&self) -> Vec<tangram_shared::ImageReport> {
        Vec::new()
    }

    /// Makes `image` present ahead of the opens that will name it (`tangram images
    /// prepull`): `None` when it was already, else the pull's duration, µs. Runtimes without
    /// images refuse.
    fn prepull<'a>(&'a self, image: &'a str) -> BoxFuture<'a, Result<Option<u64>, SandboxError>> {
        Box::pin(async move {
            Err(SandboxError::ImageRefused(format!(
                "{image}: this worker's sandbox runtime ({:?}) has no images to pull",
                self.kind()
            )))
        })
    }

    /// The worker is stopping: whatever the runtime keeps beyond the sandboxes it handed out
    /// (a warm pool's parked ones) goes.
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// Sandboxes that exist only in memory; commands never run.
///
/// As the `noop` runtime every command completes at once with exit code 0 and no output.
/// [`InMemorySandboxes::with_sleep`] makes `["sleep", SECONDS]` take that long (on tokio's
/// clock, so paused-time tests control it) and honour the timeout, for tests of draining.
#[derive(Debug, Default)]
pub struct InMemorySandboxes {
    next: AtomicU64,
    open: Mutex<BTreeSet<String>>,
    stopped: Mutex<Vec<String>>,
    honour_sleep: bool,
    leftovers: Mutex<usize>,
    start_delay: Duration,
}

impl InMemorySandboxes {
    /// The `noop` runtime: every command exits 0 at once.
    pub fn noop() -> Self {
        Self::default()
    }

    /// A fake whose `sleep N` commands take N seconds of tokio time.
    pub fn with_sleep() -> Self {
        Self {
            honour_sleep: true,
            ..Self::default()
        }
    }

    /// A fake whose sandboxes take `delay` of tokio time to create. Like Docker's, a creation
    /// exists from its first moment, whether or not its caller waits for it.
    pub fn with_start_delay(delay: Duration) -> Self {
        Self {
            start_delay: delay,
            ..Self::default()
        }
    }

    /// Pretends an earlier run left `n` sandboxes for [`SandboxRuntime::recover`] to remove.
    pub fn leave_behind(&self, n: usize) {
        *self.leftovers.lock().expect("leftovers lock") = n;
    }

    /// Sandboxes open now.
    pub fn open_count(&self) -> usize {
        self.open.lock().expect("open lock").len()
    }

    /// Sandboxes whose commands were stopped, in order.
    pub fn stopped(&self) -> Vec<String> {
        self.stopped.lock().expect("stopped lock").clone()
    }

    fn sleep_of(&self, argv: &[String]) -> Option<Duration> {
        match argv {
            [cmd, secs] if self.honour_sleep && cmd == "sleep" => {
                secs.parse::<f64>().ok().map(Duration::from_secs_f64)
            }
            _ => None,
        }
    }
}

impl SandboxRuntime for InMemorySandboxes {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Noop
    }

    fn validate(&self) -> BoxFuture<'_, Result<(), SandboxError>> {
        Box::pin(async { Ok(()) })
    }

    fn recover(&self) -> BoxFuture<'_, Result<usize, SandboxError>> {
        Box::pin(async {
            Ok(std::mem::take(
                &mut *self.leftovers.lock().expect("leftovers lock"),
            ))
        })
    }

    fn start<'a>(
        &'a self,
        key: &'a SandboxKey,
        open: &'a SandboxOpen,
        _parking_cores: &'a str,
    ) -> BoxFuture<'a, Result<SandboxHandle, SandboxError>> {
        Box::pin(async move {
            let n = self.next.fetch_add(1, Ordering::Relaxed);
            let id = format!("mem-{}-{}-{n}", key.job, key.trajectory);
            self.open.lock().expect("open lock").insert(id.clone());
            if !self.start_delay.is_zero() {
                tokio::time::sleep(self.start_delay).await;
            }
            Ok(SandboxHandle {
                id,
                cgroup: None,
                containment: None,
                pull_us: 0,
                env: env_list(&open.env),
            })
        })
    }

    fn grant<'a>(
        &'a self,
        sandbox: &'a SandboxHandle,
        _cpus: &'a str,
        _quota_us: i64,
        _widening: bool,
    ) -> BoxFuture<'a, Result<(), SandboxError>> {
        Box::pin(async move {
            if self.open.lock().expect("open lock").contains(&sandbox.id) {
                Ok(())
            } else {
                Err(SandboxError::Gone(sandbox.id.clone()))
            }
        })
    }

    fn exec<'a>(
        &'a self,
        sandbox: &'a SandboxHandle,
        request: ExecRequest<'a>,
    ) -> BoxFuture<'a, Result<ExecOutput, SandboxError>> {
        Box::pin(async move {
            if !self.open.lock().expect("open lock").contains(&sandbox.id) {
                return Err(SandboxError::Gone(sandbox.id.clone()));
            }
            let Some(wanted) = self.sleep_of(request.argv) else {
                return Ok(ExecOutput {
                    exit_code: Some(0),
                    ..ExecOutput::default()
                });
            };
            let t0 = tokio::time::Instant::now();
            let timed_out = wanted > request.timeout;
            tokio::time::sleep(wanted.min(request.timeout)).await;
            Ok(ExecOutput {
                exit_code: (!timed_out).then_some(0),
                timed_out,
                exec_us: t0.elapsed().as_micros() as u64,
                ..ExecOutput::default()
            })
        })
    }

    fn stop<'a>(&'a self, sandbox: &'a SandboxHandle) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            self.stopped
                .lock()
                .expect("stopped lock")
                .push(sandbox.id.clone());
        })
    }

    fn remove<'a>(&'a self, sandbox: &'a SandboxHandle) -> BoxFuture<'a, Result<(), SandboxError>> {
        Box::pin(async move {
            self.open.lock().expect("open lock").remove(&sandbox.id);
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> SandboxKey {
        SandboxKey {
            job: "j".into(),
            trajectory: "t".into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn noop_commands_exit_zero_at_once_without_output() {
        let rt = InMemorySandboxes::noop();
        let h = rt
            .start(&key(), &SandboxOpen::default(), "0")
            .await
            .unwrap();
        let argv = ["sh".to_string(), "-c".into(), "echo hi; exit 3".into()];
        let t0 = tokio::time::Instant::now();
        let out = rt
            .exec(
                &h,
                ExecRequest {
                    argv: &argv,
                    env: &[],
                    stdin: None,
                    files: &BTreeMap::new(),
                    timeout: Duration::from_secs(5),
                    output_limit_bytes: 1024,
                },
            )
            .await
            .unwrap();
        assert_eq!(t0.elapsed(), Duration::ZERO);
        assert_eq!(
            (out.exit_code, out.stdout.len(), out.stderr.len()),
            (Some(0), 0, 0)
        );
        rt.remove(&h).await.unwrap();
        assert_eq!(rt.open_count(), 0);
        assert!(matches!(
            rt.exec(
                &h,
                ExecRequest {
                    argv: &argv,
                    env: &[],
                    stdin: None,
                    files: &BTreeMap::new(),
                    timeout: Duration::from_secs(1),
                    output_limit_bytes: 1
                }
            )
            .await,
            Err(SandboxError::Gone(_))
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn the_fake_sleeps_on_tokio_time_and_times_out() {
        let rt = InMemorySandboxes::with_sleep();
        let h = rt
            .start(&key(), &SandboxOpen::default(), "0")
            .await
            .unwrap();
        let argv = ["sleep".to_string(), "30".into()];
        let req = ExecRequest {
            argv: &argv,
            env: &[],
            stdin: None,
            files: &BTreeMap::new(),
            timeout: Duration::from_secs(2),
            output_limit_bytes: 1024,
        };
        let t0 = tokio::time::Instant::now();
        let out = rt.exec(&h, req).await.unwrap();
        assert!(out.timed_out);
        assert_eq!(t0.elapsed(), Duration::from_secs(2));
    }
}
