//! The scheduler's metrics: every name in one place, base units, explicit buckets, bounded
//! labels (kind, code, outcome: never an id).

use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use std::net::SocketAddr;

/// Actions received, by kind (`unknown` when undecodable).
pub const ACTIONS_RECEIVED: &str = "tangram_scheduler_actions_received_total";
/// Actions rejected, by code.
pub const ACTIONS_REJECTED: &str = "tangram_scheduler_actions_rejected_total";
/// Duplicate submissions dropped.
pub const ACTIONS_DUPLICATE: &str = "tangram_scheduler_actions_duplicate_total";
/// Checks for a stored result at intake, by outcome: `skipped` (the in-memory filter ruled
/// one out), `stored` or `absent` (the server was asked).
pub const RESULT_LOOKUPS: &str = "tangram_scheduler_result_lookups_total";
/// Dispatches published, by kind.
pub const DISPATCHED: &str = "tangram_scheduler_dispatched_total";
/// Results seen, by outcome.
pub const RESULTS: &str = "tangram_scheduler_results_total";
/// Actions queued now.
pub const QUEUE_DEPTH: &str = "tangram_scheduler_queue_depth";
/// Actions dispatched and not yet finished.
pub const RUNNING: &str = "tangram_scheduler_running";
/// Workers alive.
pub const WORKERS_ALIVE: &str = "tangram_scheduler_workers_alive";
/// Workers declared lost.
pub const WORKERS_LOST: &str = "tangram_scheduler_workers_lost_total";
/// Gauge: workers cordoned or being drained by an operator.
pub const CORDONED: &str = "tangram_scheduler_cordoned_workers";
/// Gauge: fields in which the stored streams differ from the configuration at start (left
/// as stored; the log names them).
pub const STREAM_DRIFT: &str = "tangram_scheduler_stream_config_drift";
/// Counter: fence records written (a worker instance declared lost must rejoin anew).
pub const WORKERS_FENCED: &str = "tangram_scheduler_workers_fenced_total";
/// Counter: heartbeats ignored because their worker instance was fenced.
pub const FENCED_HEARTBEATS: &str = "tangram_scheduler_fenced_heartbeats_total";
/// Counter: gaps in this scheduler's reach of NATS after which worker graces were restarted
/// instead of declaring workers lost.
pub const NATS_GAPS: &str = "tangram_scheduler_nats_gaps_total";
/// Time spent in one call of the decision engine (one burst of events and its cycle).
pub const CYCLE_SECONDS: &str = "tangram_scheduler_cycle_duration_seconds";
/// Time from arrival to dispatch publish acknowledged.
pub const QUEUE_SECONDS: &str = "tangram_scheduler_queue_wait_seconds";
/// Reward actions routed, by service and whether the route restores the replica.
pub const GPU_ROUTES: &str = "tangram_scheduler_gpu_routes_total";
/// Replicas the scheduler decided to evict, by the service that needed the room.
pub const GPU_EVICTIONS: &str = "tangram_scheduler_gpu_evictions_total";
/// A provider's adaptive rate in force, requests per second.
pub const PROVIDER_RATE: &str = "tangram_scheduler_provider_effective_rate";
/// A provider's requests in flight.
pub const PROVIDER_INFLIGHT: &str = "tangram_scheduler_provider_inflight";
/// A provider's requests waiting for quota.
pub const PROVIDER_WAITING: &str = "tangram_scheduler_provider_waiting";
/// Api actions admitted, by provider and job.
pub const API_ADMITTED: &str = "tangram_scheduler_api_admitted_total";
/// Running actions taken over from an earlier leader (listed in a heartbeat, or found
/// dispatched when their message came back), by kind.
pub const ADOPTED: &str = "tangram_scheduler_adopted_total";
/// 1 while this scheduler holds the leader lease, 0 while it stands by.
pub const LEADER: &str = "tangram_scheduler_leader";
/// Terms this scheduler has begun as leader (takeovers and first starts).
pub const TERMS: &str = "tangram_scheduler_leader_terms_total";
/// Terms that ended on a NATS error (starting or running them) rather than a lost lease.
pub const TERMS_FAILED: &str = "tangram_scheduler_leader_terms_failed_total";
/// Actions queued now, by kind.
pub const QUEUE_DEPTH_BY_KIND: &str = "tangram_scheduler_queue_depth_by_kind";
/// How long the oldest queued action of a kind has waited, seconds.
pub const QUEUE_OLDEST: &str = "tangram_scheduler_queue_oldest_wait_seconds";
/// The wait a new action of a kind would see now (queue depth over the last minute's
/// throughput), seconds; what a rollout framework reads to slow generation.
pub const QUEUE_ESTIMATE: &str = "tangram_scheduler_queue_estimated_wait_seconds";
/// Actions stored in the stream and not yet delivered to the scheduler.
pub const STREAM_BACKLOG: &str = "tangram_scheduler_stream_backlog";
/// Action messages held in memory (queued or being dispatched), and their bytes.
pub const HELD_ACTIONS: &str = "tangram_scheduler_held_actions";
/// Bytes of action messages held in memory.
pub const HELD_BYTES: &str = "tangram_scheduler_held_bytes";
/// Times the intake paused because the held actions reached `max_queued_actions` or
/// `max_queued_bytes` (the stream kept the rest).
pub const INTAKE_PAUSED: &str = "tangram_scheduler_intake_paused_total";
/// GPUs known in the fleet and GPUs held by resident replicas.
pub const GPUS: &str = "tangram_scheduler_gpus";

