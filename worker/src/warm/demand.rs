//! What the warm pool should hold, learned from the opens it has seen. Pure, for tests.
//!
//! A parked sandbox is made for a [`Shape`]: an image and a work-directory size, the two
//! things fixed when a container is created. Memory and environment are not part of it: a
//! claim fits the memory limit to the open and the environment is applied per command.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;
use tokio::time::Instant;

/// How far back opens count toward the pool's size.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Head room over the observed burst.
const HEADROOM: f64 = 1.25;
/// Opens remembered for sizing, at most.
const OPENS_KEPT: usize = 4096;
/// Shapes other than the default that get parked sandboxes, at most: the images in demand,
/// not every image anyone opened once (each pooled image is held on disk by its containers).
pub const OTHER_SHAPES: usize = 4;

/// What opens a parked sandbox can serve.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Shape {
    /// The image it runs.
    pub image: String,
    /// The size of its `/work` tmpfs, MiB.
    pub workdir_mb: u64,
}

/// How many warm sandboxes to hold for one shape: the largest number of its opens in any
/// stretch of `create` within `opens` (times in order), with head room, clamped to
/// `[min, max]`.
pub fn target(opens: &[Instant], create: Duration, min: usize, max: usize) -> usize {
    let mut peak = 0;
    let mut start = 0;
    for (end, t) in opens.iter().enumerate() {
        while t.duration_since(opens[start]) > create {
            start += 1;
        }
        peak = peak.max(end + 1 - start);
    }
    let want = (peak as f64 * HEADROOM).ceil() as usize;
    want.clamp(min, max.max(min))
}

/// The opens of the last [`WINDOW`], by shape.
#[derive(Debug, Default)]
pub struct Demand {
    opens: VecDeque<(Instant, Shape)>,
}

impl Demand {
    /// Counts an open of `shape` asked at `at`.
    pub fn record(&mut self, at: Instant, shape: Shape) {
        // Kept in time order: a slow cold creation recorded late goes where it was asked.
        let i = self.opens.partition_point(|(t, _)| *t <= at);
        self.opens.insert(i, (at, shape));
        while self.opens.len() > OPENS_KEPT {
            self.opens.pop_front();
        }
    }

    /// Forgets opens older than [`WINDOW`] before `now`.
    pub fn expire(&mut self, now: Instant) {
        while self
            .opens
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > WINDOW)
        {
            self.opens.pop_front();
        }
    }

    /// Forgets every open of `shape` (its creation failed: the pool stops asking for it until
    /// opens ask again).
    pub fn forget(&mut self, shape: &Shape) {
        self.opens.retain(|(_, s)| s != shape);
    }

    /// How many sandboxes of each shape to park, in the order to fill them: `default` first
    /// (never fewer than `min`), then up to [`OTHER_SHAPES`] others by how many opens asked
    /// for them (ties by name), all within `max` together. Shapes not listed get none.
    pub fn targets(
        &self,
        default: &Shape,
        create: Duration,
        min: usize,
        max: usize,
    ) -> Vec<(Shape, usize)> {
        let mut times: HashMap<&Shape, Vec<Instant>> = HashMap::new();
        for (t, s) in &self.opens {
            times.entry(s).or_default().push(*t);
        }
        let mut out = Vec::new();
        let first = target(
            times.get(default).map_or(&[][..], |v| v.as_slice()),
            create,
            min,
            max,
        );
        let mut left = max.saturating_sub(first);
        out.push((default.clone(), first));
        let mut others: Vec<(&Shape, &Vec<Instant>)> = times
            .iter()
            .filter(|(s, _)| *s != &default)
            .map(|(s, v)| (*s, v))
            .collect();
        others.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then_with(|| a.0.cmp(b.0)));
        for (shape, opens) in others.into_iter().take(OTHER_SHAPES) {
            let n = target(opens, create, 0, max).min(left);
            left -= n;
            out.push((shape.clone(), n));
        }
        out
    }
}
