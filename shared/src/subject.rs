//! Subjects, streams and consumers of protocol v1. The one place that spells them.

use crate::action::ActionKind;
use crate::ids::{ActionId, JobId, WorkerId};
use crate::result::RejectCode;

/// Prefix of every subject.
pub const PREFIX: &str = "tangram.v1";

/// Stream holding the backlog of submitted actions (`tangram.v1.action.>`, work-queue: an
/// action leaves once it is dispatched or rejected).
pub const ACTIONS_STREAM: &str = "TANGRAM_ACTIONS";
/// Stream holding results (`tangram.v1.result.>`).
pub const RESULTS_STREAM: &str = "TANGRAM_RESULTS";
/// Stream holding dispatches in flight (`tangram.v1.dispatch.>`, work-queue: a dispatch
/// leaves once its result is stored).
pub const DISPATCH_STREAM: &str = "TANGRAM_DISPATCH";
/// Stream holding the history of actions and dispatches (sourced from the two above,
/// subjects unchanged; a window that evicts its oldest), for replay and audit.
pub const HISTORY_STREAM: &str = "TANGRAM_HISTORY";
/// Stream holding dead-letter records (`tangram.v1.deadletter.>`).
pub const DEADLETTER_STREAM: &str = "TANGRAM_DEADLETTER";

/// Durable consumer through which the scheduler reads actions.
pub const SCHEDULER_ACTIONS_CONSUMER: &str = "scheduler";
/// Durable consumer through which the scheduler reads results (to release capacity).
pub const SCHEDULER_RESULTS_CONSUMER: &str = "scheduler-results";

/// Header carrying the idempotency key (the action id).
pub const HEADER_MSG_ID: &str = "Nats-Msg-Id";
/// Header selecting the encoding: `application/msgpack` (default) or `application/json`.
pub const HEADER_CONTENT_TYPE: &str = "Content-Type";
/// Dead-letter header: the reject code.
pub const HEADER_DLQ_CODE: &str = "Tangram-Reject-Code";
/// Dead-letter header: the reason.
pub const HEADER_DLQ_REASON: &str = "Tangram-Reject-Reason";
/// Dead-letter header: the subject the message arrived on.
pub const HEADER_DLQ_SUBJECT: &str = "Tangram-Original-Subject";

/// Core NATS request/reply subject answered by the scheduler with its status (JSON).
pub const STATUS: &str = "tangram.v1.status";

/// The scheduler's key-value bucket: its epoch, its leader lease and its standbys.
pub const SCHEDULER_BUCKET: &str = "tangram_scheduler";
/// Key of the current scheduler epoch (a decimal string), bumped by each new leader.
pub const EPOCH_KEY: &str = "epoch";
/// Key of the leader lease (JSON [`crate::status::LeaderRecord`]), renewed by
/// compare-and-set on its revision.
pub const LEADER_KEY: &str = "leader";
/// Prefix of the keys standbys announce themselves under (`standby.<id>`, JSON
/// [`crate::status::StandbyRecord`]).
pub const STANDBY_PREFIX: &str = "standby.";
/// Prefix of the keys under which a leader fences a worker instance it declared lost
/// (`fence.<worker>`, the instance id as a string): that instance must drop what it holds
/// and rejoin as a new one before it runs anything again.
pub const FENCE_PREFIX: &str = "fence.";

/// Prefix of the keys of cordoned workers (`cordon.<worker>`, a JSON
/// [`crate::status::CordonRecord`]), written by operators (`tangram cordon`, `drain`).
pub const CORDON_PREFIX: &str = "cordon.";

/// The cordon key of a worker (`cordon.<worker>`).
pub fn cordon_key(worker: &WorkerId) -> String {
    format!("{CORDON_PREFIX}{worker}")
}

/// The fence key of a worker (`fence.<worker>`).
pub fn fence_key(worker: &WorkerId) -> String {
    format!("{FENCE_PREFIX}{worker}")
}

/// Subject for submitting an action: `tangram.v1.action.<job>.<kind>`.
pub fn action(job: &JobId, kind: ActionKind) -> String {
    format!("{PREFIX}.action.{job}.{}", kind.as_str())
}
/// Wildcard over every action.
pub const ACTION_ALL: &str = "tangram.v1.action.>";

