//! Small statistics shared by every crate that reports figures, so that a p99 means the same
//! thing in the scheduler's status, the simulator, the benchmarks and the CLI.

/// The value at quantile `q` (0 to 1) of an ascending slice, nearest rank: index
/// `round((n - 1) * q)`. An empty slice gives 0.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let q = q.clamp(0.0, 1.0);
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

#[cfg(test)]
mod tests {
    use super::quantile;

    #[test]
    fn nearest_rank_on_small_samples() {
        let v = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(quantile(&v, 0.0), 1.0);
        assert_eq!(quantile(&v, 0.5), 3.0);
        assert_eq!(quantile(&v, 0.99), 5.0);
        assert_eq!(quantile(&v, 0.74), 4.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
        assert_eq!(quantile(&v, 7.0), 5.0);
    }
}
