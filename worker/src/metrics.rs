//! The worker's metrics: names in one place, base units, explicit buckets, bounded labels.

use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use std::net::SocketAddr;

/// Actions finished, by kind and outcome.
pub const ACTIONS: &str = "tangram_worker_actions_total";
/// Time to grant or park cores, by mode (`cgroup`, `docker`) and direction (`grant`, `park`).
pub const GRANT_SECONDS: &str = "tangram_worker_grant_duration_seconds";
/// Command execution time.
pub const EXEC_SECONDS: &str = "tangram_worker_exec_duration_seconds";
/// Worker-side overhead per action.
pub const OVERHEAD_SECONDS: &str = "tangram_worker_overhead_seconds";
/// Sandboxes held now.
pub const SANDBOXES: &str = "tangram_worker_sandboxes";
/// Leftover containers removed at start.
pub const LEFTOVERS: &str = "tangram_worker_leftovers_removed_total";
/// Dispatches refused, by reason (`stale_epoch`, `unknown_epoch`); each also leaves a
/// dead-letter record.
pub const REFUSED: &str = "tangram_worker_refused_dispatches_total";
/// Times this worker found itself fenced (declared lost by the scheduler) and rejoined as a
/// new instance.
pub const FENCED: &str = "tangram_worker_fenced_total";
/// Results of a fenced instance's actions not published (the scheduler settled them).
pub const FENCED_RESULTS: &str = "tangram_worker_fenced_results_dropped_total";
/// Replica processes started, by service.
pub const REPLICAS_STARTED: &str = "tangram_worker_replicas_started_total";
/// Replica processes found dead, by service.
pub const REPLICAS_CRASHED: &str = "tangram_worker_replicas_crashed_total";
/// Replicas put to sleep to make room, by service.
pub const EVICTIONS: &str = "tangram_worker_evictions_total";
/// External API calls, by provider and status class (`2xx`, `429`, ...).
pub const API_CALLS: &str = "tangram_worker_api_calls_total";
/// External API call latency, by provider.
pub const API_SECONDS: &str = "tangram_worker_api_call_duration_seconds";
/// Time to restore (wake) a replica, by service.
pub const RESTORE_SECONDS: &str = "tangram_worker_restore_duration_seconds";

const FAST: &[f64] = &[
    5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1,
];
const SLOW: &[f64] = &[
    1e-3, 1e-2, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Starts the Prometheus exporter on `addr`.
pub fn install(addr: SocketAddr) -> anyhow::Result<()> {
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(Matcher::Full(GRANT_SECONDS.into()), FAST)?
        .set_buckets_for_metric(Matcher::Full(OVERHEAD_SECONDS.into()), FAST)?
        .set_buckets_for_metric(Matcher::Full(EXEC_SECONDS.into()), SLOW)?
        .set_buckets_for_metric(Matcher::Full(RESTORE_SECONDS.into()), SLOW)?
        .set_buckets_for_metric(Matcher::Full(API_SECONDS.into()), SLOW)?
        .install()?;
    Ok(())
}

pub(crate) fn action(kind: &'static str, outcome: &'static str, overhead_s: f64, exec_s: f64) {
    counter!(ACTIONS, "kind" => kind, "outcome" => outcome).increment(1);
    histogram!(OVERHEAD_SECONDS).record(overhead_s);
    if kind == "sandbox_exec" || kind == "reward" {
        histogram!(EXEC_SECONDS).record(exec_s);
    }
}
pub(crate) fn grant(mode: &'static str, direction: &'static str, seconds: f64) {
    histogram!(GRANT_SECONDS, "mode" => mode, "direction" => direction).record(seconds);
}
pub(crate) fn sandboxes(n: usize) {
    gauge!(SANDBOXES).set(n as f64);
}
pub(crate) fn leftovers(n: usize) {
    counter!(LEFTOVERS).increment(n as u64);
}
pub(crate) fn fenced() {
    counter!(FENCED).increment(1);
}
pub(crate) fn fenced_result() {
    counter!(FENCED_RESULTS).increment(1);
}
pub(crate) fn refused(reason: &'static str) {
    counter!(REFUSED, "reason" => reason).increment(1);
}
pub(crate) fn replica_started(service: &str) {
    counter!(REPLICAS_STARTED, "service" => service.to_string()).increment(1);
}
pub(crate) fn replica_crashed(service: &str) {
    counter!(REPLICAS_CRASHED, "service" => service.to_string()).increment(1);
}
pub(crate) fn eviction(service: &str) {
    counter!(EVICTIONS, "service" => service.to_string()).increment(1);
}
pub(crate) fn restore(service: &str, seconds: f64) {
    histogram!(RESTORE_SECONDS, "service" => service.to_string()).record(seconds);
}
pub(crate) fn api_call(provider: &str, status: u16, seconds: f64) {
    let class = match status {
        429 => "429",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    };
    counter!(API_CALLS, "provider" => provider.to_string(), "status" => class).increment(1);
    histogram!(API_SECONDS, "provider" => provider.to_string()).record(seconds);
}
