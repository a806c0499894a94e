//! The worker runtime: intake of dispatches, execution, results, heartbeats, shutdown.

use crate::cgroup::PERIOD_US;
use crate::config::Config;
use crate::cpuset::{self, CoreAllocator};
use crate::docker::{us_since, DockerRuntime, PARKED_QUOTA_US};
use crate::metrics as m;
use crate::providers::{CallError, Providers};
use crate::sandbox::{
    ExecRequest, InMemorySandboxes, RuntimeKind, SandboxError, SandboxHandle, SandboxKey,
    SandboxRuntime,
};
use crate::services::{ServiceError, Services};
use anyhow::Context as _;
use async_nats::jetstream;
use futures::StreamExt;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tangram_shared::codec::{self, Encoding};
use tangram_shared::{
    subject, ActionId, ActionResult, ActionSpec, Dispatch, GpuInventory, Heartbeat, InfraCode,
    Outcome, Placement, RejectCode, SandboxRef, Timing,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn, Instrument};

/// How many finished action ids are remembered to recognise a redelivered dispatch.
const RECENT: usize = 10_000;
/// In-progress acks while an action runs; the dispatch consumer's ack_wait is 10 s.
const PROGRESS_EVERY: Duration = Duration::from_secs(3);

type Key = SandboxKey;

struct Sandbox {
    handle: SandboxHandle,
    mem_mb: u64,
    /// Commands in one sandbox run one at a time, as a trajectory's actions do.
    lock: tokio::sync::Mutex<()>,
}

struct State {
    cores: CoreAllocator,
    sandboxes: HashMap<Key, Arc<Sandbox>>,
    running: HashSet<ActionId>,
    recent: VecDeque<ActionId>,
    recent_set: HashSet<ActionId>,
    max_epoch: u64,
}

struct Worker {
    config: Config,
    /// Absent on workers that run no sandboxes (GPU hosts).
    docker: Option<Arc<dyn SandboxRuntime>>,
    /// Model services, on GPU hosts.
    services: Option<Arc<Services>>,
    /// External API providers.
    providers: Option<Arc<Providers>>,
    js: jetstream::Context,
    state: Mutex<State>,
    /// Cancelled when the drain deadline passes: running commands are killed.
    hard_stop: CancellationToken,
    /// GPUs, when the worker has any.
    inventory: Option<GpuInventory>,
}

