//! Running one action, and the sandbox actions themselves: open, exec under a core grant,
//! close.

use super::{infra, unix_us, Worker};
use crate::cgroup::PERIOD_US;
use crate::cpuset;
use crate::docker::{us_since, PARKED_QUOTA_US};
use crate::sandbox::{ExecRequest, SandboxError, SandboxHandle, SandboxKey, SandboxRuntime};
use std::sync::Arc;
use std::time::Duration;
use tangram_shared::{
    ActionId, ActionResult, ActionSpec, Dispatch, InfraCode, Outcome, Placement, RejectCode, Timing,
};
use tokio::time::Instant;
use tracing::{debug, warn};

/// How long an exec waits for booked cores that are not free yet: the dispatch consumer's
/// ack wait (after which a re-size lost on its way is redelivered), and a margin.
pub(crate) const CORE_WAIT: Duration =
    Duration::from_millis(tangram_shared::DISPATCH_REDELIVERY_MS + 2_000);

/// A sandbox this worker holds.
pub(crate) struct Sandbox {
    pub(crate) handle: SandboxHandle,
    pub(crate) mem_mb: u64,
    /// The open that created it, and the idle timeout it asked for (both reported in
    /// heartbeats, for a scheduler that takes over).
    pub(crate) open: ActionId,
    pub(crate) idle_timeout_ms: Option<u64>,
    /// Commands in one sandbox run one at a time, as a trajectory's actions do.
    pub(crate) lock: tokio::sync::Mutex<()>,
}

impl Worker {
    /// The sandbox runtime; sandbox actions are refused before reaching here on workers
    /// without one.
    fn dk(&self) -> &dyn SandboxRuntime {
        self.sandboxes
            .as_deref()
            .expect("sandbox actions never run on a worker without a sandbox runtime")
    }

    pub(super) async fn execute(&self, d: &Dispatch) -> ActionResult {
        let queued_us = unix_us().saturating_sub(d.submitted_at_us);
        let a = &d.action;
        let key = SandboxKey {
            job: a.job.0.clone(),
            trajectory: a.trajectory.0.clone(),
        };
        let mut result = ActionResult::new(
            a.id.clone(),
            a.job.clone(),
            Outcome::Completed { exit_code: 0 },
            0,
        )
        .for_action(a, d.attempt);
        result.placement = Some(Placement {
            worker: self.config.id.clone(),
            cores: 0,
            cpuset: String::new(),
        });
        result.timing = Timing::new(queued_us, 0, 0);
        let t0 = Instant::now();
        if self.sandboxes.is_none() && !matches!(a.spec, ActionSpec::Reward(_) | ActionSpec::Api(_))
        {
            result.outcome = Outcome::Rejected {
                code: RejectCode::InvalidField,
                reason: format!("worker {} runs no sandboxes (a GPU host)", self.config.id),
            };
            result.finished_at_ms = unix_us() / 1000;
            return result;
        }
        match &a.spec {
            ActionSpec::Reward(reward) => self.reward(d, reward, queued_us, &mut result).await,
            ActionSpec::Api(api) => self.api(d, api, queued_us, &mut result).await,
            ActionSpec::SandboxOpen(open) => {
                let (outcome, pull_us) = self
                    .open(
                        &key,
                        &d.action.id,
                        open,
                        d.grant.mem_mb,
                        d.action.timeout_ms,
                    )
                    .await;
                result.outcome = outcome;
                result.timing = Timing::new(queued_us, us_since(t0), 0);
                result.timing.pull_us = pull_us;
            }
            ActionSpec::SandboxClose(_) => {
                let sandbox = self
                    .state
                    .lock()
                    .expect("state lock")
                    .sandboxes
                    .remove(&key);
                if let Some(s) = sandbox {
                    let _guard = s.lock.lock().await;
                    if let Err(e) = self.dk().remove(&s.handle).await {
                        result.outcome =
                            infra(InfraCode::Runtime, format!("removing the sandbox: {e}"));
                    }
                }
                result.timing = Timing::new(queued_us, us_since(t0), 0);
            }
            ActionSpec::SandboxExec(exec) => {
                self.exec(&key, d, exec, queued_us, &mut result).await;
            }
        }
        result.finished_at_ms = unix_us() / 1000;
        result
    }