/// Splits an action subject into its job and kind tokens (either may be invalid).
pub fn parse_action(subject: &str) -> Option<(&str, &str)> {
    let rest = subject.strip_prefix("tangram.v1.action.")?;
    let (job, kind) = rest.split_once('.')?;
    (!kind.contains('.')).then_some((job, kind))
}

/// Subject of an action's result: `tangram.v1.result.<job>.<action-id>`.
pub fn result(job: &JobId, id: &ActionId) -> String {
    format!("{PREFIX}.result.{job}.{id}")
}
/// Wildcard over every result.
pub const RESULT_ALL: &str = "tangram.v1.result.>";

/// Subject of one action's dispatch to a worker: `tangram.v1.dispatch.<worker>.<action-id>`.
/// The action id in the subject lets a new leader fetch a running action's dispatch with one
/// direct get when a heartbeat lists an action it does not know.
pub fn dispatch(worker: &WorkerId, id: &ActionId) -> String {
    format!("{PREFIX}.dispatch.{worker}.{id}")
}
/// Subject of a re-size of a dispatched exec: `tangram.v1.dispatch.<worker>.<action-id>.regrant`.
/// Under the worker's dispatch filter, so its consumer reads it after the dispatch it
/// amends; a token below the dispatch's own subject, so a lookup of the dispatch never
/// finds it.
pub fn regrant(worker: &WorkerId, id: &ActionId) -> String {
    format!("{PREFIX}.dispatch.{worker}.{id}.regrant")
}
/// Every dispatch to one worker: its consumer's filter, `tangram.v1.dispatch.<worker>.>`.
pub fn dispatch_filter(worker: &WorkerId) -> String {
    format!("{PREFIX}.dispatch.{worker}.>")
}
/// Wildcard over every dispatch.
pub const DISPATCH_ALL: &str = "tangram.v1.dispatch.>";
/// Durable consumer name of a worker on the dispatch stream.
pub fn worker_consumer(worker: &WorkerId) -> String {
    format!("worker-{worker}")
}

/// Subject of a worker's heartbeats (core NATS, not persisted).
pub fn heartbeat(worker: &WorkerId) -> String {
    format!("{PREFIX}.heartbeat.{worker}")
}
/// Core NATS request/reply subject the leading scheduler answers by closing every sandbox
/// of the job (`tangram.v1.close.<job>`, empty body in, [`crate::status::CloseJobReply`]
/// out).
pub fn close_job(job: &JobId) -> String {
    close_job_of(job.as_str())
}
/// The job whose rollout roles alone can read answers sent to `reply`, when it is under a
/// rollout role's inbox (`_R_rollout.<job>.`...); the all-jobs rollout role's own replies
/// (`_R_rollout.<token>...`) read as a job nobody has. `None` for other inboxes (the
/// operator's `_INBOX.`, other roles').
pub fn rollout_job_of_inbox(reply: &str) -> Option<&str> {
    let rest = reply.strip_prefix("_R_rollout.")?;
    Some(rest.split('.').next().unwrap_or(rest))
}
/// [`close_job`] of a job name not yet checked (permissions are written from role names).
pub fn close_job_of(job: &str) -> String {
    format!("{PREFIX}.close.{job}")
}
/// Wildcard over every job's close requests.
pub const CLOSE_JOB_ALL: &str = "tangram.v1.close.*";
/// Core NATS subject a rollout renews its job's lease on (`tangram.v1.lease.<job>`, JSON
/// [`crate::status::Lease`]): once a job has renewed a lease, its sandboxes are closed when
/// the lease runs out.
pub fn lease(job: &JobId) -> String {
    lease_of(job.as_str())
}
/// [`lease`] of a job name not yet checked.
pub fn lease_of(job: &str) -> String {
    format!("{PREFIX}.lease.{job}")
}
/// Wildcard over every job's leases.
pub const LEASE_ALL: &str = "tangram.v1.lease.*";
/// Core NATS request/reply subject a worker answers to pre-pull a sandbox image
/// (`tangram.v1.prepull.<worker>`, JSON [`crate::image::PrepullRequest`] in,
/// [`crate::image::PrepullReply`] out).
pub fn prepull(worker: &WorkerId) -> String {
    prepull_of(worker.as_str())
}
/// Whether a request's reply subject is an inbox: a role's (`_R_<role>...`) or the default
/// (`_INBOX.`). Answering services (the scheduler's status, a worker's pre-pull) answer only
/// these, so that a request cannot make them publish on a subject of its choosing (another
/// job's results, a heartbeat).
pub fn is_reply_inbox(subject: &str) -> bool {
    subject.starts_with("_INBOX.") || subject.starts_with("_R_")
}
/// [`prepull`] of a worker id not yet checked (permissions are written from role names).
pub fn prepull_of(worker: &str) -> String {
    format!("{PREFIX}.prepull.{worker}")
}
/// Wildcard over every heartbeat.
pub const HEARTBEAT_ALL: &str = "tangram.v1.heartbeat.*";

