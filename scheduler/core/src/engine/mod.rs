//! The decision engine: everything the scheduler decides, as a state machine with no I/O.
//!
//! `Engine::handle(event, now) -> effects`. Events are what the outside world tells the
//! scheduler (an action arrived, a message was bad, a result, a heartbeat, a dispatch was
//! stored or failed, a tick); effects are what the scheduler wants done (dispatch, reject,
//! publish a result on a worker's behalf, ack, nak, wake me at). The service turns NATS
//! messages into events and effects into NATS messages; the simulator drives the same engine
//! on a virtual clock. Time is an argument, never read here.
//!
//! The engine owns the action ledger (each action's lifecycle in
//! [`lifecycle::ActionState`], and what it holds), the queue, sandboxes
//! ([`lifecycle::SandboxState`]), the worker fleet, the learner and the cycle; the resources
//! are its pools (`pools/`: CPU cores and memory under the CPU policy, GPU chunks and
//! replicas under Evict-on-Execution, API quotas), each with its own state. See
//! `scheduler/core/README.md` for the pool interface and the lifecycle diagrams.

mod admission;
mod adopt;
mod api;
mod caps;
mod config;
mod cordon;
mod cycle;
mod events;
mod identity;
mod idle;
mod images;
pub mod intake;
pub mod lifecycle;
mod pools;
mod queue;
pub mod resize;
mod results;
mod sandboxes;
pub(crate) mod shares;
mod status;
mod workers;

use crate::model::Policy;
use lifecycle::{Entry, Sandbox, SandboxKey};
use std::collections::{BTreeMap, HashMap, VecDeque};
use tangram_shared::{Action, ActionId, ActionKind, Heartbeat, Timing, WorkerId};

pub use caps::{JobCaps, EVERY_JOB};
pub use config::{EngineConfig, UNKNOWN_IMAGE_MB};
pub use events::{
    Arrival, Delivery, Effect, Event, Now, Observation, PendingResize, Reject, WorkerGauge,
};
pub use identity::{dispatch_msg_id, latest_dispatch};
pub use idle::close_id;
pub use images::prepull_targets;
pub use intake::{check, BadMessage, RawMessage};
pub use pools::api::ApiBooking;
pub use pools::gpu::GpuBooking;

/// A worker as the engine knows it.
#[derive(Debug, Clone)]
pub(crate) struct WorkerState {
    pub(crate) hb: Heartbeat,
    pub(crate) last_seen_ms: u64,
    /// Its images by canonical reference, with their sizes (0 when unknown): those the
    /// heartbeat advertised, and those it opened a sandbox from since (it holds them now,
    /// though its heartbeat does not say so yet).
    pub(crate) images: std::collections::HashMap<String, u64>,
}

/// How many settled ids are remembered to recognise late results and resubmissions.
const SETTLED_MEMORY: usize = 100_000;
/// How often the queue by kind is reported to the metrics.
const QUEUES_EVERY_MS: u64 = 1_000;
/// Recent results kept for the status report.
const RECENT: usize = 2_000;

