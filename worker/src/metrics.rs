//! The worker's metrics: every name in one table ([`DEFS`], which `docs/METRICS.md`
//! mirrors), base units, explicit buckets, bounded labels (kind, outcome, service,
//! provider, gpu index: never an action id). The recording functions are in `record`.

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use std::net::SocketAddr;
use tangram_shared::metric::{MetricDef, MetricType, MetricUnit, BUILD_INFO};

mod record;
pub(crate) use record::*;

pub const ACTIONS: &str = "tangram_worker_actions_total";
pub const DISPATCH_REDELIVERIES: &str = "tangram_worker_dispatch_redeliveries_total";
pub const GRANT_SECONDS: &str = "tangram_worker_grant_duration_seconds";
pub const EXEC_SECONDS: &str = "tangram_worker_exec_duration_seconds";
pub const OVERHEAD_SECONDS: &str = "tangram_worker_overhead_seconds";
pub const SANDBOXES: &str = "tangram_worker_sandboxes";
pub const LEFTOVERS: &str = "tangram_worker_leftovers_removed_total";
pub const REFUSED: &str = "tangram_worker_refused_dispatches_total";
pub const FENCED: &str = "tangram_worker_fenced_total";
pub const FENCED_RESULTS: &str = "tangram_worker_fenced_results_dropped_total";
pub const RESULT_RETRIES: &str = "tangram_worker_result_retries_total";
pub const REGRANTS: &str = "tangram_worker_regrants_total";
pub const CORE_WAITS: &str = "tangram_worker_core_waits_total";
pub const WARM_CLAIMS: &str = "tangram_worker_warm_pool_claims_total";
pub const IMAGE_PULLS: &str = "tangram_worker_image_pulls_total";
pub const IMAGE_PULL_SECONDS: &str = "tangram_worker_image_pull_duration_seconds";
pub const WARM_READY: &str = "tangram_worker_warm_pool_ready";
pub const WARM_MEMORY: &str = "tangram_worker_warm_pool_memory_bytes";
pub const REPLICAS_STARTED: &str = "tangram_worker_replicas_started_total";
pub const REPLICAS_CRASHED: &str = "tangram_worker_replicas_crashed_total";
pub const EVICTIONS: &str = "tangram_worker_evictions_total";
pub const API_CALLS: &str = "tangram_worker_api_calls_total";
pub const API_SECONDS: &str = "tangram_worker_api_call_duration_seconds";
pub const RESTORE_SECONDS: &str = "tangram_worker_restore_duration_seconds";
pub const GPUS: &str = "tangram_worker_gpus";
pub const GPU_MEM_USED: &str = "tangram_worker_gpu_memory_used_bytes";
pub const GPU_MEM_TOTAL: &str = "tangram_worker_gpu_memory_total_bytes";
pub const GPU_UTIL: &str = "tangram_worker_gpu_utilization_ratio";

use MetricType::{Counter as C, Gauge as G, Histogram as H};
use MetricUnit::{Bytes as B, Count as N, Info, Ratio, Seconds as S};

const fn def(
    name: &'static str,
    kind: MetricType,
    labels: &'static [&'static str],
    unit: MetricUnit,
    help: &'static str,
) -> MetricDef {
    MetricDef {
        name,
        kind,
        labels,
        unit,
        help,
    }
}

