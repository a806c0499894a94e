//! The lifecycles the engine tracks, as enums: one per action, one per sandbox. Their
//! diagrams, with every transition and what causes it, are in `scheduler/core/README.md`
//! ("Lifecycles"), the one place for them.

use crate::elastic::ElasticModel;
use tangram_shared::codec::Encoding;
use tangram_shared::{Action, ActionId, Grant, JobId, TrajectoryId, WorkerId};

/// Where an action is in its life. Settled actions leave the table (their ids are
/// remembered for a while to recognise late results and resubmissions).
#[derive(Debug, Clone, PartialEq)]
pub enum ActionState {
    /// Waiting for capacity, in arrival order.
    Queued {
        /// When the last in-progress ack was asked for.
        last_progress_ms: u64,
    },
    /// Out of the queue after its dispatch failed to be stored twice or more in a row, until
    /// `until_ms`, so that a NATS that refuses stores is not hammered; then queued again in
    /// its arrival place.
    Backoff {
        /// Back into the queue at this time.
        until_ms: u64,
        /// When the last in-progress ack was asked for.
        last_progress_ms: u64,
    },
    /// A dispatch was handed to the service and is not yet durable. Its capacity is booked
    /// already (assumed), so no later cycle can give it away; a failed store gives it back.
    Dispatching {
        /// Where.
        worker: WorkerId,
        /// With what.
        booking: Booking,
        /// The dispatch's attempt number (1 for the first).
        attempt: u32,
        /// When it was handed over.
        since_ms: u64,
    },
    /// The dispatch is durable; the worker runs it.
    Running {
        /// Where.
        worker: WorkerId,
        /// With what.
        booking: Booking,
        /// The dispatch's attempt number.
        attempt: u32,
        /// When the dispatch was stored.
        stored_ms: u64,
        /// Its sequence in the dispatch stream (0: unknown).
        stored_seq: u64,
        /// No result by then: the action is settled as lost.
        deadline_ms: u64,
        /// When the worker was first seen to have taken in the dispatch stream past it.
        delivered_ms: Option<u64>,
        /// Whether a heartbeat listed it (or it was adopted from one): it certainly reached
        /// the worker, so an omission counts at once.
        listed_once: bool,
        /// Heartbeats in a row (counted from a redelivery window after `delivered_ms`) that
        /// did not list it.
        unreported: u8,
        /// Adopted from an earlier leader and not re-sized by this one since: the cores its
        /// worker reports for it (`Heartbeat::resized`) are what it holds.
        adopted: bool,
        /// While adopted: the last re-size the earlier leader stored and the worker had not
        /// taken when the backlog was read. Its width is what the exec holds until the worker
        /// has taken it in; from then on, what the worker reports (see [`PendingWidth`]).
        pending: Option<PendingWidth>,
    },
}

/// An adopted exec's re-size on its way to its worker. The worker takes its dispatch subject
/// in stream order, so it applies the re-size before anything this leader sends it, and an
/// earlier leader's last widths fit the worker together (its bookings did): the pending width
/// is booked. Booking what the worker reported instead let a widening on its way take cores
/// given to a new exec; booking the larger of the two booked a narrowing's cores twice. Once
/// the worker's dispatch sequence is past the re-size (or it reports running at its width, or
/// knows an epoch newer than the re-size's, so that it drops the re-size if it has not
/// applied it), the report decides: a widening the worker could apply only in part, or a
/// re-size it dropped, is booked as it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingWidth {
    /// The width the re-size sets.
    pub cores: u32,
    /// Its sequence in the dispatch stream.
    pub seq: u64,
    /// The width the worker ran it at before (reported, or the dispatch's grant).
    pub before: u32,
    /// The epoch of the leader that sent it.
    pub epoch: u64,
}

/// What a worker's last heartbeat says of an adopted exec's width.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct WidthReport {
    /// Its `resized` entry for the exec.
    pub(crate) reported: Option<u32>,
    /// How far it has taken its dispatch subject in.
    pub(crate) dispatch_seq: u64,
    /// The newest epoch it knows.
    pub(crate) known_epoch: u64,
}

