//! Requests to close a job's sandboxes (`tangram.v1.close.<job>`) and rollouts' lease
//! renewals (`tangram.v1.lease.<job>`), as the leading scheduler takes them in. Both name the
//! job in the subject, which the per-job roles' permissions hold to their own job; the
//! engine decides what to close ([`tangram_core::engine`]'s idle module).

use crate::channels::Input;
use std::collections::HashMap;
use tangram_core::Event;
use tangram_shared::status::{CloseJobReply, Lease};
use tangram_shared::{subject, JobId};
use tokio::sync::mpsc;
use tokio::time::{Duration, Instant};
use tracing::warn;

/// Renewals of one job's lease handed to the engine at most this often (the rest only
/// repeat it: a lease lasts at least a second).
const LEASE_EVERY: Duration = Duration::from_millis(100);
/// Jobs whose last renewal is remembered for that, at most.
const MOST_JOBS: usize = 10_000;

/// The job a close or lease subject names (its last token), if it is a valid job id.
fn job_of(subject: &str, prefix: &str) -> Option<JobId> {
    let job = subject.strip_prefix(prefix)?.strip_prefix('.')?;
    JobId::new(job).ok()
}

/// Answers one close request: the engine asks for a close of each of the job's sandboxes,
/// and the asker learns how many. False when the state task is gone.
pub(crate) async fn answer_close(
    msg: async_nats::Message,
    tx: &mpsc::Sender<Input>,
    client: &async_nats::Client,
) -> bool {
    let Some(reply) = msg.reply else { return true };
    if !subject::is_reply_inbox(&reply) {
        warn!(%reply, "a close request asked for its answer outside an inbox; not answered");
        return true;
    }
    let prefix = format!("{}.close", subject::PREFIX);
    let Some(job) = job_of(&msg.subject, &prefix) else {
        let body = serde_json::json!({"error": format!("{} names no valid job", msg.subject)});
        let _ = client.publish(reply, body.to_string().into()).await;
        return true;
    };
    let (otx, orx) = tokio::sync::oneshot::channel();
    if tx.send(Input::CloseJob(job, otx)).await.is_err() {
        return false;
    }
    if let Ok(closing) = orx.await {
        if let Ok(body) = serde_json::to_vec(&CloseJobReply { closing }) {
            let _ = client.publish(reply, body.into()).await;
        }
    }
    true
}

/// Lease renewals, coalesced per job.
#[derive(Default)]
pub(crate) struct Leases {
    last: HashMap<JobId, Instant>,
}

impl Leases {
    /// The engine's event for one renewal, unless it only repeats one taken less than
    /// [`LEASE_EVERY`] ago or does not read.
    pub(crate) fn take(&mut self, subject: &str, body: &[u8], now: Instant) -> Option<Event> {
        let prefix = format!("{}.lease", subject::PREFIX);
        let job = job_of(subject, &prefix)?;
        let lease: Lease = match serde_json::from_slice(body) {
            Ok(l) => l,
            Err(e) => {
                warn!(%job, error = %e, "a lease renewal that is not JSON like {{\"ttl_ms\": 30000}}; ignored");
                return None;
            }
        };
        if self
            .last
            .get(&job)
            .is_some_and(|t| now.duration_since(*t) < LEASE_EVERY)
        {
            return None;
        }
        if self.last.len() >= MOST_JOBS {
            self.last
                .retain(|_, t| now.duration_since(*t) < LEASE_EVERY);
        }
        self.last.insert(job.clone(), now);
        Some(Event::Lease {
            job,
            ttl_ms: lease.ttl_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renewal_names_its_job_by_subject_and_repeats_within_a_tenth_of_a_second_coalesce() {
        let mut l = Leases::default();
        let t0 = Instant::now();
        let body = br#"{"ttl_ms": 5000}"#;
        let e = l.take("tangram.v1.lease.job-a", body, t0);
        assert_eq!(
            e,
            Some(Event::Lease {
                job: JobId::new("job-a").unwrap(),
                ttl_ms: 5000
            })
        );
        assert_eq!(l.take("tangram.v1.lease.job-a", body, t0), None);
        assert!(l.take("tangram.v1.lease.job-b", body, t0).is_some());
        assert!(l
            .take("tangram.v1.lease.job-a", body, t0 + LEASE_EVERY)
            .is_some());
        assert_eq!(l.take("tangram.v1.lease.job-c", b"soon", t0), None);
        assert_eq!(l.take("tangram.v1.lease.bad job", body, t0), None);
    }
}