    /// Creates the trajectory's sandbox, image pull included, within the open's timeout:
    /// past it the open is answered `timed_out` and the creation, left to finish, is
    /// removed when it does (an open the scheduler has settled never leaves a container
    /// nobody booked).
    async fn open(
        &self,
        key: &SandboxKey,
        id: &ActionId,
        open: &tangram_shared::SandboxOpen,
        mem_mb: u64,
        timeout_ms: u64,
    ) -> (Outcome, u64) {
        if self
            .state
            .lock()
            .expect("state lock")
            .sandboxes
            .contains_key(key)
        {
            return (Outcome::Completed { exit_code: 0 }, 0); // a redelivered open: already done
        }
        let runtime = self
            .sandboxes
            .clone()
            .expect("sandbox actions never run on a worker without a sandbox runtime");
        let mut start = tokio::spawn({
            let (runtime, key, open) = (runtime.clone(), key.clone(), open.clone());
            let parking = self.config.parking_cores.clone();
            async move { runtime.start(&key, &open, &parking).await }
        });
        let budget = Duration::from_millis(timeout_ms);
        let created = match tokio::time::timeout(budget, &mut start).await {
            Ok(Ok(created)) => created,
            Ok(Err(e)) => Err(SandboxError::Backend(Box::new(e))),
            Err(_) => {
                warn!(trajectory = %key.trajectory, timeout_ms, "sandbox not ready within the open's timeout (an image pull?); removed once created");
                tokio::spawn(async move {
                    if let Ok(Ok(handle)) = start.await {
                        if let Err(e) = runtime.remove(&handle).await {
                            warn!(sandbox = %handle.id, error = %e, "removing a sandbox created after its open timed out");
                        }
                    }
                });
                return (Outcome::TimedOut, 0);
            }
        };
        let handle = match created {
            Ok(h) => h,
            Err(SandboxError::NoImage(image)) => {
                let reason = format!("image {image:?} is not present on worker {}", self.config.id);
                return (Outcome::Rejected { code: RejectCode::InvalidField, reason }, 0);
            }
            Err(SandboxError::ImageRefused(reason)) => {
                return (Outcome::Rejected { code: RejectCode::InvalidField, reason }, 0);
            }
            Err(SandboxError::Pull(why)) => return (infra(InfraCode::Runtime, why), 0),
            Err(SandboxError::Cgroup(e)) => {
                return (infra(
                    InfraCode::Grant,
                    format!("finding the sandbox's cgroup ({e}); set grant_mode = \"docker\" on hosts without a writable cgroup tree"),
                ), 0)
            }
            Err(e) => return (infra(InfraCode::Runtime, format!("creating the sandbox: {e}")), 0),
        };
        let pull_us = handle.pull_us;
        let sandbox = Arc::new(Sandbox {
            handle,
            mem_mb: mem_mb.max(open.memory_mb),
            open: id.clone(),
            idle_timeout_ms: open.idle_timeout_ms,
            lock: tokio::sync::Mutex::new(()),
        });
        self.state
            .lock()
            .expect("state lock")
            .sandboxes
            .insert(key.clone(), sandbox);
        (Outcome::Completed { exit_code: 0 }, pull_us)
    }

    /// Takes the cores exec `d` was booked (or the size a re-size that came before it set),
    /// and records the exec as holding them. Cores the scheduler booked may not be free yet:
    /// a narrowing or an end that frees them can reach this worker after the dispatch that
    /// relies on them (a re-size redelivered after a NATS node died carrying it comes within
    /// the dispatch consumer's ack wait). So the exec waits for them, its cores still
    /// promised (`State::reserved`, which widenings leave alone), up to [`CORE_WAIT`];
    /// `Err` with the count it could not take after that.
    async fn take_cores(
        &self,
        d: &Dispatch,
        s: &Arc<Sandbox>,
        gate: &Arc<tokio::sync::Mutex<()>>,
    ) -> Result<Vec<u32>, usize> {
        let id = &d.action.id;
        let mut deadline = Instant::now() + CORE_WAIT;
        let mut waited = false;
        loop {
            let freed = self.cores_freed.notified();
            {
                let mut st = self.state.lock().expect("state lock");
                let st = &mut *st;
                let early = st.early.get(id).filter(|r| r.attempt == d.attempt).cloned();
                let n = early
                    .as_ref()
                    .map_or(d.grant.cores, |r| r.grant.cores)
                    .max(1) as usize;
                let cores = st.cores.take(n);
                let timed_out = Instant::now() >= deadline;
                if cores.is_some() || timed_out {
                    st.early.remove(id);
                    st.reserved.remove(id);
                    if waited {
                        crate::metrics::core_wait(if cores.is_some() {
                            "granted"
                        } else {
                            "timed_out"
                        });
                    }
                }
                if let Some(c) = cores {
                    st.execs.insert(
                        id.clone(),
                        super::resize::Sizing {
                            attempt: d.attempt,
                            cores: c.clone(),
                            sandbox: s.clone(),
                            epoch: early.as_ref().map_or(d.epoch, |r| r.epoch),
                            seq: early.map_or(0, |r| r.seq),
                            gate: gate.clone(),
                        },
                    );
                    return Ok(c);
                }
                if timed_out {
                    return Err(n);
                }
                if !waited {
                    debug!(action = %id, cores = n, free = st.cores.free(), "waiting for booked cores to be freed");
                }
            }
            waited = true;
            tokio::select! {
                _ = tokio::time::timeout_at(deadline, freed) => {}
                // Killed at the drain's deadline: it never starts.
                _ = self.hard_stop.cancelled() => deadline = Instant::now(),
            }
        }
    }

