//! The simulator's driver: the scheduler's decision engine ([`crate::engine::Engine`]) on a
//! virtual clock, with simulated workers around it. Every decision (placement, elastic
//! cores, GPU routes and evictions, API admission, the baselines) is the engine's; the driver
//! only plays the rollouts and the workers:
//!
//! - Each trajectory with sandbox commands opens its sandbox when it starts (the open takes
//!   no time, except a `k8s` pod's start), submits each step's action when the previous one completed plus the step's
//!   think time, and closes the sandbox after its last step.
//! - Workers: one per CPU node (`n0000`, ...), one per GPU node (`g0000`, ..., serving every
//!   service), and one (`api`) that calls every provider. They report once, never fail, and
//!   store every dispatch at once.
//! - An exec runs for its true duration with the cores it was granted; a reward call for its
//!   execution time after its replica is ready (a restore takes the service's restore time,
//!   and a request routed to a replica still restoring waits for it); an api call answers
//!   after its latency with status 200.
//!
//! ACT is measured from when an action was due (its trajectory's think time ended) to its
//! completion, so a `static` trajectory's wait for its sandbox counts against its first
//! action, as it would for a rollout.

use super::timeline::Track;
use super::{ActionRecord, Elasticity, SimCall, SimReport, Workload};
use crate::elastic::ElasticModel;
use crate::engine::{Arrival, Now};
use crate::{Effect, Engine, EngineConfig, Event};
use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use tangram_shared::codec::Encoding;
use tangram_shared::{
    Action, ActionId, ActionKind, ActionResult, ActionSpec, Api, ChunkRef, Dispatch, GpuInventory,
    Heartbeat, HttpReply, JobId, Outcome, Placement, ProviderReport, Reward, SandboxClose,
    SandboxExec, SandboxOpen, ServiceReport, ServiceUse, Timing, TrajectoryId, WorkerId,
};

mod workers;

/// What a run counted beyond the report.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SimStats {
    /// Replica restores.
    pub restores: u64,
    /// Replica evictions.
    pub evictions: u64,
    /// Actions rejected by the engine (their trajectory stops there).
    pub unserved: u64,
    /// GPU-milliseconds held by resident replicas.
    pub gpu_reserved_ms: f64,
    /// GPU-milliseconds of work: each reward call's execution times its replica's GPUs,
    /// divided by the replica's slots.
    pub gpu_used_ms: f64,
    /// GPUs known to the engine.
    pub gpus: u32,
    /// (time ms, fraction of the GPUs resident), sampled at events.
    pub gpu_utilisation: Vec<(f64, f64)>,
    /// Image pulls started (a workload with [`super::SimImages`]).
    pub pulls: u64,
    /// MB pulled.
    pub pulled_mb: f64,
    /// Sandbox opens' waits for their image, summed, ms.
    pub pull_wait_ms: f64,
}

/// An event on the virtual clock. In the max-heap the earliest comes out first, and events
/// at the same time in the order they were pushed.
#[derive(Debug, PartialEq)]
struct Timed {
    at_ms: f64,
    seq: u64,
    kind: Kind,
}

impl Eq for Timed {}
impl PartialOrd for Timed {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Timed {
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .at_ms
            .total_cmp(&self.at_ms)
            .then(other.seq.cmp(&self.seq))
    }
}

#[derive(Debug, PartialEq)]
enum Kind {
    /// Trajectory `t` starts.
    Start(usize),
    /// Trajectory `t` submits its next step's action.
    Submit(usize),
    /// A dispatched action completes on its worker, unless it was re-sized since (the
    /// number is its [`Started::version`] when this completion was planned).
    Done(Box<ActionResult>, u32),
    /// The engine asked to be woken.
    Tick,
}

/// Per trajectory.
#[derive(Debug, Clone, Default)]
struct Traj {
    /// Next step.
    next: usize,
    /// When the next step's action is due.
    due_ms: f64,
    /// `static`: the sandbox's cores and since when it holds them.
    held: Option<(u32, f64)>,
    /// It stopped (finished, or an action was rejected).
    done: bool,
}

/// What the driver remembers of a dispatched step.
#[derive(Debug, Clone)]
struct Started {
    t: usize,
    at_ms: f64,
    cores: u32,
    overhead_ms: f64,
    /// An exec's run, for re-sizing (malleable policies).
    exec: Option<ExecRun>,
    /// Bumped at each re-size: completions planned before it are stale.
    version: u32,
}

