//! Where sandbox images are, for image-aware placement ([`crate::model::ImageNeed`]).

use super::Engine;
use std::collections::HashMap;
use tangram_shared::image::ImageRef;
use tangram_shared::status::WorkerStatus;
use tangram_shared::WorkerId;

/// A worker's images by canonical reference, with their sizes in bytes (0 when unknown):
/// what its last heartbeat advertised, plus what it opened a sandbox from since.
pub(crate) fn from_heartbeat(images: &[tangram_shared::ImageReport]) -> HashMap<String, u64> {
    images
        .iter()
        .filter_map(|i| Some((ImageRef::canonical_of(&i.reference)?, i.size_bytes)))
        .collect()
}

/// Images by canonical reference: the workers holding each and its largest known size.
#[derive(Debug, Default)]
pub(crate) struct ImageIndex {
    by_key: HashMap<String, (Vec<WorkerId>, u64)>,
}

impl ImageIndex {
    fn add(&mut self, key: &str, worker: &WorkerId, size_bytes: u64) {
        let (holders, size) = self.by_key.entry(key.to_string()).or_default();
        if !holders.contains(worker) {
            holders.push(worker.clone());
        }
        *size = (*size).max(size_bytes);
    }

    /// What placement needs to know of `key`: its holders, sorted, and its expected pull.
    pub(crate) fn need(
        &self,
        key: String,
        config: &super::EngineConfig,
    ) -> crate::model::ImageNeed {
        let (mut holders, size) = self.by_key.get(&key).cloned().unwrap_or_default();
        holders.sort();
        let mb = if size > 0 {
            size as f64 / 1e6
        } else {
            super::UNKNOWN_IMAGE_MB as f64
        };
        let pull_ms = mb / config.pull_mb_per_s.max(1e-3) * 1e3;
        crate::model::ImageNeed {
            key,
            holders,
            pull_ms: pull_ms.min(u64::MAX as f64 / 2.0) as u64,
            load_ms: config.image_load_ms,
        }
    }
}

impl Engine {
    /// Where each image is: held by a worker (advertised, or opened from since its heartbeat)
    /// or being fetched for a sandbox there now.
    pub(crate) fn image_index(&self) -> ImageIndex {
        let mut index = ImageIndex::default();
        for (id, w) in &self.workers {
            for (key, size) in &w.images {
                index.add(key, id, *size);
            }
        }
        for s in self.sandboxes.values().filter(|s| s.holds()) {
            if let Some(key) = &s.image {
                index.add(key, &s.worker, 0);
            }
        }
        index
    }
}

/// Which workers should pull `image` ahead of the opens that will name it (`tangram images
/// prepull`): `n` in all, holders first, then the CPU workers
/// taking new work with the fewest sandboxes (ties by id); the chosen that hold it already
/// are asked too (they answer `present` at once).
pub fn prepull_targets(workers: &[WorkerStatus], image: &str, n: Option<usize>) -> Vec<String> {
    let want = ImageRef::canonical_of(image);
    let holds = |w: &WorkerStatus| {
        w.images
            .iter()
            .any(|i| ImageRef::canonical_of(&i.reference) == want)
    };
    let mut eligible: Vec<&WorkerStatus> = workers
        .iter()
        .filter(|w| w.cores > 0 && !w.draining && !w.cordoned && w.drain_by_unix_ms.is_none())
        .collect();
    eligible.sort_by(|a, b| (!holds(a), a.sandboxes, &a.id).cmp(&(!holds(b), b.sandboxes, &b.id)));
    let n = n.unwrap_or(eligible.len());
    eligible.into_iter().take(n).map(|w| w.id.clone()).collect()
}
