//! Ticks and ranges: the numbers on an axis are round, and an axis closes on one of them.

/// A tick label: the shortest decimal of `v` (ticks are round, so a few digits at most).
pub fn tick(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let s = format!("{:.6}", v);
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.to_string()
    }
}

/// Whether the labels of one axis, in order, read as round ticks: evenly spaced by 1, 2, 2.5
/// or 5 times a power of ten and multiples of that step, or round numbers each 2 to 10 times
/// the one before (a log axis).
pub fn round_ticks(ticks: &[f64]) -> bool {
    let steps: Vec<f64> = ticks.windows(2).map(|w| w[1] - w[0]).collect();
    let Some(&step) = steps.first() else {
        return ticks.iter().all(|v| is_round(*v));
    };
    let even = steps.iter().all(|s| (s - step).abs() <= step.abs() * 1e-6)
        && is_round(step)
        && ticks
            .iter()
            .all(|v| ((v / step) - (v / step).round()).abs() < 1e-6);
    let log = ticks.iter().all(|v| *v > 0.0 && is_round(*v))
        && ticks
            .windows(2)
            .all(|w| w[1] / w[0] >= 2.0 - 1e-9 && w[1] / w[0] <= 10.0 + 1e-9);
    even || log
}

/// Whether `v` is a round number: 1, 2, 2.5 or 5 times a power of ten, or 0.
pub fn is_round(v: f64) -> bool {
    if v == 0.0 {
        return true;
    }
    let v = v.abs();
    let m = v / 10f64.powf(v.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .any(|r| (m - r).abs() < 1e-6)
}

/// The x range of a linear axis: from 0 (times and counts start there) unless a value is
/// negative, to the largest value.
pub(super) fn from_zero(xs: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = bounds(xs);
    (lo.min(0.0), hi)
}

/// The smallest and largest of `xs` (0 to 1 when there are none, widened when equal).
pub(super) fn bounds(xs: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = xs
        .filter(|x| x.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
            (a.min(x), b.max(x))
        });
    if !lo.is_finite() {
        (0.0, 1.0)
    } else if hi > lo {
        (lo, hi)
    } else {
        (lo, lo + 1.0)
    }
}

/// The whole decades around [lo, hi] (at least one).
pub(super) fn decades(lo: f64, hi: f64) -> (f64, f64) {
    let a = lo.max(1e-9).log10().floor();
    let b = hi.max(1e-9).log10().ceil().max(a + 1.0);
    (10f64.powf(a), 10f64.powf(b))
}

/// The round number at or above the largest of `ys` (1 when there is none), so the top
/// tick closes the axis.
pub(super) fn nice_max(ys: impl Iterator<Item = f64>) -> f64 {
    let m = ys.filter(|y| y.is_finite()).fold(0.0, f64::max);
    if m <= 0.0 {
        return 1.0;
    }
    let p = 10f64.powf(m.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|r| r * p)
        .find(|v| *v >= m * (1.0 - 1e-9))
        .unwrap_or(10.0 * p)
}

/// 2 or 5 times a power of ten (a log axis labels only the powers, to stay uncrowded).
pub(super) fn is_two_five(v: f64) -> bool {
    let m = v / 10f64.powf(v.log10().floor());
    (m - 2.0).abs() < 1e-6 || (m - 2.5).abs() < 1e-6 || (m - 5.0).abs() < 1e-6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_short() {
        assert_eq!(tick(0.2), "0.2");
        assert_eq!(tick(1500.0), "1500");
        assert_eq!(tick(-0.0), "0");
        assert!(is_round(0.25) && is_round(2000.0) && is_round(5e-3));
        assert!(!is_round(0.3) && !is_round(1234.0) && !is_round(0.125));
        assert_eq!(nice_max([0.0, 7.3].into_iter()), 10.0);
        assert_eq!(nice_max([1.0].into_iter()), 1.0);
        assert_eq!(nice_max([0.0, 180.0].into_iter()), 200.0);
        assert_eq!(nice_max(std::iter::empty()), 1.0);
    }
}