async fn sandbox_runtime(config: &Config) -> anyhow::Result<Arc<dyn SandboxRuntime>> {
    let runtime: Arc<dyn SandboxRuntime> = match config.sandbox_runtime {
        RuntimeKind::Docker => Arc::new(
            DockerRuntime::connect(
                config.id.as_str(),
                config.sandbox.clone(),
                config.grant_mode,
            )
            .await
            .context("connecting to the Docker daemon")?,
        ),
        RuntimeKind::Noop => {
            warn!("sandbox_runtime = \"noop\": commands are NOT run, every exec reports exit 0 at once; for pipeline benchmarks only, never for real workloads");
            Arc::new(InMemorySandboxes::noop())
        }
    };
    runtime.validate().await.map_err(|e| match e {
        SandboxError::NoImage(image) => anyhow::anyhow!(
            "default sandbox image {image:?} is not present; build it with deploy/build-sandbox-image.sh"
        ),
        e => anyhow::Error::new(e).context("checking the sandbox runtime"),
    })?;
    // Reconcile: whatever an earlier run of this worker left is unusable now (its cores and
    // grants are unknown); remove it. Actions that were running in it come back as redelivered
    // dispatches and are reported lost (their sandbox is gone).
    let removed = runtime.recover().await?;
    if removed > 0 {
        m::leftovers(removed);
        info!(
            count = removed,
            "removed leftover sandboxes of an earlier run"
        );
    }
    Ok(runtime)
}

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Runs the worker until `shutdown` is cancelled, then drains within the grace period.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let docker = if config.sandboxes {
        Some(sandbox_runtime(&config).await?)
    } else {
        None
    };
    let inventory = crate::gpu::discover(config.nvml, &config.gpu_groups)?;
    let services = match (&inventory, config.services.is_empty()) {
        (_, true) => None,
        (None, false) => anyhow::bail!(
            "{} service(s) are configured but this worker has no GPUs: NVML found none and the config declares none ([gpu] groups or count)",
            config.services.len()
        ),
        (Some(inv), false) => {
            let s = Arc::new(Services::new(config.id.as_str(), config.services.clone(), inv.clone(), config.state_dir.clone()));
            s.start().await.context("deploying model services")?;
            Some(s)
        }
    };

    let client = async_nats::ConnectOptions::new()
        .name(format!("tangram-worker-{}", config.id))
        .connect(&config.nats_url)
        .await
        .with_context(|| format!("connecting to NATS at {}", config.nats_url))?;
    let js = jetstream::new(client.clone());
    tangram_nats::ensure_streams(&js).await?;
    let consumer = tangram_nats::worker_consumer(&js, &config.id).await?;

    let providers =
        (!config.providers.is_empty()).then(|| Arc::new(Providers::new(config.providers.clone())));
    let worker = Arc::new(Worker {
        state: Mutex::new(State {
            cores: CoreAllocator::with_domains(&config.cores, &cpuset::numa_domains()),
            sandboxes: HashMap::new(),
            running: HashSet::new(),
            recent: VecDeque::new(),
            recent_set: HashSet::new(),
            max_epoch: 0,
        }),
        config,
        docker,
        services: services.clone(),
        providers,
        inventory,
        js,
        hard_stop: CancellationToken::new(),
    });
    let instance = format!("{:x}-{:x}", std::process::id(), unix_us());
    info!(worker = %worker.config.id, %instance, cores = %cpuset::format(&worker.config.cores), "worker starting");

    let tasks = TaskTracker::new();
    let heartbeat_stop = CancellationToken::new();
    tasks.spawn(heartbeats(
        worker.clone(),
        client.clone(),
        instance.clone(),
        heartbeat_stop.clone(),
    ));

    if let Some(svc) = services.clone() {
        let stop = heartbeat_stop.clone();
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tick.tick() => svc.check_health().await,
                }
            }
        });
    }

    // Intake until shutdown.
    let actions = TaskTracker::new();
    let mut messages = consumer.messages().await?;
    loop {
        let msg = tokio::select! {
            _ = shutdown.cancelled() => break,
            m = messages.next() => m,
        };
        let msg = match msg {
            Some(Ok(m)) => m,
            Some(Err(e)) => {
                warn!(error = %e, "dispatch consumer error");
                continue;
            }
            None => break,
        };
        if let Some(dispatch) = worker.admit(&msg).await {
            let w = worker.clone();
            let span = tracing::info_span!("action", id = %dispatch.action.id, kind = dispatch.action.kind().as_str());
            actions.spawn(async move { w.handle(dispatch, msg).await }.instrument(span));
        }
    }
    drop(messages);

    // Phase one: no new work; let running actions finish within the grace period.
    info!(
        grace_ms = worker.config.shutdown_grace.as_millis() as u64,
        "draining"
    );
    actions.close();
    if tokio::time::timeout(worker.config.shutdown_grace, actions.wait())
        .await
        .is_err()
    {
        // Phase two: kill what is left; each reports `infra_error: shutdown`.
        warn!("grace period over; stopping running actions");
        worker.hard_stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), actions.wait()).await;
    }
    let sandboxes: Vec<Arc<Sandbox>> = worker
        .state
        .lock()
        .expect("state lock")
        .sandboxes
        .drain()
        .map(|(_, s)| s)
        .collect();
    if let Some(docker) = &worker.docker {
        for s in sandboxes {
            let _ = docker.remove(&s.handle).await;
        }
    }
    if let Some(svc) = &worker.services {
        svc.stop_all();
    }
    heartbeat_stop.cancel();
    tasks.close();
    // NATS may be gone by now: every last step is bounded, so SIGTERM always ends the process.
    let last_words = async {
        tasks.wait().await;
        send_heartbeat(&worker, &client, &instance, u64::MAX, true).await;
        client.flush().await.ok();
    };
    if tokio::time::timeout(Duration::from_secs(3), last_words)
        .await
        .is_err()
    {
        warn!("could not say goodbye to NATS within 3 s");
    }
    info!("worker stopped");
    Ok(())
}

async fn heartbeats(
    worker: Arc<Worker>,
    client: async_nats::Client,
    instance: String,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(worker.config.heartbeat);
    let mut seq = 0;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        seq += 1;
        send_heartbeat(&worker, &client, &instance, seq, false).await;
    }
}