/// A running exec: its true model and how far it has got.
#[derive(Debug, Clone)]
struct ExecRun {
    model: ElasticModel,
    /// Fraction of its work done before `since_ms`.
    done: f64,
    /// Since when it has had its current cores.
    since_ms: f64,
    /// Core-milliseconds held before `since_ms`.
    core_ms: f64,
    /// Its result, re-sent at the new completion time.
    result: ActionResult,
}

struct Driver<'w> {
    w: &'w Workload,
    engine: Engine,
    elasticity: Elasticity,
    heap: BinaryHeap<Timed>,
    seq: u64,
    trajs: Vec<Traj>,
    jobs: Vec<JobId>,
    ids: Vec<TrajectoryId>,
    has_cpu: Vec<bool>,
    started: HashMap<ActionId, Started>,
    /// Replica readiness: (service, worker, chunk) -> ready at.
    ready: HashMap<(String, WorkerId, ChunkRef), f64>,
    restore_ms: BTreeMap<String, f64>,
    slots: BTreeMap<String, u32>,
    tick_at: Option<f64>,
    report: SimReport,
    stats: SimStats,
    static_cores: Option<u32>,
    /// `k8s`: the median pod start, ms.
    pod_start_ms: Option<f64>,
    last_end: f64,
    next_delivery: u64,
    /// Per CPU node: the images it holds and pulls.
    node_images: Vec<super::images::NodeImages>,
    /// Per GPU service: GPUs its resident replicas hold now (for the report's timeline).
    resident: BTreeMap<String, u32>,
}

/// Runs `w` under `policy` through the decision engine.
pub(crate) fn run<S: super::Simulated + ?Sized>(
    w: &Workload,
    sim: &S,
    elasticity: Elasticity,
    image_load_ms: Option<u64>,
) -> (SimReport, SimStats) {
    let policy = sim.policy();
    let static_cores = policy.provisioning().trajectory_cores();
    let mut jobs_in_order: Vec<String> = Vec::new();
    for t in &w.trajectories {
        if !jobs_in_order.contains(&t.job) {
            jobs_in_order.push(t.job.clone());
        }
    }
    let config = EngineConfig {
        policy: policy.name().to_string(),
        static_cores: static_cores.unwrap_or(super::STATIC_CORES),
        // Simulated workers never fail: no liveness, no deadlines, no in-progress acks.
        missed_heartbeats: u32::MAX,
        settle_ms: 0,
        progress_every_ms: u64::MAX / 4,
        result_grace_ms: u64::MAX / 4,
        task_pools: jobs_in_order,
        job_weights: w.job_weights.clone(),
        fair_share: !w.queue_order,
        job_caps: w.job_caps.clone(),
        static_trajectories: Some(w.trajectories.len() as u32),
        image_locality: image_load_ms.is_some(),
        image_load_ms: image_load_ms.unwrap_or(0),
        pull_mb_per_s: if w.images.pull_mb_per_s > 0.0 {
            w.images.pull_mb_per_s
        } else {
            EngineConfig::default().pull_mb_per_s
        },
        ..EngineConfig::default()
    };
    let pool: u32 = w.nodes.iter().sum();
    let mut d = Driver {
        w,
        engine: Engine::with_policy(config, policy),
        elasticity,
        heap: BinaryHeap::new(),
        seq: 0,
        trajs: vec![Traj::default(); w.trajectories.len()],
        jobs: w
            .trajectories
            .iter()
            .map(|t| JobId::new(t.job.clone()).expect("valid job name"))
            .collect(),
        ids: (0..w.trajectories.len())
            .map(|i| TrajectoryId::new(format!("t{i}")).expect("valid id"))
            .collect(),
        has_cpu: w
            .trajectories
            .iter()
            .map(|t| t.steps.iter().any(|s| s.action.call == SimCall::Cpu))
            .collect(),
        started: HashMap::new(),
        ready: HashMap::new(),
        restore_ms: w
            .services
            .iter()
            .map(|s| (s.name.clone(), s.restore_ms as f64))
            .collect(),
        slots: w
            .services
            .iter()
            .map(|s| (s.name.clone(), s.slots.max(1)))
            .collect(),
        tick_at: None,
        report: SimReport {
            policy: sim.label().to_string(),
            actions: Vec::new(),
            step_time_ms: 0.0,
            reserved_core_ms: 0.0,
            used_core_ms: 0.0,
            utilisation: Vec::new(),
            pool_cores: pool,
            unit: "cpu",
            timeline: super::Timeline::with_quotas(
                w.providers
                    .iter()
                    .map(|p| (p.name.clone(), p.rate_per_s))
                    .collect(),
            ),
        },
        stats: SimStats::default(),
        static_cores,
        pod_start_ms: sim.pod_start_ms(),
        last_end: 0.0,
        next_delivery: 1,
        node_images: vec![Default::default(); w.nodes.len()],
        resident: BTreeMap::new(),
    };
    let first = w
        .trajectories
        .iter()
        .map(|t| t.start_ms)
        .fold(f64::INFINITY, f64::min);
    let start = if first.is_finite() {
        first.min(0.0)
    } else {
        0.0
    };
    let fx = d
        .engine
        .handle_all(d.heartbeats(), Now::virtual_ms(start.max(0.0) as u64));
    d.effects(fx, start);
    d.stats.gpus = d.engine.gpus().gpus().0;
    d.resident = d.resident_now();
    for (i, t) in w.trajectories.iter().enumerate() {
        if !t.steps.is_empty() {
            d.push(t.start_ms, Kind::Start(i));
        }
    }
    d.run_loop();
    d.report.step_time_ms = if first.is_finite() {
        d.last_end - first
    } else {
        0.0
    };
    (d.report, d.stats)
}

