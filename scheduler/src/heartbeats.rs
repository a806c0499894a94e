//! Heartbeats as the scheduler takes them in. A worker's credential may publish heartbeats
//! only on its own subject (`tangram.v1.heartbeat.<worker>`), so the subject, not the body,
//! says who speaks: a body naming another worker is refused (it would make that worker look
//! restarted, or invent a ghost that attracts placements). Each subject is rate limited
//! before anything is decoded, so that one credential cannot load the state task.

use std::collections::HashMap;
use tangram_shared::codec::{decode, Encoding};
use tangram_shared::Heartbeat;
use tokio::time::Instant;

/// Heartbeats a subject may send per second, sustained: twice what the fastest period a
/// worker accepts (50 ms) sends.
pub(crate) const RATE_PER_S: f64 = 40.0;
/// And in a burst.
pub(crate) const BURST: f64 = 40.0;
/// Subjects remembered at most; the quietest are forgotten beyond it (only the operator and
/// scheduler credentials may publish on subjects no worker has).
const MOST_SUBJECTS: usize = 100_000;
/// A refusal is logged at most this often per subject and reason.
const WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// Why a heartbeat was not taken in (the metric's `reason` label).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Its subject is not a worker's heartbeat subject.
    Subject,
    /// Its subject sent more than the rate allows.
    Rate,
    /// Its body did not decode.
    Undecodable(String),
    /// Its body names another worker than its subject.
    NotItsWorker {
        /// The worker its subject names.
        subject: String,
        /// The worker its body names.
        claimed: String,
    },
}

impl Refused {
    /// The metric's label.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Refused::Subject => "subject",
            Refused::Rate => "rate",
            Refused::Undecodable(_) => "undecodable",
            Refused::NotItsWorker { .. } => "not_its_worker",
        }
    }
}

/// A token bucket per heartbeat subject.
#[derive(Default)]
pub(crate) struct HeartbeatGate {
    buckets: HashMap<String, (f64, Instant)>,
    /// When each (subject, reason) was last logged.
    warned: HashMap<(String, &'static str), Instant>,
}

impl HeartbeatGate {
    /// The heartbeat on `subject` with body `payload`, received at `now`, if it may be taken in.
    pub(crate) fn take(
        &mut self,
        subject: &str,
        payload: &[u8],
        now: Instant,
    ) -> Result<Heartbeat, Refused> {
        let worker = worker_of(subject).ok_or(Refused::Subject)?;
        if !self.admit(worker, now) {
            return Err(Refused::Rate);
        }
        let hb = decode::<Heartbeat>(payload, Encoding::Msgpack)
            .map_err(|e| Refused::Undecodable(e.to_string()))?;
        if hb.worker.as_str() != worker {
            return Err(Refused::NotItsWorker {
                subject: worker.to_string(),
                claimed: hb.worker.to_string(),
            });
        }
        Ok(hb)
    }

    /// Whether a refusal of `reason` on `subject` is to be logged at `now`: once a minute
    /// (the metric counts every one).
    pub(crate) fn should_warn(
        &mut self,
        subject: &str,
        reason: &'static str,
        now: Instant,
    ) -> bool {
        if self.warned.len() >= MOST_SUBJECTS {
            self.warned.clear();
        }
        let key = (subject.to_string(), reason);
        match self.warned.get(&key) {
            Some(t) if now.saturating_duration_since(*t) < WARN_EVERY => false,
            _ => {
                self.warned.insert(key, now);
                true
            }
        }
    }

    /// Whether `worker`'s bucket holds a token at `now` (taking it).
    fn admit(&mut self, worker: &str, now: Instant) -> bool {
        if !self.buckets.contains_key(worker) && self.buckets.len() >= MOST_SUBJECTS {
            // The quietest half goes: their buckets were full again long ago, or soon are.
            let mut at: Vec<Instant> = self.buckets.values().map(|(_, t)| *t).collect();
            at.sort_unstable();
            let cut = at[at.len() / 2];
            self.buckets.retain(|_, (_, t)| *t > cut);
        }
        let (tokens, at) = self
            .buckets
            .entry(worker.to_string())
            .or_insert((BURST, now));
        let refill = now.saturating_duration_since(*at).as_secs_f64() * RATE_PER_S;
        *tokens = (*tokens + refill).min(BURST);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The worker a heartbeat subject names: its one token after `tangram.v1.heartbeat.`.
pub(crate) fn worker_of(subject: &str) -> Option<&str> {
    let prefix = tangram_shared::subject::HEARTBEAT_ALL.trim_end_matches('*');
    let w = subject.strip_prefix(prefix)?;
    (!w.is_empty() && !w.contains('.')).then_some(w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tangram_shared::codec::encode;

    fn body(worker: &str) -> Vec<u8> {
        let hb: Heartbeat = serde_json::from_value(serde_json::json!({
            "worker": worker, "instance": "i1", "seq": 1, "interval_ms": 1000,
            "cores": 4, "mem_mb": 4096,
        }))
        .unwrap();
        encode(&hb, Encoding::Msgpack).unwrap()
    }

    #[test]
    fn a_heartbeat_is_taken_from_the_worker_its_subject_names_only() {
        let mut g = HeartbeatGate::default();
        let now = Instant::now();
        let hb = g.take("tangram.v1.heartbeat.w1", &body("w1"), now).unwrap();
        assert_eq!(hb.worker.as_str(), "w1");
        assert_eq!(
            g.take("tangram.v1.heartbeat.w2", &body("w1"), now),
            Err(Refused::NotItsWorker {
                subject: "w2".into(),
                claimed: "w1".into()
            })
        );
        assert_eq!(
            g.take("tangram.v1.heartbeat.w2", &body("ghost"), now)
                .unwrap_err()
                .reason(),
            "not_its_worker"
        );
        for bad in [
            "tangram.v1.heartbeat.",
            "tangram.v1.heartbeat.a.b",
            "tangram.v1.status",
        ] {
            assert_eq!(
                g.take(bad, &body("w1"), now),
                Err(Refused::Subject),
                "{bad}"
            );
        }
        assert!(matches!(
            g.take("tangram.v1.heartbeat.w3", b"\x01\x02", now),
            Err(Refused::Undecodable(_))
        ));
    }

    #[test]
    fn a_subject_past_its_rate_is_refused_and_others_are_not() {
        let mut g = HeartbeatGate::default();
        let t0 = Instant::now();
        let flood = "tangram.v1.heartbeat.loud";
        let taken = (0..1000)
            .filter(|_| g.take(flood, &body("loud"), t0).is_ok())
            .count();
        assert_eq!(taken, BURST as usize, "a burst is bounded");
        assert_eq!(g.take(flood, &body("loud"), t0), Err(Refused::Rate));
        // Another worker is untouched.
        assert!(g
            .take("tangram.v1.heartbeat.quiet", &body("quiet"), t0)
            .is_ok());
        // A second later, the rate's worth again; a worker at its fastest period (50 ms)
        // is never refused.
        let t1 = t0 + Duration::from_secs(1);
        let taken = (0..1000)
            .filter(|_| g.take(flood, &body("loud"), t1).is_ok())
            .count();
        assert_eq!(taken, RATE_PER_S as usize);
        let fast = "tangram.v1.heartbeat.fast";
        for i in 0..2_000u64 {
            let at = t0 + Duration::from_millis(50 * i);
            assert!(g.take(fast, &body("fast"), at).is_ok(), "heartbeat {i}");
        }
    }
}
