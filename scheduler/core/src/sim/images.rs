//! Sandbox images in the simulator: which trajectory opens its sandbox from which image, how
//! large each is, and how fast a node pulls; and `swe-images`, a workload of per-task images
//! (one image per repository and version, as SWE-bench-style datasets ship them).

use super::{AiCoding, Elasticity, Rng, SimReport, SimStats, Simulated, Summary, Workload};

/// The images a workload's sandboxes open from, and the pull model: a node pulls one image
/// at a time at `pull_mb_per_s`; opens of an image a node holds start at once, and opens of
/// one it is pulling wait for that pull.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SimImages {
    /// Images: reference and size, MB.
    pub images: Vec<(String, f64)>,
    /// Trajectory `i`'s image (an index into `images`); `None` or missing: the default
    /// image, which every node holds.
    pub of_trajectory: Vec<Option<usize>>,
    /// A node's pull throughput, MB/s.
    pub pull_mb_per_s: f64,
}

impl SimImages {
    /// Trajectory `t`'s image: its reference and size, MB.
    pub fn of(&self, t: usize) -> Option<(&str, f64)> {
        let i = self.of_trajectory.get(t).copied().flatten()?;
        self.images.get(i).map(|(r, mb)| (r.as_str(), *mb))
    }

    /// How long a pull of `mb` takes, ms.
    pub fn pull_ms(&self, mb: f64) -> f64 {
        mb / self.pull_mb_per_s.max(1e-3) * 1e3
    }
}

/// Parameters of the `swe-images` generator: ai-coding's trajectories (same seed, same
/// steps), grouped by task, each task with its own image.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SweImages {
    /// Concurrent trajectories.
    pub batch: usize,
    /// Trajectories per task (a GRPO group): consecutive trajectories share a task.
    pub group: usize,
    /// Seed.
    pub seed: u64,
    /// A node's pull throughput, MB/s.
    pub pull_mb_per_s: f64,
}

impl SweImages {
    /// Median image size, MB: per-repository images of 1 to 5 GB.
    pub const MEDIAN_MB: f64 = 2_000.0;

    /// Generates the workload: `batch / group` tasks, image sizes log-normal around
    /// [`SweImages::MEDIAN_MB`] clamped to 1 to 5 GB, no image on any node at the start.
    pub fn generate(&self) -> Workload {
        let mut w = AiCoding {
            batch: self.batch,
            seed: self.seed,
            jobs: 1,
        }
        .generate();
        let group = self.group.max(1);
        let tasks = w.trajectories.len().div_ceil(group);
        let mut rng = Rng::new(self.seed ^ 0x1a6e_5000);
        w.images = SimImages {
            images: (0..tasks)
                .map(|k| {
                    let mb = rng.lognormal(Self::MEDIAN_MB, 0.5).clamp(1_000.0, 5_000.0);
                    (format!("registry.local:5000/swe/task-{k:04}:v1"), mb)
                })
                .collect(),
            of_trajectory: (0..w.trajectories.len()).map(|i| Some(i / group)).collect(),
            pull_mb_per_s: self.pull_mb_per_s,
        };
        w
    }
}

/// What a node holds and is pulling.
#[derive(Debug, Clone, Default)]
pub(crate) struct NodeImages {
    /// Image index to when it is (or was) ready on the node, ms.
    ready_at: std::collections::HashMap<usize, f64>,
    /// When the node's pull queue is free, ms.
    free_at: f64,
}

