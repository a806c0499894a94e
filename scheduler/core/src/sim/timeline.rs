//! What a run did over time, for its picture: GPUs resident per service, restores and
//! evictions, API calls admitted per provider and job. Recorded in bins of one width shared by
//! every track; when a run outgrows [`MAX_BINS`] bins the width doubles (pairs of bins merge),
//! so memory stays bounded whatever the run's length and every track stays on the same grid
//! (stacked pictures need that). Recording only watches: it never feeds back into a decision.

use std::collections::BTreeMap;

/// Bins kept per track at most; past it the bin width doubles.
pub const MAX_BINS: usize = 512;

/// The first bin width: one second, so that short runs show rates per second.
const FIRST_BIN_MS: f64 = 1_000.0;

/// One thing followed over time.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Track {
    /// GPUs held by a service's resident replicas (a level: the bin holds GPU-milliseconds).
    Resident(String),
    /// Replica restores (a count).
    Restores,
    /// Replica evictions (a count).
    Evictions,
    /// API calls a provider admitted for a job (a count).
    Admitted {
        /// The provider.
        provider: String,
        /// The job.
        job: String,
    },
}

impl Track {
    /// Whether the track is a level (averaged over a bin) rather than a count (a rate).
    pub fn is_level(&self) -> bool {
        matches!(self, Track::Resident(_))
    }
}

/// The recorded tracks.
#[derive(Debug, Clone, PartialEq)]
pub struct Timeline {
    /// Width of every bin, ms.
    pub bin_ms: f64,
    /// The last instant recorded, ms (the last bin is only filled up to it).
    pub end_ms: f64,
    tracks: BTreeMap<Track, Vec<f64>>,
    /// Per provider: the quota's rate, calls per second.
    pub quota_per_s: BTreeMap<String, f64>,
}

impl Default for Timeline {
    fn default() -> Self {
        Self {
            bin_ms: FIRST_BIN_MS,
            end_ms: 0.0,
            tracks: BTreeMap::new(),
            quota_per_s: BTreeMap::new(),
        }
    }
}

impl Timeline {
    /// An empty timeline for a run whose providers allow these rates (calls per second).
    pub fn with_quotas(quota_per_s: BTreeMap<String, f64>) -> Self {
        Self {
            quota_per_s,
            ..Self::default()
        }
    }

    /// Counts `n` events of `track` at `at_ms`.
    pub fn count(&mut self, track: Track, at_ms: f64, n: f64) {
        let at_ms = at_ms.max(0.0);
        let i = self.bin_of(at_ms);
        let bins = self.tracks.entry(track).or_default();
        if bins.len() <= i {
            bins.resize(i + 1, 0.0);
        }
        bins[i] += n;
        self.end_ms = self.end_ms.max(at_ms);
    }

    /// Records that `track` stood at `level` from `from_ms` to `to_ms`.
    pub fn level(&mut self, track: Track, from_ms: f64, to_ms: f64, level: f64) {
        let (from_ms, to_ms) = (from_ms.max(0.0), to_ms.max(0.0));
        if to_ms <= from_ms {
            return;
        }
        self.bin_of(to_ms);
        self.end_ms = self.end_ms.max(to_ms);
        if level == 0.0 && !self.tracks.contains_key(&track) {
            return;
        }
        let w = self.bin_ms;
        // The bin the span ends in (a span ending on a boundary ends in the bin before it).
        let last = ((to_ms / w).ceil() as usize).saturating_sub(1);
        let bins = self.tracks.entry(track).or_default();
        if bins.len() <= last {
            bins.resize(last + 1, 0.0);
        }
        let mut i = (from_ms / w) as usize;
        while i <= last {
            let (lo, hi) = (from_ms.max(i as f64 * w), to_ms.min((i + 1) as f64 * w));
            bins[i] += level * (hi - lo).max(0.0);
            i += 1;
        }
    }

    /// The tracks recorded, in order.
    pub fn tracks(&self) -> impl Iterator<Item = &Track> {
        self.tracks.keys()
    }

    /// A track as (bin middle in seconds, value): the mean level over the bin for a level,
    /// events per second for a count. Empty when the track was never recorded.
    pub fn series(&self, track: &Track) -> Vec<(f64, f64)> {
        let Some(bins) = self.tracks.get(track) else {
            return Vec::new();
        };
        let w = self.bin_ms;
        bins.iter()
            .enumerate()
            .map(|(i, v)| {
                let lo = i as f64 * w;
                // The last bin is only filled up to the end of the run: a level is its mean
                // over that part; a count over less than half a bin is spread over the whole
                // bin, or a sliver would spike.
                let filled = (self.end_ms.min(lo + w) - lo).max(w * 1e-6);
                let width = if track.is_level() || filled >= w / 2.0 {
                    filled
                } else {
                    w
                };
                let per = if track.is_level() { width } else { width / 1e3 };
                ((lo + width / 2.0) / 1e3, v / per)
            })
            .collect()
    }

    /// The bin of `at_ms`, widening the bins first if it lies past [`MAX_BINS`].
    fn bin_of(&mut self, at_ms: f64) -> usize {
        loop {
            let i = (at_ms / self.bin_ms) as usize;
            if i < MAX_BINS {
                return i;
            }
            self.bin_ms *= 2.0;
            for bins in self.tracks.values_mut() {
                *bins = bins.chunks(2).map(|p| p.iter().sum()).collect();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_become_rates_and_levels_become_means() {
        let mut t = Timeline::default();
        for k in 0..10 {
            t.count(Track::Restores, 100.0 * k as f64, 1.0);
        }
        t.level(Track::Resident("a".into()), 0.0, 500.0, 4.0);
        t.level(Track::Resident("a".into()), 500.0, 2_000.0, 2.0);
        let r = t.series(&Track::Restores);
        assert_eq!(r.len(), 1);
        // Ten in the first second, which the level's end covers whole.
        assert_eq!(t.end_ms, 2_000.0);
        assert!((r[0].1 - 10.0).abs() < 1e-9, "{r:?}");
        let a = t.series(&Track::Resident("a".into()));
        assert_eq!(a.len(), 2);
        assert!(
            (a[0].1 - 3.0).abs() < 1e-9 && (a[1].1 - 2.0).abs() < 1e-9,
            "{a:?}"
        );
    }

    #[test]
    fn a_long_run_stays_within_max_bins_on_one_grid() {
        let mut t = Timeline::default();
        let hour = 3_600_000.0;
        t.level(Track::Resident("a".into()), 0.0, hour, 1.0);
        t.count(Track::Evictions, hour, 1.0);
        t.count(Track::Evictions, 10.0, 1.0);
        let a = t.series(&Track::Resident("a".into()));
        let e = t.series(&Track::Evictions);
        assert!(a.len() <= MAX_BINS && e.len() <= MAX_BINS);
        assert_eq!(t.bin_ms, 8_000.0);
        // The level survives the merges: one GPU all along.
        assert!(a.iter().all(|p| (p.1 - 1.0).abs() < 1e-9), "{a:?}");
        // Ending a sliver into a bin, a level keeps its value there.
        t.level(Track::Resident("a".into()), hour, hour + 10.0, 1.0);
        let a = t.series(&Track::Resident("a".into()));
        assert!((a.last().unwrap().1 - 1.0).abs() < 1e-9, "{:?}", a.last());
        // Both events kept: the count's integral over the run is 2.
        let total: f64 = t.tracks[&Track::Evictions].iter().sum();
        assert_eq!(total, 2.0);
    }
}