impl WidthReport {
    /// What `hb` says of exec `id`.
    pub(crate) fn of(hb: &tangram_shared::Heartbeat, id: &ActionId) -> Self {
        WidthReport {
            reported: hb.resized.get(id).copied(),
            dispatch_seq: hb.dispatch_seq,
            known_epoch: hb.known_epoch,
        }
    }
}

impl PendingWidth {
    /// The width an adopted exec holds after its worker's report; `None` leaves the booking
    /// as it is. Clears `pending` once the worker has taken the re-size in or will drop it.
    pub(crate) fn settle(pending: &mut Option<PendingWidth>, report: WidthReport) -> Option<u32> {
        let WidthReport {
            reported,
            dispatch_seq,
            known_epoch,
        } = report;
        let Some(p) = *pending else {
            return reported;
        };
        let taken = (p.seq > 0 && dispatch_seq >= p.seq)
            || reported == Some(p.cores)
            || p.epoch < known_epoch;
        if taken {
            *pending = None;
            Some(reported.unwrap_or(p.before))
        } else {
            Some(p.cores)
        }
    }
}

impl ActionState {
    /// Queued or backing off: holding nothing, waiting to be launched.
    pub fn is_waiting(&self) -> bool {
        matches!(
            self,
            ActionState::Queued { .. } | ActionState::Backoff { .. }
        )
    }
}

/// What a launched action holds until it settles: its part of one pool.
#[derive(Debug, Clone, PartialEq)]
pub enum Booking {
    /// A sandbox action's cores and memory on its worker.
    Cpu(CpuBooking),
    /// A reward action's replica: service and chunk.
    Gpu(super::GpuBooking),
    /// An api action's provider quota.
    Api(super::ApiBooking),
    /// Nothing this engine gives back: a reward or api action adopted from an earlier
    /// leader (which booked its slot or quota), or a replica slot whose replica is gone.
    Nothing,
}

/// What a sandbox action holds of the CPU pool.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CpuBooking {
    /// Cores and memory on the worker, as its dispatch grants them.
    pub grant: Grant,
    /// Cores counted against the worker (0 for an open, whose sandbox holds what it takes,
    /// and for an exec under `static`, which runs on its sandbox's cores).
    pub counted_cores: u32,
}

impl CpuBooking {
    /// Re-sized (or corrected by its worker's report) to `cores`; the counted cores follow
    /// unless none are counted. Whether the grant changed.
    pub(crate) fn set_cores(&mut self, cores: u32) -> bool {
        if self.counted_cores > 0 {
            self.counted_cores = cores;
        }
        let changed = self.grant.cores != cores;
        self.grant.cores = cores;
        changed
    }
}

impl Booking {
    /// Its cores and memory, for a sandbox action.
    pub fn cpu(&self) -> Option<&CpuBooking> {
        match self {
            Booking::Cpu(c) => Some(c),
            _ => None,
        }
    }

    pub(crate) fn cpu_mut(&mut self) -> Option<&mut CpuBooking> {
        match self {
            Booking::Cpu(c) => Some(c),
            _ => None,
        }
    }

    /// Cores counted against its worker.
    pub fn counted_cores(&self) -> u32 {
        self.cpu().map_or(0, |c| c.counted_cores)
    }
}

/// One action the engine has not settled.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// The action.
    pub action: Action,
    /// Its result's encoding.
    pub encoding: Encoding,
    /// Published at, µs since the Unix epoch.
    pub submitted_at_us: u64,
    /// Its message, acked once the dispatch is durable.
    pub delivery: super::Delivery,
    /// Arrived at (engine clock).
    pub arrived_ms: u64,
    /// A given elasticity model (the simulator's oracle).
    pub model: Option<ElasticModel>,
    /// Dispatch attempts made so far.
    pub attempts: u32,
    /// Dispatch stores that failed in a row (the next attempt waits longer each time).
    pub failures: u32,
    /// The only worker it may go to, when a baseline confines it (`per-task` opens) or a
    /// failed store may have reached that worker after all.
    pub pin: Option<WorkerId>,
    /// When a failed store pinned it: the pin is lifted once the worker has reported long
    /// enough without the action ([`Engine::release_pins`](super::Engine)), so that a full
    /// worker cannot hold it forever.
    pub pinned_since_ms: Option<u64>,
    /// Where it is.
    pub state: ActionState,
    /// The size of its message, bytes (0 for one adopted from a heartbeat).
    pub bytes: u32,
}

