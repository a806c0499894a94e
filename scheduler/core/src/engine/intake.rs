//! Intake: validating action messages (a pure function the service calls on its intake
//! task, off the engine's path), arrivals, duplicates and rejections.

use super::lifecycle::{ActionState, Entry};
use super::{Arrival, Delivery, Effect, Engine, Now, Observation, Reject};
use tangram_shared::codec::{self, Encoding};
use tangram_shared::{subject, Action, ActionId, ActionResult, JobId, RejectCode, Rejection};

/// Jobs whose `per-task` open rotation is remembered at most.
const MAX_TASK_JOBS: usize = 10_000;

/// An action message as it came off the stream.
#[derive(Debug, Clone, Copy)]
pub struct RawMessage<'a> {
    /// Its subject.
    pub subject: &'a str,
    /// Its `Nats-Msg-Id` header.
    pub msg_id: Option<&'a str>,
    /// Its `Content-Type` header.
    pub content_type: Option<&'a str>,
    /// Its body.
    pub payload: &'a [u8],
}

/// A message that will not be scheduled, and whom to tell.
#[derive(Debug, Clone, PartialEq)]
pub struct BadMessage {
    /// Its message.
    pub delivery: Delivery,
    /// The action id, when one could be read.
    pub id: Option<String>,
    /// The job, when one could be read.
    pub job: Option<String>,
    /// The encoding the rejection result is written in.
    pub encoding: Encoding,
    /// Why.
    pub rejection: Rejection,
}

/// Decodes and validates one action message: size, encoding, the action's own rules, and
/// that the subject, the `Nats-Msg-Id` and the body agree.
pub fn check(
    raw: &RawMessage<'_>,
    limits: &tangram_shared::Limits,
    max_action_bytes: usize,
    delivery: Delivery,
) -> Result<(Action, Encoding), Box<BadMessage>> {
    let (subject_job, subject_kind) = subject::parse_action(raw.subject).unwrap_or(("", ""));
    let mut bad = Box::new(BadMessage {
        delivery,
        id: raw.msg_id.map(str::to_string),
        job: Some(subject_job.to_string()),
        encoding: Encoding::Msgpack,
        rejection: Rejection::new(RejectCode::Undecodable, ""),
    });
    let encoding = match Encoding::from_content_type(raw.content_type) {
        Ok(e) => e,
        Err(e) => {
            bad.rejection = Rejection::new(RejectCode::Undecodable, e.to_string());
            return Err(bad);
        }
    };
    bad.encoding = encoding;
    if raw.payload.len() > max_action_bytes {
        bad.rejection = Rejection::new(
            RejectCode::Oversized,
            format!(
                "action is {} bytes; the limit is {max_action_bytes} (put large inputs in the image)",
                raw.payload.len(),
            ),
        );
        if bad.id.is_none() {
            bad.id = codec::read_envelope(raw.payload, encoding).id;
        }
        return Err(bad);
    }
    let action = match codec::decode_action(raw.payload, encoding) {
        Ok(a) => a,
        Err(f) => {
            bad.id = bad.id.or(f.envelope.id);
            bad.rejection = f.rejection;
            return Err(bad);
        }
    };
    bad.id = Some(action.id.to_string());
    if let Err(r) = action.validate(limits) {
        bad.rejection = r;
        return Err(bad);
    }
    let mismatch = if action.job.as_str() != subject_job {
        Some(format!(
            "body job {:?} does not match the subject's job {subject_job:?}",
            action.job.0
        ))
    } else if action.kind().as_str() != subject_kind {
        Some(format!(
            "body kind {:?} does not match the subject's kind {subject_kind:?}",
            action.kind().as_str()
        ))
    } else if raw.msg_id.is_some_and(|h| h != action.id.as_str()) {
        Some(format!(
            "Nats-Msg-Id {:?} does not match the body id {:?}",
            raw.msg_id.unwrap_or_default(),
            action.id.0
        ))
    } else {
        None
    };
    if let Some(reason) = mismatch {
        bad.rejection = Rejection::new(RejectCode::Mismatch, reason);
        return Err(bad);
    }
    Ok((action, encoding))
}

