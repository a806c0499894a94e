//! Learned elasticity: when actions carry no model, estimate T1 and the parallel fraction per
//! (job, tool) key from completed actions, which report the cores they ran with and how long
//! they took.
//!
//! Under Amdahl's law `t(m) = T1 * ((1 - p) + p / m) = a + b / m`, linear in `x = 1 / m`, so
//! an ordinary least-squares fit of `t` on `x` over the samples gives `a` and `b`, then
//! `T1 = a + b` and `p = b / (a + b)`. With samples at a single core count the slope is
//! unknown; the prior parallel fraction is kept and only T1 is scaled.

use crate::elastic::{ElasticModel, Speedup};
use std::collections::HashMap;

/// Prior parallel fraction before anything is known about a key's scaling.
pub const PRIOR_P: f64 = 0.5;
/// Keys kept at most. Keys come from rollouts (job and program name), so their number is
/// not ours to choose: past this, the least recently observed eighth is forgotten (those
/// keys start again from the prior).
pub const MAX_KEYS: usize = 10_000;

#[derive(Debug, Default, Clone)]
struct Sums {
    n: f64,
    sx: f64,
    sy: f64,
    sxx: f64,
    sxy: f64,
    distinct: Option<(u32, bool)>,
    /// The learner's observation count when this key was last observed.
    last: u64,
}

/// Per-key running sums; O(1) memory per key.
#[derive(Debug, Default, Clone)]
pub struct Learner {
    keys: HashMap<String, Sums>,
    observed: u64,
    evicted: u64,
}

impl Learner {
    /// An empty learner.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that an action of `key` ran `exec_ms` with `cores`.
    pub fn observe(&mut self, key: &str, cores: u32, exec_ms: f64) {
        if cores == 0 || !(exec_ms.is_finite() && exec_ms > 0.0) {
            return;
        }
        if !self.keys.contains_key(key) && self.keys.len() >= MAX_KEYS {
            self.evict_oldest();
        }
        self.observed += 1;
        let s = self.keys.entry(key.to_string()).or_default();
        s.last = self.observed;
        let x = 1.0 / cores as f64;
        s.n += 1.0;
        s.sx += x;
        s.sy += exec_ms;
        s.sxx += x * x;
        s.sxy += x * exec_ms;
        s.distinct = match s.distinct {
            None => Some((cores, false)),
            Some((c, many)) => Some((c, many || c != cores)),
        };
    }

    /// Forgets the least recently observed eighth of the keys (one sort per eighth, so the
    /// cost per observation stays constant).
    fn evict_oldest(&mut self) {
        let mut lasts: Vec<u64> = self.keys.values().map(|s| s.last).collect();
        let cut = (lasts.len() / 8).max(1);
        let (_, nth, _) = lasts.select_nth_unstable(cut - 1);
        let threshold = *nth;
        let before = self.keys.len();
        self.keys.retain(|_, s| s.last > threshold);
        self.evicted += (before - self.keys.len()) as u64;
    }

    /// Keys forgotten to stay within [`MAX_KEYS`].
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// The model learned for `key`, if any sample was seen.
    pub fn model(&self, key: &str) -> Option<ElasticModel> {
        let s = self.keys.get(key)?;
        let mean_y = s.sy / s.n;
        let mean_x = s.sx / s.n;
        let var_x = s.sxx / s.n - mean_x * mean_x;
        let (t1, p) = if s.distinct.is_some_and(|d| d.1) && var_x > 1e-12 {
            let b = ((s.sxy / s.n - mean_x * mean_y) / var_x).max(0.0);
            let a = (mean_y - b * mean_x).max(0.0);
            let t1 = (a + b).max(1e-3);
            (t1, (b / t1).clamp(0.0, 1.0))
        } else {
            // One core count seen: t(m) = T1 * ((1 - p) + p / m) with the prior p.
            let m = s.distinct.map_or(1, |d| d.0) as f64;
            (mean_y / ((1.0 - PRIOR_P) + PRIOR_P / m), PRIOR_P)
        };
        Some(ElasticModel {
            t1_ms: t1,
            speedup: Speedup::Amdahl(p),
        })
    }

    /// Keys known.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// True when nothing was observed.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovers_amdahl_parameters_from_samples_at_several_core_counts() {
        let truth = ElasticModel {
            t1_ms: 4000.0,
            speedup: Speedup::Amdahl(0.8),
        };
        let mut l = Learner::new();
        for m in [1, 2, 4, 8, 16, 4, 2] {
            l.observe("job/pytest", m, truth.dur_ms(m));
        }
        let got = l.model("job/pytest").unwrap();
        assert!((got.t1_ms - 4000.0).abs() < 1.0, "{got:?}");
        assert!(
            matches!(got.speedup, Speedup::Amdahl(p) if (p - 0.8).abs() < 1e-6),
            "{got:?}"
        );
        assert!(l.model("other").is_none());
    }

    #[test]
    fn distinct_programs_past_the_bound_evict_the_least_recently_observed() {
        let mut l = Learner::new();
        for i in 0..MAX_KEYS {
            l.observe(&format!("job/prog-{i}"), 1, 100.0);
        }
        // Key 0 is observed again: it is the most recent now.
        l.observe("job/prog-0", 2, 60.0);
        for i in 0..3 * MAX_KEYS {
            l.observe(&format!("job/other-{i}"), 1, 100.0);
            assert!(l.len() <= MAX_KEYS);
        }
        assert!(l.evicted() >= 3 * MAX_KEYS as u64);
        assert!(l.model("job/prog-1").is_none());
        assert!(l
            .model(&format!("job/other-{}", 3 * MAX_KEYS - 1))
            .is_some());
    }

    #[test]
    fn one_core_count_keeps_the_prior_and_scales_t1() {
        let mut l = Learner::new();
        l.observe("k", 2, 750.0);
        let got = l.model("k").unwrap();
        assert!((got.dur_ms(2) - 750.0).abs() < 1e-6);
        assert_eq!(got.speedup, Speedup::Amdahl(PRIOR_P));
    }
}
