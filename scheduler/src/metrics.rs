//! The scheduler's metrics: every name in one table ([`DEFS`], which `docs/METRICS.md`
//! mirrors), base units, explicit buckets, bounded labels (kind, code, outcome, service,
//! provider, worker: never an action id). The recording functions are in `record`.

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use std::net::SocketAddr;
use tangram_shared::metric::{MetricDef, MetricType, MetricUnit, BUILD_INFO};

mod record;
pub(crate) use record::*;

pub const ACTIONS_RECEIVED: &str = "tangram_scheduler_actions_received_total";
pub const ACTIONS_REJECTED: &str = "tangram_scheduler_actions_rejected_total";
pub const ACTIONS_DUPLICATE: &str = "tangram_scheduler_actions_duplicate_total";
pub const ACTION_REDELIVERIES: &str = "tangram_scheduler_action_redeliveries_total";
pub const INTAKE_TAKEN_BACK: &str = "tangram_scheduler_intake_taken_back_total";
pub const RESULT_LOOKUPS: &str = "tangram_scheduler_result_lookups_total";
pub const DISPATCHED: &str = "tangram_scheduler_dispatched_total";
pub const RESULTS: &str = "tangram_scheduler_results_total";
pub const QUEUE_DEPTH: &str = "tangram_scheduler_queue_depth";
pub const RUNNING: &str = "tangram_scheduler_running";
pub const WORKERS_ALIVE: &str = "tangram_scheduler_workers_alive";
pub const WORKERS_LOST: &str = "tangram_scheduler_workers_lost_total";
pub const HEARTBEAT_AGE: &str = "tangram_scheduler_worker_heartbeat_age_seconds";
pub const POOL_CORES: &str = "tangram_scheduler_pool_cores";
pub const POOL_MEMORY: &str = "tangram_scheduler_pool_memory_bytes";
pub const CORDONED: &str = "tangram_scheduler_cordoned_workers";
pub const STREAM_DRIFT: &str = "tangram_scheduler_stream_config_drift";
pub const WORKERS_FENCED: &str = "tangram_scheduler_workers_fenced_total";
pub const FENCED_HEARTBEATS: &str = "tangram_scheduler_fenced_heartbeats_total";
pub const REFUSED_HEARTBEATS: &str = "tangram_scheduler_heartbeats_refused_total";
pub const DECLARATIONS_REFUSED: &str = "tangram_scheduler_declarations_refused_total";
pub const SANDBOXES_CLOSED: &str = "tangram_scheduler_sandboxes_closed_total";
pub const NATS_GAPS: &str = "tangram_scheduler_nats_gaps_total";
pub const CYCLE_SECONDS: &str = "tangram_scheduler_cycle_duration_seconds";
pub const QUEUE_SECONDS: &str = "tangram_scheduler_queue_wait_seconds";
pub const ACT_SECONDS: &str = "tangram_scheduler_act_seconds";
pub const ACT_PHASE_SECONDS: &str = "tangram_scheduler_act_phase_seconds";
pub const GPU_ROUTES: &str = "tangram_scheduler_gpu_routes_total";
pub const GPU_EVICTIONS: &str = "tangram_scheduler_gpu_evictions_total";
pub const PROVIDER_RATE: &str = "tangram_scheduler_provider_effective_rate";
pub const PROVIDER_INFLIGHT: &str = "tangram_scheduler_provider_inflight";
pub const PROVIDER_WAITING: &str = "tangram_scheduler_provider_waiting";
pub const API_ADMITTED: &str = "tangram_scheduler_api_admitted_total";
pub const ADOPTED: &str = "tangram_scheduler_adopted_total";
pub const LEADER: &str = "tangram_scheduler_leader";
pub const EPOCH: &str = "tangram_scheduler_epoch";
pub const TERMS: &str = "tangram_scheduler_leader_terms_total";
pub const TERMS_FAILED: &str = "tangram_scheduler_leader_terms_failed_total";
pub const PLANNING_PAUSED: &str = "tangram_scheduler_planning_paused_total";
pub const QUEUE_DEPTH_BY_KIND: &str = "tangram_scheduler_queue_depth_by_kind";
pub const QUEUE_OLDEST: &str = "tangram_scheduler_queue_oldest_wait_seconds";
pub const QUEUE_ESTIMATE: &str = "tangram_scheduler_queue_estimated_wait_seconds";
pub const STREAM_BACKLOG: &str = "tangram_scheduler_stream_backlog";
pub const DEADLETTERS: &str = "tangram_scheduler_deadletter_messages";
pub const HELD_ACTIONS: &str = "tangram_scheduler_held_actions";
pub const HELD_BYTES: &str = "tangram_scheduler_held_bytes";
pub const INTAKE_PAUSED: &str = "tangram_scheduler_intake_paused_total";
pub const GPUS: &str = "tangram_scheduler_gpus";

