//! Host CPU sets: parsing `"0-3,6"` lists, and the allocator that hands out specific cores.

use std::collections::BTreeSet;

/// Parses a cpuset list (`"0-3,6"`).
pub fn parse(list: &str) -> Result<Vec<u32>, String> {
    let mut cpus = BTreeSet::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (part, part),
        };
        let lo: u32 = lo
            .parse()
            .map_err(|_| format!("{part:?} is not a CPU number or range"))?;
        let hi: u32 = hi
            .parse()
            .map_err(|_| format!("{part:?} is not a CPU number or range"))?;
        if lo > hi || hi > 4095 {
            return Err(format!("{part:?} is not a valid CPU range"));
        }
        cpus.extend(lo..=hi);
    }
    if cpus.is_empty() {
        return Err(format!("cpuset {list:?} is empty"));
    }
    Ok(cpus.into_iter().collect())
}

/// Formats CPUs as a compact cpuset list.
pub fn format(cpus: &[u32]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        while i + 1 < sorted.len() && sorted[i + 1] == sorted[i] + 1 {
            i += 1;
        }
        out.push(if start == sorted[i] {
            start.to_string()
        } else {
            format!("{start}-{}", sorted[i])
        });
        i += 1;
    }
    out.join(",")
}

/// The cores this worker may grant, and which are free. The worker has the last word on
/// admission: a grant that would need a busy core is refused here even if the scheduler
/// thought it free.
#[derive(Debug)]
pub struct CoreAllocator {
    free: BTreeSet<u32>,
    total: usize,
}

impl CoreAllocator {
    /// An allocator over `cores`.
    pub fn new(cores: &[u32]) -> Self {
        Self {
            free: cores.iter().copied().collect(),
            total: cores.len(),
        }
    }
    /// Cores managed.
    pub fn total(&self) -> usize {
        self.total
    }
    /// Takes `n` free cores, lowest ids first (neighbours share caches), or none.
    pub fn take(&mut self, n: usize) -> Option<Vec<u32>> {
        if n == 0 || self.free.len() < n {
            return None;
        }
        let got: Vec<u32> = self.free.iter().take(n).copied().collect();
        for c in &got {
            self.free.remove(c);
        }
        Some(got)
    }
    /// Returns cores.
    pub fn give_back(&mut self, cores: &[u32]) {
        self.free.extend(cores.iter().copied());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_round_trip() {
        assert_eq!(parse("0-3, 6,8-9").unwrap(), vec![0, 1, 2, 3, 6, 8, 9]);
        assert_eq!(format(&[9, 8, 0, 1, 2, 3, 6]), "0-3,6,8-9");
        assert!(parse("3-1").is_err());
        assert!(parse("x").is_err());
        assert!(parse("").is_err());
    }

    #[test]
    fn allocator_never_hands_out_a_core_twice() {
        let mut a = CoreAllocator::new(&[0, 1, 2]);
        let x = a.take(2).unwrap();
        assert_eq!(a.take(2), None);
        let y = a.take(1).unwrap();
        assert!(!x.contains(&y[0]));
        a.give_back(&x);
        assert_eq!(a.take(2).unwrap(), x);
    }
}