    async fn exec(
        &self,
        key: &SandboxKey,
        d: &Dispatch,
        exec: &tangram_shared::SandboxExec,
        queued_us: u64,
        result: &mut ActionResult,
    ) {
        let sandbox = self
            .state
            .lock()
            .expect("state lock")
            .sandboxes
            .get(key)
            .cloned();
        let Some(s) = sandbox else {
            result.outcome = infra(
                InfraCode::SandboxLost,
                format!("worker {} holds no sandbox for trajectory {} (it restarted or the sandbox was removed)", self.config.id, key.trajectory),
            );
            return;
        };
        let _guard = s.lock.lock().await;
        let t0 = Instant::now();
        let id = &d.action.id;
        // Held through the first grant, so that a re-size read meanwhile is written after it.
        let gate = Arc::new(tokio::sync::Mutex::new(()));
        let first_write = gate.clone().lock_owned().await;
        let taken = self.take_cores(d, &s, &gate).await;
        let cores = match taken {
            Ok(c) => c,
            Err(n) => {
                result.outcome = infra(
                    InfraCode::Grant,
                    format!("{n} cores are not free on worker {}", self.config.id),
                );
                return;
            }
        };
        let n = cores.len();
        let list = cpuset::format(&cores);
        if let Some(p) = result.placement.as_mut() {
            p.cores = n as u32;
            p.cpuset = list.clone();
        }
        let mut exec_us = 0;
        let mut lost = false;
        let outcome = async {
            let granted = self.dk().grant(&s.handle, &list, n as i64 * PERIOD_US, true).await;
            drop(first_write);
            granted.map_err(|e| sandbox_outcome(e, &format!("granting cores {list}")))?;
            let argv: Vec<String> = exec.argv.iter().map(|a| a.replace("{cpus}", &n.to_string())).collect();
            let env = crate::sandbox::exec_env(&s.handle.env, n, &exec.env);
            let run = self.dk().exec(
                &s.handle,
                ExecRequest {
                    argv: &argv,
                    env: &env,
                    stdin: exec.stdin.as_ref().map(|t| t.as_bytes()),
                    files: &exec.files,
                    timeout: Duration::from_millis(d.action.timeout_ms),
                    output_limit_bytes: self.config.sandbox.output_limit_bytes,
                },
            );
            let out = tokio::select! {
                r = run => r.map_err(|e| sandbox_outcome(e, "running the command"))?,
                _ = self.hard_stop.cancelled() => {
                    self.dk().stop(&s.handle).await;
                    return Err(infra(InfraCode::Shutdown, "the worker stopped before the command finished".to_string()));
                }
            };
            exec_us = out.exec_us;
            lost = out.sandbox_lost;
            result.stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            result.stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            result.truncated = out.truncated;
            Ok(match (out.timed_out, out.exit_code) {
                (true, _) => Outcome::TimedOut,
                (false, Some(code)) if out.oom_killed => Outcome::OutOfMemory { exit_code: code as i32 },
                (false, Some(code)) => Outcome::Completed { exit_code: code as i32 },
                (false, None) => infra(InfraCode::Runtime, "the command's exit code is unavailable".into()),
            })
        }
        .await;
        // Park again whatever happened, then give the cores back: those it holds now (a
        // re-size may have changed them), once no re-size is being written.
        let sizing = self.state.lock().expect("state lock").execs.remove(id);
        let held = sizing.as_ref().map_or(cores, |z| z.cores.clone());
        let _parking = gate.lock().await;
        if let Err(e) = self
            .dk()
            .grant(
                &s.handle,
                &self.config.parking_cores,
                PARKED_QUOTA_US,
                false,
            )
            .await
        {
            warn!(error = %e, "parking the sandbox failed");
        }
        self.state
            .lock()
            .expect("state lock")
            .cores
            .give_back(&held);
        self.cores_freed.notify_waiters();
        result.outcome = outcome.unwrap_or_else(|o| o);
        // A sandbox that ended with the command (gVisor out of memory: the command's outcome
        // stands, the trajectory's next command is told sandbox_lost) goes as a lost one does.
        if lost
            || matches!(
                result.outcome,
                Outcome::InfraError {
                    code: InfraCode::SandboxLost,
                    ..
                }
            )
        {
            // Only this sandbox: a fence may have replaced the map's entry meanwhile.
            let mine = {
                let mut st = self.state.lock().expect("state lock");
                let mine = st.sandboxes.get(key).is_some_and(|x| Arc::ptr_eq(x, &s));
                if mine {
                    st.sandboxes.remove(key);
                }
                mine
            };
            // A stopped container stays until removed: its tmpfs and its record go now.
            if mine {
                if let Err(e) = self.dk().remove(&s.handle).await {
                    warn!(error = %e, "removing a lost sandbox's container failed");
                }
            }
        }
        let overhead = us_since(t0).saturating_sub(exec_us);
        result.timing = Timing::new(queued_us, overhead, exec_us);
    }
}

fn sandbox_outcome(e: SandboxError, doing: &str) -> Outcome {
    match e {
        SandboxError::Gone(_) => infra(
            InfraCode::SandboxLost,
            format!("{doing}: the sandbox is gone"),
        ),
        SandboxError::Grant(_) | SandboxError::Cgroup(_) => {
            infra(InfraCode::Grant, format!("{doing}: {e}"))
        }
        SandboxError::Files(why) => infra(InfraCode::Runtime, why),
        e => infra(InfraCode::Runtime, format!("{doing}: {e}")),
    }
}