/// The scheduler's brain. See the module docs.
#[derive(Debug)]
pub struct Engine {
    pub(crate) config: EngineConfig,
    /// How the policy provisions cores (the CPU pool's policy's).
    pub(crate) provisioning: crate::model::Provisioning,
    pub(crate) learner: crate::learn::Learner,
    pub(crate) started_ms: Option<u64>,
    /// When NATS was last confirmed reachable ([`Event::Reachable`]); `None` until then.
    pub(crate) reachable_ms: Option<u64>,
    pub(crate) workers: BTreeMap<WorkerId, WorkerState>,
    /// Every action not yet settled, with its lifecycle state.
    pub(crate) actions: HashMap<ActionId, Entry>,
    /// Queued actions in arrival order.
    pub(crate) queue: Vec<ActionId>,
    /// Settled ids, oldest first (bounded).
    pub(crate) settled: VecDeque<ActionId>,
    pub(crate) settled_set: std::collections::HashSet<ActionId>,
    pub(crate) sandboxes: HashMap<SandboxKey, Sandbox>,
    /// The resource pools: CPU, GPU, API quota.
    pub(crate) pools: pools::Pools,
    /// Recent completed results, by kind, for the status report.
    pub(crate) recent: VecDeque<(ActionKind, Timing, u64)>,
    /// Something changed since the last plan.
    pub(crate) dirty: bool,
    /// When the queue was last reported to the metrics.
    queues_observed_ms: Option<u64>,
    /// True once `settle_ms` has passed since the first event.
    pub(crate) settled_in: bool,
    /// Workers lost less than [`EngineConfig::rejoin_ms`] ago that have not come back, with
    /// when: while any is, no action is rejected for want of capacity.
    pub(crate) departed: BTreeMap<WorkerId, u64>,
    /// Shutting down: nothing more is launched, and what cannot go ahead is handed back.
    pub(crate) stopping: bool,
    /// Holds the leader lease as far as the shell can tell ([`Event::Leadership`]): when
    /// not, nothing is planned.
    pub(crate) leading: bool,
    /// When a rate-limited action can go next.
    pub(crate) wake_at: Option<u64>,
    pub(crate) out: Vec<Effect>,
    /// Actions whose dispatch was asked for, to adopt them.
    pub(crate) adopting: std::collections::HashSet<ActionId>,
    /// The term's dispatch backlog is still being read ([`EngineConfig::await_backlog`]).
    pub(crate) backlog_pending: bool,
    /// `per-task`: opens placed so far per job, for round robin inside its pool.
    pub(crate) task_opens: HashMap<String, usize>,
    /// Worker instances declared lost, by worker: their heartbeats are ignored until the
    /// worker reports as a new instance (it fences itself on reading the fence record);
    /// with when the fence was last asked for.
    pub(crate) fenced: BTreeMap<WorkerId, (String, u64)>,
    /// Workers an operator cordoned or is draining.
    pub(crate) cordons: BTreeMap<WorkerId, cordon::Cordon>,
    /// Malleable policies: how far each elastic exec has got (see [`resize`]).
    pub(crate) progress: HashMap<ActionId, resize::Progress>,
    /// The last re-size's sequence: one more for each, so two in one millisecond are ordered.
    pub(crate) regrant_seq: u64,
    /// Malleable policies: workers where something started, ended or was stored since the
    /// last re-size (only those are re-sized).
    pub(crate) touched: std::collections::BTreeSet<WorkerId>,
    /// Idle clocks, leases and the closes the engine asked for itself ([`idle`]).
    pub(crate) idle: idle::Idle,
    /// Queued actions per job and queueing deadlines ([`admission`]).
    pub(crate) admission: admission::Admission,
}

impl Engine {
    /// An engine with no workers and an empty queue, running the policy `config` names.
    /// An unknown name is an error (it used to fall back to `tangram` without a word).
    pub fn new(config: EngineConfig) -> Result<Self, crate::policies::UnknownPolicy> {
        let policy = crate::policies::configured(&config.policy, config.static_cores)?;
        Ok(Self::with_policy(config, policy))
    }

    /// An engine running `policy` (its name in `config` is then only informative).
    pub fn with_policy(config: EngineConfig, policy: Box<dyn Policy>) -> Self {
        let cpu = pools::cpu::CpuPool::new(policy);
        let provisioning = cpu.provisioning();
        let backlog_pending = config.await_backlog;
        let api = pools::api::ApiPool::with_definitions(config.providers.clone());
        let gpu = pools::gpu::GpuPool::with_definitions(
            provisioning.malleable(),
            config.services.clone(),
        );
        Self {
            config,
            provisioning,
            learner: crate::learn::Learner::new(),
            started_ms: None,
            reachable_ms: None,
            workers: BTreeMap::new(),
            actions: HashMap::new(),
            queue: Vec::new(),
            settled: VecDeque::new(),
            settled_set: Default::default(),
            sandboxes: HashMap::new(),
            pools: pools::Pools { cpu, gpu, api },
            recent: VecDeque::new(),
            dirty: false,
            queues_observed_ms: None,
            settled_in: false,
            departed: BTreeMap::new(),
            fenced: BTreeMap::new(),
            cordons: BTreeMap::new(),
            stopping: false,
            leading: true,
            wake_at: None,
            out: Vec::new(),
            adopting: Default::default(),
            backlog_pending,
            task_opens: HashMap::new(),
            progress: HashMap::new(),
            regrant_seq: 0,
            touched: Default::default(),
            idle: Default::default(),
            admission: Default::default(),
        }
    }

    /// Applies one event and plans if anything changed.
    pub fn handle(&mut self, event: Event, now: Now) -> Vec<Effect> {
        self.handle_all(std::iter::once(event), now)
    }