impl Entry {
    /// When this entry next needs the engine's attention: an in-progress ack or a deadline.
    pub(crate) fn due_ms(&self, progress_every_ms: u64) -> Option<u64> {
        match &self.state {
            ActionState::Queued { last_progress_ms } => Some(last_progress_ms + progress_every_ms),
            ActionState::Backoff {
                until_ms,
                last_progress_ms,
            } => Some((*until_ms).min(last_progress_ms + progress_every_ms)),
            ActionState::Dispatching { .. } => None,
            ActionState::Running { deadline_ms, .. } => Some(*deadline_ms),
        }
    }

    /// Its worker and booking, once launched.
    pub fn placed(&self) -> Option<(&WorkerId, &Booking)> {
        match &self.state {
            ActionState::Queued { .. } | ActionState::Backoff { .. } => None,
            ActionState::Dispatching {
                worker, booking, ..
            }
            | ActionState::Running {
                worker, booking, ..
            } => Some((worker, booking)),
        }
    }
}

/// A trajectory's sandbox: `(job, trajectory)`.
pub type SandboxKey = (JobId, TrajectoryId);

/// Where a sandbox is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxState {
    /// Open dispatched, container not yet confirmed.
    Opening,
    /// Ready for commands.
    Open,
    /// Close dispatched.
    Closing,
    /// Its worker was lost or restarted without it; it holds nothing. Commands for it are
    /// rejected until the trajectory opens a new one or closes it.
    Lost,
}

/// A trajectory's sandbox.
#[derive(Debug, Clone, PartialEq)]
pub struct Sandbox {
    /// The worker holding it.
    pub worker: WorkerId,
    /// Memory it reserves, MiB.
    pub mem_mb: u64,
    /// `static`: cores it holds for its whole life.
    pub cores: u32,
    /// Where it is.
    pub state: SandboxState,
    /// Its image, canonical, when its open named one (the worker holds it, or is fetching
    /// it, while the sandbox is there).
    pub image: Option<String>,
}

/// The canonical image a sandbox open names, if any.
pub(crate) fn open_image(action: &tangram_shared::Action) -> Option<String> {
    match &action.spec {
        tangram_shared::ActionSpec::SandboxOpen(o) => o
            .image
            .as_deref()
            .and_then(tangram_shared::image::ImageRef::canonical_of),
        _ => None,
    }
}

impl Sandbox {
    /// The sandbox an open holds on `worker` from its launch (or its adoption) until its
    /// result: the grant's memory, and under per-trajectory provisioning (`static`) its
    /// cores.
    pub(crate) fn opening(
        worker: &tangram_shared::WorkerId,
        open: &tangram_shared::Action,
        grant: tangram_shared::Grant,
        provisioning: crate::model::Provisioning,
    ) -> Self {
        Self {
            worker: worker.clone(),
            mem_mb: grant.mem_mb,
            cores: if provisioning.trajectory_cores().is_some() {
                grant.cores
            } else {
                0
            },
            state: SandboxState::Opening,
            image: open_image(open),
        }
    }

    /// A sandbox known to exist on `worker` without this engine having launched its open (a
    /// joining worker reports it, or an unseen open's result names it): open, with the memory
    /// reported, and `static`'s cores.
    pub(crate) fn known(
        worker: &tangram_shared::WorkerId,
        mem_mb: u64,
        provisioning: crate::model::Provisioning,
    ) -> Self {
        Self {
            worker: worker.clone(),
            mem_mb,
            cores: provisioning.trajectory_cores().unwrap_or(0),
            state: SandboxState::Open,
            image: None,
        }
    }

    /// True while it holds capacity on its worker.
    pub fn holds(&self) -> bool {
        self.state != SandboxState::Lost
    }
}
