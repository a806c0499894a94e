//! Waits between tries of something that failed, spread at random so that many processes
//! that failed together (every worker when the server restarts) do not all try again at the
//! same instant. Only the runtime around the engine waits like this: the scheduling core never
//! calls it, so its decisions stay a function of its inputs.

use std::time::Duration;

/// `wait` spread uniformly over [wait/2, 3·wait/2]: on average the wait asked for.
pub fn jitter(wait: Duration) -> Duration {
    wait.mul_f64(0.5 + fastrand::f64())
}

/// The wait before try `attempt` (the first retry is attempt 1): `first`, doubling each
/// attempt, at most `max`, then [`jitter`]ed.
pub fn backoff(attempt: u32, first: Duration, max: Duration) -> Duration {
    let doublings = attempt.saturating_sub(1).min(31);
    let wait = first
        .checked_mul(1u32 << doublings)
        .map_or(max, |w| w.min(max));
    jitter(wait)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_half_and_one_and_a_half_and_varies() {
        let wait = Duration::from_secs(2);
        let waits: Vec<Duration> = (0..200).map(|_| jitter(wait)).collect();
        assert!(waits.iter().all(|w| *w >= wait / 2 && *w <= wait * 3 / 2));
        // Spread, not one value (200 equal draws from a continuous range do not happen).
        assert!(waits.iter().any(|w| *w != waits[0]), "{waits:?}");
        let mean = waits.iter().sum::<Duration>() / 200;
        assert!(mean > wait * 3 / 4 && mean < wait * 5 / 4, "{mean:?}");
    }

    #[test]
    fn backoff_doubles_from_the_first_wait_up_to_the_cap() {
        let (first, max) = (Duration::from_millis(100), Duration::from_secs(1));
        for (attempt, base) in [
            (0, 100),
            (1, 100),
            (2, 200),
            (3, 400),
            (4, 800),
            (5, 1000),
            (40, 1000),
        ] {
            let base = Duration::from_millis(base);
            for _ in 0..20 {
                let w = backoff(attempt, first, max);
                assert!(
                    w >= base / 2 && w <= base * 3 / 2,
                    "attempt {attempt}: {w:?}"
                );
            }
        }
    }
}
