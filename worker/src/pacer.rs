//! Spacing of calls to one rate-limited provider as they leave this worker.
//!
//! The scheduler admits calls under the provider's pooled quota, but a call can leave later
//! than it was admitted (a busy host, a paused process), and calls admitted 25 ms apart can
//! then leave together and overrun the provider's bucket. The pacer keeps the worker's own
//! sends within the provider's rate and the burst the scheduler uses, so a stall on this
//! worker delays calls instead of bunching them.

use std::time::Duration;
use tokio::sync::Mutex;
use tokio::time::Instant;

/// A token bucket that reserves: a caller takes a token now or the next one to come, and
/// waits until then. Callers leave in the order they asked.
#[derive(Debug)]
pub struct Pacer {
    rate_per_s: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl Pacer {
    /// A full bucket of `burst` tokens refilled at `rate_per_s`.
    pub fn new(rate_per_s: f64, burst: f64) -> Self {
        Self {
            rate_per_s: rate_per_s.max(1e-3),
            burst: burst.max(1.0),
            state: Mutex::new((burst.max(1.0), Instant::now())),
        }
    }

    /// For a provider declaring `rate_per_s` and `burst`: the burst the scheduler uses.
    pub fn for_provider(rate_per_s: f64, burst: u32) -> Self {
        Self::new(
            rate_per_s,
            tangram_shared::pacing::usable_burst(rate_per_s, burst),
        )
    }

    /// Waits until this caller's token is there, and takes it.
    pub async fn wait(&self) {
        let delay = {
            let mut st = self.state.lock().await;
            let now = Instant::now();
            let refill = now.saturating_duration_since(st.1).as_secs_f64() * self.rate_per_s;
            st.0 = (st.0 + refill).min(self.burst) - 1.0;
            st.1 = now;
            if st.0 >= 0.0 {
                Duration::ZERO
            } else {
                Duration::from_secs_f64(-st.0 / self.rate_per_s)
            }
        };
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Pacer;
    use std::time::Duration;
    use tokio::time::Instant;

    #[tokio::test(start_paused = true)]
    async fn calls_bunched_by_a_stall_leave_the_worker_at_the_provider_rate() {
        // 40/s with a declared burst of 4: one token usable, one call per 25 ms after it.
        let pacer = std::sync::Arc::new(Pacer::for_provider(40.0, 4));
        let t0 = Instant::now();
        let mut left = Vec::new();
        for _ in 0..5 {
            pacer.wait().await;
            left.push(t0.elapsed());
        }
        assert_eq!(left[0], Duration::ZERO);
        for w in left.windows(2) {
            assert!(w[1] - w[0] >= Duration::from_millis(25), "{left:?}");
        }
        // Idle for a second: the bucket refills to its burst, not beyond.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let t1 = Instant::now();
        pacer.wait().await;
        pacer.wait().await;
        assert_eq!(
            t1.elapsed(),
            Duration::from_millis(25),
            "one token saved up, then paced"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_callers_are_spaced_too() {
        let pacer = std::sync::Arc::new(Pacer::new(100.0, 1.0));
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let p = pacer.clone();
            tasks.push(tokio::spawn(async move {
                p.wait().await;
                t0.elapsed()
            }));
        }
        let mut at = Vec::new();
        for t in tasks {
            at.push(t.await.unwrap());
        }
        at.sort();
        assert_eq!(
            at,
            [0, 10, 20, 30].map(Duration::from_millis).to_vec(),
            "one call per 10 ms"
        );
    }
}
