//! The state task: the only owner of the cluster view, the queue and the bookings.

use crate::config::Config;
use crate::metrics as m;
use crate::service::content_type;
use async_nats::jetstream::{self, AckKind};
use async_nats::HeaderMap;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tangram_core::{Constraint, Pending, Snapshot, Unplaced, WorkerView};
use tangram_shared::codec::{self, Encoding};
use tangram_shared::{
    subject, Action, ActionId, ActionKind, ActionResult, ChunkRef, Dispatch, Evict, GpuRoute,
    Grant, Heartbeat, InfraCode, JobId, Limits, Outcome, RejectCode, Rejection, TrajectoryId,
    WorkerId,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// What the other tasks send the state task.
#[derive(Debug)]
pub(crate) enum Event {
    Action(Box<jetstream::Message>),
    Result(Box<ActionResult>),
    Heartbeat(Box<Heartbeat>),
    Tick,
    /// A rate-limited action may go now.
    Wake,
    /// Someone asked for the status report.
    Status(tokio::sync::oneshot::Sender<tangram_shared::status::Status>),
}

/// How often queued actions get an in-progress ack, well inside the consumer's 10 s ack wait
/// (short so that actions held by a scheduler that died come back quickly).
const PROGRESS_EVERY: Duration = Duration::from_secs(3);
/// Dead-letter records keep at most this much of the original payload.
const DEADLETTER_PAYLOAD_CAP: usize = 64 * 1024;

struct WorkerState {
    hb: Heartbeat,
    last_seen: Instant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SandboxPhase {
    /// Open dispatched, container not yet confirmed.
    Opening,
    Open,
    /// Close dispatched.
    Closing,
}

struct Sandbox {
    worker: WorkerId,
    mem_mb: u64,
    phase: SandboxPhase,
    /// `static` (per-trajectory provisioning): cores the sandbox holds for its whole life.
    cores: u32,
}

struct Queued {
    action: Action,
    msg: Box<jetstream::Message>,
    encoding: Encoding,
    submitted_at_us: u64,
    arrived: Instant,
    last_progress: Instant,
}

struct Running {
    worker: WorkerId,
    grant: Grant,
    job: JobId,
    trajectory: TrajectoryId,
    kind: ActionKind,
    encoding: Encoding,
    attempt: u32,
    /// Learned-elasticity key of an exec (`job/tool`).
    learn_key: Option<String>,
    /// A reward action's replica: service and chunk (on `worker`).
    gpu: Option<(String, tangram_core::Chunk)>,
    /// An api action's provider.
    provider: Option<String>,
}

/// An external API provider: its pooled quota, what may be called, who can call it.
struct Provider {
    quota: tangram_core::quota::Quota,
    report: tangram_shared::ProviderReport,
    workers: BTreeSet<WorkerId>,
}

fn chunk_of(c: ChunkRef) -> tangram_core::Chunk {
    tangram_core::Chunk {
        group: c.group,
        start: c.start,
        len: c.len,
    }
}
fn chunk_ref(c: tangram_core::Chunk) -> ChunkRef {
    ChunkRef {
        group: c.group,
        start: c.start,
        len: c.len,
    }
}

/// The key under which an exec's elasticity is learned: its job and the program it runs
/// (`argv[0]` without its directory, or the module for `python -m`).
fn learn_key(action: &Action) -> Option<String> {
    let tangram_shared::ActionSpec::SandboxExec(e) = &action.spec else {
        return None;
    };
    let prog = e.argv.first()?.rsplit('/').next()?.to_string();
    let tool = match (
        prog.starts_with("python"),
        e.argv.get(1).map(String::as_str),
        e.argv.get(2),
    ) {
        (true, Some("-m"), Some(module)) => format!("{prog} -m {module}"),
        _ => prog,
    };
    Some(format!("{}/{tool}", action.job))
}

type SandboxKey = (JobId, TrajectoryId);

pub(crate) struct Scheduler {
    config: Config,
    policy: Box<dyn tangram_core::Policy>,
    /// Elasticity learned from completed execs, per job and tool.
    learner: tangram_core::learn::Learner,
    limits: Limits,
    epoch: u64,
    js: jetstream::Context,
    results_stream: jetstream::stream::Stream,
    started: Instant,
    workers: BTreeMap<WorkerId, WorkerState>,
    queue: Vec<Queued>,
    running: HashMap<ActionId, Running>,
    sandboxes: HashMap<SandboxKey, Sandbox>,
    /// GPU services: residency, routing, LRU eviction (Evict-on-Execution).
    eoe: tangram_core::Eoe,
    /// External API providers, pooled quota per provider.
    providers: BTreeMap<String, Provider>,
    /// When a rate-limited action can go next: the run loop wakes then.
    pub(crate) wake_at: Option<Instant>,
    /// `static` (per-trajectory provisioning): each sandbox's fixed cores.
    static_cores: Option<u32>,
    /// `static`: GPU services pinned (an even split of the GPUs, never evicted).
    pinned: bool,
    /// `static`: per-trajectory slices of each provider's rate.
    slices: HashMap<(JobId, TrajectoryId, String), tangram_core::quota::Quota>,
    /// Recent results' timing, by kind, for the status report.
    recent: std::collections::VecDeque<(ActionKind, tangram_shared::Timing)>,
    dirty: bool,
    /// False until `config.settle` has passed since start: until then nothing is rejected for
    /// want of a sandbox or a big enough worker, since heartbeats may still be on their way.
    settled: bool,
}

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

impl Scheduler {
    pub(crate) fn new(
        config: Config,
        epoch: u64,
        js: jetstream::Context,
        results_stream: jetstream::stream::Stream,
    ) -> Self {
        let limits = Limits {
            max_timeout_ms: config.max_timeout.as_millis() as u64,
            ..Limits::default()
        };
        let policy: Box<dyn tangram_core::Policy> = if config.policy == "static" {
            Box::new(tangram_core::policies::Static {
                cores: config.static_cores,
            })
        } else {
            tangram_core::by_name(&config.policy)
                .unwrap_or_else(|| Box::new(tangram_core::Tangram::default()))
        };
        let static_cores = policy.per_trajectory_cores();
        Self {
            config,
            policy,
            learner: tangram_core::learn::Learner::new(),
            limits,
            epoch,
            js,
            results_stream,
            started: Instant::now(),
            workers: BTreeMap::new(),
            queue: Vec::new(),
            running: HashMap::new(),
            sandboxes: HashMap::new(),
            eoe: tangram_core::Eoe::new(Vec::new()),
            providers: BTreeMap::new(),
            wake_at: None,
            static_cores,
            pinned: false,
            slices: HashMap::new(),
            recent: std::collections::VecDeque::new(),
            dirty: false,
            settled: false,
        }
    }

    pub(crate) async fn run(&mut self, mut rx: mpsc::Receiver<Event>, shutdown: CancellationToken) {
        loop {
            let wake = self.wake_at;
            let event = tokio::select! {
                _ = shutdown.cancelled() => break,
                e = rx.recv() => match e { Some(e) => e, None => break },
                _ = async {
                    match wake {
                        Some(t) => tokio::time::sleep_until(t.into()).await,
                        None => std::future::pending().await,
                    }
                } => {
                    self.wake_at = None;
                    self.dirty = true;
                    Event::Wake
                }
            };
            self.handle(event).await;
            // Coalesce a burst: drain what is already waiting before planning once.
            while let Ok(event) = rx.try_recv() {
                self.handle(event).await;
            }
            if self.dirty {
                self.dirty = false;
                self.cycle().await;
            }
        }
        // Hand queued actions back at once (instead of after the ack wait), so that the next
        // scheduler picks them up without delay.
        for q in self.queue.drain(..) {
            let _ =
                tokio::time::timeout(Duration::from_secs(1), q.msg.ack_with(AckKind::Nak(None)))
                    .await;
        }
    }

    async fn handle(&mut self, event: Event) {
        match event {
            Event::Action(msg) => self.intake(msg).await,
            Event::Result(r) => self.on_result(*r),
            Event::Heartbeat(hb) => self.on_heartbeat(*hb),
            Event::Tick => self.on_tick().await,
            Event::Wake => {}
            Event::Status(reply) => {
                let _ = reply.send(self.status());
            }
        }
    }

    // ---- intake -------------------------------------------------------------------------

    async fn intake(&mut self, msg: Box<jetstream::Message>) {
        let submitted_at_us = msg
            .info()
            .map(|i| (i.published.unix_timestamp_nanos() / 1000) as u64)
            .unwrap_or_else(|_| unix_us());
        match self.check(&msg) {
            Ok((action, encoding)) => {
                m::received(action.kind().as_str());
                let seq = |m: &jetstream::Message| m.info().map(|i| i.stream_sequence).ok();
                if let Some(q) = self.queue.iter_mut().find(|q| q.action.id == action.id) {
                    q.last_progress = Instant::now();
                    if seq(&q.msg) == seq(&msg) {
                        // A redelivery of a queued action (its ack wait ran out): keep the newest
                        // delivery, the one the server expects the ack on.
                        q.msg = msg;
                    } else {
                        m::duplicate();
                        ack(&msg).await;
                    }
                    return;
                }
                if self.already_seen(&action).await {
                    m::duplicate();
                    debug!(action = %action.id, "duplicate submission dropped");
                    ack(&msg).await;
                    return;
                }
                let now = Instant::now();
                self.queue.push(Queued {
                    action,
                    msg,
                    encoding,
                    submitted_at_us,
                    arrived: now,
                    last_progress: now,
                });
                self.dirty = true;
            }
            Err(bad) => {
                m::received("unknown");
                self.reject_message(&msg, bad).await;
            }
        }
    }

    /// Decodes and validates one message.
    fn check(&self, msg: &jetstream::Message) -> Result<(Action, Encoding), Bad> {
        let (subject_job, subject_kind) = subject::parse_action(&msg.subject).unwrap_or(("", ""));
        let header_id = msg
            .headers
            .as_ref()
            .and_then(|h| h.get(subject::HEADER_MSG_ID))
            .map(|v| v.as_str().to_string());
        let mut bad = Bad {
            id: header_id.clone(),
            job: Some(subject_job.to_string()),
            encoding: Encoding::Msgpack,
            rejection: Rejection::new(RejectCode::Undecodable, ""),
        };
        let encoding = match content_type(&msg.headers) {
            Ok(e) => e,
            Err(e) => {
                bad.rejection = Rejection::new(RejectCode::Undecodable, e.to_string());
                return Err(bad);
            }
        };
        bad.encoding = encoding;
        if msg.payload.len() > self.config.max_action_bytes {
            bad.rejection = Rejection::new(
                RejectCode::Oversized,
                format!(
                    "action is {} bytes; the limit is {} (put large inputs in the image)",
                    msg.payload.len(),
                    self.config.max_action_bytes
                ),
            );
            if bad.id.is_none() {
                bad.id = codec::read_envelope(&msg.payload, encoding).id;
            }
            return Err(bad);
        }
        let action = match codec::decode_action(&msg.payload, encoding) {
            Ok(a) => a,
            Err(f) => {
                bad.id = bad.id.or(f.envelope.id);
                bad.rejection = f.rejection;
                return Err(bad);
            }
        };
        bad.id = Some(action.id.to_string());
        if let Err(r) = action.validate(&self.limits) {
            bad.rejection = r;
            return Err(bad);
        }
        let mismatch = if action.job.as_str() != subject_job {
            Some(format!(
                "body job {:?} does not match the subject's job {subject_job:?}",
                action.job.0
            ))
        } else if action.kind().as_str() != subject_kind {
            Some(format!(
                "body kind {:?} does not match the subject's kind {subject_kind:?}",
                action.kind().as_str()
            ))
        } else if header_id
            .as_deref()
            .is_some_and(|h| h != action.id.as_str())
        {
            Some(format!(
                "Nats-Msg-Id {:?} does not match the body id {:?}",
                header_id.unwrap_or_default(),
                action.id.0
            ))
        } else {
            None
        };
        if let Some(reason) = mismatch {
            bad.rejection = Rejection::new(RejectCode::Mismatch, reason);
            return Err(bad);
        }
        Ok((action, encoding))
    }

    /// True when this id is running or already has a result.
    async fn already_seen(&self, action: &Action) -> bool {
        if self.running.contains_key(&action.id) {
            return true;
        }
        let result_subject = subject::result(&action.job, &action.id);
        self.results_stream
            .get_last_raw_message_by_subject(&result_subject)
            .await
            .is_ok()
    }

    // ---- planning -----------------------------------------------------------------------

    fn snapshot(&self) -> Snapshot {
        let mut used: HashMap<&WorkerId, (u32, u64)> = HashMap::new();
        for r in self.running.values() {
            // Under `static`, an exec runs on its sandbox's own cores, already booked.
            if !(self.static_cores.is_some() && r.kind == ActionKind::SandboxExec) {
                used.entry(&r.worker).or_default().0 += r.grant.cores;
            }
        }
        for s in self.sandboxes.values() {
            let u = used.entry(&s.worker).or_default();
            u.1 += s.mem_mb;
            u.0 += s.cores;
        }
        Snapshot::new(
            self.workers
                .iter()
                .map(|(id, w)| {
                    let (cores, mem) = used.get(id).copied().unwrap_or_default();
                    WorkerView {
                        id: id.clone(),
                        total_cores: w.hb.cores,
                        free_cores: w.hb.cores.saturating_sub(cores),
                        total_mem_mb: w.hb.mem_mb,
                        free_mem_mb: w.hb.mem_mb.saturating_sub(mem),
                        accepting: !w.hb.draining,
                    }
                })
                .collect(),
        )
    }

    async fn cycle(&mut self) {
        let t0 = Instant::now();
        // Resolve sandbox constraints; some actions are decided before the core sees them.
        let mut pending = Vec::with_capacity(self.queue.len());
        let mut rejections: Vec<(ActionId, Rejection)> = Vec::new();
        let mut queued_opens: HashSet<SandboxKey> = HashSet::new();
        let now_ms = self.started.elapsed().as_millis() as u64;
        // Reward actions: Evict-on-Execution routing, in queue order.
        let mut backlog: HashMap<&str, u32> = HashMap::new();
        for q in &self.queue {
            if let tangram_shared::ActionSpec::Reward(r) = &q.action.spec {
                *backlog.entry(r.service.as_str()).or_default() += 1;
            }
        }
        if self.static_cores.is_some() && !self.pinned && self.settled {
            let (total, _) = self.eoe.gpus();
            let n = self.eoe.services().count() as u32;
            if total > 0 && n > 0 {
                // Static deployment: an even split of the GPUs between the services, resident
                // from now on and never evicted.
                let short = self.eoe.pin(total / n);
                info!(
                    gpus_per_service = total / n,
                    ?short,
                    "static: GPU services pinned"
                );
                self.pinned = true;
            }
        }
        let mut routes: Vec<(ActionId, WorkerId, GpuRoute)> = Vec::new();
        let mut busy_services: HashSet<String> = HashSet::new();
        for q in &self.queue {
            let tangram_shared::ActionSpec::Reward(r) = &q.action.spec else {
                continue;
            };
            if busy_services.contains(&r.service) {
                continue;
            }
            let left = backlog.get(r.service.as_str()).copied().unwrap_or(1);
            match self.eoe.route_with_backlog(&r.service, now_ms, left) {
                Ok(route) => {
                    if let Some(b) = backlog.get_mut(r.service.as_str()) {
                        *b = b.saturating_sub(1);
                    }
                    routes.push((
                        q.action.id.clone(),
                        route.node.clone(),
                        GpuRoute {
                            service: r.service.clone(),
                            chunk: chunk_ref(route.chunk),
                            restore: route.restore,
                            evict: route
                                .evict
                                .iter()
                                .map(|e| Evict {
                                    service: e.service.clone(),
                                    chunk: chunk_ref(e.chunk),
                                })
                                .collect(),
                        },
                    ));
                }
                Err(tangram_core::Unrouted::Busy { .. }) => {
                    busy_services.insert(r.service.clone());
                }
                Err(why) if self.settled => {
                    let code = match why {
                        tangram_core::Unrouted::UnknownService(_) => RejectCode::UnknownService,
                        _ => RejectCode::Unsatisfiable,
                    };
                    let known: Vec<String> = self.eoe.services().map(|s| s.name.clone()).collect();
                    let reason = if known.is_empty() {
                        format!("{why}; no worker serves any model service")
                    } else {
                        format!("{why}; services: {}", known.join(", "))
                    };
                    rejections.push((q.action.id.clone(), Rejection::new(code, reason)));
                }
                // Settling: the worker serving it may not have reported yet.
                Err(_) => {}
            }
        }
        let api_routes = self.plan_api(now_ms, &mut rejections);
        let mut direct: Vec<(ActionId, WorkerId, u32)> = Vec::new();
        for q in &self.queue {
            let a = &q.action;
            let key = (a.job.clone(), a.trajectory.clone());
            let constraint = match a.kind() {
                ActionKind::Reward | ActionKind::Api => continue,
                ActionKind::SandboxOpen => {
                    if self.sandboxes.contains_key(&key) || !queued_opens.insert(key) {
                        rejections.push((
                            a.id.clone(),
                            Rejection::new(
                                RejectCode::SandboxExists,
                                format!(
                                    "trajectory {} of job {} already has a sandbox; close it first",
                                    a.trajectory, a.job
                                ),
                            ),
                        ));
                        continue;
                    }
                    Constraint::Any
                }
                ActionKind::SandboxExec | ActionKind::SandboxClose => {
                    match self.sandboxes.get(&key) {
                        Some(s) if s.phase == SandboxPhase::Open => {
                            Constraint::OnWorker(s.worker.clone())
                        }
                        // Wait for the open to finish or for the close ahead to take effect.
                        Some(_) => continue,
                        None if queued_opens.contains(&key) => continue,
                        // Just started: the workers' heartbeats (which list their sandboxes)
                        // may not all have arrived yet.
                        None if !self.settled => continue,
                        None => {
                            rejections.push((
                            a.id.clone(),
                            Rejection::new(
                                RejectCode::NoSandbox,
                                format!(
                                    "trajectory {} of job {} has no open sandbox; send sandbox_open first",
                                    a.trajectory, a.job
                                ),
                            ),
                        ));
                            continue;
                        }
                    }
                }
            };
            let mut demand = a.demand();
            if let Some(c) = self.static_cores {
                match a.kind() {
                    // The trajectory's sandbox takes its fixed cores for its whole life.
                    ActionKind::SandboxOpen => {
                        demand.cores = Some(tangram_shared::CpuRange { min: c, max: c })
                    }
                    // Its commands run at once on those cores.
                    ActionKind::SandboxExec => {
                        let max = demand.cores.map_or(1, |r| r.max);
                        if let Constraint::OnWorker(w) = &constraint {
                            direct.push((a.id.clone(), w.clone(), c.min(max).max(1)));
                        }
                        continue;
                    }
                    _ => {}
                }
            }
            pending.push(Pending {
                id: a.id.clone(),
                demand,
                constraint,
                model: learn_key(a).and_then(|k| self.learner.model(&k)),
                needs: Default::default(),
            });
        }
        let snapshot = self.snapshot();
        let plan = self.policy.schedule(&snapshot, &pending, now_ms);
        let core_s = t0.elapsed().as_secs_f64();

        for (id, rejection) in rejections {
            self.reject_queued(&id, rejection).await;
        }
        for (id, why) in plan.unplaced {
            match why {
                // Just started: a worker large enough may not have reported yet.
                Unplaced::NeverFits(_) if !self.settled => {}
                Unplaced::NeverFits(_) => {
                    self.reject_queued(
                        &id,
                        Rejection::new(RejectCode::Unsatisfiable, why.to_string()),
                    )
                    .await
                }
                Unplaced::MayFitLater(_) => debug!(action = %id, reason = %why, "waiting"),
            }
        }
        for launch in plan.launches {
            self.launch(launch, None).await;
        }
        for (id, worker, cores) in direct {
            let launch = tangram_core::Launch {
                id,
                worker,
                grant: Grant { cores, mem_mb: 0 },
            };
            self.launch(launch, None).await;
        }
        for (id, worker, route) in routes {
            let launch = tangram_core::Launch {
                id,
                worker,
                grant: Grant::default(),
            };
            self.launch(launch, Some(route)).await;
        }
        for (id, worker, provider) in api_routes {
            let launch = tangram_core::Launch {
                id,
                worker,
                grant: Grant::default(),
            };
            self.launch_api(launch, provider).await;
        }
        m::cycle(
            core_s,
            self.queue.len(),
            self.running.len(),
            self.workers.len(),
        );
    }

    /// Admits api actions under their providers' pooled quotas: per provider, while a token
    /// and a concurrency slot are free, the next action by weighted fair share between jobs.
    /// Sets `wake_at` to when the next token comes for a provider with actions waiting.
    fn plan_api(
        &mut self,
        now_ms: u64,
        rejections: &mut Vec<(ActionId, Rejection)>,
    ) -> Vec<(ActionId, WorkerId, String)> {
        let mut waiting: BTreeMap<String, Vec<(usize, String)>> = BTreeMap::new();
        for (i, q) in self.queue.iter().enumerate() {
            let tangram_shared::ActionSpec::Api(api) = &q.action.spec else {
                continue;
            };
            let Some(p) = self.providers.get(&api.provider) else {
                if self.settled {
                    let known: Vec<&str> = self.providers.keys().map(String::as_str).collect();
                    rejections.push((
                        q.action.id.clone(),
                        Rejection::new(
                            RejectCode::UnknownProvider,
                            if known.is_empty() {
                                format!(
                                    "no worker calls a provider named {:?}; none are declared",
                                    api.provider
                                )
                            } else {
                                format!(
                                    "no worker calls a provider named {:?}; providers: {}",
                                    api.provider,
                                    known.join(", ")
                                )
                            },
                        ),
                    ));
                }
                continue;
            };
            if !p.report.allows(&api.method, &api.path) {
                rejections.push((
                    q.action.id.clone(),
                    Rejection::new(
                        RejectCode::NotAllowed,
                        format!(
                            "{} {} is not allowed for provider {:?} (allowed: {})",
                            api.method,
                            api.path,
                            api.provider,
                            p.report.allow.join(", ")
                        ),
                    ),
                ));
                continue;
            }
            if let Some(h) = api
                .headers
                .keys()
                .find(|h| !p.report.allow_headers.contains(&h.to_ascii_lowercase()))
            {
                rejections.push((
                    q.action.id.clone(),
                    Rejection::new(
                        RejectCode::NotAllowed,
                        format!(
                            "header {h:?} is not allowed for provider {:?}",
                            api.provider
                        ),
                    ),
                ));
                continue;
            }
            waiting
                .entry(api.provider.clone())
                .or_default()
                .push((i, q.action.job.0.clone()));
        }
        let mut routes = Vec::new();
        let mut next_ms: Option<u64> = None;
        let mut load: HashMap<WorkerId, usize> = HashMap::new();
        for r in self.running.values() {
            if r.provider.is_some() {
                *load.entry(r.worker.clone()).or_default() += 1;
            }
        }
        for (name, mut list) in waiting {
            let Some(p) = self.providers.get_mut(&name) else {
                continue;
            };
            let accepting: Vec<WorkerId> = p
                .workers
                .iter()
                .filter(|w| self.workers.get(*w).is_some_and(|s| !s.hb.draining))
                .cloned()
                .collect();
            if accepting.is_empty() {
                continue;
            }
            // Spread admitted calls over the workers that can make them, least loaded first.
            let mut assign = |i: usize, routes: &mut Vec<(ActionId, WorkerId, String)>| {
                let worker = accepting
                    .iter()
                    .min_by_key(|w| (load.get(*w).copied().unwrap_or(0), (*w).clone()))
                    .expect("not empty")
                    .clone();
                *load.entry(worker.clone()).or_default() += 1;
                routes.push((self.queue[i].action.id.clone(), worker, name.clone()));
            };
            if self.static_cores.is_some() {
                // Per-trajectory provisioning: each trajectory has its own even slice of the
                // rate (rate / open sandboxes, burst 1); the provider's connection cap holds.
                let mut inflight = self
                    .running
                    .values()
                    .filter(|r| r.provider.as_deref() == Some(name.as_str()))
                    .count() as u32;
                let share = self.sandboxes.len().max(1) as f64;
                for (i, job) in list.drain(..) {
                    let traj = self.queue[i].action.trajectory.clone();
                    let key = (JobId(job.clone()), traj, name.clone());
                    let slice = self.slices.entry(key).or_insert_with(|| {
                        tangram_core::quota::Quota::new(
                            tangram_core::quota::ProviderQuota {
                                name: name.clone(),
                                rate_per_s: p.report.rate_per_s / share,
                                burst: 2,
                                concurrency: u32::MAX,
                                slow_ms: None,
                            },
                            now_ms,
                        )
                    });
                    match slice.ready_in_ms(now_ms) {
                        Some(0) if inflight < p.report.concurrency => {
                            slice.take(&job, 1.0, now_ms);
                            inflight += 1;
                            assign(i, &mut routes);
                        }
                        Some(ms) if ms > 0 => {
                            next_ms = Some(next_ms.map_or(ms, |n: u64| n.min(ms)))
                        }
                        _ => {}
                    }
                }
                continue;
            }
            // Fair share picks among the jobs' oldest waiting calls: one queue per job, in
            // arrival order.
            let mut by_job: BTreeMap<String, std::collections::VecDeque<usize>> = BTreeMap::new();
            for (i, job) in list.drain(..) {
                by_job.entry(job).or_default().push_back(i);
            }
            let mut left: usize = by_job.values().map(|q| q.len()).sum();
            while left > 0 {
                match p.quota.ready_in_ms(now_ms) {
                    Some(0) => {
                        let mut heads: Vec<(usize, &str)> = by_job
                            .iter()
                            .filter_map(|(j, q)| q.front().map(|&i| (i, j.as_str())))
                            .collect();
                        heads.sort_unstable();
                        let Some(i) = p.quota.pick(&heads) else {
                            break;
                        };
                        let job = self.queue[i].action.job.0.clone();
                        by_job.get_mut(&job).and_then(|q| q.pop_front());
                        left -= 1;
                        let weight = self.config.job_weights.get(&job).copied().unwrap_or(1.0);
                        p.quota.take(&job, weight, now_ms);
                        assign(i, &mut routes);
                    }
                    Some(ms) => {
                        next_ms = Some(next_ms.map_or(ms, |n: u64| n.min(ms)));
                        break;
                    }
                    None => break, // at the concurrency cap: a reply will wake us
                }
            }
            m::provider(&name, p.quota.effective_rate(), p.quota.inflight(), left);
        }
        self.wake_at = next_ms.map(|ms| Instant::now() + Duration::from_millis(ms));
        routes
    }

    async fn launch_api(&mut self, launch: tangram_core::Launch, provider: String) {
        let id = launch.id.clone();
        self.launch(launch, None).await;
        match self.running.get_mut(&id) {
            Some(r) => {
                r.provider = Some(provider.clone());
                m::api_admitted(&provider, r.job.as_str());
            }
            // Not durably dispatched: it stays queued; give the token's slot back.
            None => {
                let now_ms = self.started.elapsed().as_millis() as u64;
                if let Some(p) = self.providers.get_mut(&provider) {
                    p.quota.finish(now_ms, None, 0);
                }
            }
        }
    }

    async fn launch(&mut self, launch: tangram_core::Launch, gpu: Option<GpuRoute>) {
        let Some(pos) = self.queue.iter().position(|q| q.action.id == launch.id) else {
            return;
        };
        // A reward route booked a slot (and maybe evictions) in the manager: if the dispatch
        // cannot be made durable, the booking is given back.
        let unbook = |eoe: &mut tangram_core::Eoe, route: &Option<GpuRoute>| {
            if let Some(r) = route {
                if let Some(i) = eoe.find(&r.service, &launch.worker, chunk_of(r.chunk)) {
                    eoe.finish(i, 0);
                }
            }
        };
        let q = self.queue.remove(pos);
        let dispatch = Dispatch {
            epoch: self.epoch,
            attempt: 1,
            action: q.action.clone(),
            grant: launch.grant,
            submitted_at_us: q.submitted_at_us,
            result_encoding: q.encoding,
            gpu: gpu.clone(),
        };
        let payload = match codec::encode(&dispatch, Encoding::Msgpack) {
            Ok(p) => p,
            Err(e) => {
                warn!(action = %launch.id, error = %e, "encoding a dispatch");
                unbook(&mut self.eoe, &gpu);
                self.queue.insert(pos, q);
                return;
            }
        };
        let mut headers = HeaderMap::new();
        headers.insert(
            subject::HEADER_MSG_ID,
            format!("{}:{}:{}", q.action.id, self.epoch, dispatch.attempt).as_str(),
        );
        headers.insert(
            subject::HEADER_CONTENT_TYPE,
            Encoding::Msgpack.content_type(),
        );
        let published = match self
            .js
            .publish_with_headers(subject::dispatch(&launch.worker), headers, payload.into())
            .await
        {
            Ok(ack_future) => ack_future.await.map(|_| ()).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = published {
            // Not durably dispatched: keep it queued in its place and try again next cycle.
            warn!(action = %launch.id, error = %e, "dispatch publish failed; will retry");
            unbook(&mut self.eoe, &gpu);
            self.queue.insert(pos, q);
            self.dirty = true;
            return;
        }
        let kind = q.action.kind();
        let key = (q.action.job.clone(), q.action.trajectory.clone());
        match kind {
            ActionKind::SandboxOpen => {
                self.sandboxes.insert(
                    key,
                    Sandbox {
                        worker: launch.worker.clone(),
                        mem_mb: launch.grant.mem_mb,
                        phase: SandboxPhase::Opening,
                        cores: if self.static_cores.is_some() {
                            launch.grant.cores
                        } else {
                            0
                        },
                    },
                );
            }
            ActionKind::SandboxClose => {
                if let Some(s) = self.sandboxes.get_mut(&key) {
                    s.phase = SandboxPhase::Closing;
                }
            }
            ActionKind::SandboxExec | ActionKind::Reward | ActionKind::Api => {}
        }
        if let Some(r) = &gpu {
            m::gpu_route(&r.service, r.restore, r.evict.len());
        }
        self.running.insert(
            q.action.id.clone(),
            Running {
                worker: launch.worker.clone(),
                grant: launch.grant,
                job: q.action.job.clone(),
                trajectory: q.action.trajectory.clone(),
                kind,
                encoding: q.encoding,
                attempt: dispatch.attempt,
                learn_key: learn_key(&q.action),
                gpu: gpu.map(|r| (r.service, chunk_of(r.chunk))),
                provider: None,
            },
        );
        m::dispatched(kind.as_str(), q.arrived.elapsed().as_secs_f64());
        debug!(action = %q.action.id, worker = %launch.worker, cores = launch.grant.cores, "dispatched");
        // Only now, with the dispatch durable, is the action acknowledged.
        ack(&q.msg).await;
    }

    // ---- results and workers ------------------------------------------------------------

    fn on_result(&mut self, r: ActionResult) {
        m::result(r.outcome.label());
        if let (Some(kind), Outcome::Completed { .. }) = (r.kind, &r.outcome) {
            self.recent.push_back((kind, r.timing));
            while self.recent.len() > 2_000 {
                self.recent.pop_front();
            }
        }
        let Some(run) = self.running.remove(&r.id) else {
            return;
        };
        if let (Some(k), Outcome::Completed { .. }, Some(p)) =
            (&run.learn_key, &r.outcome, &r.placement)
        {
            self.learner
                .observe(k, p.cores, r.timing.exec_us as f64 / 1e3);
        }
        if let Some(provider) = &run.provider {
            let now_ms = self.started.elapsed().as_millis() as u64;
            let key = (run.job.clone(), run.trajectory.clone(), provider.clone());
            if let Some(slice) = self.slices.get_mut(&key) {
                slice.finish(
                    now_ms,
                    r.http.as_ref().map(|h| h.status),
                    r.timing.exec_us / 1000,
                );
            } else if let Some(p) = self.providers.get_mut(provider) {
                let status = match &r.outcome {
                    Outcome::TimedOut => Some(429), // a provider that does not answer is overloaded
                    _ => r.http.as_ref().map(|h| h.status),
                };
                p.quota.finish(now_ms, status, r.timing.exec_us / 1000);
            }
        }
        if let Some((service, chunk)) = &run.gpu {
            let now_ms = self.started.elapsed().as_millis() as u64;
            if let Some(i) = self.eoe.find(service, &run.worker, *chunk) {
                self.eoe.finish(i, now_ms);
                if matches!(
                    r.outcome,
                    Outcome::InfraError {
                        code: InfraCode::Service,
                        ..
                    }
                ) {
                    // The replica failed; the worker restarts it asleep.
                    self.eoe.mark_evicted(i);
                }
            }
            if r.service.as_ref().is_some_and(|u| u.restored) {
                self.eoe
                    .observe_restore(service, r.timing.overhead_us / 1000);
            }
        }
        let key = (run.job.clone(), run.trajectory.clone());
        match (run.kind, &r.outcome) {
            (ActionKind::SandboxOpen, Outcome::Completed { exit_code: 0 }) => {
                if let Some(s) = self.sandboxes.get_mut(&key) {
                    s.phase = SandboxPhase::Open;
                }
            }
            (ActionKind::SandboxOpen, _) | (ActionKind::SandboxClose, _) => {
                self.sandboxes.remove(&key);
                self.slices
                    .retain(|(j, t, _), _| !(j == &key.0 && t == &key.1));
            }
            (
                ActionKind::SandboxExec,
                Outcome::InfraError {
                    code: InfraCode::SandboxLost,
                    ..
                },
            ) => {
                self.sandboxes.remove(&key);
            }
            (ActionKind::SandboxExec, _) | (ActionKind::Reward, _) | (ActionKind::Api, _) => {}
        }
        self.dirty = true;
    }

    fn on_heartbeat(&mut self, hb: Heartbeat) {
        if hb.worker.check().is_err() {
            return;
        }
        let restarted = self
            .workers
            .get(&hb.worker)
            .is_some_and(|w| w.hb.instance != hb.instance);
        if restarted {
            // The new instance removed its predecessor's containers: forget the sandboxes it
            // does not list, except those still being opened by a dispatch it will run.
            let listed: HashSet<SandboxKey> = hb
                .sandboxes
                .iter()
                .map(|s| (s.job.clone(), s.trajectory.clone()))
                .collect();
            self.sandboxes.retain(|k, s| {
                s.worker != hb.worker || s.phase == SandboxPhase::Opening || listed.contains(k)
            });
            info!(worker = %hb.worker, "worker restarted");
        }
        self.on_gpu_report(&hb, restarted || !self.workers.contains_key(&hb.worker));
        self.on_providers(&hb);
        if !self.workers.contains_key(&hb.worker) {
            info!(worker = %hb.worker, cores = hb.cores, mem_mb = hb.mem_mb, "worker joined");
            // Sandboxes a worker reports (after a scheduler restart) are adopted.
            for s in &hb.sandboxes {
                self.sandboxes
                    .entry((s.job.clone(), s.trajectory.clone()))
                    .or_insert(Sandbox {
                        worker: hb.worker.clone(),
                        mem_mb: s.mem_mb,
                        phase: SandboxPhase::Open,
                        cores: self.static_cores.unwrap_or(0),
                    });
            }
        }
        self.workers.insert(
            hb.worker.clone(),
            WorkerState {
                hb,
                last_seen: Instant::now(),
            },
        );
        self.dirty = true;
    }

    /// GPU inventory and services from a heartbeat. The scheduler's view of residency is
    /// authoritative while a worker instance lives; a new instance's report replaces it.
    fn on_providers(&mut self, hb: &Heartbeat) {
        let now_ms = self.started.elapsed().as_millis() as u64;
        for p in self.providers.values_mut() {
            p.workers.remove(&hb.worker);
        }
        for r in &hb.providers {
            let spec = tangram_core::quota::ProviderQuota {
                name: r.name.clone(),
                rate_per_s: r.rate_per_s,
                burst: r.burst,
                concurrency: r.concurrency,
                slow_ms: r.slow_ms,
            };
            let p = self.providers.entry(r.name.clone()).or_insert_with(|| {
                info!(provider = %r.name, rate = r.rate_per_s, burst = r.burst, concurrency = r.concurrency, "provider declared");
                Provider {
                    quota: tangram_core::quota::Quota::new(spec.clone(), now_ms),
                    report: r.clone(),
                    workers: BTreeSet::new(),
                }
            });
            p.quota.redeclare(spec, now_ms);
            p.report = r.clone();
            p.workers.insert(hb.worker.clone());
        }
    }

    fn on_gpu_report(&mut self, hb: &Heartbeat, fresh: bool) {
        for s in &hb.services {
            self.eoe.declare(tangram_core::ServiceSpec {
                name: s.name.clone(),
                gpus: s.gpus,
                restore_ms: s.restore_ms,
                slots: s.slots.max(1),
            });
        }
        let Some(inv) = &hb.gpus else {
            if fresh {
                self.eoe.remove_node(&hb.worker);
            }
            return;
        };
        let sizes: Vec<u8> = inv.groups.iter().map(|g| g.len().min(8) as u8).collect();
        if fresh {
            self.eoe.remove_node(&hb.worker);
        }
        self.eoe.set_node(&hb.worker, &sizes, !hb.draining);
        if fresh {
            let now_ms = self.started.elapsed().as_millis() as u64;
            for s in &hb.services {
                for r in &s.replicas {
                    self.eoe
                        .adopt(&s.name, &hb.worker, chunk_of(r.chunk), r.resident, now_ms);
                }
            }
            info!(worker = %hb.worker, gpus = sizes.iter().map(|&g| g as u32).sum::<u32>(), services = hb.services.len(), "GPU worker reported");
        }
        m::gpus(&hb.worker, self.eoe.gpus());
    }

    async fn on_tick(&mut self) {
        let now = Instant::now();
        if !self.settled && self.started.elapsed() >= self.config.settle {
            self.settled = true;
            self.dirty = true; // decide what was held back while settling
        }
        let lost: Vec<WorkerId> = self
            .workers
            .iter()
            .filter(|(_, w)| {
                let grace = Duration::from_millis(w.hb.interval_ms.max(100))
                    * self.config.worker_missed_heartbeats;
                now.duration_since(w.last_seen) > grace
            })
            .map(|(id, _)| id.clone())
            .collect();
        for worker in lost {
            self.worker_lost(&worker).await;
        }
        for q in &mut self.queue {
            if now.duration_since(q.last_progress) > PROGRESS_EVERY {
                q.last_progress = now;
                if let Err(e) = q.msg.ack_with(AckKind::Progress).await {
                    warn!(action = %q.action.id, error = %e, "in-progress ack");
                }
            }
        }
    }

    async fn worker_lost(&mut self, worker: &WorkerId) {
        warn!(%worker, "worker lost: no heartbeat within the grace period");
        m::worker_lost();
        self.workers.remove(worker);
        self.sandboxes.retain(|_, s| &s.worker != worker);
        self.eoe.remove_node(worker);
        for p in self.providers.values_mut() {
            p.workers.remove(worker);
        }
        let ids: Vec<ActionId> = self
            .running
            .iter()
            .filter(|(_, r)| &r.worker == worker)
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            let Some(run) = self.running.remove(&id) else {
                continue;
            };
            if let Some(p) = run
                .provider
                .as_ref()
                .and_then(|p| self.providers.get_mut(p))
            {
                p.quota
                    .finish(self.started.elapsed().as_millis() as u64, None, 0);
            }
            if let Some((service, chunk)) = &run.gpu {
                if let Some(i) = self.eoe.find(service, worker, *chunk) {
                    self.eoe.finish(i, 0);
                }
            }
            let outcome = Outcome::InfraError {
                code: InfraCode::WorkerLost,
                reason: format!(
                    "worker {worker} stopped sending heartbeats while running this action"
                ),
            };
            let mut result = ActionResult::new(id, run.job.clone(), outcome, unix_us() / 1000);
            result.trajectory = Some(run.trajectory.clone());
            result.kind = Some(run.kind);
            result.attempt = run.attempt;
            self.publish_result(&result, run.encoding).await;
        }
        self.dirty = true;
    }

    fn status(&self) -> tangram_shared::status::Status {
        use tangram_shared::status::*;
        let now = Instant::now();
        let mut st = Status {
            epoch: self.epoch,
            policy: self.config.policy.clone(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            sandboxes: self.sandboxes.len(),
            ..Default::default()
        };
        let snapshot = self.snapshot();
        for (id, w) in &self.workers {
            let view = snapshot.worker(id);
            st.workers.push(WorkerStatus {
                id: id.to_string(),
                cores: w.hb.cores,
                cores_used: view.map_or(0, |v| v.total_cores - v.free_cores),
                mem_mb: w.hb.mem_mb,
                mem_used_mb: view.map_or(0, |v| v.total_mem_mb - v.free_mem_mb),
                gpus: w
                    .hb
                    .gpus
                    .as_ref()
                    .map_or(0, |g| g.groups.iter().map(|x| x.len() as u32).sum()),
                gpu_source: w.hb.gpus.as_ref().map(|g| g.source.clone()),
                last_seen_s: now.duration_since(w.last_seen).as_secs_f64(),
                draining: w.hb.draining,
            });
        }
        for q in &self.queue {
            *st.queued
                .entry(q.action.kind().as_str().to_string())
                .or_default() += 1;
        }
        for r in self.running.values() {
            *st.running.entry(r.kind.as_str().to_string()).or_default() += 1;
        }
        for s in self.eoe.services() {
            let mut svc = ServiceStatus {
                name: s.name.clone(),
                gpus: s.gpus,
                restore_ms: s.restore_ms,
                ..Default::default()
            };
            for r in self.eoe.replicas().iter().filter(|r| r.service == s.name) {
                svc.busy += r.busy;
                if r.resident {
                    svc.resident.push(format!(
                        "{}:{}/{}+{}",
                        r.node, r.chunk.group, r.chunk.start, r.chunk.len
                    ));
                }
            }
            st.services.push(svc);
        }
        for (name, p) in &self.providers {
            st.providers.push(ProviderStatus {
                name: name.clone(),
                rate_per_s: p.report.rate_per_s,
                effective_rate_per_s: p.quota.effective_rate(),
                inflight: self
                    .running
                    .values()
                    .filter(|r| r.provider.as_deref() == Some(name.as_str()))
                    .count() as u32,
                concurrency: p.report.concurrency,
                admitted: p.quota.admitted().clone(),
            });
        }
        let mut by_kind: BTreeMap<&str, Vec<&tangram_shared::Timing>> = BTreeMap::new();
        for (k, t) in &self.recent {
            by_kind.entry(k.as_str()).or_default().push(t);
        }
        for (k, ts) in by_kind {
            let n = ts.len();
            let mut acts: Vec<f64> = ts.iter().map(|t| t.act_us as f64 / 1e6).collect();
            acts.sort_by(f64::total_cmp);
            let mean = |f: &dyn Fn(&tangram_shared::Timing) -> u64| {
                ts.iter().map(|t| f(t) as f64).sum::<f64>() / n as f64 / 1e6
            };
            st.recent.insert(
                k.to_string(),
                ActStats {
                    count: n,
                    mean_s: acts.iter().sum::<f64>() / n as f64,
                    p50_s: acts[(n - 1) / 2],
                    p99_s: acts[((n - 1) as f64 * 0.99).round() as usize],
                    queued_s: mean(&|t| t.queued_us),
                    overhead_s: mean(&|t| t.overhead_us),
                    exec_s: mean(&|t| t.exec_us),
                },
            );
        }
        st
    }

    // ---- rejections ---------------------------------------------------------------------

    async fn reject_queued(&mut self, id: &ActionId, rejection: Rejection) {
        let Some(pos) = self.queue.iter().position(|q| &q.action.id == id) else {
            return;
        };
        let q = self.queue.remove(pos);
        let bad = Bad {
            id: Some(q.action.id.to_string()),
            job: Some(q.action.job.0.clone()),
            encoding: q.encoding,
            rejection,
        };
        self.reject_message(&q.msg, bad).await;
    }

    /// Publishes the dead-letter record and then the rejection result (when the submitter
    /// can be addressed), then acks the message.
    async fn reject_message(&mut self, msg: &jetstream::Message, bad: Bad) {
        m::rejected(bad.rejection.code.as_str());
        info!(subject = %msg.subject, code = bad.rejection.code.as_str(), reason = %bad.rejection.reason, "action rejected");
        let addressable = match (&bad.id, &bad.job) {
            (Some(id), Some(job)) => ActionId::new(id.clone())
                .ok()
                .zip(JobId::new(job.clone()).ok()),
            _ => None,
        };
        let mut headers = HeaderMap::new();
        headers.insert(subject::HEADER_DLQ_CODE, bad.rejection.code.as_str());
        // Header values cannot hold line breaks.
        let reason: String = bad
            .rejection
            .reason
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        headers.insert(subject::HEADER_DLQ_REASON, reason.as_str());
        headers.insert(subject::HEADER_DLQ_SUBJECT, msg.subject.as_str());
        if let Some(id) = &bad.id {
            let id: String = id.chars().filter(|c| !c.is_control()).take(256).collect();
            headers.insert("Tangram-Action-Id", id.as_str());
        }
        headers.insert(subject::HEADER_CONTENT_TYPE, bad.encoding.content_type());
        let payload = msg
            .payload
            .slice(..msg.payload.len().min(DEADLETTER_PAYLOAD_CAP));
        match self
            .js
            .publish_with_headers(subject::deadletter(bad.rejection.code), headers, payload)
            .await
        {
            Ok(f) => {
                if let Err(e) = f.await {
                    warn!(error = %e, "dead-letter publish not acknowledged");
                }
            }
            Err(e) => warn!(error = %e, "dead-letter publish failed"),
        }
        // The record is stored before the submitter hears: whoever sees a rejection can find
        // it in the dead-letter stream.
        if let Some((id, job)) = addressable {
            let result = ActionResult::rejected(id, job, bad.rejection.clone(), unix_us() / 1000);
            self.publish_result(&result, bad.encoding).await;
        }
        ack(msg).await;
    }

    async fn publish_result(&self, result: &ActionResult, encoding: Encoding) {
        if let Err(e) = tangram_nats::publish_result(&self.js, result, encoding, 3).await {
            warn!(action = %result.id, error = %e, "result lost");
        }
    }
}

/// A message that will not be scheduled, and whom to tell.
struct Bad {
    id: Option<String>,
    job: Option<String>,
    encoding: Encoding,
    rejection: Rejection,
}

async fn ack(msg: &jetstream::Message) {
    if let Err(e) = msg.ack().await {
        warn!(subject = %msg.subject, error = %e, "ack failed; the action may be redelivered (and deduplicated)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use tangram_shared::{ActionSpec, SandboxExec, TrajectoryId};

    fn exec(argv: &[&str]) -> Action {
        Action {
            id: ActionId::new("a").unwrap(),
            job: JobId::new("j").unwrap(),
            trajectory: TrajectoryId::new("t").unwrap(),
            timeout_ms: 1000,
            spec: ActionSpec::SandboxExec(SandboxExec {
                argv: argv.iter().map(|s| s.to_string()).collect(),
                files: BTreeMap::new(),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn elasticity_is_learned_per_job_and_program() {
        assert_eq!(
            learn_key(&exec(&["/usr/bin/make", "-j4"])).as_deref(),
            Some("j/make")
        );
        assert_eq!(
            learn_key(&exec(&["python3", "-m", "pytest", "-n", "{cpus}"])).as_deref(),
            Some("j/python3 -m pytest")
        );
        assert_eq!(
            learn_key(&exec(&["python3", "main.py"])).as_deref(),
            Some("j/python3")
        );
    }
}