/// Subject of a dead-letter record: `tangram.v1.deadletter.<code>`.
pub fn deadletter(code: RejectCode) -> String {
    format!("{PREFIX}.deadletter.{}", code.as_str())
}
/// Subject of a worker's record of a dispatch it refused: `tangram.v1.deadletter.<reason>`,
/// one of [`DISPATCH_REFUSALS`].
pub fn deadletter_refused(reason: &str) -> String {
    format!("{PREFIX}.deadletter.{reason}")
}
/// A worker's refusal of a dispatch from a scheduler that has been superseded.
pub const REFUSED_STALE_EPOCH: &str = "stale_epoch";
/// A worker's refusal of a dispatch of an epoch no scheduler has held.
pub const REFUSED_UNKNOWN_EPOCH: &str = "unknown_epoch";
/// A worker's refusal of a dispatch addressed to one of its instances that was fenced.
pub const REFUSED_FENCED_INSTANCE: &str = "fenced_instance";
/// Every reason a worker refuses a dispatch for: the `<code>` of its dead-letter record
/// beside the [`RejectCode`]s of the scheduler's. Never a result.
pub const DISPATCH_REFUSALS: [&str; 3] = [
    REFUSED_STALE_EPOCH,
    REFUSED_UNKNOWN_EPOCH,
    REFUSED_FENCED_INSTANCE,
];
/// Header naming the worker that refused a dispatch.
pub const HEADER_DLQ_WORKER: &str = "Tangram-Worker";
/// Dead-letter header: the action's id, when one could be read.
pub const HEADER_DLQ_ACTION: &str = "Tangram-Action-Id";
/// Wildcard over every dead-letter record.
pub const DEADLETTER_ALL: &str = "tangram.v1.deadletter.>";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rollout_inbox_names_the_job_whose_roles_can_read_it() {
        assert_eq!(rollout_job_of_inbox("_R_rollout.jobA.nuid.1"), Some("jobA"));
        assert_eq!(rollout_job_of_inbox("_R_rollout.nuid"), Some("nuid"));
        assert_eq!(rollout_job_of_inbox("_INBOX.abc.1"), None);
        assert_eq!(rollout_job_of_inbox("_R_scheduler.x"), None);
        assert_eq!(rollout_job_of_inbox("_R_rollout"), None);
    }

    #[test]
    fn answers_go_to_inboxes_only() {
        assert!(is_reply_inbox("_INBOX.abc.1"));
        assert!(is_reply_inbox("_R_rollout-job.xyz"));
        for other in [
            "tangram.v1.result.other-job.x",
            "tangram.v1.heartbeat.w1",
            "$JS.API.STREAM.PURGE.TANGRAM_RESULTS",
            "_INBOXX",
            "",
        ] {
            assert!(!is_reply_inbox(other), "{other}");
        }
    }

    #[test]
    fn subjects_are_versioned_and_parse_back() {
        let job = JobId::new("j1").unwrap();
        let s = action(&job, ActionKind::SandboxExec);
        assert_eq!(s, "tangram.v1.action.j1.sandbox_exec");
        assert_eq!(parse_action(&s), Some(("j1", "sandbox_exec")));
        assert_eq!(parse_action("tangram.v1.action.j1"), None);
        assert_eq!(parse_action("tangram.v1.action.j1.a.b"), None);
        let id = ActionId::new("a-7").unwrap();
        assert_eq!(result(&job, &id), "tangram.v1.result.j1.a-7");
        assert_eq!(
            deadletter(RejectCode::Oversized),
            "tangram.v1.deadletter.oversized"
        );
    }
}