use MetricType::{Counter as C, Gauge as G, Histogram as H};
use MetricUnit::{Bytes as B, Count as N, Info, PerSecond, Seconds as S};

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

/// Every metric the scheduler emits.
#[rustfmt::skip]
pub const DEFS: &[MetricDef] = &[
    def(BUILD_INFO, G, &["version", "git_sha", "component"], Info, "The build of this process (value 1); git_sha when the build knows its commit (a git checkout, or TANGRAM_GIT_SHA)."),
    def(ACTIONS_RECEIVED, C, &["kind"], N, "Actions received, by kind (unknown when undecodable)."),
    def(ACTIONS_REJECTED, C, &["code"], N, "Actions rejected at intake or placement, by reject code; each leaves a dead letter."),
    def(ACTIONS_DUPLICATE, C, &[], N, "Resubmissions of an action already known, dropped."),
    def(ACTION_REDELIVERIES, C, &[], N, "Action messages JetStream delivered more than once (an earlier leader or this one did not ack in time)."),
    def(INTAKE_TAKEN_BACK, C, &[], N, "Actions a new leader read back at the start of its term that an earlier leader was delivered and never answered, rather than waiting out their ack wait."),
    def(RESULT_LOOKUPS, C, &["outcome"], N, "Checks for a stored result at intake: skipped (ruled out in memory), stored, absent or failed."),
    def(DISPATCHED, C, &["kind"], N, "Dispatches stored, by kind."),
    def(RESULTS, C, &["outcome", "code"], N, "Results seen, by outcome and failure code (none unless rejected or an infrastructure error)."),
    def(QUEUE_DEPTH, G, &[], N, "Actions queued now."),
    def(RUNNING, G, &[], N, "Actions dispatched and not yet finished."),
    def(WORKERS_ALIVE, G, &[], N, "Workers heard from within their grace."),
    def(WORKERS_LOST, C, &[], N, "Workers declared lost after going silent past their grace."),
    def(HEARTBEAT_AGE, G, &["worker"], S, "Since each live worker's last heartbeat; NaN once the worker has left the fleet."),
    def(POOL_CORES, G, &["state"], N, "Cores of the live workers: total, and booked by running actions."),
    def(POOL_MEMORY, G, &["state"], B, "Sandbox memory of the live workers: total, and booked by open sandboxes."),
    def(CORDONED, G, &[], N, "Workers cordoned or being drained by an operator."),
    def(STREAM_DRIFT, G, &[], N, "Fields in which the stored streams differ from the configuration at start (left as stored; the log names them)."),
    def(WORKERS_FENCED, C, &[], N, "Fence records written: a worker instance declared lost must rejoin anew."),
    def(FENCED_HEARTBEATS, C, &[], N, "Heartbeats ignored because their worker instance was fenced."),
    def(REFUSED_HEARTBEATS, C, &["reason"], N, "Heartbeats not taken in, by reason (not_its_worker: the body names another worker than the subject; rate: past 40 a second from one subject; undecodable; subject: not a worker's heartbeat subject)."),
    def(DECLARATIONS_REFUSED, C, &["kind"], N, "Workers' declarations refused because they differ from the fleet's definition in force (kind: provider), once per worker and name until it declares the definition again."),
    def(SANDBOXES_CLOSED, C, &["reason"], N, "Closes the scheduler submitted itself, by reason (idle_timeout, job_closed, lease_expired)."),
    def(NATS_GAPS, C, &[], N, "Gaps in this scheduler's reach of NATS after which worker graces were restarted instead of declaring workers lost."),
    def(CYCLE_SECONDS, H, &[], S, "One call of the decision engine: a burst of events and its planning cycle."),
    def(QUEUE_SECONDS, H, &["kind"], S, "From an action's arrival to its dispatch being stored, by kind."),
    def(ACT_SECONDS, H, &["kind"], S, "Action completion time (queued + overhead + exec) of each first result, by kind."),
    def(ACT_PHASE_SECONDS, H, &["kind", "phase"], S, "The parts of ACT, by kind and phase: queued, overhead, exec."),
    def(GPU_ROUTES, C, &["service", "restore"], N, "Reward actions routed, by service and whether the route restores a replica."),
    def(GPU_EVICTIONS, C, &["service"], N, "Replicas the scheduler decided to evict, by the service that needed the room."),
    def(PROVIDER_RATE, G, &["provider"], PerSecond, "A provider's adaptive request rate in force."),
    def(PROVIDER_INFLIGHT, G, &["provider"], N, "A provider's requests in flight."),
    def(PROVIDER_WAITING, G, &["provider"], N, "A provider's requests waiting for quota."),
    def(API_ADMITTED, C, &["provider", "rl_job"], N, "Api actions admitted, by provider and RL job (at most 256 jobs, later ones as other)."),
    def(ADOPTED, C, &["kind"], N, "Running actions taken over from an earlier leader, by kind."),
    def(LEADER, G, &[], N, "1 while this scheduler holds the leader lease, 0 while it stands by."),
    def(EPOCH, G, &[], N, "The epoch of this scheduler's current or last term as leader (0 before its first)."),
    def(TERMS, C, &[], N, "Terms this scheduler has begun as leader."),
    def(TERMS_FAILED, C, &[], N, "Terms that ended on a NATS error rather than a lost lease."),
    def(PLANNING_PAUSED, C, &[], N, "Times the leader's fence fell (lease renewals unanswered) and planning paused until a renewal went through."),
    def(QUEUE_DEPTH_BY_KIND, G, &["kind"], N, "Actions queued now, by kind."),
    def(QUEUE_OLDEST, G, &["kind"], S, "How long the oldest queued action of a kind has waited."),
    def(QUEUE_ESTIMATE, G, &["kind"], S, "The wait a new action of a kind would see now (depth over recent throughput)."),
    def(STREAM_BACKLOG, G, &[], N, "Actions stored in the stream and not yet delivered to the scheduler."),
    def(DEADLETTERS, G, &[], N, "Records stored in the dead-letter stream (rejections and refused dispatches)."),
    def(HELD_ACTIONS, G, &[], N, "Action messages held in memory (queued or being dispatched)."),
    def(HELD_BYTES, G, &[], B, "Bytes of the action messages held in memory."),
    def(INTAKE_PAUSED, C, &[], N, "Times the intake paused at max_queued_actions or max_queued_bytes (the stream kept the rest)."),
    def(GPUS, G, &["state"], N, "GPUs known in the fleet (total) and held by resident replicas (resident)."),
];

const CYCLE_BUCKETS: &[f64] = &[
    1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5, 1.0,
];
/// Queue waits: sub-millisecond when idle, minutes when a fleet is saturated.
const QUEUE_BUCKETS: &[f64] = &[
    1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5, 1.0, 5.0, 30.0, 60.0, 300.0, 900.0,
];
/// ACT and its parts: a millisecond close to a sandbox's lifetime, an exec up to the
/// default `max_timeout` (one hour).
const ACT_BUCKETS: &[f64] = &[
    1e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
    3600.0,
];

/// The bucket set of every histogram.
pub const BUCKETS: &[(&str, &[f64])] = &[
    (CYCLE_SECONDS, CYCLE_BUCKETS),
    (QUEUE_SECONDS, QUEUE_BUCKETS),
    (ACT_SECONDS, ACT_BUCKETS),
    (ACT_PHASE_SECONDS, ACT_BUCKETS),
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
    tangram_shared::metric::register(DEFS, "scheduler", env!("CARGO_PKG_VERSION"));
}

#[cfg(test)]
mod tests;