async fn send_heartbeat(
    worker: &Worker,
    client: &async_nats::Client,
    instance: &str,
    seq: u64,
    draining: bool,
) {
    let hb = {
        let st = worker.state.lock().expect("state lock");
        let mut sandboxes: Vec<SandboxRef> = st
            .sandboxes
            .iter()
            .filter_map(|(key, s)| {
                Some(SandboxRef {
                    job: tangram_shared::JobId::new(key.job.clone()).ok()?,
                    trajectory: tangram_shared::TrajectoryId::new(key.trajectory.clone()).ok()?,
                    mem_mb: s.mem_mb,
                })
            })
            .collect();
        sandboxes.sort();
        let mut running: Vec<ActionId> = st.running.iter().cloned().collect();
        running.sort();
        m::sandboxes(sandboxes.len());
        Heartbeat {
            worker: worker.config.id.clone(),
            instance: instance.to_string(),
            seq,
            interval_ms: worker.config.heartbeat.as_millis() as u64,
            cores: if worker.docker.is_some() {
                worker.config.cores.len() as u32
            } else {
                0
            },
            mem_mb: if worker.docker.is_some() {
                worker.config.mem_mb
            } else {
                0
            },
            running,
            sandboxes,
            draining,
            gpus: worker.inventory.clone(),
            services: worker
                .services
                .as_ref()
                .map(|s| s.report())
                .unwrap_or_default(),
            providers: worker
                .providers
                .as_ref()
                .map(|p| p.report())
                .unwrap_or_default(),
        }
    };
    match codec::encode(&hb, Encoding::Msgpack) {
        Ok(bytes) => {
            if let Err(e) = client
                .publish(subject::heartbeat(&worker.config.id), bytes.into())
                .await
            {
                warn!(error = %e, "heartbeat publish failed");
            }
        }
        Err(e) => warn!(error = %e, "encoding a heartbeat"),
    }
}

impl Worker {
    /// The Docker client; sandbox actions are refused before reaching here on workers
    /// without one.
    fn dk(&self) -> &dyn SandboxRuntime {
        self.docker
            .as_deref()
            .expect("sandbox actions never run on a worker without Docker")
    }

    async fn api(
        &self,
        d: &Dispatch,
        api: &tangram_shared::Api,
        queued_us: u64,
        result: &mut ActionResult,
    ) {
        let Some(providers) = &self.providers else {
            result.outcome = Outcome::Rejected {
                code: RejectCode::UnknownProvider,
                reason: format!("worker {} calls no external providers", self.config.id),
            };
            return;
        };
        let timeout = Duration::from_millis(d.action.timeout_ms);
        let called = tokio::select! {
            r = providers.call(api, timeout) => r,
            _ = self.hard_stop.cancelled() => {
                result.outcome = infra(InfraCode::Shutdown, format!("worker {} stopped", self.config.id));
                return;
            }
        };
        match called {
            Ok(c) => {
                result.timing = Timing::new(queued_us, c.wait_us, c.call_us);
                m::api_call(&api.provider, c.reply.status, c.call_us as f64 / 1e6);
                result.http = Some(c.reply);
            }
            Err(CallError::Timeout(ms)) => {
                result.timing = Timing::new(queued_us, 0, ms * 1000);
                result.outcome = Outcome::TimedOut;
            }
            Err(CallError::Unknown(p)) => {
                result.outcome = Outcome::Rejected {
                    code: RejectCode::UnknownProvider,
                    reason: format!("worker {} has no provider named {p:?}", self.config.id),
                };
            }
            Err(CallError::NotAllowed(why)) => {
                result.outcome = Outcome::Rejected {
                    code: RejectCode::NotAllowed,
                    reason: why,
                };
            }
            Err(CallError::Unreachable(why)) => result.outcome = infra(InfraCode::Provider, why),
        }
    }