impl Engine {
    pub(crate) fn on_arrived(&mut self, a: Arrival, now: Now) {
        self.out.push(Effect::Observe(Observation::Received(Some(
            a.action.kind(),
        ))));
        if let Some(e) = self.actions.get_mut(&a.action.id) {
            if e.delivery == a.delivery {
                // A redelivery of the message we hold: the server now expects the ack on this
                // delivery, which has the same handle. Queued or dispatching, the ack is still
                // to come; running, it was sent and lost, so it is sent again.
                match &mut e.state {
                    ActionState::Queued { last_progress_ms }
                    | ActionState::Backoff {
                        last_progress_ms, ..
                    } => *last_progress_ms = now.ms,
                    ActionState::Dispatching { .. } => {}
                    ActionState::Running { .. } => self.out.push(Effect::Ack(a.delivery)),
                }
            } else {
                // The same id in another message: a resubmission.
                self.out.push(Effect::Observe(Observation::Duplicate));
                self.out.push(Effect::Ack(a.delivery));
            }
            return;
        }
        if a.seen || self.settled_set.contains(&a.action.id) {
            self.out.push(Effect::Observe(Observation::Duplicate));
            self.out.push(Effect::Ack(a.delivery));
            return;
        }
        if let Some(d) = a.dispatched {
            // An earlier leader stored its dispatch and ended before acking: the worker has
            // it, so it is taken over, never dispatched again.
            let (worker, dispatch) = *d;
            if dispatch.action.id == a.action.id {
                self.adopt(
                    worker,
                    dispatch,
                    Some(a.delivery),
                    super::adopt::Found::Fetched,
                    now,
                );
                return;
            }
        }
        if self.stopping {
            // The next scheduler takes it.
            self.out.push(Effect::Nak(a.delivery));
            return;
        }
        if let Some(rejection) = self.refused_admission(&a.action).filter(|_| !a.redelivered) {
            let (id, job) = (a.action.id.to_string(), a.action.job.0.clone());
            self.reject(a.delivery, Some(id), Some(job), a.encoding, rejection, now);
            return;
        }
        self.admitted(&a.action, a.bytes, now);
        let id = a.action.id.clone();
        // The scheduler's own closes are not a use of the sandbox.
        if !matches!(
            &a.action.spec,
            tangram_shared::ActionSpec::SandboxClose(c) if c.reason.is_some()
        ) {
            self.idle_touch(&a.action.job, &a.action.trajectory, now);
        }
        let pin = self.task_pool_home(&a.action);
        self.actions.insert(
            id.clone(),
            Entry {
                action: a.action,
                encoding: a.encoding,
                submitted_at_us: a.submitted_at_us,
                delivery: a.delivery,
                arrived_ms: now.ms,
                model: a.model,
                attempts: 0,
                failures: 0,
                pin,
                pinned_since_ms: None,
                bytes: a.bytes,
                state: ActionState::Queued {
                    last_progress_ms: now.ms,
                },
            },
        );
        self.queue.push(id);
        self.dirty = true;
    }

    /// `per-task`: the worker a job's sandbox goes to, round robin over the job's share of
    /// the workers.
    fn task_pool_home(&mut self, action: &Action) -> Option<tangram_shared::WorkerId> {
        if self.provisioning != crate::model::Provisioning::PerTask
            || action.kind() != tangram_shared::ActionKind::SandboxOpen
        {
            return None;
        }
        let jobs = &self.config.task_pools;
        let j = jobs.iter().position(|x| x == action.job.as_str())?;
        let workers: Vec<&tangram_shared::WorkerId> = self.workers.keys().collect();
        let mine: Vec<&tangram_shared::WorkerId> = workers
            .iter()
            .enumerate()
            .filter(|(i, _)| i % jobs.len() == j)
            .map(|(_, w)| *w)
            .collect();
        let pool = if mine.is_empty() { workers } else { mine };
        if self.task_opens.len() >= MAX_TASK_JOBS && !self.task_opens.contains_key(&action.job.0) {
            // Round-robin counters only: forgetting them restarts each job's rotation.
            self.task_opens.clear();
        }
        let n = self.task_opens.entry(action.job.0.clone()).or_default();
        *n += 1;
        pool.get((*n - 1) % pool.len().max(1)).map(|w| (*w).clone())
    }

    pub(crate) fn on_bad(&mut self, bad: super::BadMessage, now: Now) {
        self.out.push(Effect::Observe(Observation::Received(None)));
        self.reject(
            bad.delivery,
            bad.id,
            bad.job,
            bad.encoding,
            bad.rejection,
            now,
        );
    }

    /// Rejects a queued action: it leaves the queue settled, with a dead-letter record and a
    /// rejection result.
    pub(crate) fn reject_queued(&mut self, id: &ActionId, rejection: Rejection, now: Now) {
        let Some(e) = self.actions.get(id) else {
            return;
        };
        if !matches!(e.state, ActionState::Queued { .. }) {
            return;
        }
        // It leaves the queue when the cycle compacts it.
        let e = self.actions.remove(id).expect("present");
        self.remember_settled(id.clone());
        self.reject(
            e.delivery,
            Some(e.action.id.to_string()),
            Some(e.action.job.0.clone()),
            e.encoding,
            rejection,
            now,
        );
    }

    fn reject(
        &mut self,
        delivery: Delivery,
        id: Option<String>,
        job: Option<String>,
        encoding: codec::Encoding,
        rejection: Rejection,
        now: Now,
    ) {
        self.out.push(Effect::Observe(Observation::Rejected(
            rejection.code.as_str(),
        )));
        let addressable = match (&id, &job) {
            (Some(id), Some(job)) => ActionId::new(id.clone())
                .ok()
                .zip(JobId::new(job.clone()).ok()),
            _ => None,
        };
        let result = addressable.map(|(id, job)| {
            ActionResult::rejected(id, job, rejection.clone(), now.unix_us / 1000)
        });
        self.out.push(Effect::Reject(Box::new(Reject {
            message: BadMessage {
                delivery,
                id,
                job,
                encoding,
                rejection,
            },
            result,
        })));
    }

    pub(crate) fn on_shutdown(&mut self) {
        self.stopping = true;
        // Hand queued actions back at once (instead of after the ack wait) so that the next
        // scheduler picks them up without delay. Dispatching and running ones stay with
        // their workers.
        let mut backing_off: Vec<(u64, ActionId)> = self
            .actions
            .iter()
            .filter_map(|(id, e)| match e.state {
                ActionState::Backoff { until_ms, .. } => Some((until_ms, id.clone())),
                _ => None,
            })
            .collect();
        backing_off.sort();
        let waiting = backing_off.into_iter().map(|(_, id)| id);
        for id in std::mem::take(&mut self.queue).into_iter().chain(waiting) {
            if let Some(e) = self.actions.remove(&id) {
                self.out.push(Effect::Nak(e.delivery));
            }
        }
    }
}
