//! Garbage collection of pulled sandbox images under a disk budget (`[sandbox]
//! image_budget_mb`): after a pull, while the pulled images (those the `sandbox.pull`
//! allow-list admits; never the default image) take more than the budget, the least recently
//! used one that no container uses is removed. The image just pulled is never a candidate.
//! The choice is [`victims`] (pure); listing and removing is [`DockerSandboxes::after_pull`].

use super::{DockerError, DockerSandboxes};
use bollard::query_parameters::{
    ListContainersOptionsBuilder, ListImagesOptionsBuilder, RemoveImageOptionsBuilder,
};
use std::collections::{HashMap, HashSet};
use tokio::time::Instant;

/// One tag of a pulled image, as the collector sees it.
#[derive(Debug, Clone)]
pub struct Held {
    /// The reference (`registry/repository:tag`).
    pub tag: String,
    /// The image it names.
    pub id: String,
    /// The image's size, bytes.
    pub bytes: u64,
    /// When a sandbox last used it (`None`: not since this worker started).
    pub last_used: Option<Instant>,
    /// A container (any state) uses it.
    pub in_use: bool,
}

/// The tags to remove, least recently used first, until what is held fits `budget` bytes;
/// `keep` (the image just pulled) and tags in use are never chosen. An image counts once
/// however many tags name it, and frees its bytes when its last held tag goes.
pub fn victims(held: &[Held], budget: u64, keep: &str) -> Vec<String> {
    let mut tags_of: HashMap<&str, usize> = HashMap::new();
    let mut bytes_of: HashMap<&str, u64> = HashMap::new();
    for h in held {
        *tags_of.entry(&h.id).or_default() += 1;
        bytes_of.insert(&h.id, h.bytes);
    }
    let mut total: u64 = bytes_of.values().sum();
    let mut order: Vec<&Held> = held.iter().filter(|h| h.tag != keep && !h.in_use).collect();
    order.sort_by_key(|h| h.last_used);
    let pinned: HashSet<&str> = held
        .iter()
        .filter(|h| h.tag == keep || h.in_use)
        .map(|h| h.id.as_str())
        .collect();
    let mut out = Vec::new();
    for h in order {
        if total <= budget {
            break;
        }
        out.push(h.tag.clone());
        let left = tags_of.get_mut(h.id.as_str()).expect("counted");
        *left -= 1;
        if *left == 0 && !pinned.contains(h.id.as_str()) {
            total = total.saturating_sub(h.bytes);
        }
    }
    out
}

impl DockerSandboxes {
    /// The images held, as last listed.
    pub fn images(&self) -> Vec<tangram_shared::ImageReport> {
        self.held.lock().expect("held lock").clone()
    }

    /// Lists the sandbox images held now (the default image and those the pull allow-list
    /// admits) for the heartbeats; a failed listing keeps the last one.
    pub async fn refresh_images(&self) {
        match self.list_held().await {
            Ok(held) => *self.held.lock().expect("held lock") = held,
            Err(e) => tracing::warn!(error = %e, "listing images"),
        }
    }

    /// The sandbox images on the daemon now, one entry per reference: the default image and
    /// those the pull allow-list admits, sorted by reference.
    async fn list_held(&self) -> Result<Vec<tangram_shared::ImageReport>, DockerError> {
        let images = self
            .docker
            .list_images(Some(ListImagesOptionsBuilder::default().build()))
            .await?;
        let mut held: Vec<tangram_shared::ImageReport> = images
            .iter()
            .flat_map(|i| {
                i.repo_tags.iter().map(|t| tangram_shared::ImageReport {
                    reference: t.clone(),
                    id: i.id.clone(),
                    size_bytes: i.size.max(0) as u64,
                })
            })
            .filter(|r| {
                self.config
                    .pull
                    .open_refusal(&r.reference, &self.config.image)
                    .is_none()
            })
            .collect();
        held.sort_by(|a, b| a.reference.cmp(&b.reference));
        Ok(held)
    }