/// Every metric the worker emits.
#[rustfmt::skip]
pub const DEFS: &[MetricDef] = &[
    def(BUILD_INFO, G, &["version", "git_sha", "component"], Info, "The build of this process (value 1); git_sha when the build knows its commit (a git checkout, or TANGRAM_GIT_SHA)."),
    def(ACTIONS, C, &["kind", "outcome"], N, "Actions finished, by kind and outcome."),
    def(DISPATCH_REDELIVERIES, C, &[], N, "Dispatch messages JetStream delivered more than once (to this or an earlier instance)."),
    def(GRANT_SECONDS, H, &["mode", "direction"], S, "Time to grant or park cores, or to fit a claimed warm sandbox's memory limit, by mode (cgroup, docker) and direction (grant, park, resize)."),
    def(EXEC_SECONDS, H, &["kind"], S, "Execution time of commands, reward calls and api calls, by kind."),
    def(OVERHEAD_SECONDS, H, &["kind"], S, "Worker-side time around the execution (container create and start for an open, grants, waits), by kind."),
    def(SANDBOXES, G, &[], N, "Sandboxes held now."),
    def(LEFTOVERS, C, &[], N, "Leftover containers of an earlier instance removed at start."),
    def(REFUSED, C, &["reason"], N, "Dispatches refused, by reason (stale_epoch, unknown_epoch); each leaves a dead letter."),
    def(FENCED, C, &[], N, "Times this worker found itself fenced and rejoined as a new instance."),
    def(FENCED_RESULTS, C, &[], N, "Results of a fenced instance's actions not published (the scheduler settled them)."),
    def(RESULT_RETRIES, C, &[], N, "Rounds of result publishing that failed and were tried again (a result is never given up while the worker runs)."),
    def(REGRANTS, C, &["direction"], N, "Running execs re-sized by a malleable policy (tangram-v2), by direction (widen, narrow)."),
    def(CORE_WAITS, C, &["result"], N, "Execs whose booked cores were not free when they started, which waited for a narrowing or an end to free them, by result (granted, timed_out: failed `infra_error: grant`)."),
    def(IMAGE_PULLS, C, &["outcome"], N, "Sandbox images pulled because an open named one the worker lacked, by outcome (ok, refused: not allowed or not in the registry, failed: registry unreachable, credentials refused or too slow). Opens sharing a pull count once each."),
    def(IMAGE_PULL_SECONDS, H, &[], S, "How long a successful image pull took."),
    def(WARM_CLAIMS, C, &["result"], N, "Opens on the worker's parking cores, by result (hit: a parked sandbox of the open's image and work directory was claimed; miss: none was ready and one was created)."),
    def(WARM_READY, G, &[], N, "Warm sandboxes ready to claim."),
    def(WARM_MEMORY, G, &[], B, "Memory the warm sandboxes may use (their limits, summed)."),
    def(REPLICAS_STARTED, C, &["service"], N, "Replica processes started, by service."),
    def(REPLICAS_CRASHED, C, &["service"], N, "Replica processes found dead, by service."),
    def(EVICTIONS, C, &["service"], N, "Replicas put to sleep to make room, by service."),
    def(API_CALLS, C, &["provider", "status"], N, "External API calls, by provider and status class (2xx, 3xx, 4xx, 429, 5xx)."),
    def(API_SECONDS, H, &["provider"], S, "External API call latency, by provider."),
    def(RESTORE_SECONDS, H, &["service"], S, "Time to restore (wake) a replica, by service."),
    def(GPUS, G, &["source"], N, "GPUs this worker offers, by where the inventory came from (nvml or declared)."),
    def(GPU_MEM_USED, G, &["gpu"], B, "Memory in use on each GPU, from NVML (absent without a driver)."),
    def(GPU_MEM_TOTAL, G, &["gpu"], B, "Memory of each GPU, from NVML (absent without a driver)."),
    def(GPU_UTIL, G, &["gpu"], Ratio, "Share of the last sample period each GPU ran a kernel, from NVML (absent without a driver)."),
];

/// Grants: microseconds by cgroup write, milliseconds through Docker.
const GRANT: &[f64] = &[
    5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.5,
];
/// Overhead: sub-millisecond for an exec's grant, seconds for a cold sandbox open.
const OVERHEAD: &[f64] = &[
    1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0,
];
/// Execution: a millisecond up to the default `max_timeout` (one hour).
const EXEC: &[f64] = &[
    1e-3, 1e-2, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];
/// Restores, API calls and image pulls: milliseconds to minutes.
const SLOW: &[f64] = &[
    1e-3, 1e-2, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// The bucket set of every histogram.
pub const BUCKETS: &[(&str, &[f64])] = &[
    (GRANT_SECONDS, GRANT),
    (OVERHEAD_SECONDS, OVERHEAD),
    (EXEC_SECONDS, EXEC),
    (RESTORE_SECONDS, SLOW),
    (API_SECONDS, SLOW),
    (IMAGE_PULL_SECONDS, SLOW),
];

/// The exporter's builder with every histogram's buckets.
fn builder() -> anyhow::Result<PrometheusBuilder> {
    let mut b = PrometheusBuilder::new();
    for (name, buckets) in BUCKETS {
        b = b.set_buckets_for_metric(Matcher::Full(name.to_string()), buckets)?;
    }
    Ok(b)
}

/// Starts the Prometheus exporter on `addr` and registers every metric.
pub fn install(addr: SocketAddr) -> anyhow::Result<()> {
    builder()?.with_http_listener(addr).install()?;
    register();
    Ok(())
}

/// Registers [`DEFS`] with the installed recorder (descriptions, build info, zeros).
pub fn register() {
    tangram_shared::metric::register(DEFS, "worker", env!("CARGO_PKG_VERSION"));
}

#[cfg(test)]
mod tests;
