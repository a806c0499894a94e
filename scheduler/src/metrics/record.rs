//! Recording: one function per event the service reports, each writing the names of the
//! table in `metrics.rs`.

use super::*;
use metrics::{counter, gauge, histogram};
use std::collections::BTreeSet;
use std::sync::Mutex;
use tangram_core::engine::WorkerGauge;
use tangram_shared::{ActionKind, Timing};

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
pub(crate) fn action_redelivered() {
    counter!(ACTION_REDELIVERIES).increment(1);
}
pub(crate) fn intake_taken_back() {
    counter!(INTAKE_TAKEN_BACK).increment(1);
}
pub(crate) fn dispatched(kind: &'static str, queued_s: f64) {
    counter!(DISPATCHED, "kind" => kind).increment(1);
    histogram!(QUEUE_SECONDS, "kind" => kind).record(queued_s);
}
pub(crate) fn result(outcome: &'static str, code: &'static str) {
    counter!(RESULTS, "outcome" => outcome, "code" => code).increment(1);
}
pub(crate) fn act(kind: ActionKind, t: Timing) {
    let k = kind.as_str();
    histogram!(ACT_SECONDS, "kind" => k).record(t.act_us as f64 / 1e6);
    for (phase, us) in [
        ("queued", t.queued_us),
        ("overhead", t.overhead_us),
        ("exec", t.exec_us),
    ] {
        histogram!(ACT_PHASE_SECONDS, "kind" => k, "phase" => phase).record(us as f64 / 1e6);
    }
}
pub(crate) fn nats_gap() {
    counter!(NATS_GAPS).increment(1);
}
pub(crate) fn worker_lost() {
    counter!(WORKERS_LOST).increment(1);
}

/// Workers whose heartbeat age this process has reported: one that leaves the fleet reads
/// NaN from then on (the exporter keeps a series once written).
static REPORTED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

pub(crate) fn workers(live: &[WorkerGauge]) {
    let mut reported = REPORTED.lock().unwrap_or_else(|e| e.into_inner());
    let now: BTreeSet<String> = live.iter().map(|w| w.worker.to_string()).collect();
    for gone in reported.difference(&now) {
        gauge!(HEARTBEAT_AGE, "worker" => gone.clone()).set(f64::NAN);
    }
    let (mut cores, mut booked, mut mem, mut mem_booked) = (0u64, 0u64, 0u64, 0u64);
    for w in live {
        gauge!(HEARTBEAT_AGE, "worker" => w.worker.to_string()).set(w.heartbeat_age_s);
        cores += u64::from(w.cores);
        booked += u64::from(w.cores_booked);
        mem += w.mem_mb;
        mem_booked += w.mem_booked_mb;
    }
    reported.extend(now);
    gauge!(POOL_CORES, "state" => "total").set(cores as f64);
    gauge!(POOL_CORES, "state" => "booked").set(booked as f64);
    gauge!(POOL_MEMORY, "state" => "total").set((mem << 20) as f64);
    gauge!(POOL_MEMORY, "state" => "booked").set((mem_booked << 20) as f64);
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
pub(crate) fn heartbeat_refused(reason: &'static str) {
    counter!(REFUSED_HEARTBEATS, "reason" => reason).increment(1);
}
pub(crate) fn declaration_refused(kind: &'static str) {
    counter!(DECLARATIONS_REFUSED, "kind" => kind).increment(1);
}
pub(crate) fn sandbox_closing(reason: &'static str) {
    counter!(SANDBOXES_CLOSED, "reason" => reason).increment(1);
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
    for kind in ActionKind::ALL {
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
pub(crate) fn deadletters(n: u64) {
    gauge!(DEADLETTERS).set(n as f64);
}
pub(crate) fn gpu_route(service: &str, restore: bool, evictions: usize) {
    let restore = if restore { "true" } else { "false" };
    counter!(GPU_ROUTES, "service" => service.to_string(), "restore" => restore).increment(1);
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

/// RL job label values kept at most; later jobs are counted as `other`, so a fleet that runs
/// many short jobs does not grow the exporter without bound.
const MAX_JOB_LABELS: usize = 256;

fn job_label(job: &str) -> String {
    static SEEN: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
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

/// The label is `rl_job`, not `job`: Prometheus sets `job` on every target it scrapes.
pub(crate) fn api_admitted(provider: &str, job: &str) {
    counter!(API_ADMITTED, "provider" => provider.to_string(), "rl_job" => job_label(job))
        .increment(1);
}

/// Leading (in term `epoch`) or standing by (the gauge keeps the last term's epoch).
pub(crate) fn leader(leading: bool, epoch: u64) {
    gauge!(LEADER).set(if leading { 1.0 } else { 0.0 });
    gauge!(EPOCH).set(epoch as f64);
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
