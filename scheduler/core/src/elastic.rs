//! Elasticity: how an action's duration depends on the units of its key elastic resource,
//! and how to share units among actions so that the sum of their durations is smallest.
//!
//! `dur(m) = T1 / speedup(m)`, with `speedup(m) = E(m) * m` and `0 < E(m) <= 1`.

/// A speed-up curve.
#[derive(Debug, Clone, PartialEq)]
pub enum Speedup {
    /// Amdahl's law with parallel fraction `p` in [0, 1]: `1 / ((1 - p) + p / m)`.
    Amdahl(f64),
    /// A power law `m^a`, `a` in [0, 1].
    Power(f64),
    /// A profiled table of `(m, efficiency)`, sorted by `m`; `speedup(m) = E(m) * m` with `E`
    /// interpolated linearly and held flat beyond the ends.
    Table(Vec<(u32, f64)>),
}

impl Speedup {
    /// The speed-up with `m` units (`m >= 1`).
    pub fn at(&self, m: u32) -> f64 {
        let m = m.max(1);
        let mf = m as f64;
        match self {
            Speedup::Amdahl(p) => {
                let p = p.clamp(0.0, 1.0);
                1.0 / ((1.0 - p) + p / mf)
            }
            Speedup::Power(a) => mf.powf(a.clamp(0.0, 1.0)),
            Speedup::Table(points) => {
                let eff = match points.iter().position(|&(pm, _)| pm >= m) {
                    None => points.last().map_or(1.0, |p| p.1),
                    Some(0) => points[0].1,
                    Some(i) => {
                        let (m0, e0) = points[i - 1];
                        let (m1, e1) = points[i];
                        if m1 == m0 {
                            e1
                        } else {
                            e0 + (e1 - e0) * (mf - m0 as f64) / (m1 - m0) as f64
                        }
                    }
                };
                (eff.clamp(1e-6, 1.0) * mf).max(1e-6)
            }
        }
    }
}

/// An action's elasticity model.
#[derive(Debug, Clone, PartialEq)]
pub struct ElasticModel {
    /// Duration with one unit, in milliseconds.
    pub t1_ms: f64,
    /// Speed-up curve.
    pub speedup: Speedup,
}

impl ElasticModel {
    /// The model assumed when an action carries none and nothing has been learned for its
    /// key yet: 1 s of work with parallel fraction 0.5 (a middle guess; learning replaces it).
    pub fn unknown() -> Self {
        Self {
            t1_ms: 1000.0,
            speedup: Speedup::Amdahl(0.5),
        }
    }

    /// Duration with `m` units, in milliseconds.
    pub fn dur_ms(&self, m: u32) -> f64 {
        self.t1_ms / self.speedup.at(m)
    }

    /// True when the duration is convex in `m` over `[min, max]` (the marginal gain of one
    /// more unit never grows), which makes the greedy allocation optimal.
    pub fn is_convex(&self, min: u32, max: u32) -> bool {
        // T1 * ((1 - p) + p / m) and T1 * m^-a are convex in m for p, a in [0, 1].
        if matches!(self.speedup, Speedup::Amdahl(_) | Speedup::Power(_)) {
            return true;
        }
        let mut last_gain = f64::INFINITY;
        for m in min..max {
            let gain = self.dur_ms(m) - self.dur_ms(m + 1);
            if gain > last_gain + 1e-9 {
                return false;
            }
            last_gain = gain;
        }
        true
    }
}

/// One claimant in an allocation.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim<'a> {
    /// Fewest units.
    pub min: u32,
    /// Most units.
    pub max: u32,
    /// Duration model.
    pub model: &'a ElasticModel,
}

