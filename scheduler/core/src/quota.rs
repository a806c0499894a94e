//! External API quota as a pooled resource: per provider, one token bucket (rate and burst)
//! and one concurrency cap for the whole fleet, weighted fair shares between jobs when demand
//! exceeds the quota, and an adaptive effective rate (additive increase, multiplicative
//! decrease on HTTP 429 or slow replies).
//!
//! Pure: time is an argument.

use std::collections::BTreeMap;

/// A token bucket: `rate_per_s` tokens a second, at most `burst` saved up; one request takes
/// one token.
#[derive(Debug, Clone, Copy, PartialEq)]
struct TokenBucket {
    /// Refill rate, tokens per second.
    rate_per_s: f64,
    /// Most tokens held.
    burst: f64,
    /// Tokens held at `at_ms`.
    tokens: f64,
    /// When `tokens` was measured, on the caller's clock.
    at_ms: u64,
}

impl TokenBucket {
    /// Tokens available at `now_ms`.
    fn available(&self, now_ms: u64) -> f64 {
        let dt = now_ms.saturating_sub(self.at_ms) as f64 / 1e3;
        (self.tokens + dt * self.rate_per_s).min(self.burst)
    }

    /// Milliseconds from `now_ms` until `n` tokens are available (`None`: never, the bucket
    /// neither holds nor refills that many).
    fn ready_in_ms(&self, n: f64, now_ms: u64) -> Option<u64> {
        let have = self.available(now_ms);
        if have >= n {
            Some(0)
        } else if self.rate_per_s > 0.0 && n <= self.burst {
            Some(((n - have) / self.rate_per_s * 1e3).ceil() as u64)
        } else {
            None
        }
    }
}

/// A provider's declared quota.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderQuota {
    /// Name `api` actions use.
    pub name: String,
    /// Requests per second, for the whole fleet.
    pub rate_per_s: f64,
    /// Burst, requests.
    pub burst: u32,
    /// Requests in flight at most.
    pub concurrency: u32,
    /// Replies slower than this count as overload, ms.
    pub slow_ms: Option<u64>,
}

/// Multiplicative decrease factor on overload.
pub const DECREASE: f64 = 0.5;
/// The effective rate never drops below this share of the declared rate.
pub const FLOOR: f64 = 0.05;
/// Additive increase, as a share of the declared rate per second of good replies.
pub const INCREASE_PER_S: f64 = 0.10;
/// At most one decrease per this many ms (a burst of 429s is one signal).
pub const DECREASE_EVERY_MS: u64 = 250;

pub use tangram_shared::pacing::HEADROOM_S;

/// The burst the scheduler uses (see [`tangram_shared::pacing::usable_burst`]).
fn usable_burst(spec: &ProviderQuota) -> f64 {
    tangram_shared::pacing::usable_burst(spec.rate_per_s, spec.burst)
}

/// One provider's live state.
#[derive(Debug, Clone, PartialEq)]
pub struct Quota {
    spec: ProviderQuota,
    bucket: TokenBucket,
    effective: f64,
    inflight: u32,
    last_decrease_ms: Option<u64>,
    /// Last time the rate was raised (or lowered), for the time-based increase.
    last_adjust_ms: u64,
    /// Start-time fair queuing: each job's finish tag, and the system's virtual time.
    tags: BTreeMap<String, f64>,
    vtime: f64,
    /// Requests admitted per job (for reports).
    admitted: BTreeMap<String, u64>,
    /// Overload signals seen.
    overloads: u64,
}

/// Jobs a provider keeps per-job state for (fair-queuing tags, admission counts). Tags of
/// idle jobs are dropped past it; admissions of jobs beyond it are counted under
/// [`OTHER_JOBS`].
pub const MAX_JOBS: usize = 1_024;
/// The admission count of jobs past [`MAX_JOBS`].
pub const OTHER_JOBS: &str = "(other jobs)";