    /// After a pull of `keep`: removes pulled images, least recently used first, until they
    /// fit the budget (`keep` stays), and records what is held for the heartbeats, from one
    /// listing.
    pub(super) async fn after_pull(&self, keep: &str) {
        let listed = match self.list_held().await {
            Ok(l) => l,
            Err(e) => return tracing::warn!(error = %e, "listing images"),
        };
        let removed = match self.collect(keep, &listed).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "collecting unused pulled images");
                Vec::new()
            }
        };
        let held = listed
            .into_iter()
            .filter(|r| !removed.contains(&r.reference))
            .collect();
        *self.held.lock().expect("held lock") = held;
    }

    /// Notes that a sandbox was created from `image` now (or that it was pre-pulled).
    pub(crate) fn used(&self, image: &str) {
        self.last_used
            .lock()
            .expect("last-used lock")
            .insert(image.to_string(), Instant::now());
    }

    /// Removes pulled images of `listed`, least recently used first, until they fit the
    /// budget; `keep` (just pulled) stays. Returns the tags removed.
    async fn collect(
        &self,
        keep: &str,
        listed: &[tangram_shared::ImageReport],
    ) -> Result<Vec<String>, DockerError> {
        let Some(budget) = self.config.pull.budget_bytes else {
            return Ok(Vec::new());
        };
        let containers = self
            .docker
            .list_containers(Some(
                ListContainersOptionsBuilder::default().all(true).build(),
            ))
            .await?;
        let in_use: HashSet<String> = containers
            .iter()
            .flat_map(|c| [c.image.clone(), c.image_id.clone()])
            .flatten()
            .collect();
        let last_used = self.last_used.lock().expect("last-used lock").clone();
        let held: Vec<Held> = listed
            .iter()
            .filter(|r| r.reference != self.config.image)
            .map(|r| Held {
                tag: r.reference.clone(),
                id: r.id.clone(),
                bytes: r.size_bytes,
                last_used: last_used.get(&r.reference).copied(),
                in_use: in_use.contains(&r.reference) || in_use.contains(&r.id),
            })
            .collect();
        let mut removed = Vec::new();
        for tag in victims(&held, budget, keep) {
            let options = RemoveImageOptionsBuilder::default().force(false).build();
            match self.docker.remove_image(&tag, Some(options), None).await {
                Ok(_) => {
                    tracing::info!(image = %tag, "removed an unused pulled image (over sandbox.image_budget_mb)");
                    removed.push(tag);
                }
                // Taken into use since it was listed: it stays.
                Err(e) => {
                    tracing::warn!(image = %tag, error = %e, "could not remove a pulled image")
                }
            }
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(tag: &str, id: &str, mb: u64, used_s_ago: Option<u64>, in_use: bool) -> Held {
        let now = Instant::now() + std::time::Duration::from_secs(1_000);
        Held {
            tag: tag.into(),
            id: id.into(),
            bytes: mb << 20,
            last_used: used_s_ago.map(|s| now - std::time::Duration::from_secs(s)),
            in_use,
        }
    }

    #[test]
    fn the_least_recently_used_unused_images_go_until_the_rest_fits() {
        let h = [
            held("r/a:1", "A", 100, Some(300), false),
            held("r/b:1", "B", 100, Some(200), false),
            held("r/c:1", "C", 100, Some(100), false),
            held("r/new:1", "N", 100, None, false),
        ];
        // 400 MB held, 250 allowed: the two oldest go; the new one stays though never used.
        assert_eq!(victims(&h, 250 << 20, "r/new:1"), ["r/a:1", "r/b:1"]);
        assert!(victims(&h, 400 << 20, "r/new:1").is_empty(), "it fits");
    }

    #[test]
    fn an_image_in_use_or_just_pulled_is_never_removed_even_over_budget() {
        let h = [
            held("r/a:1", "A", 100, Some(300), true),
            held("r/new:1", "N", 100, None, false),
        ];
        assert!(victims(&h, 1, "r/new:1").is_empty());
    }

    #[test]
    fn an_image_frees_its_bytes_only_when_its_last_tag_goes() {
        let h = [
            held("r/a:1", "A", 100, Some(300), false),
            held("r/a:alias", "A", 100, Some(250), false),
            held("r/b:1", "B", 100, Some(100), false),
            held("r/new:1", "N", 100, None, false),
        ];
        // 300 MB held (A counted once), 200 allowed: both tags of A go, then it fits.
        assert_eq!(victims(&h, 200 << 20, "r/new:1"), ["r/a:1", "r/a:alias"]);
    }
}
