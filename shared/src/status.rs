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
    /// Workers, by id: all of them, or one page when `next_after` is set.
    pub workers: Vec<WorkerStatus>,
    /// Workers known in all, whether or not this reply lists every one.
    #[serde(default)]
    pub workers_total: usize,
    /// Set when the reply lists only a page of the workers (a listing of every worker would
    /// pass [`STATUS_PAGE_BYTES`], or the request asked for fewer): the last id listed. Ask
    /// again with [`StatusRequest::workers_after`] set to it for the next page.
    #[serde(default)]
    pub next_after: Option<String>,
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
    /// Why queued actions wait, as of the scheduler's last planning cycle: a reason
    /// ("no worker with 4096 MiB free", "quota of search") and how many wait for it.
    #[serde(default)]
    pub waiting: BTreeMap<String, usize>,
    /// Actions running, by kind.
    pub running: BTreeMap<String, usize>,
    /// Sandboxes open.
    pub sandboxes: usize,
    /// Sandboxes open, and the memory they hold, by job: which job holds the fleet (a
    /// rollout that leaks sandboxes shows here). Absent from schedulers that predate it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub jobs: BTreeMap<String, JobStatus>,
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

/// How large the workers of one status reply may be, as JSON: half the smallest `max_payload`
/// a NATS server ships with (1 MiB), so that every page fits every server.
pub const STATUS_PAGE_BYTES: usize = 512 * 1024;

/// The body of a status request. Empty, or `{}`, asks for the first page.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct StatusRequest {
    /// List only workers whose id sorts after this one (the previous reply's `next_after`).
    #[serde(default)]
    pub workers_after: Option<String>,
    /// List at most this many workers.
    #[serde(default)]
    pub workers_limit: Option<usize>,
}

impl StatusRequest {
    /// Reads a request body: empty, or JSON of this shape.
    pub fn parse(body: &[u8]) -> Result<Self, serde_json::Error> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self::default());
        }
        serde_json::from_slice(body)
    }
}

impl Status {
    /// The report as a rollout role may read it when its answer goes to `<job>`'s inbox:
    /// only `<job>`'s entry under `jobs` and its own admissions under each provider, and no
    /// worker's image list or warm pool (other jobs' private images). Fleet totals, queues
    /// by kind and workers' capacity stay: a rollout paces itself on them.
    pub fn scope_to(&mut self, job: &str) {
        self.jobs.retain(|j, _| j == job);
        for w in &mut self.workers {
            w.images.clear();
            w.warm = None;
        }
        for p in &mut self.providers {
            p.admitted.retain(|j, _| j == job);
        }
    }
}

/// Cuts `status.workers` to the page `req` asks for: in id order, after `workers_after`, at
/// most `workers_limit`, and no more than `budget` bytes of JSON (one worker at least, so
/// that paging always moves on). Sets `workers_total`, and `next_after` when workers remain.
pub fn page(status: &mut Status, req: &StatusRequest, budget: usize) {
    let mut workers = std::mem::take(&mut status.workers);
    workers.sort_by(|a, b| a.id.cmp(&b.id));
    status.workers_total = workers.len();
    let start = match &req.workers_after {
        Some(after) => workers.partition_point(|w| w.id.as_str() <= after.as_str()),
        None => 0,
    };
    let limit = req.workers_limit.unwrap_or(usize::MAX).max(1);
    let mut used = 0;
    let mut kept = Vec::new();
    for w in workers.drain(start..) {
        // The size of its JSON and a comma.
        let size = serde_json::to_vec(&w).map_or(0, |b| b.len()) + 1;
        if kept.len() == limit || (!kept.is_empty() && used + size > budget) {
            status.next_after = kept.last().map(|w: &WorkerStatus| w.id.clone());
            break;
        }
        used += size;
        kept.push(w);
    }
    status.workers = kept;
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

/// What one job holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct JobStatus {
    /// Sandboxes open (or being opened).
    pub sandboxes: usize,
    /// The memory they hold, MiB.
    pub mem_mb: u64,
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

/// The leading scheduler's answer to a close request on [`crate::subject::close_job`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CloseJobReply {
    /// Sandboxes of the job it is closing now (a `sandbox_close` submitted for each, whose
    /// result reaches the job's results subject with `reason: job_closed`).
    pub closing: u64,
}

/// A rollout's renewal of its job's lease, on [`crate::subject::lease`]. The first renewal
/// puts the job's sandboxes under the lease: when no renewal has come for `ttl_ms`, the
/// scheduler closes them (`reason: lease_expired`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Lease {
    /// How long the lease lasts from this renewal, in milliseconds (bounded by the
    /// scheduler to 1 s .. 1 h).
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub ttl_ms: u64,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn status_of(n: usize) -> Status {
        Status {
            // Out of order on purpose: pages are in id order.
            workers: (0..n)
                .rev()
                .map(|i| WorkerStatus {
                    id: format!("w{i:03}"),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn ids(s: &Status) -> Vec<&str> {
        s.workers.iter().map(|w| w.id.as_str()).collect()
    }

    #[test]
    fn pages_list_every_worker_once_in_order_within_the_budget() {
        let one = serde_json::to_vec(&WorkerStatus {
            id: "w000".into(),
            ..Default::default()
        })
        .unwrap()
        .len()
            + 1;
        let mut seen = Vec::new();
        let mut req = StatusRequest::default();
        let mut pages = 0;
        loop {
            let mut s = status_of(10);
            page(&mut s, &req, one * 4);
            assert_eq!(s.workers_total, 10);
            assert!(s.workers.len() <= 4, "{:?}", ids(&s));
            seen.extend(ids(&s).into_iter().map(String::from));
            pages += 1;
            match s.next_after {
                Some(after) => req.workers_after = Some(after),
                None => break,
            }
        }
        assert_eq!(pages, 3);
        let want: Vec<String> = (0..10).map(|i| format!("w{i:03}")).collect();
        assert_eq!(seen, want);
    }

    #[test]
    fn a_reply_that_fits_lists_everything_and_says_no_next() {
        let mut s = status_of(3);
        page(&mut s, &StatusRequest::default(), STATUS_PAGE_BYTES);
        assert_eq!(ids(&s), vec!["w000", "w001", "w002"]);
        assert_eq!((s.workers_total, s.next_after), (3, None));
        // A limit pages too; one worker larger than the budget still makes a page.
        let mut s = status_of(3);
        let req = StatusRequest {
            workers_limit: Some(2),
            ..Default::default()
        };
        page(&mut s, &req, STATUS_PAGE_BYTES);
        assert_eq!(s.next_after.as_deref(), Some("w001"));
        let mut s = status_of(3);
        page(&mut s, &StatusRequest::default(), 1);
        assert_eq!(ids(&s), vec!["w000"]);
    }

    #[test]
    fn a_request_body_is_empty_or_json_and_bad_json_is_an_error() {
        assert_eq!(StatusRequest::parse(b"").unwrap(), StatusRequest::default());
        assert_eq!(
            StatusRequest::parse(b" \n").unwrap(),
            StatusRequest::default()
        );
        let r = StatusRequest::parse(br#"{"workers_after":"w1","workers_limit":5}"#).unwrap();
        assert_eq!(r.workers_after.as_deref(), Some("w1"));
        assert!(StatusRequest::parse(b"not json").is_err());
    }
}
