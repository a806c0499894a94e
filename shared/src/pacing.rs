//! How calls to a rate-limited provider are spaced, the one rule the scheduler (admission
//! under the pooled quota) and the worker (the moment a call leaves) both apply.

/// Headroom kept below a provider's burst, as time at its declared rate: calls admitted back
/// to back can reach the provider closer together than they were admitted (dispatch and
/// network jitter), and the provider's own bucket absorbs up to this much compression.
pub const HEADROOM_S: f64 = 0.1;

/// The burst to use against a provider declaring `rate_per_s` and `burst`: the declared burst
/// less the tokens [`HEADROOM_S`] of the rate brings (at least one token of headroom, and at
/// least one token left to use).
pub fn usable_burst(rate_per_s: f64, burst: u32) -> f64 {
    let headroom = (rate_per_s * HEADROOM_S).ceil().max(1.0);
    (burst as f64 - headroom).max(1.0)
}

#[cfg(test)]
mod tests {
    use super::usable_burst;

    #[test]
    fn headroom_is_a_tenth_of_a_second_of_the_rate_and_one_token_is_always_left() {
        assert_eq!(usable_burst(40.0, 4), 1.0);
        assert_eq!(usable_burst(10.0, 5), 4.0);
        assert_eq!(usable_burst(200.0, 50), 30.0);
        assert_eq!(usable_burst(1000.0, 10), 1.0);
    }
}