impl NodeImages {
    /// An open of image `i` (`mb` in size) at `now`: how long it waits for the image, ms,
    /// and whether it started a pull.
    pub(crate) fn open(&mut self, i: usize, mb: f64, now: f64, images: &SimImages) -> (f64, bool) {
        if let Some(&at) = self.ready_at.get(&i) {
            return ((at - now).max(0.0), false);
        }
        let at = self.free_at.max(now) + images.pull_ms(mb);
        self.free_at = at;
        self.ready_at.insert(i, at);
        (at - now, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn images() -> SimImages {
        SimImages {
            images: vec![("a".into(), 1_000.0), ("b".into(), 500.0)],
            of_trajectory: vec![Some(0), Some(1), None],
            pull_mb_per_s: 100.0,
        }
    }

    #[test]
    fn a_node_pulls_one_image_at_a_time_and_shares_a_pull_in_flight() {
        let imgs = images();
        let mut n = NodeImages::default();
        assert_eq!(n.open(0, 1_000.0, 0.0, &imgs), (10_000.0, true));
        // The second image queues behind the first.
        assert_eq!(n.open(1, 500.0, 1_000.0, &imgs), (14_000.0, true));
        // An open of the first while it is pulling waits for that pull, no second pull.
        assert_eq!(n.open(0, 1_000.0, 4_000.0, &imgs), (6_000.0, false));
        // Once held, an open starts at once.
        assert_eq!(n.open(0, 1_000.0, 20_000.0, &imgs), (0.0, false));
        assert_eq!(imgs.of(2), None);
        assert_eq!(imgs.of(1), Some(("b", 500.0)));
    }

    #[test]
    fn swe_images_groups_trajectories_by_task_with_sizes_between_1_and_5_gb() {
        let w = SweImages {
            batch: 64,
            group: 8,
            seed: 1,
            pull_mb_per_s: 100.0,
        }
        .generate();
        assert_eq!(w.images.images.len(), 8);
        assert!(w
            .images
            .images
            .iter()
            .all(|(_, mb)| (1_000.0..=5_000.0).contains(mb)));
        assert_eq!(w.images.of_trajectory[7], Some(0));
        assert_eq!(w.images.of_trajectory[8], Some(1));
        let distinct: std::collections::HashSet<u64> =
            w.images.images.iter().map(|(_, mb)| *mb as u64).collect();
        assert!(distinct.len() > 1, "sizes vary");
    }
}

/// One run of the `swe-images` side-by-side.
#[derive(Debug, Clone)]
pub struct ImageRun {
    /// The policy's name, with `/ignore-images` appended where placement ignored images.
    pub name: String,
    /// Whether placement weighed where images are.
    pub aware: bool,
    /// What it measured (its `policy` is `name`).
    pub report: SimReport,
    /// The report's summary, computed once.
    pub summary: Summary,
    /// Pulls, what they moved and how long opens waited for them.
    pub stats: SimStats,
}

impl ImageRun {
    /// The mean wait of a trajectory's open for its image, s.
    pub fn mean_open_wait_s(&self, trajectories: usize) -> f64 {
        self.stats.pull_wait_ms / 1e3 / trajectories.max(1) as f64
    }
}

/// Each policy run twice on `workload` (oracle elasticity): with image-aware placement,
/// weighing `image_load_ms` per sandbox per core against a pull, then ignoring images, in
/// that order. `progress(done, total, name)` is told before each run.
pub fn compare_images<S: Simulated + ?Sized>(
    workload: &Workload,
    policies: &[(&str, &S)],
    image_load_ms: u64,
    mut progress: impl FnMut(usize, usize, &str),
) -> Vec<ImageRun> {
    let total = 2 * policies.len();
    let mut runs = Vec::with_capacity(total);
    for (name, policy) in policies {
        for aware in [true, false] {
            progress(runs.len(), total, name);
            let load = aware.then_some(image_load_ms);
            let (mut report, stats) =
                super::run_images(workload, *policy, Elasticity::Oracle, load);
            let name = if aware {
                name.to_string()
            } else {
                format!("{name}/ignore-images")
            };
            report.policy = name.clone();
            let summary = report.summary();
            runs.push(ImageRun {
                name,
                aware,
                report,
                summary,
                stats,
            });
        }
    }
    runs
}

/// Run `i`'s gain from weighing images: the mean ACT of the same policy ignoring images (the
/// run after it) over its own; `None` for a run that ignored images (or an empty run).
pub fn image_gain(runs: &[ImageRun], i: usize) -> Option<f64> {
    let (run, ignoring) = (runs.get(i)?, runs.get(i + 1)?);
    if !run.aware {
        return None;
    }
    let aware = run.summary.mean_act_s;
    let ignoring = ignoring.summary.mean_act_s;
    Some(if aware > 0.0 { ignoring / aware } else { 0.0 })
}