const CYCLE_BUCKETS: &[f64] = &[1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2];
const QUEUE_BUCKETS: &[f64] = &[1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5, 1.0, 5.0, 30.0];

/// Starts the Prometheus exporter on `addr`.
pub fn install(addr: SocketAddr) -> anyhow::Result<()> {
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(Matcher::Full(CYCLE_SECONDS.into()), CYCLE_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(QUEUE_SECONDS.into()), QUEUE_BUCKETS)?
        .install()?;
    Ok(())
}

pub(crate) fn result_lookup(outcome: &'static str) {
    counter!(RESULT_LOOKUPS, "outcome" => outcome).increment(1);
}

pub(crate) fn received(kind: &'static str) {
    counter!(ACTIONS_RECEIVED, "kind" => kind).increment(1);
}
pub(crate) fn rejected(code: &'static str) {
    counter!(ACTIONS_REJECTED, "code" => code).increment(1);
}
pub(crate) fn duplicate() {
    counter!(ACTIONS_DUPLICATE).increment(1);
}
pub(crate) fn dispatched(kind: &'static str, queued_s: f64) {
    counter!(DISPATCHED, "kind" => kind).increment(1);
    histogram!(QUEUE_SECONDS).record(queued_s);
}
pub(crate) fn result(outcome: &'static str) {
    counter!(RESULTS, "outcome" => outcome).increment(1);
}
pub(crate) fn nats_gap() {
    counter!(NATS_GAPS).increment(1);
}
pub(crate) fn worker_lost() {
    counter!(WORKERS_LOST).increment(1);
}
pub(crate) fn cordons(workers: usize) {
    gauge!(CORDONED).set(workers as f64);
}
pub(crate) fn stream_drift(fields: usize) {
    gauge!(STREAM_DRIFT).set(fields as f64);
}
pub(crate) fn worker_fenced() {
    counter!(WORKERS_FENCED).increment(1);
}
pub(crate) fn fenced_heartbeat() {
    counter!(FENCED_HEARTBEATS).increment(1);
}
pub(crate) fn cycle_seconds(seconds: f64) {
    histogram!(CYCLE_SECONDS).record(seconds);
}
pub(crate) fn gauges(queued: usize, running: usize, alive: usize) {
    gauge!(QUEUE_DEPTH).set(queued as f64);
    gauge!(RUNNING).set(running as f64);
    gauge!(WORKERS_ALIVE).set(alive as f64);
}
pub(crate) fn queues(
    queues: &std::collections::BTreeMap<String, tangram_shared::status::QueueStatus>,
) {
    // Every kind is set, so a kind whose queue emptied reads 0 rather than its last depth.
    for kind in tangram_shared::ActionKind::ALL {
        let q = queues.get(kind.as_str()).cloned().unwrap_or_default();
        let k = kind.as_str();
        gauge!(QUEUE_DEPTH_BY_KIND, "kind" => k).set(q.depth as f64);
        gauge!(QUEUE_OLDEST, "kind" => k).set(q.oldest_wait_s);
        gauge!(QUEUE_ESTIMATE, "kind" => k).set(q.est_wait_s.unwrap_or(q.oldest_wait_s));
    }
}
pub(crate) fn held(count: usize, bytes: u64) {
    gauge!(HELD_ACTIONS).set(count as f64);
    gauge!(HELD_BYTES).set(bytes as f64);
}
pub(crate) fn intake_paused() {
    counter!(INTAKE_PAUSED).increment(1);
}
pub(crate) fn backlog(n: u64) {
    gauge!(STREAM_BACKLOG).set(n as f64);
}
pub(crate) fn gpu_route(service: &str, restore: bool, evictions: usize) {
    counter!(GPU_ROUTES, "service" => service.to_string(), "restore" => if restore { "true" } else { "false" }).increment(1);
    if evictions > 0 {
        counter!(GPU_EVICTIONS, "service" => service.to_string()).increment(evictions as u64);
    }
}
pub(crate) fn gpus(total: u32, resident: u32) {
    gauge!(GPUS, "state" => "total").set(total as f64);
    gauge!(GPUS, "state" => "resident").set(resident as f64);
}
pub(crate) fn provider(name: &str, rate: f64, inflight: u32, waiting: usize) {
    gauge!(PROVIDER_RATE, "provider" => name.to_string()).set(rate);
    gauge!(PROVIDER_INFLIGHT, "provider" => name.to_string()).set(inflight as f64);
    gauge!(PROVIDER_WAITING, "provider" => name.to_string()).set(waiting as f64);
}
/// Job label values the metrics keep at most; later jobs are counted as `other`, so a fleet
/// that runs many short jobs does not grow the exporter without bound.
const MAX_JOB_LABELS: usize = 256;

fn job_label(job: &str) -> String {
    static SEEN: std::sync::Mutex<std::collections::BTreeSet<String>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if seen.contains(job) {
        job.to_string()
    } else if seen.len() < MAX_JOB_LABELS {
        seen.insert(job.to_string());
        job.to_string()
    } else {
        "other".to_string()
    }
}

pub(crate) fn api_admitted(provider: &str, job: &str) {
    counter!(API_ADMITTED, "provider" => provider.to_string(), "job" => job_label(job))
        .increment(1);
}

pub(crate) fn leader(leading: bool) {
    gauge!(LEADER).set(if leading { 1.0 } else { 0.0 });
    if leading {
        counter!(TERMS).increment(1);
    }
}

pub(crate) fn term_failed() {
    counter!(TERMS_FAILED).increment(1);
}

pub(crate) fn adopted(kind: &'static str) {
    counter!(ADOPTED, "kind" => kind).increment(1);
}
