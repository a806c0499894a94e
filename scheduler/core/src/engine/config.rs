//! How the engine is set up ([`EngineConfig`]), with the defaults the scheduler and the
//! simulator start from.

use std::collections::BTreeMap;
use tangram_shared::Limits;

/// How the engine is set up.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// The scheduler's epoch, carried by every dispatch.
    pub epoch: u64,
    /// Policy name (see [`crate::policies::REGISTRY`]).
    pub policy: String,
    /// Cores per sandbox under `static`.
    pub static_cores: u32,
    /// Heartbeat periods a worker may miss before it is declared lost.
    pub missed_heartbeats: u32,
    /// After start, how long to wait for heartbeats before rejecting on cluster knowledge.
    pub settle_ms: u64,
    /// After a worker is lost, how long (unless it heartbeats again sooner) no action is
    /// rejected for want of capacity: a restarting worker may bring back the service's GPUs,
    /// the provider or the sandbox size the action needs.
    pub rejoin_ms: u64,
    /// Jobs' weights (default 1) for their shares of every pool: the order in which the
    /// CPU and GPU pools take waiting actions (`engine/shares.rs`), widening under
    /// `tangram-v2`, and external API quota.
    pub job_weights: BTreeMap<String, f64>,
    /// Pools take waiting actions in weighted fair order between jobs (`engine/shares.rs`);
    /// off, in queue order (first come, first served: the simulator's baseline).
    pub fair_share: bool,
    /// The operator's definitions of external API providers' quotas, by name: workers'
    /// declarations must match them. Providers not defined take the quota their first
    /// serving workers declared.
    pub providers: BTreeMap<String, crate::quota::ProviderQuota>,
    /// The operator's definitions of GPU services' sizes and slots, by name: workers'
    /// declarations must match them. Services not defined take the spec their first
    /// serving workers declared.
    pub services: BTreeMap<String, crate::gpu::ServiceSpec>,
    /// Caps per job (see [`super::JobCaps`]), by job; [`super::EVERY_JOB`] (`*`) for every
    /// job not listed. Empty: no caps.
    pub job_caps: BTreeMap<String, super::JobCaps>,
    /// The most actions one job may have queued unless its caps say otherwise (see
    /// `engine/admission.rs`); `None`: no limit but the intake gate's.
    pub max_queued_per_job: Option<u32>,
    /// The most bytes of action messages one job may have queued; `None`: no limit but the
    /// intake gate's.
    pub max_queued_bytes_per_job: Option<u64>,
    /// Validation limits.
    pub limits: Limits,
    /// In-progress acks for queued actions this often (inside the consumer's ack wait).
    pub progress_every_ms: u64,
    /// A running action with no result this long past its timeout is settled as lost.
    pub result_grace_ms: u64,
    /// Per-task pools (`per-task`): the jobs isolated, in order; worker `i` (by id) belongs
    /// to job `i mod n`. Jobs not listed may use any worker.
    pub task_pools: Vec<String>,
    /// `static`: the trajectories each provider's rate is split between (the batch the
    /// deployment is provisioned for); `None`: the sandboxes open when a trajectory first
    /// calls.
    pub static_trajectories: Option<u32>,
    /// How often the shell confirms NATS is reachable ([`Event::Reachable`]); 0 when it
    /// never does. A worker is declared lost only on evidence: a confirmation that came more
    /// than its grace after its last heartbeat. A gap of more than twice this between
    /// confirmations (NATS paused or unreachable, this process stalled) restarts every
    /// worker's grace and pushes result deadlines back by the gap, since nobody's silence
    /// could be judged during it.
    pub reachable_every_ms: u64,
    /// Image-aware placement: a sandbox open naming an image prefers a worker that holds it
    /// ([`crate::model::ImageNeed`]); off, placement ignores images.
    pub image_locality: bool,
    /// Expected pull throughput of a worker, MB/s, for the pull time of an image of known
    /// size (an image no worker advertises is taken as [`UNKNOWN_IMAGE_MB`]).
    pub pull_mb_per_s: f64,
    /// What one more sandbox per core on a worker is expected to cost a trajectory, ms: the
    /// load image-aware placement weighs against a pull.
    pub image_load_ms: u64,
    /// Launch nothing until [`Event::BacklogRead`]: a service starting a term reads the
    /// dispatch backlog an earlier leader left, and what it adopts from there must be booked
    /// before anything is placed beside it. Off for the simulator and tests that have no
    /// backlog.
    pub await_backlog: bool,
    /// A sandbox no action has used for this long is closed (`reason: idle_timeout`), ms;
    /// an open may ask for another timeout, up to `limits.max_idle_timeout_ms`. 0: none by
    /// default (the simulator's); the scheduler's configuration sets it.
    pub idle_timeout_ms: u64,
}

/// The size assumed for an image no worker advertises, MB.
pub const UNKNOWN_IMAGE_MB: u64 = 1_024;

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            epoch: 1,
            policy: "tangram".into(),
            static_cores: crate::policies::STATIC_CORES,
            missed_heartbeats: 3,
            settle_ms: 2_000,
            rejoin_ms: 30_000,
            job_weights: BTreeMap::new(),
            fair_share: true,
            job_caps: BTreeMap::new(),
            providers: BTreeMap::new(),
            services: BTreeMap::new(),
            max_queued_per_job: None,
            max_queued_bytes_per_job: None,
            limits: Limits::default(),
            // Short, so that actions held by a scheduler that died come back quickly; the
            // consumer's ack wait is 10 s.
            progress_every_ms: 3_000,
            // Room for a replica restore or a slow worker on top of the action's own timeout.
            result_grace_ms: 60_000,
            task_pools: Vec::new(),
            static_trajectories: None,
            reachable_every_ms: 0,
            image_locality: true,
            pull_mb_per_s: 100.0,
            image_load_ms: 60_000,
            await_backlog: false,
            idle_timeout_ms: 0,
        }
    }
}
