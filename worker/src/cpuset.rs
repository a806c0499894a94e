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

/// The host's NUMA domains as CPU lists, from `/sys/devices/system/node/node*/cpulist`;
/// empty when the host reports none.
pub fn numa_domains() -> Vec<Vec<u32>> {
    let Ok(entries) = std::fs::read_dir("/sys/devices/system/node") else {
        return Vec::new();
    };
    let mut nodes: Vec<(u32, Vec<u32>)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let id: u32 = name.strip_prefix("node")?.parse().ok()?;
            let list = std::fs::read_to_string(e.path().join("cpulist")).ok()?;
            Some((id, parse(list.trim()).ok()?))
        })
        .collect();
    nodes.sort();
    nodes.into_iter().map(|(_, cpus)| cpus).collect()
}

/// The cores this worker may grant, and which are free. The worker has the last word on
/// admission: a grant that would need a busy core is refused here even if the scheduler
/// thought it free.
///
/// Grants stay inside one NUMA domain when one has room (best fit: the domain with the fewest
/// free cores that still holds the whole grant, keeping large domains whole for large
/// grants); otherwise they take from the domains with the most free cores first.
#[derive(Debug)]
pub struct CoreAllocator {
    /// Free cores per domain (one domain when the host reports none).
    domains: Vec<BTreeSet<u32>>,
    /// The domain of every managed core.
    home: std::collections::BTreeMap<u32, usize>,
    total: usize,
}

impl CoreAllocator {
    /// An allocator over `cores`, all in one domain.
    pub fn new(cores: &[u32]) -> Self {
        Self::with_domains(cores, &[])
    }

    /// An allocator over `cores`, grouped by the host's NUMA `domains` (cores in no listed
    /// domain form one more).
    pub fn with_domains(cores: &[u32], domains: &[Vec<u32>]) -> Self {
        let mut rest: BTreeSet<u32> = cores.iter().copied().collect();
        let mut out = Vec::new();
        for d in domains {
            let mine: BTreeSet<u32> = d.iter().copied().filter(|c| rest.contains(c)).collect();
            if !mine.is_empty() {
                rest.retain(|c| !mine.contains(c));
                out.push(mine);
            }
        }
        if !rest.is_empty() {
            out.push(rest);
        }
        let home = out
            .iter()
            .enumerate()
            .flat_map(|(d, cs)| cs.iter().map(move |&c| (c, d)))
            .collect();
        Self {
            domains: out,
            home,
            total: cores.len(),
        }
    }

    /// Cores managed.
    pub fn total(&self) -> usize {
        self.total
    }

    /// NUMA domains in use.
    pub fn domains(&self) -> usize {
        self.domains.len()
    }

    /// Cores free now.
    pub fn free(&self) -> usize {
        self.domains.iter().map(BTreeSet::len).sum()
    }

    /// Takes `n` free cores, or none.
    pub fn take(&mut self, n: usize) -> Option<Vec<u32>> {
        let free: usize = self.domains.iter().map(BTreeSet::len).sum();
        if n == 0 || free < n {
            return None;
        }
        let best_fit = (0..self.domains.len())
            .filter(|&d| self.domains[d].len() >= n)
            .min_by_key(|&d| (self.domains[d].len(), d));
        let order: Vec<usize> = match best_fit {
            Some(d) => vec![d],
            None => {
                let mut o: Vec<usize> = (0..self.domains.len()).collect();
                o.sort_by_key(|&d| (std::cmp::Reverse(self.domains[d].len()), d));
                o
            }
        };
        let mut got = Vec::with_capacity(n);
        for d in order {
            // Lowest ids first within a domain: neighbours tend to share caches.
            let take: Vec<u32> = self.domains[d]
                .iter()
                .take(n - got.len())
                .copied()
                .collect();
            for c in &take {
                self.domains[d].remove(c);
            }
            got.extend(take);
            if got.len() == n {
                break;
            }
        }
        got.sort_unstable();
        Some(got)
    }

    /// Returns cores.
    pub fn give_back(&mut self, cores: &[u32]) {
        for c in cores {
            if let Some(&d) = self.home.get(c) {
                self.domains[d].insert(*c);
            }
        }
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
    fn grants_stay_inside_one_numa_domain_when_one_has_room() {
        // Two domains of 4 cores.
        let domains = vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]];
        let mut a = CoreAllocator::with_domains(&(0..8).collect::<Vec<_>>(), &domains);
        assert_eq!(a.domains(), 2);
        let x = a.take(3).unwrap();
        assert_eq!(x, vec![0, 1, 2]);
        // One core left in domain 0: a grant of 1 fits there (best fit), keeping domain 1 whole.
        assert_eq!(a.take(1).unwrap(), vec![3]);
        assert_eq!(a.take(4).unwrap(), vec![4, 5, 6, 7]);
        a.give_back(&x);
        a.give_back(&[5, 6]);
        // 3 free in domain 0, 2 in domain 1: a grant of 4 has to span both.
        let span = a.take(4).unwrap();
        assert_eq!(span.len(), 4);
        assert!(span.iter().filter(|&&c| c < 4).count() == 3);

        // Interleaved domains (even and odd CPUs) are kept apart too.
        let mut b = CoreAllocator::with_domains(&[0, 1, 2, 3], &[vec![0, 2], vec![1, 3]]);
        let two = b.take(2).unwrap();
        assert!(two == vec![0, 2] || two == vec![1, 3], "{two:?}");
        b.give_back(&two);
        assert_eq!(b.take(4).unwrap(), vec![0, 1, 2, 3]);
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
