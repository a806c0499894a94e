//! Which results are stored already, without asking the server on every action.
//!
//! Intake must not run an action whose result is stored (a resubmission after the stream's
//! two-minute duplicate window, or a redelivery after a crash). Asking the results stream per
//! action costs a round trip on the path of every action. Instead the scheduler keeps a Bloom
//! filter over the subjects of stored results: filled at start from the stream's subject list
//! and kept current by the results feed. "Absent" is certain and skips the lookup; "maybe"
//! (a stored result, a false positive, or one that aged out of the stream) asks the server as
//! before, so a false positive costs a round trip and never skips an action.
//!
//! The filter is fixed in size (8 MiB): about 0.2% false positives at four million stored
//! results, about 4% at ten million; it only ever gets slower, never wrong. It answers only
//! once the start-up scan is complete; until then every action is looked up.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Bits in the filter: 2^26 (8 MiB).
const BITS: u64 = 1 << 26;
/// Bits set per subject.
const PROBES: u64 = 4;

/// A Bloom filter over stored result subjects, shared by the intake (reads), the results
/// feed and the start-up scan (writes). Lock-free: bits are only ever set.
pub struct StoredResults {
    words: Box<[AtomicU64]>,
    ready: AtomicBool,
    hasher: std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>,
}

impl Default for StoredResults {
    fn default() -> Self {
        Self::with_bits(BITS)
    }
}

impl StoredResults {
    fn with_bits(bits: u64) -> Self {
        let words = (0..bits.div_ceil(64)).map(|_| AtomicU64::new(0)).collect();
        Self {
            words,
            ready: AtomicBool::new(false),
            hasher: Default::default(),
        }
    }

    fn probes(&self, subject: &str) -> impl Iterator<Item = (usize, u64)> {
        let bits = self.words.len() as u64 * 64;
        let mut h = self.hasher.build_hasher();
        h.write(subject.as_bytes());
        let h1 = h.finish();
        h.write_u8(0x5a);
        let h2 = h.finish() | 1;
        (0..PROBES).map(move |i| {
            let bit = h1.wrapping_add(i.wrapping_mul(h2)) % bits;
            ((bit / 64) as usize, 1u64 << (bit % 64))
        })
    }

    /// Records that a result is stored on `subject`.
    pub fn insert(&self, subject: &str) {
        for (word, mask) in self.probes(subject) {
            self.words[word].fetch_or(mask, Ordering::Relaxed);
        }
    }

    /// The start-up scan is complete: from now on "absent" answers are trusted.
    pub fn mark_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    /// Whether the scan is complete.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// True only when no result is stored on `subject` for certain: the scan is complete and
    /// the subject was never inserted. False means "ask the server".
    pub fn surely_absent(&self, subject: &str) -> bool {
        self.is_ready()
            && self
                .probes(subject)
                .any(|(word, mask)| self.words[word].load(Ordering::Relaxed) & mask == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_absent_before_the_scan_completes() {
        let f = StoredResults::default();
        assert!(!f.surely_absent("tangram.v1.result.j.a1"));
        f.mark_ready();
        assert!(f.surely_absent("tangram.v1.result.j.a1"));
    }

    #[test]
    fn an_inserted_subject_is_never_absent() {
        let f = StoredResults::default();
        f.mark_ready();
        for i in 0..10_000 {
            f.insert(&format!("tangram.v1.result.j.a{i}"));
        }
        for i in 0..10_000 {
            assert!(!f.surely_absent(&format!("tangram.v1.result.j.a{i}")));
        }
    }

    #[test]
    fn false_positives_stay_rare_at_the_design_load() {
        // A small filter at the same load factor as 4 M subjects in 2^26 bits.
        let f = StoredResults::with_bits(1 << 16);
        f.mark_ready();
        let n = (4_000_000u64 * (1 << 16) / BITS) as usize;
        for i in 0..n {
            f.insert(&format!("tangram.v1.result.j.stored-{i}"));
        }
        let probes = 20_000;
        let false_positives = (0..probes)
            .filter(|i| !f.surely_absent(&format!("tangram.v1.result.j.fresh-{i}")))
            .count();
        let rate = false_positives as f64 / probes as f64;
        assert!(rate < 0.01, "false positive rate {rate}");
    }
}