impl Driver<'_> {
    fn push(&mut self, at_ms: f64, kind: Kind) {
        self.heap.push(Timed {
            at_ms,
            seq: self.seq,
            kind,
        });
        self.seq += 1;
    }

    fn run_loop(&mut self) {
        let mut resident_since = 0.0f64;
        while let Some(ev) = self.heap.pop() {
            let now = ev.at_ms;
            // GPU-ms held by resident replicas since the last event.
            let resident = self.engine.gpus().gpus().1;
            self.stats.gpu_reserved_ms += resident as f64 * (now - resident_since).max(0.0);
            for (service, &gpus) in &self.resident {
                self.report.timeline.level(
                    Track::Resident(service.clone()),
                    resident_since,
                    now,
                    gpus as f64,
                );
            }
            resident_since = now;
            let mut batch = vec![ev];
            while self.heap.peek().is_some_and(|e| e.at_ms <= now) {
                batch.push(self.heap.pop().expect("peeked"));
            }
            let mut events = Vec::new();
            for ev in batch {
                self.event(ev.kind, now, &mut events);
            }
            if events.is_empty() {
                continue;
            }
            let fx = self.engine.handle_all(events, Now::virtual_ms(now as u64));
            self.effects(fx, now);
            if self.stats.gpus > 0 {
                self.resident = self.resident_now();
                let resident = self.engine.gpus().gpus().1;
                self.stats
                    .gpu_utilisation
                    .push((now, resident as f64 / self.stats.gpus as f64));
            }
            if self.report.pool_cores > 0 {
                let held: u32 = self.engine.booked().values().map(|b| b.0).sum();
                self.report
                    .utilisation
                    .push((now, held as f64 / self.report.pool_cores as f64));
            }
            if self.trajs.iter().all(|t| t.done) {
                break;
            }
        }
    }

    /// GPUs held by each service's resident replicas, every declared service listed.
    fn resident_now(&self) -> BTreeMap<String, u32> {
        let mut out: BTreeMap<String, u32> = self
            .w
            .services
            .iter()
            .map(|s| (s.name.clone(), 0))
            .collect();
        for r in self
            .engine
            .gpus()
            .replicas()
            .iter()
            .filter(|r| r.is_resident())
        {
            *out.entry(r.service.clone()).or_default() += r.chunk.len as u32;
        }
        out
    }

    fn event(&mut self, kind: Kind, now: f64, events: &mut Vec<Event>) {
        match kind {
            Kind::Start(t) => {
                let spec = &self.w.trajectories[t];
                self.trajs[t].due_ms = spec.start_ms + spec.steps[0].think_ms;
                if self.has_cpu[t] {
                    let open = SandboxOpen {
                        image: self.w.images.of(t).map(|(r, _)| r.to_string()),
                        ..SandboxOpen::default()
                    };
                    let a = self.action(t, "open", ActionSpec::SandboxOpen(open));
                    events.push(self.arrival(a, None));
                } else {
                    let due = self.trajs[t].due_ms;
                    self.push(due, Kind::Submit(t));
                }
            }
            Kind::Submit(t) => {
                let step = &self.w.trajectories[t].steps[self.trajs[t].next];
                let a = &step.action;
                let spec = match &a.call {
                    SimCall::Cpu => ActionSpec::SandboxExec(SandboxExec {
                        argv: vec![a.tool.clone()],
                        cpus: a.cores,
                        ..Default::default()
                    }),
                    SimCall::Reward { service } => ActionSpec::Reward(Reward {
                        service: service.clone(),
                        inputs: vec!["x".into()],
                        options: Default::default(),
                    }),
                    SimCall::Api { provider } => ActionSpec::Api(Api {
                        provider: provider.clone(),
                        method: "GET".into(),
                        path: "/".into(),
                        query: Default::default(),
                        body: None,
                        headers: Default::default(),
                    }),
                };
                let model = match (&a.call, self.elasticity) {
                    (SimCall::Cpu, Elasticity::Oracle) => Some(ElasticModel {
                        t1_ms: a.t1_ms,
                        speedup: a.speedup.clone(),
                    }),
                    _ => None,
                };
                let step_no = self.trajs[t].next;
                let action = self.action(t, &format!("s{step_no}"), spec);
                events.push(self.arrival(action, model));
            }
            Kind::Done(r, version) => {
                if self
                    .started
                    .get(&r.id)
                    .is_some_and(|s| s.version != version)
                {
                    return; // re-sized since: its completion moved
                }
                let next = self.completed(&r, now);
                events.push(Event::Result(r));
                events.extend(next);
            }
            Kind::Tick => {
                if self.tick_at.is_some_and(|t| t <= now) {
                    self.tick_at = None;
                }
                events.push(Event::Tick);
            }
        }
    }

    fn action(&self, t: usize, what: &str, spec: ActionSpec) -> Action {
        Action {
            queue_timeout_ms: None,
            id: ActionId::new(format!("t{t}-{what}")).expect("valid id"),
            job: self.jobs[t].clone(),
            trajectory: self.ids[t].clone(),
            timeout_ms: 3_600_000,
            spec,
        }
    }

    fn arrival(&mut self, action: Action, model: Option<ElasticModel>) -> Event {
        let delivery = self.next_delivery;
        self.next_delivery += 1;
        Event::Arrived(Box::new(Arrival {
            action,
            encoding: Encoding::Msgpack,
            submitted_at_us: 0,
            delivery,
            seen: false,
            model,
            dispatched: None,
            bytes: 0,
            redelivered: false,
        }))
    }

    fn traj_of(id: &ActionId) -> usize {
        let s = id.as_str();
        s[1..s.find('-').expect("sim ids are t<i>-<what>")]
            .parse()
            .expect("sim ids are t<i>-<what>")
    }

    /// Carries out the engine's effects at `now`: dispatches are stored at once and run.
    fn effects(&mut self, mut fx: Vec<Effect>, now: f64) {
        loop {
            let mut follow = Vec::new();
            for e in fx {
                match e {
                    Effect::Dispatch { worker, dispatch } => {
                        follow.push(Event::DispatchStored {
                            id: dispatch.action.id.clone(),
                            attempt: dispatch.attempt,
                            seq: 0,
                        });
                        self.execute(&worker, &dispatch, now);
                    }
                    Effect::Reject(r) => {
                        if let Some(id) =
                            r.message.id.as_deref().and_then(|i| ActionId::new(i).ok())
                        {
                            self.stop(Self::traj_of(&id), now);
                        }
                    }
                    Effect::PublishResult { result, .. } => {
                        self.stop(Self::traj_of(&result.id), now)
                    }
                    Effect::WakeAt(at) => {
                        let at = at as f64;
                        // Far-off wakes are the liveness and deadline timers of workers that
                        // never fail: the run ends long before.
                        if at < 1e12 && self.tick_at.is_none_or(|t| at < t) {
                            self.tick_at = Some(at);
                            self.push(at.max(now), Kind::Tick);
                        }
                    }
                    // The simulator knows every action it dispatched: it never adopts.
                    Effect::FetchDispatch { id, .. } => {
                        follow.push(Event::AdoptFailed { id });
                    }
                    Effect::Regrant { regrant, .. } => {
                        self.resize(&regrant.id, regrant.grant.cores, now)
                    }
                    // Simulated workers never fail, so none is ever fenced; simulated runs
                    // set no idle timeout and renew no lease, so the engine closes nothing.
                    Effect::Fence { .. }
                    | Effect::Submit(_)
                    | Effect::Ack(_)
                    | Effect::Nak(_)
                    | Effect::Progress(_)
                    | Effect::Observe(_) => {}
                }
            }
            if follow.is_empty() {
                break;
            }
            fx = self.engine.handle_all(follow, Now::virtual_ms(now as u64));
        }
    }

    fn stop(&mut self, t: usize, now: f64) {
        if !self.trajs[t].done {
            self.stats.unserved += 1;
            self.finish(t, now);
        }
    }

    fn finish(&mut self, t: usize, now: f64) {
        let tr = &mut self.trajs[t];
        tr.done = true;
        if let Some((cores, since)) = tr.held.take() {
            self.report.reserved_core_ms += cores as f64 * (now - since);
        }
    }
}
