//! What crosses the engine's boundary: events in, effects out, and the clock.

use crate::elastic::ElasticModel;
use tangram_shared::codec::Encoding;
use tangram_shared::{
    Action, ActionId, ActionKind, ActionResult, Dispatch, Heartbeat, JobId, Timing, WorkerId,
};

/// The time of an event: a monotonic millisecond clock for decisions, and wall-clock time for
/// the timestamps written into results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Now {
    /// Monotonic milliseconds (any origin; the service counts from its start).
    pub ms: u64,
    /// Wall-clock time, microseconds since the Unix epoch.
    pub unix_us: u64,
}

impl Now {
    /// A virtual clock where wall time is the monotonic time (simulations, tests).
    pub fn virtual_ms(ms: u64) -> Self {
        Self {
            ms,
            unix_us: ms * 1000,
        }
    }
}

/// The service's handle on an action message, to ack or nak it: its stream sequence. A
/// redelivery of the same message has the same one.
pub type Delivery = u64;

/// An action that passed validation.
#[derive(Debug, Clone, PartialEq)]
pub struct Arrival {
    /// The action.
    pub action: Action,
    /// The encoding its result is written in.
    pub encoding: Encoding,
    /// When the rollout published it (the stream's timestamp), µs since the Unix epoch.
    pub submitted_at_us: u64,
    /// Its message.
    pub delivery: Delivery,
    /// True when a result for this id is already stored (a resubmission outside the
    /// stream's duplicate window): the intake looks that up off the engine's path.
    pub seen: bool,
    /// Its elasticity when the caller knows it (the simulator's oracle); otherwise the
    /// learner's model for its (job, tool) key.
    pub model: Option<ElasticModel>,
    /// For a redelivery: the dispatch stored for this action already, if any (an earlier
    /// leader dispatched it and ended before acking the message), with its worker.
    pub dispatched: Option<Box<(WorkerId, Dispatch)>>,
    /// The size of its message, bytes (what it takes of the intake gate).
    pub bytes: u32,
    /// Its message was delivered before (to this or an earlier leader, which admitted it):
    /// it is not refused for its job's cap of queued actions.
    pub redelivered: bool,
}

/// What the outside world tells the engine.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A valid action message.
    Arrived(Box<Arrival>),
    /// A message that will never be scheduled.
    Bad(Box<super::BadMessage>),
    /// A result (from a worker, or one the engine published itself).
    Result(Box<ActionResult>),
    /// A worker's heartbeat.
    Heartbeat(Box<Heartbeat>),
    /// A dispatch is durable in the stream.
    DispatchStored {
        /// The action.
        id: ActionId,
        /// The attempt the dispatch carried.
        attempt: u32,
        /// Its sequence in the dispatch stream (0 when unknown: then the worker's omission
        /// of it is judged after a grace instead).
        seq: u64,
    },
    /// A dispatch could not be stored.
    DispatchFailed {
        /// The action.
        id: ActionId,
        /// The attempt the dispatch carried.
        attempt: u32,
        /// Why, for the log.
        error: String,
    },
    /// Time passed: liveness, deadlines, in-progress acks.
    Tick,
    /// A round trip to NATS just succeeded (the leader lease was renewed): what this
    /// scheduler saw of the workers until now was not its own silence. Sent about every
    /// [`crate::EngineConfig::reachable_every_ms`]; an engine never sent one judges worker
    /// liveness by the clock alone.
    Reachable,
    /// Whether this scheduler holds the leader lease as far as it can tell: `false` when its
    /// fence fell (renewals unanswered for three quarters of the lease: another scheduler
    /// may lead now), `true` when a renewal went through again. While not leading the
    /// engine plans nothing (no launch, re-size or rejection goes out; what waits stays
    /// queued in its place) but keeps its table, acks in progress and takes results, so a
    /// leader whose fence comes back goes on where it was. Engines start leading.
    Leadership {
        /// The lease is held.
        held: bool,
    },
    /// The scheduler is stopping: hand queued actions back.
    Shutdown,
    /// The stored dispatch of an action a worker reports running, fetched because this
    /// engine asked ([`Effect::FetchDispatch`]).
    Adopt {
        /// The worker that runs it.
        worker: WorkerId,
        /// Its dispatch, as stored.
        dispatch: Box<Dispatch>,
    },
    /// A dispatch found in the dispatch backlog when the term began: stored, no result
    /// stored for it, and perhaps not yet taken in by its worker (or its worker is gone for
    /// good, and the result deadline settles it).
    AdoptStored {
        /// The worker it is addressed to.
        worker: WorkerId,
        /// Its dispatch, as stored.
        dispatch: Box<Dispatch>,
        /// Its stream sequence (a heartbeat's dispatch sequence past it means delivered).
        seq: u64,
        /// The last re-size stored for it after the dispatch and not yet taken by the worker
        /// (still in the backlog), if any.
        resize: Option<PendingResize>,
    },
    /// The term's dispatch backlog has been read: every dispatch in it was handed over as
    /// [`Event::AdoptStored`] (see [`crate::EngineConfig::await_backlog`]).
    BacklogRead,
    /// No dispatch was found for an action asked about.
    AdoptFailed {
        /// The action.
        id: ActionId,
    },
    /// An operator cordoned or drained a worker (`Some`), or uncordoned it (`None`).
    Cordon {
        /// The worker.
        worker: WorkerId,
        /// The record as stored.
        cordon: Option<tangram_shared::status::CordonRecord>,
    },
    /// A rollout renewed its job's lease (`tangram.v1.lease.<job>`).
    Lease {
        /// The job.
        job: JobId,
        /// How long it lasts from now, ms (bounded by the engine).
        ttl_ms: u64,
    },
}