/// Gives each claim between its min and max units, using at most `units` in all, to minimise
/// the sum of durations. Exact dynamic programme: `f[j][u] = min_x f[j-1][u-x] + dur_j(x)`
/// over the units above the minimums. Returns `None` when the minimums do not fit.
pub fn allocate_dp(claims: &[Claim<'_>], units: u32) -> Option<Vec<u32>> {
    let base: u32 = claims.iter().map(|c| c.min).sum();
    let spare = units.checked_sub(base)? as usize;
    let n = claims.len();
    // best[u]: least total duration of the claims so far using exactly u spare units.
    let mut best = vec![f64::INFINITY; spare + 1];
    best[0] = 0.0;
    let mut choice: Vec<Vec<u32>> = Vec::with_capacity(n);
    for c in claims {
        let extra_max = (c.max - c.min) as usize;
        let mut next = vec![f64::INFINITY; spare + 1];
        let mut pick = vec![0u32; spare + 1];
        for (u, slot) in next.iter_mut().enumerate() {
            for x in 0..=extra_max.min(u) {
                let prev = best[u - x];
                if prev.is_finite() {
                    let v = prev + c.model.dur_ms(c.min + x as u32);
                    if v < *slot - 1e-12 {
                        *slot = v;
                        pick[u] = x as u32;
                    }
                }
            }
        }
        best = next;
        choice.push(pick);
    }
    // Using fewer units can never be better than more (durations do not grow with units),
    // but ties are resolved towards fewer units so that nothing is granted for no gain.
    let mut u = (0..=spare)
        .filter(|&u| best[u].is_finite())
        .min_by(|&a, &b| best[a].total_cmp(&best[b]).then(a.cmp(&b)))?;
    let mut out = vec![0; n];
    for j in (0..n).rev() {
        let x = choice[j][u];
        out[j] = claims[j].min + x;
        u -= x as usize;
    }
    Some(out)
}

/// The same allocation by marginal gains: start every claim at its minimum and hand out one
/// unit at a time to the claim whose duration drops most. Optimal when every duration is
/// convex; O((n + units) log n).
pub fn allocate_greedy(claims: &[Claim<'_>], units: u32) -> Option<Vec<u32>> {
    Greedy::new(claims, units).map(|g| g.alloc().to_vec())
}

/// The marginal-gain greedy, kept alive so that claims can be dropped from the tail and their
/// units handed to the others without starting over (for convex durations the result equals a
/// fresh greedy over the remaining claims: restricted to any subset, an optimal separable
/// convex allocation is optimal for that subset's budget).
#[derive(Debug, Clone)]
pub struct Greedy<'c, 'm> {
    claims: &'c [Claim<'m>],
    alloc: Vec<u32>,
    live: usize,
    free: u32,
    heap: std::collections::BinaryHeap<Step>,
    /// Claims that received a unit since the last [`Greedy::take_touched`] (may repeat).
    touched: Vec<usize>,
}

#[derive(Debug, Clone, PartialEq)]
struct Step {
    gain: f64,
    claim: std::cmp::Reverse<usize>,
    at: u32,
}
impl Eq for Step {}
impl PartialOrd for Step {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Step {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.gain
            .total_cmp(&other.gain)
            .then(self.claim.cmp(&other.claim))
    }
}

impl<'c, 'm> Greedy<'c, 'm> {
    /// Allocates `units` among all `claims`; `None` when their minimums do not fit.
    pub fn new(claims: &'c [Claim<'m>], units: u32) -> Option<Self> {
        let base: u32 = claims.iter().map(|c| c.min).sum();
        let free = units.checked_sub(base)?;
        let mut g = Self {
            claims,
            alloc: claims.iter().map(|c| c.min).collect(),
            live: claims.len(),
            free,
            heap: std::collections::BinaryHeap::with_capacity(claims.len()),
            touched: Vec::new(),
        };
        for j in 0..claims.len() {
            g.push(j);
        }
        g.spend();
        Some(g)
    }

    fn push(&mut self, j: usize) {
        let (c, x) = (&self.claims[j], self.alloc[j]);
        if x < c.max {
            let gain = c.model.dur_ms(x) - c.model.dur_ms(x + 1);
            self.heap.push(Step {
                gain,
                claim: std::cmp::Reverse(j),
                at: x,
            });
        }
    }

    fn spend(&mut self) {
        while self.free > 0 {
            let Some(step) = self.heap.pop() else { break };
            let j = step.claim.0;
            if j >= self.live || self.alloc[j] != step.at {
                continue; // stale: dropped claim, or superseded by a later step
            }
            if step.gain <= 1e-12 {
                self.heap.push(step); // nobody gains; keep it for after a drop
                break;
            }
            self.alloc[j] += 1;
            self.free -= 1;
            self.touched.push(j);
            self.push(j);
        }
    }

    /// Drops the last live claim and redistributes its units.
    pub fn drop_last(&mut self) {
        if self.live == 0 {
            return;
        }
        self.live -= 1;
        self.free += self.alloc[self.live];
        self.spend();
    }

    /// The claims that gained units since the last call (sorted, without repeats), so that a
    /// caller can update what it derived from the allocation instead of recomputing it.
    pub fn take_touched(&mut self) -> Vec<usize> {
        let mut t = std::mem::take(&mut self.touched);
        t.sort_unstable();
        t.dedup();
        t
    }

    /// The allocation of the live claims.
    pub fn alloc(&self) -> &[u32] {
        &self.alloc[..self.live]
    }

    /// Units not allocated.
    pub fn free(&self) -> u32 {
        self.free
    }
}

