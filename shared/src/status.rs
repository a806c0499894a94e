//! The scheduler's status report, answered on `tangram.v1.status` (core NATS request/reply,
//! JSON): what `tangram status` shows.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The whole report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Status {
    /// The scheduler's epoch.
    pub epoch: u64,
    /// Scheduling policy in force.
    pub policy: String,
    /// Seconds since the scheduler started.
    pub uptime_s: f64,
    /// Workers, by id.
    pub workers: Vec<WorkerStatus>,
    /// Actions waiting, by kind.
    pub queued: BTreeMap<String, usize>,
    /// The queue by kind: depth, the oldest wait and an estimate of the wait a new action of
    /// that kind would see now. What a rollout framework reads to slow generation.
    #[serde(default)]
    pub queues: BTreeMap<String, QueueStatus>,
    /// Actions stored in the stream and not yet delivered to the scheduler (the backlog beyond
    /// its in-memory queue); `None` when the stream could not be asked.
    #[serde(default)]
    pub backlog: Option<u64>,
    /// Actions running, by kind.
    pub running: BTreeMap<String, usize>,
    /// Sandboxes open.
    pub sandboxes: usize,
    /// GPU services and where they are resident.
    pub services: Vec<ServiceStatus>,
    /// External API providers.
    pub providers: Vec<ProviderStatus>,
    /// ACT of recent results, by kind.
    pub recent: BTreeMap<String, ActStats>,
    /// The scheduler holding the leader lease (the one answering).
    #[serde(default)]
    pub leader: Option<LeaderRecord>,
    /// Standby schedulers that announced themselves in the last few seconds.
    #[serde(default)]
    pub standbys: Vec<StandbyRecord>,
}

/// The queue of one action kind.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct QueueStatus {
    /// Actions waiting.
    pub depth: usize,
    /// How long the oldest of them has waited, seconds.
    pub oldest_wait_s: f64,
    /// Completions per second over the last minute (or since the first one seen).
    pub throughput_per_s: f64,
    /// The wait a new action of this kind would see now: the depth divided by the recent
    /// throughput, at least the mean queueing time of recent results; `None` while there is
    /// a queue and no completion yet to estimate from.
    pub est_wait_s: Option<f64>,
}

/// One worker.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct WorkerStatus {
    /// Its id.
    pub id: String,
    /// Cores it grants, and how many are booked now.
    pub cores: u32,
    /// Cores booked by running actions.
    pub cores_used: u32,
    /// Memory for sandboxes, and how much open sandboxes reserve, MiB.
    pub mem_mb: u64,
    /// Memory reserved, MiB.
    pub mem_used_mb: u64,
    /// GPUs it has (declared or from NVML).
    pub gpus: u32,
    /// Where its GPU inventory came from.
    pub gpu_source: Option<String>,
    /// Seconds since its last heartbeat.
    pub last_seen_s: f64,
    /// Taking no new work.
    pub draining: bool,
    /// Cordoned by an operator: no new sandboxes or unpinned work; its open sandboxes keep
    /// running their trajectories' commands.
    #[serde(default)]
    pub cordoned: bool,
    /// Being drained: when its remaining sandboxes are closed, Unix milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_by_unix_ms: Option<u64>,
    /// Actions placed there and not yet settled.
    #[serde(default)]
    pub running: u32,
    /// Sandboxes open (or opening, or closing) there.
    #[serde(default)]
    pub sandboxes: u32,
    /// Its warm pool of parked sandboxes, when it keeps one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<crate::WarmPoolReport>,
    /// The sandbox images it holds (from its heartbeats).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<crate::ImageReport>,
}

/// One GPU service.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ServiceStatus {
    /// Name.
    pub name: String,
    /// GPUs per replica.
    pub gpus: u8,
    /// Expected restore time now, ms.
    pub restore_ms: u64,
    /// Resident replicas as `worker:group/start+len`, with requests in flight.
    pub resident: Vec<String>,
    /// Requests in flight on it.
    pub busy: u32,
}

/// One provider.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ProviderStatus {
    /// Name.
    pub name: String,
    /// Declared rate, requests/s.
    pub rate_per_s: f64,
    /// Adaptive rate in force.
    pub effective_rate_per_s: f64,
    /// In flight now, and the cap.
    pub inflight: u32,
    /// Concurrency cap.
    pub concurrency: u32,
    /// Admitted so far, by job.
    pub admitted: BTreeMap<String, u64>,
}

/// ACT statistics over recent results, seconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ActStats {
    /// Results counted.
    pub count: usize,
    /// Mean ACT.
    pub mean_s: f64,
    /// Median.
    pub p50_s: f64,
    /// 99th percentile.
    pub p99_s: f64,
    /// Mean queueing.
    pub queued_s: f64,
    /// Mean overhead.
    pub overhead_s: f64,
    /// Mean execution.
    pub exec_s: f64,
}

/// An operator's cordon of a worker, as stored under `cordon.<worker>` in the scheduler's
/// bucket (JSON). Deleting the key uncordons.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CordonRecord {
    /// Drained, not only cordoned: at this time (Unix milliseconds) the worker's remaining
    /// sandboxes are closed, and commands sent to them are rejected (`no_sandbox`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_by_unix_ms: Option<u64>,
    /// Who asked, for people.
    #[serde(default)]
    pub by: String,
    /// When, Unix milliseconds.
    #[serde(default)]
    pub at_unix_ms: u64,
}

/// The leader lease, as stored under [`crate::subject::LEADER_KEY`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct LeaderRecord {
    /// The scheduler's id (host and pid unless configured).
    pub id: String,
    /// Its process id.
    pub pid: u32,
    /// Its host name.
    pub host: String,
    /// The epoch it leads in.
    pub epoch: u64,
    /// When it took the lease, Unix milliseconds.
    pub since_unix_ms: u64,
    /// When it last renewed the lease, Unix milliseconds (its own clock).
    pub renewed_unix_ms: u64,
    /// How long the lease holds without a renewal, ms.
    pub ttl_ms: u64,
}

/// A standby scheduler, as announced under `standby.<id>`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct StandbyRecord {
    /// The scheduler's id.
    pub id: String,
    /// Its process id.
    pub pid: u32,
    /// Its host name.
    pub host: String,
    /// When it last announced itself, Unix milliseconds (its own clock).
    pub seen_unix_ms: u64,
}