    /// Applies a burst of events, then plans once (coalescing: one cycle per burst).
    pub fn handle_all(&mut self, events: impl IntoIterator<Item = Event>, now: Now) -> Vec<Effect> {
        let started = *self.started_ms.get_or_insert(now.ms);
        if !self.settled_in && now.ms.saturating_sub(started) >= self.config.settle_ms {
            self.settled_in = true;
            self.dirty = true; // decide what was held back while settling
        }
        let rejoin = self.config.rejoin_ms;
        let before = self.departed.len();
        self.departed.retain(|_, t| now.ms < *t + rejoin);
        if self.departed.len() < before {
            self.dirty = true; // a worker did not come back: judge what waited for it
        }
        for event in events {
            self.apply(event, now);
        }
        if self.dirty {
            self.dirty = false;
            self.cycle(now);
        }
        if self
            .queues_observed_ms
            .is_none_or(|t| now.ms >= t + QUEUES_EVERY_MS)
        {
            self.queues_observed_ms = Some(now.ms);
            self.out
                .push(Effect::Observe(Observation::Queues(self.queues(now))));
            let workers = self.worker_gauges(now);
            self.out
                .push(Effect::Observe(Observation::Workers(workers)));
        }
        if let Some(at) = self.next_wake(now) {
            self.out.push(Effect::WakeAt(at));
        }
        std::mem::take(&mut self.out)
    }

    /// Whether an action may be rejected because no worker in the fleet can take it: not
    /// while settling in after start, nor while a lost worker may still come back.
    pub(crate) fn judges_capacity(&self) -> bool {
        self.settled_in && self.departed.is_empty()
    }

    fn apply(&mut self, event: Event, now: Now) {
        match event {
            Event::Arrived(a) => self.on_arrived(*a, now),
            Event::Bad(b) => self.on_bad(*b, now),
            Event::Result(r) => self.on_result(*r, now),
            Event::Heartbeat(hb) => self.on_heartbeat(*hb, now),
            Event::DispatchStored { id, attempt, seq } => {
                self.on_dispatch_stored(&id, attempt, seq, now)
            }
            Event::DispatchFailed { id, attempt, .. } => self.on_dispatch_failed(&id, attempt, now),
            Event::Tick => self.on_tick(now),
            Event::Reachable => self.on_reachable(now),
            Event::Leadership { held } => {
                if held && !self.leading {
                    self.dirty = true; // plan what waited while the lease was in doubt
                    self.leases_restart(now); // renewals meanwhile did not reach it
                }
                self.leading = held;
            }
            Event::Shutdown => self.on_shutdown(),
            Event::Adopt { worker, dispatch } => {
                let found = adopt::Found::Fetched;
                self.adopt(worker, *dispatch, None, found, now)
            }
            Event::AdoptStored {
                worker,
                dispatch,
                seq,
                resize,
            } => {
                let found = adopt::Found::Backlog { seq, resize };
                self.adopt(worker, *dispatch, None, found, now)
            }
            Event::AdoptFailed { id } => self.on_adopt_failed(&id),
            Event::BacklogRead => {
                self.backlog_pending = false;
                self.dirty = true;
            }
            Event::Cordon { worker, cordon } => {
                self.on_cordon(worker, cordon.map(|c| c.drain_by_unix_ms), now)
            }
            Event::Lease { job, ttl_ms } => self.on_lease(job, ttl_ms, now),
        }
    }

    /// The earliest time something is due: a rate-limited action, a deadline, a worker's
    /// grace, an in-progress ack, the end of settling.
    fn next_wake(&self, now: Now) -> Option<u64> {
        let mut at = self.wake_at;
        let mut earliest = |t: u64| at = Some(at.map_or(t, |a: u64| a.min(t)));
        if !self.settled_in {
            if let Some(s) = self.started_ms {
                earliest(s + self.config.settle_ms);
            }
        }
        if let Some(t) = self.departed.values().min() {
            earliest(t + self.config.rejoin_ms);
        }
        for w in self.workers.values() {
            earliest(w.last_seen_ms + self.grace_ms(&w.hb) + 1);
        }
        if let Some(t) = self.next_drain_ms() {
            earliest(t);
        }
        if let Some(t) = self.next_idle_ms() {
            earliest(t);
        }
        if let Some(t) = self.next_queue_deadline_ms() {
            earliest(t);
        }
        for e in self.actions.values() {
            if let Some(t) = e.due_ms(self.config.progress_every_ms) {
                earliest(t);
            }
        }
        at.map(|t| t.max(now.ms))
    }

