//! The queue as a rollout framework sees it: depth per kind, the oldest wait, and an estimate
//! of the wait a new action would see now (Little's law on the last minute's completions).
//! A read of the engine's state, no decisions.

use super::{Engine, Now};
use std::collections::BTreeMap;
use tangram_shared::status::QueueStatus;

/// Completions older than this do not count towards the throughput.
const WINDOW_MS: u64 = 60_000;
/// The shortest span a throughput is measured over, so one early completion does not read
/// as a huge rate.
const MIN_SPAN_MS: u64 = 1_000;

impl Engine {
    /// Queue depth, oldest wait, throughput and estimated wait per action kind. Kinds with
    /// neither a queue nor a recent completion are left out.
    pub fn queues(&self, now: Now) -> BTreeMap<String, QueueStatus> {
        let mut out: BTreeMap<String, QueueStatus> = BTreeMap::new();
        for e in self.actions.values() {
            if e.state.is_waiting() {
                let q = out.entry(e.action.kind().as_str().to_string()).or_default();
                q.depth += 1;
                let waited = now.ms.saturating_sub(e.arrived_ms) as f64 / 1e3;
                q.oldest_wait_s = q.oldest_wait_s.max(waited);
            }
        }
        // Completions in the window, and how long the window really is: the ring of recent
        // results may cover less than a minute, and the engine may be younger than that.
        let since = now.ms.saturating_sub(WINDOW_MS);
        let mut done: BTreeMap<&str, (usize, f64)> = BTreeMap::new();
        let mut first_ms = now.ms;
        for (kind, timing, at_ms) in self.recent.iter().filter(|(_, _, at)| *at >= since) {
            let d = done.entry(kind.as_str()).or_default();
            d.0 += 1;
            d.1 += timing.queued_us as f64 / 1e6;
            first_ms = first_ms.min(*at_ms);
        }
        let started = self.started_ms.unwrap_or(now.ms).max(since);
        let span_s = now
            .ms
            .saturating_sub(first_ms.min(started))
            .max(MIN_SPAN_MS) as f64
            / 1e3;
        for (kind, (n, queued_sum)) in &done {
            out.entry(kind.to_string()).or_default().throughput_per_s = *n as f64 / span_s;
            let q = out.get_mut(*kind).expect("just inserted");
            q.est_wait_s = Some(estimate(
                q.depth,
                q.throughput_per_s,
                queued_sum / *n as f64,
            ));
        }
        for q in out.values_mut() {
            if q.depth == 0 && q.est_wait_s.is_none() {
                q.est_wait_s = Some(0.0);
            }
        }
        out
    }
}

/// The wait a new arrival would see: the queue ahead of it drained at the recent rate, and
/// never less than what recent actions of the kind actually waited.
fn estimate(depth: usize, throughput_per_s: f64, recent_mean_wait_s: f64) -> f64 {
    let drain = if throughput_per_s > 0.0 {
        depth as f64 / throughput_per_s
    } else {
        0.0
    };
    drain.max(if depth == 0 { 0.0 } else { recent_mean_wait_s })
}

#[cfg(test)]
mod tests {
    use super::estimate;

    #[test]
    fn the_estimate_drains_the_queue_at_the_recent_rate() {
        assert_eq!(estimate(100, 50.0, 0.1), 2.0);
    }

    #[test]
    fn the_estimate_is_never_below_what_recent_actions_waited() {
        assert_eq!(estimate(1, 100.0, 3.0), 3.0);
    }

    #[test]
    fn an_empty_queue_waits_nothing() {
        assert_eq!(estimate(0, 10.0, 3.0), 0.0);
    }
}
