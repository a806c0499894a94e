//! Configuration layering shared by the scheduler and the worker: a TOML file with
//! `<PREFIX><KEY>` environment variables laid over it, through one library (figment), and
//! the merged result printed back with secrets redacted (`--check-config`).

use std::path::{Path, PathBuf};

/// Why a layered configuration could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    /// The file could not be read.
    #[error("reading {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file or a variable does not fit the schema (the message names the key and where
    /// it was set).
    #[error("{0}")]
    Layered(String),
}

/// The file (when given) with the variables `<prefix><KEY>` laid over it, nested keys'
/// parts joined by `__` (`TANGRAM_WORKER_SANDBOX__PIDS_LIMIT`); `<prefix>CONFIG` (the path
/// itself) is not a key.
pub fn layered<T: serde::de::DeserializeOwned>(
    path: Option<&Path>,
    prefix: &str,
) -> Result<T, LayerError> {
    use figment::providers::{Env, Format as _, Toml};
    let mut f = figment::Figment::new();
    if let Some(p) = path {
        std::fs::metadata(p).map_err(|source| LayerError::Read {
            path: p.to_path_buf(),
            source,
        })?;
        f = f.merge(Toml::file_exact(p));
    }
    f.merge(Env::prefixed(prefix).split("__").ignore(&["config"]))
        .extract()
        .map_err(|e| LayerError::Layered(e.to_string()))
}

/// A configuration as TOML, unset keys left out, secrets redacted ([`crate::auth::redact`]).
pub fn effective<T: serde::Serialize>(config: &T) -> String {
    let mut v = serde_json::to_value(config).unwrap_or_default();
    strip_nulls(&mut v);
    crate::auth::redact(&mut v);
    toml::to_string(&v).unwrap_or_else(|e| format!("# not printable as TOML: {e}\n{v}"))
}

fn strip_nulls(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            m.retain(|_, x| !x.is_null());
            m.values_mut().for_each(strip_nulls);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}