/// Allocates with the greedy when every model is convex on its range, else with the DP.
pub fn allocate(claims: &[Claim<'_>], units: u32) -> Option<Vec<u32>> {
    if claims.iter().all(|c| c.model.is_convex(c.min, c.max)) {
        allocate_greedy(claims, units)
    } else {
        allocate_dp(claims, units)
    }
}

/// Total duration of an allocation.
pub fn total_ms(claims: &[Claim<'_>], alloc: &[u32]) -> f64 {
    claims
        .iter()
        .zip(alloc)
        .map(|(c, &x)| c.model.dur_ms(x))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speedup_models() {
        assert!((Speedup::Amdahl(1.0).at(8) - 8.0).abs() < 1e-9);
        assert!((Speedup::Amdahl(0.0).at(8) - 1.0).abs() < 1e-9);
        assert!((Speedup::Amdahl(0.5).at(2) - 4.0 / 3.0).abs() < 1e-9);
        assert!((Speedup::Power(0.5).at(16) - 4.0).abs() < 1e-9);
        let t = Speedup::Table(vec![(1, 1.0), (4, 0.5)]);
        assert!((t.at(4) - 2.0).abs() < 1e-9);
        assert!((t.at(2) - 2.0 * (1.0 - 0.5 / 3.0)).abs() < 1e-9);
        assert!((t.at(8) - 4.0).abs() < 1e-9, "held flat beyond the table");
    }

    #[test]
    fn the_kept_greedy_matches_a_fresh_one_after_drops() {
        let models: Vec<ElasticModel> = (0..12)
            .map(|i| ElasticModel {
                t1_ms: 300.0 + 170.0 * i as f64,
                speedup: Speedup::Amdahl(0.1 * (i % 10) as f64),
            })
            .collect();
        let claims: Vec<Claim<'_>> = models
            .iter()
            .enumerate()
            .map(|(i, m)| Claim {
                min: 1 + (i % 2) as u32,
                max: 9,
                model: m,
            })
            .collect();
        let mut g = Greedy::new(&claims, 40).unwrap();
        for n in (1..=12).rev() {
            let fresh = allocate_greedy(&claims[..n], 40).unwrap();
            let (a, b) = (
                total_ms(&claims[..n], g.alloc()),
                total_ms(&claims[..n], &fresh),
            );
            assert!((a - b).abs() < 1e-6, "n={n}: kept {a} fresh {b}");
            g.drop_last();
        }
    }

    #[test]
    fn allocation_prefers_the_parallel_action() {
        let serial = ElasticModel {
            t1_ms: 1000.0,
            speedup: Speedup::Amdahl(0.0),
        };
        let parallel = ElasticModel {
            t1_ms: 1000.0,
            speedup: Speedup::Amdahl(1.0),
        };
        let claims = [
            Claim {
                min: 1,
                max: 8,
                model: &serial,
            },
            Claim {
                min: 1,
                max: 8,
                model: &parallel,
            },
        ];
        assert_eq!(allocate_dp(&claims, 8).unwrap(), vec![1, 7]);
        assert_eq!(allocate_greedy(&claims, 8).unwrap(), vec![1, 7]);
        assert_eq!(allocate(&claims, 1), None, "minimums must fit");
    }
}
