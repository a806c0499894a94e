//! Worker ids claimed from a pool.
//!
//! Interchangeable workers started from one definition (`docker-compose up --scale
//! cpu-worker=N`, an autoscaling group) cannot each be handed an id and a seed. Instead they
//! share a folder of per-worker seeds, `worker-<id>.nk` as `tangram creds` writes them, and
//! a folder of lock files; each worker takes the first id whose lock it can hold
//! (`flock`, exclusive) and keeps that lock for as long as it runs. The kernel drops the
//! lock when the process ends, however it ends, so the id is free again for the next
//! worker; a new holder is a new instance to the scheduler, and it removes the sandboxes
//! the last holder left behind, as any starting worker does. Every id keeps its own seed
//! and therefore its own NATS permissions: a pool shares no credential.
//!
//! The locks must be on a filesystem shared by the pool's workers and the same kernel (a
//! Docker volume on one host); across hosts give each host its own pool prefix.

use serde::Deserialize;
use std::fs::File;
use std::path::{Path, PathBuf};

/// `[pool]` in the worker's config.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawPool {
    /// The folder holding the seeds (`worker-<id>.nk`).
    pub seeds: PathBuf,
    /// The folder for the lock files (`<id>.lock`), writable and shared by the pool.
    pub locks: PathBuf,
    /// Ids this pool may take start with this (`cpu-` takes `cpu-1`, `cpu-2`, ...).
    pub prefix: String,
}

/// An id this process holds, with its seed. Dropping it frees the id.
#[derive(Debug)]
pub struct Claim {
    /// The worker id.
    pub id: String,
    /// Its seed file.
    pub seed: PathBuf,
    _lock: File,
}

/// Why no id could be claimed.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// A folder could not be read, or a lock file opened.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The seeds folder has no seed for this prefix.
    #[error("{seeds} holds no seed named worker-{prefix}<n>.nk; make them with `tangram creds --workers`")]
    Empty {
        /// The seeds folder.
        seeds: PathBuf,
        /// The prefix.
        prefix: String,
    },
    /// Every id is held by a running worker.
    #[error("all {count} ids of pool {prefix:?} are held by running workers; make more seeds (and add them to the servers' authorization) before scaling further")]
    Exhausted {
        /// The prefix.
        prefix: String,
        /// How many ids the pool has.
        count: usize,
    },
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> PoolError + '_ {
    move |source| PoolError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The pool's ids, in natural order (`cpu-2` before `cpu-10`).
pub fn ids(seeds: &Path, prefix: &str) -> Result<Vec<String>, PoolError> {
    let mut ids: Vec<String> = std::fs::read_dir(seeds)
        .map_err(io(seeds))?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let id = name.strip_prefix("worker-")?.strip_suffix(".nk")?;
            id.starts_with(prefix).then(|| id.to_string())
        })
        .collect();
    ids.sort_by(|a, b| a.len().cmp(&b.len()).then_with(|| a.cmp(b)));
    Ok(ids)
}

/// Claims the first free id of the pool.
pub fn claim(pool: &RawPool) -> Result<Claim, PoolError> {
    let ids = ids(&pool.seeds, &pool.prefix)?;
    if ids.is_empty() {
        return Err(PoolError::Empty {
            seeds: pool.seeds.clone(),
            prefix: pool.prefix.clone(),
        });
    }
    std::fs::create_dir_all(&pool.locks).map_err(io(&pool.locks))?;
    for id in &ids {
        let path = pool.locks.join(format!("{id}.lock"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io(&path))?;
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {
                // Who holds it, for a person looking at the folder.
                let _ = file.set_len(0);
                let _ = std::io::Write::write_all(
                    &mut &file,
                    format!(
                        "pid {} host {}\n",
                        std::process::id(),
                        std::fs::read_to_string("/etc/hostname")
                            .unwrap_or_default()
                            .trim()
                    )
                    .as_bytes(),
                );
                return Ok(Claim {
                    id: id.clone(),
                    seed: pool.seeds.join(format!("worker-{id}.nk")),
                    _lock: file,
                });
            }
            Err(rustix::io::Errno::WOULDBLOCK) => continue,
            Err(e) => return Err(io(&path)(e.into())),
        }
    }
    Err(PoolError::Exhausted {
        prefix: pool.prefix.clone(),
        count: ids.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(n: usize) -> (tempfile::TempDir, RawPool) {
        let dir = tempfile::tempdir().unwrap();
        let seeds = dir.path().join("creds");
        std::fs::create_dir(&seeds).unwrap();
        for i in 1..=n {
            std::fs::write(seeds.join(format!("worker-cpu-{i}.nk")), "SU...\n").unwrap();
        }
        // Neither of these belongs to the pool.
        std::fs::write(seeds.join("worker-gpu-1.nk"), "SU...\n").unwrap();
        std::fs::write(seeds.join("scheduler.nk"), "SU...\n").unwrap();
        let p = RawPool {
            seeds,
            locks: dir.path().join("locks"),
            prefix: "cpu-".into(),
        };
        (dir, p)
    }

    #[test]
    fn ids_are_taken_in_natural_order_and_held_until_dropped() {
        let (_dir, p) = pool(11);
        let first = claim(&p).unwrap();
        assert_eq!(first.id, "cpu-1");
        assert!(first.seed.ends_with("worker-cpu-1.nk"));
        let held: Vec<Claim> = (0..9).map(|_| claim(&p).unwrap()).collect();
        assert_eq!(held.last().unwrap().id, "cpu-10");
        let eleventh = claim(&p).unwrap();
        assert_eq!(eleventh.id, "cpu-11");
        assert!(matches!(
            claim(&p),
            Err(PoolError::Exhausted { count: 11, .. })
        ));
        // The process holding cpu-1 ends: the next worker gets cpu-1 again.
        drop(first);
        assert_eq!(claim(&p).unwrap().id, "cpu-1");
        drop(eleventh);
    }

    #[test]
    fn a_pool_without_seeds_says_how_to_make_them() {
        let (_dir, mut p) = pool(2);
        p.prefix = "edge-".into();
        let e = claim(&p).unwrap_err();
        assert!(matches!(e, PoolError::Empty { .. }), "{e}");
        assert!(e.to_string().contains("tangram creds"), "{e}");
    }
}