/// What the engine wants done.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Publish a dispatch to its worker, then report `DispatchStored` or `DispatchFailed`.
    Dispatch {
        /// The worker.
        worker: WorkerId,
        /// The decision.
        dispatch: Box<Dispatch>,
    },
    /// Change the cores of a dispatched exec (malleable policies): the worker widens or
    /// narrows its cpuset and quota while it runs. Advisory: a worker that has finished the
    /// action, or never got it, ignores it, and the result settles the booking as usual.
    Regrant {
        /// The worker.
        worker: WorkerId,
        /// What to publish on [`tangram_shared::subject::regrant`].
        regrant: tangram_shared::Regrant,
    },
    /// Store a dead-letter record of the message, then (when `addressable`) publish the
    /// rejection result, then ack the message.
    Reject(Box<Reject>),
    /// Publish a result on a worker's behalf (the worker is gone or never answered).
    PublishResult {
        /// The result.
        result: Box<ActionResult>,
        /// Its encoding.
        encoding: Encoding,
    },
    /// Ack an action message (its dispatch is durable, or it needs nothing more).
    Ack(Delivery),
    /// Hand an action message back for redelivery.
    Nak(Delivery),
    /// Tell JetStream the message is still being worked on.
    Progress(Delivery),
    /// Call `handle(Event::Tick, ..)` at this monotonic time at the latest.
    WakeAt(u64),
    /// Something worth counting (metrics).
    Observe(Observation),
    /// Record durably that this worker instance was declared lost (the fence record it
    /// reads): it drops its sandboxes and running actions, and rejoins as a new instance.
    Fence {
        /// The worker.
        worker: WorkerId,
        /// The instance declared lost.
        instance: String,
    },
    /// Publish an action of the scheduler's own (a `sandbox_close` with a reason) on its
    /// job's action subject, with its id as the message id: it comes back through the
    /// stream like any rollout's, and its result reaches the job's results subject.
    Submit(Box<Action>),
    /// Fetch the stored dispatch of an action a worker reports running and this engine does
    /// not know; answer with [`Event::Adopt`] or [`Event::AdoptFailed`].
    FetchDispatch {
        /// The worker reporting it.
        worker: WorkerId,
        /// The action.
        id: ActionId,
    },
}

/// A rejected message, whom to tell, and what to tell them.
#[derive(Debug, Clone, PartialEq)]
pub struct Reject {
    /// The message and why.
    pub message: super::BadMessage,
    /// The rejection result to publish after the dead-letter record, when the submitter can
    /// be addressed.
    pub result: Option<ActionResult>,
}