    async fn reward(
        &self,
        d: &Dispatch,
        reward: &tangram_shared::Reward,
        queued_us: u64,
        result: &mut ActionResult,
    ) {
        let Some(services) = &self.services else {
            result.outcome = Outcome::Rejected {
                code: RejectCode::UnknownService,
                reason: format!("worker {} serves no model services", self.config.id),
            };
            return;
        };
        let Some(route) = &d.gpu else {
            result.outcome = infra(
                InfraCode::Service,
                "a reward dispatch came without a GPU route".to_string(),
            );
            return;
        };
        let timeout = Duration::from_millis(d.action.timeout_ms);
        let served = tokio::select! {
            r = services.serve(route, &reward.inputs, &reward.options, timeout) => r,
            _ = tokio::time::sleep(timeout + Duration::from_secs(1)) => {
                result.outcome = Outcome::TimedOut;
                return;
            }
            _ = self.hard_stop.cancelled() => {
                result.outcome = infra(InfraCode::Shutdown, format!("worker {} stopped", self.config.id));
                return;
            }
        };
        match served {
            Ok(s) => {
                result.timing = Timing::new(queued_us, s.overhead_us, s.exec_us);
                result.scores = Some(s.scores);
                result.service = Some(tangram_shared::ServiceUse {
                    service: route.service.clone(),
                    gpus: s.gpus,
                    restored: s.restored,
                    evicted: s.evicted,
                });
            }
            Err(ServiceError::Unknown(name)) => {
                result.outcome = Outcome::Rejected {
                    code: RejectCode::UnknownService,
                    reason: format!("worker {} serves no service named {name:?}", self.config.id),
                };
            }
            Err(e) => result.outcome = infra(InfraCode::Service, e.to_string()),
        }
    }

    /// Decodes a dispatch and decides whether to run it. Acks and drops stale, duplicate
    /// and undecodable ones.
    async fn admit(&self, msg: &jetstream::Message) -> Option<Dispatch> {
        let dispatch = match codec::decode::<Dispatch>(&msg.payload, Encoding::Msgpack) {
            Ok(d) => d,
            Err(e) => {
                warn!(error = %e, "undecodable dispatch dropped");
                let _ = msg.ack().await;
                return None;
            }
        };
        let redelivered = msg.info().map(|i| i.delivered > 1).unwrap_or(false);
        let verdict = {
            let mut st = self.state.lock().expect("state lock");
            if dispatch.epoch < st.max_epoch {
                Some("stale epoch")
            } else if st.running.contains(&dispatch.action.id) {
                // Redelivered while still running: the running copy will ack.
                return None;
            } else if st.recent_set.contains(&dispatch.action.id) {
                Some("already finished")
            } else if redelivered {
                Some("in flight on an earlier instance")
            } else {
                st.max_epoch = dispatch.epoch;
                st.running.insert(dispatch.action.id.clone());
                None
            }
        };
        if verdict == Some("in flight on an earlier instance") {
            // It was delivered before and is neither running nor finished here: an earlier
            // instance of this worker had it when it died. Its sandbox state is gone with the
            // reconciled containers, so report it lost rather than run it half-blind.
            warn!(action = %dispatch.action.id, "reporting an action lost by an earlier instance");
            let a = &dispatch.action;
            let outcome = infra(
                InfraCode::WorkerLost,
                format!(
                    "worker {} restarted while this action was in flight",
                    self.config.id
                ),
            );
            let mut result =
                ActionResult::new(a.id.clone(), a.job.clone(), outcome, unix_us() / 1000)
                    .for_action(a, dispatch.attempt);
            result.timing = Timing::new(unix_us().saturating_sub(dispatch.submitted_at_us), 0, 0);
            self.publish_result(&result, dispatch.result_encoding).await;
            let _ = msg.ack().await;
            return None;
        }
        if let Some(why) = verdict {
            if why == "stale epoch" {
                m::stale();
            }
            debug!(action = %dispatch.action.id, why, "dispatch dropped");
            let _ = msg.ack().await;
            return None;
        }
        Some(dispatch)
    }

    async fn handle(self: Arc<Self>, dispatch: Dispatch, msg: jetstream::Message) {
        // Keep the dispatch from being redelivered while it runs (ack_wait is short so that a
        // crashed instance's work comes back quickly).
        let result = {
            let work = self.execute(&dispatch);
            tokio::pin!(work);
            let mut tick = tokio::time::interval(PROGRESS_EVERY);
            tick.tick().await;
            loop {
                tokio::select! {
                    r = &mut work => break r,
                    _ = tick.tick() => {
                        if let Err(e) = msg.ack_with(jetstream::AckKind::Progress).await {
                            warn!(error = %e, "in-progress ack");
                        }
                    }
                }
            }
        };
        m::action(
            dispatch.action.kind().as_str(),
            result.outcome.label(),
            result.timing.overhead_us as f64 / 1e6,
            result.timing.exec_us as f64 / 1e6,
        );
        // The result is durable before the dispatch is acked: a crash in between means a
        // redelivery, which the result's Nats-Msg-Id deduplicates.
        self.publish_result(&result, dispatch.result_encoding).await;
        if let Err(e) = msg.ack().await {
            warn!(error = %e, "acking a dispatch");
        }
        let mut st = self.state.lock().expect("state lock");
        st.running.remove(&dispatch.action.id);
        st.recent.push_back(dispatch.action.id.clone());
        st.recent_set.insert(dispatch.action.id.clone());
        while st.recent.len() > RECENT {
            if let Some(old) = st.recent.pop_front() {
                st.recent_set.remove(&old);
            }
        }
    }