impl Quota {
    /// A provider with a full bucket at `now_ms`. Part of the burst is kept as headroom for
    /// jitter between the scheduler's admission and the request's arrival at the provider
    /// (see [`HEADROOM_S`]), so the provider never sees more than its own bucket allows.
    pub fn new(spec: ProviderQuota, now_ms: u64) -> Self {
        let burst = usable_burst(&spec);
        Self {
            bucket: TokenBucket {
                rate_per_s: spec.rate_per_s,
                burst,
                tokens: burst,
                at_ms: now_ms,
            },
            effective: spec.rate_per_s,
            spec,
            inflight: 0,
            last_decrease_ms: None,
            last_adjust_ms: now_ms,
            tags: BTreeMap::new(),
            vtime: 0.0,
            admitted: BTreeMap::new(),
            overloads: 0,
        }
    }

    /// The quota as declared.
    pub fn spec(&self) -> &ProviderQuota {
        &self.spec
    }

    /// Updates the declared quota (a worker's config changed); keeps live state.
    pub fn redeclare(&mut self, spec: ProviderQuota, now_ms: u64) {
        if spec != self.spec {
            let burst = usable_burst(&spec);
            self.settle(now_ms);
            self.bucket.burst = burst;
            self.bucket.tokens = self.bucket.tokens.min(burst);
            self.effective = self.effective.min(spec.rate_per_s);
            self.bucket.rate_per_s = self.effective;
            self.spec = spec;
        }
    }

    fn settle(&mut self, now_ms: u64) {
        self.bucket.tokens = self.bucket.available(now_ms);
        self.bucket.at_ms = self.bucket.at_ms.max(now_ms);
    }

    /// The adaptive rate in force, requests per second.
    pub fn effective_rate(&self) -> f64 {
        self.effective
    }

    /// Requests in flight.
    pub fn inflight(&self) -> u32 {
        self.inflight
    }

    /// Requests admitted per job so far.
    pub fn admitted(&self) -> &BTreeMap<String, u64> {
        &self.admitted
    }

    /// Overload signals (429 or slow replies) seen.
    pub fn overloads(&self) -> u64 {
        self.overloads
    }

    /// `Some(0)` when a request may start now; `Some(ms)` when the next token comes in that
    /// long; `None` when the concurrency cap is reached (wait for a reply).
    pub fn ready_in_ms(&self, now_ms: u64) -> Option<u64> {
        if self.inflight >= self.spec.concurrency {
            return None;
        }
        self.bucket.ready_in_ms(1.0, now_ms)
    }

    /// Among waiting requests `(index, job)` in arrival order, the one to admit next: the job
    /// with the smallest start tag (requests admitted divided by the job's weight, never
    /// behind the virtual time, so that a job that was idle does not monopolise), the
    /// earliest arrival within a job and on ties.
    pub fn pick(&self, waiting: &[(usize, &str)]) -> Option<usize> {
        let mut best: Option<(f64, usize, usize)> = None;
        let mut seen: Vec<&str> = Vec::new();
        for (pos, &(idx, job)) in waiting.iter().enumerate() {
            if seen.contains(&job) {
                continue;
            }
            seen.push(job);
            let start = self.tags.get(job).copied().unwrap_or(0.0).max(self.vtime);
            if best
                .is_none_or(|(s, p, _)| start < s - 1e-12 || (start - s).abs() <= 1e-12 && pos < p)
            {
                best = Some((start, pos, idx));
            }
        }
        best.map(|(_, _, idx)| idx)
    }

    /// Admits one request of `job` (weight `weight`) at `now_ms`: takes a token and a
    /// concurrency slot. Call [`Quota::finish`] with its reply.
    pub fn take(&mut self, job: &str, weight: f64, now_ms: u64) {
        self.settle(now_ms);
        self.bucket.tokens -= 1.0;
        self.inflight += 1;
        let start = self.tags.get(job).copied().unwrap_or(0.0).max(self.vtime);
        self.vtime = start;
        self.tags
            .insert(job.to_string(), start + 1.0 / weight.max(1e-6));
        if self.tags.len() > MAX_JOBS {
            self.forget_idle_tags();
        }
        if self.admitted.len() >= MAX_JOBS && !self.admitted.contains_key(job) {
            *self.admitted.entry(OTHER_JOBS.to_string()).or_default() += 1;
        } else {
            *self.admitted.entry(job.to_string()).or_default() += 1;
        }
    }

