//! Results not yet stored, kept on disk: a result whose first publishing round failed is
//! written under `<state_dir>/results/` until it is stored, so that a worker that dies
//! during a NATS outage still publishes the real result when it starts again (before it
//! takes any dispatch, so that its report of the dispatch as lost comes second and is
//! refused). Bounded in count; past the bound a result is kept in memory only.

use std::path::PathBuf;
use tangram_shared::codec::{self, Encoding};
use tangram_shared::{ActionId, ActionResult};
use tracing::warn;

/// Results kept on disk at most.
const MAX_SPOOLED: usize = 10_000;

/// One kept result.
#[derive(serde::Serialize, serde::Deserialize)]
struct Kept {
    encoding: Encoding,
    result: ActionResult,
}

/// The folder of kept results.
#[derive(Debug, Clone)]
pub(crate) struct Spool {
    dir: PathBuf,
}

impl Spool {
    /// The spool under a worker's state directory.
    pub(crate) fn new(state_dir: &std::path::Path) -> Self {
        Self {
            dir: state_dir.join("results"),
        }
    }

    fn path(&self, id: &ActionId) -> PathBuf {
        // Action ids are [A-Za-z0-9_-]: safe as file names.
        self.dir.join(format!("{id}.msgpack"))
    }

    /// Keeps a result until [`Spool::forget`]; false when it could not be (logged).
    pub(crate) fn keep(&self, result: &ActionResult, encoding: Encoding) -> bool {
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(&self.dir)?;
            if std::fs::read_dir(&self.dir)?.count() >= MAX_SPOOLED {
                return Err(std::io::Error::other(format!(
                    "{MAX_SPOOLED} results are kept already"
                )));
            }
            let bytes = codec::encode(
                &Kept {
                    encoding,
                    result: result.clone(),
                },
                Encoding::Msgpack,
            )
            .map_err(std::io::Error::other)?;
            // Written whole, then renamed: a crash never leaves half a result.
            let tmp = self.dir.join(format!(".{}.tmp", result.id));
            std::fs::write(&tmp, bytes)?;
            std::fs::rename(&tmp, self.path(&result.id))
        };
        match write() {
            Ok(()) => true,
            Err(e) => {
                warn!(action = %result.id, error = %e, dir = %self.dir.display(), "result not kept on disk (kept in memory)");
                false
            }
        }
    }

    /// The result is stored: it need not be kept.
    pub(crate) fn forget(&self, id: &ActionId) {
        match std::fs::remove_file(self.path(id)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => warn!(action = %id, error = %e, "removing a kept result"),
        }
    }

    /// Every kept result (one that does not decode is removed, logged).
    pub(crate) fn all(&self) -> Vec<(ActionResult, Encoding)> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for e in entries.flatten() {
            let path = e.path();
            if path.extension().is_none_or(|x| x != "msgpack") {
                continue;
            }
            match std::fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| {
                    codec::decode::<Kept>(&b, Encoding::Msgpack).map_err(|e| e.to_string())
                }) {
                Ok(k) => out.push((k.result, k.encoding)),
                Err(e) => {
                    warn!(path = %path.display(), error = %e, "a kept result does not decode; removed");
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        out
    }
}