/// One live worker, as the metrics read it.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerGauge {
    /// Its id.
    pub worker: WorkerId,
    /// Since its last heartbeat, seconds.
    pub heartbeat_age_s: f64,
    /// Cores it grants.
    pub cores: u32,
    /// Cores booked by what runs there.
    pub cores_booked: u32,
    /// Memory for sandboxes, MiB.
    pub mem_mb: u64,
    /// Memory open sandboxes reserve, MiB.
    pub mem_booked_mb: u64,
}

/// Metrics the engine reports; the service owns their names.
#[derive(Debug, Clone, PartialEq)]
pub enum Observation {
    /// An action (or an undecodable message: `None`) was received.
    Received(Option<ActionKind>),
    /// A resubmission was dropped.
    Duplicate,
    /// A message was rejected, by code.
    Rejected(&'static str),
    /// A dispatch was stored, with the action's time in the queue.
    Dispatched {
        /// Kind.
        kind: ActionKind,
        /// Arrival to dispatch stored, seconds.
        queued_s: f64,
    },
    /// A result was seen, by outcome label and failure code (`none` unless rejected or an
    /// infrastructure error).
    Result {
        /// [`tangram_shared::Outcome::label`].
        outcome: &'static str,
        /// [`tangram_shared::Outcome::code_label`].
        code: &'static str,
    },
    /// The first result of an action of a known kind, with where its time went (every
    /// outcome: a failure's time counts as much as a success's).
    Act {
        /// Kind.
        kind: ActionKind,
        /// Queued, overhead and execution, as the worker measured them.
        timing: Timing,
    },
    /// The live workers, in id order (with the queues, at most once a second).
    Workers(Vec<WorkerGauge>),
    /// A running action taken over from an earlier leader.
    Adopted(ActionKind),
    /// A worker was declared lost.
    WorkerLost,
    /// A heartbeat from a fenced worker instance was ignored.
    FencedHeartbeat,
    /// Workers cordoned or being drained now.
    Cordons(usize),
    /// NATS answered again after a gap this long, ms: worker graces and result deadlines
    /// were restarted rather than judged on silence nobody could hear.
    Unreachable {
        /// The gap between two confirmations that NATS answered.
        gap_ms: u64,
    },
    /// The queue by kind (at most once a second): depth, oldest wait, estimated wait.
    Queues(std::collections::BTreeMap<String, tangram_shared::status::QueueStatus>),
    /// One planning cycle.
    Cycle {
        /// Actions queued.
        queued: usize,
        /// Actions dispatching or running.
        running: usize,
        /// Workers alive.
        workers: usize,
    },
    /// A reward action was routed.
    GpuRoute {
        /// Service.
        service: String,
        /// The route restores the replica.
        restore: bool,
        /// Replicas evicted for it.
        evictions: usize,
    },
    /// GPUs in the fleet and GPUs resident.
    Gpus {
        /// All.
        total: u32,
        /// Held by resident replicas.
        resident: u32,
    },
    /// A provider's state after admission.
    Provider {
        /// Provider.
        name: String,
        /// Adaptive rate, per second.
        rate: f64,
        /// In flight.
        inflight: u32,
        /// Waiting.
        waiting: usize,
    },
    /// A worker's declaration of a fleet-wide definition (a provider's quota) differs from the
    /// one in force: it was refused, and the worker is not given its calls.
    DeclarationRefused {
        /// What was declared (`provider`).
        kind: &'static str,
        /// Its name.
        name: String,
        /// The worker.
        worker: WorkerId,
    },
    /// The scheduler asked to close a sandbox no rollout closed, for this reason.
    Closing(tangram_shared::CloseReason),
    /// An api action was admitted.
    ApiAdmitted {
        /// Provider.
        provider: String,
        /// Job.
        job: String,
    },
}

/// A re-size an earlier leader stored for a dispatch, found in the backlog: its worker has not
/// taken it yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingResize {
    /// The width it sets.
    pub cores: u32,
    /// Its sequence in the dispatch stream: a heartbeat's `dispatch_seq` at or past it says
    /// the worker has taken it in (applied it, in full or as far as its spare cores went, or
    /// dropped it as an older epoch's).
    pub seq: u64,
    /// The epoch of the leader that sent it: a worker whose heartbeat knows a newer one drops
    /// it if it has not applied it, so its report decides.
    pub epoch: u64,
}