    /// How long a worker may stay silent before it is declared lost.
    pub(crate) fn grace_ms(&self, hb: &Heartbeat) -> u64 {
        hb.interval_ms.max(100) * self.config.missed_heartbeats as u64
    }

    /// An action's elasticity: the one it was given (the simulator's oracle), else what the
    /// learner holds for its (job, tool) key.
    pub(crate) fn model_of(&self, e: &Entry) -> Option<crate::elastic::ElasticModel> {
        e.model
            .clone()
            .or_else(|| learn_key(&e.action).and_then(|k| self.learner.model(&k)))
    }

    /// Keys the elasticity learner holds (bounded by [`crate::learn::MAX_KEYS`]).
    pub fn learned_keys(&self) -> usize {
        self.learner.len()
    }

    /// The policy's name.
    pub fn policy_name(&self) -> &'static str {
        self.pools.cpu.policy_name()
    }

    /// Actions not yet settled (queued, dispatching or running).
    pub fn unsettled(&self) -> usize {
        self.actions.len()
    }

    /// An action's lifecycle state, if it is not settled.
    pub fn state_of(&self, id: &ActionId) -> Option<&lifecycle::ActionState> {
        self.actions.get(id).map(|e| &e.state)
    }

    /// True when this id was settled (and is still remembered).
    pub fn is_settled(&self, id: &ActionId) -> bool {
        self.settled_set.contains(id)
    }

    /// Whether this engine plans: it holds the leader lease as far as it knows.
    pub fn is_leading(&self) -> bool {
        self.leading
    }

    /// Actions whose dispatch is handed out and not yet known to be stored or not: a
    /// stopping shell waits for these to reach zero before it exits.
    pub fn dispatching_count(&self) -> usize {
        self.actions
            .values()
            .filter(|e| matches!(e.state, lifecycle::ActionState::Dispatching { .. }))
            .count()
    }

    /// Queued actions, in arrival order.
    pub fn queued(&self) -> &[ActionId] {
        &self.queue
    }

    /// A sandbox's state.
    pub fn sandbox(
        &self,
        job: &tangram_shared::JobId,
        trajectory: &tangram_shared::TrajectoryId,
    ) -> Option<&Sandbox> {
        self.sandboxes.get(&(job.clone(), trajectory.clone()))
    }

    /// Cores and memory booked per worker by launched sandbox actions and held sandboxes
    /// (workers with none booked are absent): what the snapshot subtracts from the workers'
    /// capacity.
    pub fn booked(&self) -> BTreeMap<WorkerId, (u32, u64)> {
        self.used()
            .into_iter()
            .map(|(w, u)| (w.clone(), u))
            .collect()
    }

    /// Workers known alive.
    pub fn workers(&self) -> impl Iterator<Item = (&WorkerId, &Heartbeat)> {
        self.workers.iter().map(|(id, w)| (id, &w.hb))
    }

    /// The GPU manager (read only).
    pub fn gpus(&self) -> &crate::gpu::Eoe {
        self.pools.gpu.eoe()
    }

    /// Marks an id settled: remembered for late results and resubmissions.
    pub(crate) fn remember_settled(&mut self, id: ActionId) {
        if self.settled_set.insert(id.clone()) {
            self.settled.push_back(id);
            while self.settled.len() > SETTLED_MEMORY {
                if let Some(old) = self.settled.pop_front() {
                    self.settled_set.remove(&old);
                }
            }
        }
    }

    pub(crate) fn push_recent(&mut self, kind: ActionKind, timing: Timing, now: Now) {
        self.recent.push_back((kind, timing, now.ms));
        while self.recent.len() > RECENT {
            self.recent.pop_front();
        }
    }
}

/// The key under which an exec's elasticity is learned: its job and the program it runs
/// (`argv[0]` without its directory, or the module for `python -m`).
pub fn learn_key(action: &Action) -> Option<String> {
    let tangram_shared::ActionSpec::SandboxExec(e) = &action.spec else {
        return None;
    };
    let prog = bounded(e.argv.first()?.rsplit('/').next()?);
    let tool = match (
        prog.starts_with("python"),
        e.argv.get(1).map(String::as_str),
        e.argv.get(2),
    ) {
        (true, Some("-m"), Some(module)) => format!("{prog} -m {}", bounded(module)),
        _ => prog,
    };
    Some(format!("{}/{tool}", action.job))
}

/// A program or module name as part of a learner key: at most 64 characters (a rollout may
/// send anything as `argv[0]`).
fn bounded(s: &str) -> String {
    s.chars().take(64).collect()
}