    /// Keeps the fair-queuing tags within [`MAX_JOBS`]. A tag at or behind the virtual time
    /// says nothing a missing one does not (both start at the virtual time), so those go
    /// first, changing no pick; if that is not enough, the lowest tags (the jobs idle the
    /// longest) go too, each such job gaining at most one request's worth of head start.
    fn forget_idle_tags(&mut self) {
        let vtime = self.vtime;
        self.tags.retain(|_, tag| *tag > vtime);
        if self.tags.len() > MAX_JOBS {
            let mut tags: Vec<f64> = self.tags.values().copied().collect();
            let cut = (tags.len() / 8).max(1);
            let (_, nth, _) = tags.select_nth_unstable_by(cut - 1, f64::total_cmp);
            let threshold = *nth;
            self.tags.retain(|_, tag| *tag > threshold);
        }
    }

    /// A request ended: `status` is the HTTP status when a reply came, `latency_ms` how long
    /// the call took. A 429, or a reply slower than the provider's `slow_ms`, halves the
    /// effective rate (at most once per 250 ms, never below 5% of the declared rate); good
    /// replies add 10% of the declared rate back per second since the last change.
    pub fn finish(&mut self, now_ms: u64, status: Option<u16>, latency_ms: u64) {
        self.inflight = self.inflight.saturating_sub(1);
        let overload = status == Some(429) || self.spec.slow_ms.is_some_and(|s| latency_ms > s);
        let base = self.spec.rate_per_s;
        let before = self.effective;
        if overload {
            self.overloads += 1;
            let due = self
                .last_decrease_ms
                .is_none_or(|t| now_ms.saturating_sub(t) >= DECREASE_EVERY_MS);
            if due {
                self.effective = (self.effective * DECREASE).max(base * FLOOR);
                self.last_decrease_ms = Some(now_ms);
                self.last_adjust_ms = now_ms;
            }
        } else if status.is_some_and(|s| s < 500) && self.effective < base {
            let dt = now_ms.saturating_sub(self.last_adjust_ms) as f64 / 1e3;
            self.effective = (self.effective + base * INCREASE_PER_S * dt).min(base);
            self.last_adjust_ms = now_ms;
        } else if self.effective >= base {
            self.last_adjust_ms = now_ms;
        }
        if self.effective != before {
            self.settle(now_ms);
            self.bucket.rate_per_s = self.effective;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(rate: f64, burst: u32, conc: u32) -> ProviderQuota {
        ProviderQuota {
            name: "search".into(),
            rate_per_s: rate,
            burst,
            concurrency: conc,
            slow_ms: Some(2_000),
        }
    }

    #[test]
    fn rate_burst_and_concurrency_bound_admissions() {
        let mut q = Quota::new(spec(10.0, 4, 100), 0);
        // Burst less the headroom (one token at 10/s) at once, then one per 100 ms.
        for _ in 0..3 {
            assert_eq!(q.ready_in_ms(0), Some(0));
            q.take("a", 1.0, 0);
        }
        assert_eq!(q.ready_in_ms(0), Some(100));
        assert_eq!(q.ready_in_ms(100), Some(0));
        let mut c = Quota::new(spec(1000.0, 100, 2), 0);
        c.take("a", 1.0, 0);
        c.take("a", 1.0, 0);
        assert_eq!(c.ready_in_ms(0), None, "concurrency cap");
        c.finish(5, Some(200), 5);
        assert_eq!(c.ready_in_ms(5), Some(0));
    }

    #[test]
    fn ten_thousand_jobs_keep_per_job_state_bounded() {
        let mut q = Quota::new(spec(1e9, 1_000_000, 1_000_000), 0);
        for i in 0..10_000 {
            let job = format!("job-{i}");
            q.take(&job, 1.0, 0);
            q.finish(0, Some(200), 1);
            assert!(q.tags.len() <= MAX_JOBS + 1);
        }
        assert!(q.admitted().len() <= MAX_JOBS + 1);
        assert_eq!(q.admitted().values().sum::<u64>(), 10_000);
        assert_eq!(q.admitted()[OTHER_JOBS], 10_000 - MAX_JOBS as u64);
        // A job the bound forgot still gets its fair start: the current virtual time.
        let waiting = [(0, "job-0"), (1, "job-9999")];
        assert_eq!(q.pick(&waiting), Some(0));
    }

    #[test]
    fn backlogged_jobs_share_by_weight_and_a_newcomer_does_not_monopolise() {
        let mut q = Quota::new(spec(1e9, 1_000_000, 1_000_000), 0);
        let w = |j: &str| if j == "a" { 2.0 } else { 1.0 };
        let waiting = [(0, "a"), (1, "b")];
        let mut n = BTreeMap::new();
        for _ in 0..300 {
            let i = q.pick(&waiting).unwrap();
            let job = waiting[i].1;
            q.take(job, w(job), 0);
            *n.entry(job).or_insert(0) += 1;
        }
        assert_eq!((n["a"], n["b"]), (200, 100));
        // c arrives late: it starts at the current virtual time, not at zero.
        let waiting = [(0, "a"), (1, "b"), (2, "c")];
        let mut m = BTreeMap::new();
        for _ in 0..400 {
            let i = q.pick(&waiting).unwrap();
            let job = waiting[i].1;
            q.take(job, w(job), 0);
            *m.entry(job).or_insert(0) += 1;
        }
        let (a, b, c) = (m["a"], m["b"], m["c"]);
        assert!(
            (198..=202).contains(&a) && (98..=102).contains(&b) && (98..=102).contains(&c),
            "{m:?}"
        );
    }

    #[test]
    fn headroom_below_the_burst_grows_with_the_rate() {
        // Regression: one token of headroom (25 ms at 40/s) let dispatch jitter under load
        // bunch two calls into a provider whose own bucket was empty.
        let q = Quota::new(spec(40.0, 10, 100), 0);
        let mut n = 0;
        let mut q = q;
        while q.ready_in_ms(0) == Some(0) {
            q.take("a", 1.0, 0);
            n += 1;
        }
        assert_eq!(n, 6, "10 less the 4 tokens 100 ms of 40/s brings");
        let mut small = Quota::new(spec(40.0, 2, 100), 0);
        small.take("a", 1.0, 0);
        assert_ne!(
            small.ready_in_ms(0),
            Some(0),
            "at least one token of headroom, one left to use"
        );
    }

    #[test]
    fn aimd_backs_off_on_429_and_recovers() {
        let mut q = Quota::new(spec(100.0, 10, 100), 0);
        q.take("a", 1.0, 0);
        q.finish(10, Some(429), 10);
        assert_eq!(q.effective_rate(), 50.0);
        // A second 429 right after is the same signal.
        q.take("a", 1.0, 20);
        q.finish(20, Some(429), 10);
        assert_eq!(q.effective_rate(), 50.0);
        q.take("a", 1.0, 300);
        q.finish(300, Some(429), 10);
        assert_eq!(q.effective_rate(), 25.0);
        // Slow replies count as overload too.
        q.take("a", 1.0, 600);
        q.finish(600, Some(200), 5_000);
        assert_eq!(q.effective_rate(), 12.5);
        // Good replies add 10 per second (10% of 100) back.
        q.take("a", 1.0, 1_600);
        q.finish(1_600, Some(200), 10);
        assert!(
            (q.effective_rate() - 22.5).abs() < 1e-9,
            "{}",
            q.effective_rate()
        );
        for i in 0..20 {
            q.take("a", 1.0, 2_000 + i * 1_000);
            q.finish(2_000 + i * 1_000, Some(200), 10);
        }
        assert_eq!(
            q.effective_rate(),
            100.0,
            "recovers to the declared rate, no further"
        );
        assert_eq!(q.overloads(), 4);
    }
}