    async fn publish_result(&self, result: &ActionResult, encoding: Encoding) {
        // Results must not be lost: retry with backoff, bounded (about 3 s in all).
        if let Err(e) = tangram_nats::publish_result(&self.js, result, encoding, 5).await {
            warn!(action = %result.id, error = %e, "result lost");
        }
    }

    async fn execute(&self, d: &Dispatch) -> ActionResult {
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
        if self.docker.is_none() && !matches!(a.spec, ActionSpec::Reward(_) | ActionSpec::Api(_)) {
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
                result.outcome = self.open(&key, open, d.grant.mem_mb).await;
                result.timing = Timing::new(queued_us, us_since(t0), 0);
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

    async fn open(&self, key: &Key, open: &tangram_shared::SandboxOpen, mem_mb: u64) -> Outcome {
        if self
            .state
            .lock()
            .expect("state lock")
            .sandboxes
            .contains_key(key)
        {
            return Outcome::Completed { exit_code: 0 }; // a redelivered open: already done
        }
        let created = self.dk().start(key, open, &self.config.parking_cores).await;
        let handle = match created {
            Ok(h) => h,
            Err(SandboxError::NoImage(image)) => {
                return Outcome::Rejected {
                    code: RejectCode::InvalidField,
                    reason: format!(
                        "image {image:?} is not present on worker {}",
                        self.config.id
                    ),
                }
            }
            Err(SandboxError::Cgroup(e)) => {
                return infra(
                    InfraCode::Grant,
                    format!("finding the sandbox's cgroup ({e}); set grant_mode = \"docker\" on hosts without a writable cgroup tree"),
                )
            }
            Err(e) => return infra(InfraCode::Runtime, format!("creating the sandbox: {e}")),
        };
        let sandbox = Arc::new(Sandbox {
            handle,
            mem_mb: mem_mb.max(open.memory_mb),
            lock: tokio::sync::Mutex::new(()),
        });
        self.state
            .lock()
            .expect("state lock")
            .sandboxes
            .insert(key.clone(), sandbox);
        Outcome::Completed { exit_code: 0 }
    }

    async fn exec(
        &self,
        key: &Key,
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
        let n = d.grant.cores.max(1) as usize;
        let Some(cores) = self.state.lock().expect("state lock").cores.take(n) else {
            result.outcome = infra(
                InfraCode::Grant,
                format!("{n} cores are not free on worker {}", self.config.id),
            );
            return;
        };
        let list = cpuset::format(&cores);
        if let Some(p) = result.placement.as_mut() {
            p.cores = n as u32;
            p.cpuset = list.clone();
        }
        let mut exec_us = 0;
        let outcome = async {
            self.dk().grant(&s.handle, &list, n as i64 * PERIOD_US, true)
                .await
                .map_err(|e| sandbox_outcome(e, &format!("granting cores {list}")))?;
            let argv: Vec<String> = exec.argv.iter().map(|a| a.replace("{cpus}", &n.to_string())).collect();
            let mut env = vec![format!("TANGRAM_CPUS={n}")];
            env.extend(exec.env.iter().map(|(k, v)| format!("{k}={v}")));
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
            result.stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            result.stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            result.truncated = out.truncated;
            Ok(match (out.timed_out, out.exit_code) {
                (true, _) => Outcome::TimedOut,
                (false, Some(code)) => Outcome::Completed { exit_code: code as i32 },
                (false, None) => infra(InfraCode::Runtime, "the command's exit code is unavailable".into()),
            })
        }
        .await;
        // Park again whatever happened, then give the cores back.
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
            .give_back(&cores);
        result.outcome = outcome.unwrap_or_else(|o| o);
        if matches!(
            result.outcome,
            Outcome::InfraError {
                code: InfraCode::SandboxLost,
                ..
            }
        ) {
            self.state.lock().expect("state lock").sandboxes.remove(key);
        }
        let overhead = us_since(t0).saturating_sub(exec_us);
        result.timing = Timing::new(queued_us, overhead, exec_us);
    }
}

fn infra(code: InfraCode, reason: String) -> Outcome {
    Outcome::InfraError { code, reason }
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
