//! Configuration layering shared by the scheduler, the worker and `tangram up`: a TOML file
//! with `<PREFIX><KEY>` environment variables laid over it (a flag, read by clap, is laid
//! over both by the binary), and the merged result printed back with secrets redacted
//! (`--check-config`). One TOML parser (the `toml` crate) does all of it, so an error names
//! the file's line or the variable that set the key.

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
/// itself) is not a key. The prefix is matched without regard to case and keys are
/// lowercased.
pub fn layered<T: serde::de::DeserializeOwned>(
    path: Option<&Path>,
    prefix: &str,
) -> Result<T, LayerError> {
    layered_from(path, prefix, std::env::vars_os())
}

/// [`layered`] with the environment given (for tests).
pub fn layered_from<T: serde::de::DeserializeOwned>(
    path: Option<&Path>,
    prefix: &str,
    vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> Result<T, LayerError> {
    let mut table = toml::Table::new();
    // What the file alone says when it does not fit: the error then carries the file's line
    // and column, so it is the one reported if the merged configuration does not fit either
    // (a variable may complete what the file leaves out).
    let mut file_error = None;
    if let Some(p) = path {
        let text = std::fs::read_to_string(p).map_err(|source| LayerError::Read {
            path: p.to_path_buf(),
            source,
        })?;
        let at_file = |e: toml::de::Error| {
            LayerError::Layered(format!("{}: {}", p.display(), e.to_string().trim()))
        };
        table = toml::from_str(&text).map_err(at_file)?;
        file_error = toml::from_str::<T>(&text).err().map(at_file);
    }
    let mut vars: Vec<(String, Vec<String>, String)> = vars
        .into_iter()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter_map(|(name, value)| {
            let key = strip_prefix_ignoring_case(&name, prefix)?.to_ascii_lowercase();
            if key.is_empty() || key == "config" {
                return None;
            }
            let path = key.split("__").map(str::to_string).collect();
            Some((name, path, value))
        })
        .collect();
    // Sorted, so that two variables naming one key (differing in case) always settle the
    // same way.
    vars.sort();
    // The first variable that fitted in no form, while the configuration did not fit: if the
    // whole does not fit at the end, it is named (a later variable may complete a table it
    // began, so it is not an error by itself).
    let mut suspect: Option<(String, Vec<String>)> = None;
    for (name, key, text) in vars {
        // A value that reads as TOML (a number, a boolean, `[1, 2]`, `{a = 1}`) is taken as
        // such, unless only its text fits the key (`TANGRAM_WORKER_ID=7`); anything else is
        // a string.
        let typed = toml_value(&text);
        let mut tried: Vec<toml::Value> = typed.iter().cloned().collect();
        tried.push(toml::Value::String(text));
        let fitted = tried.iter().find(|value| {
            let mut with = table.clone();
            set(&mut with, &key, (*value).clone());
            T::deserialize(toml::Value::Table(with)).is_ok()
        });
        match fitted {
            Some(value) => set(&mut table, &key, value.clone()),
            None => {
                let value = tried.swap_remove(0);
                set(&mut table, &key, value);
                suspect.get_or_insert((name, key));
            }
        }
    }
    T::deserialize(toml::Value::Table(table)).map_err(|e| {
        let e = e.to_string();
        match (suspect, file_error) {
            (Some((name, key)), _) => {
                LayerError::Layered(format!("{name} (key {}): {}", key.join("."), e.trim()))
            }
            (None, Some(file)) => file,
            (None, None) => LayerError::Layered(e.trim().to_string()),
        }
    })
}

/// `over` laid on `base`: tables merge key by key, anything else in `over` replaces.
pub fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

fn set(table: &mut toml::Table, key: &[String], value: toml::Value) {
    let Some((last, parents)) = key.split_last() else {
        return;
    };
    let mut at = table;
    for part in parents {
        let entry = at
            .entry(part.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if !entry.is_table() {
            *entry = toml::Value::Table(toml::Table::new());
        }
        let toml::Value::Table(t) = entry else {
            unreachable!("made a table above")
        };
        at = t;
    }
    at.insert(last.clone(), value);
}

/// `text` as a TOML value, when it is one (a datetime stays text).
fn toml_value(text: &str) -> Option<toml::Value> {
    let mut doc: toml::Table = toml::from_str(&format!("v = {text}")).ok()?;
    match doc.remove("v")? {
        toml::Value::Datetime(_) => None,
        v => Some(v),
    }
}

fn strip_prefix_ignoring_case<'a>(name: &'a str, prefix: &str) -> Option<&'a str> {
    let head = name.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &name[prefix.len()..])
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    #[derive(Debug, Default, serde::Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Raw {
        id: Option<String>,
        heartbeat_ms: Option<u64>,
        cores: Option<Vec<u32>>,
        debug: Option<bool>,
        sandbox: Option<Sandbox>,
    }

    #[derive(Debug, Default, serde::Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Sandbox {
        pids_limit: Option<u32>,
        runtime: Option<String>,
    }

    fn vars(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect()
    }

    fn file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn variables_are_laid_over_the_file_key_by_key_in_nested_tables() {
        let (_d, path) = file("id = \"file\"\nheartbeat_ms = 100\n[sandbox]\nruntime = \"runc\"\n");
        let raw: Raw = layered_from(
            Some(&path),
            "T_",
            vars(&[
                ("T_HEARTBEAT_MS", "250"),
                ("t_sandbox__pids_limit", "64"),
                ("T_CORES", "[0, 1]"),
                ("T_DEBUG", "true"),
                ("T_CONFIG", "/ignored.toml"),
                ("OTHER_ID", "not ours"),
            ]),
        )
        .unwrap();
        assert_eq!(
            raw,
            Raw {
                id: Some("file".into()),
                heartbeat_ms: Some(250),
                cores: Some(vec![0, 1]),
                debug: Some(true),
                sandbox: Some(Sandbox {
                    pids_limit: Some(64),
                    runtime: Some("runc".into()),
                }),
            }
        );
    }

    #[test]
    fn a_value_that_reads_as_a_number_still_sets_a_text_key() {
        let raw: Raw = layered_from(
            None,
            "T_",
            vars(&[("T_ID", "7"), ("T_SANDBOX__RUNTIME", "2024-01-01")]),
        )
        .unwrap();
        assert_eq!(raw.id.as_deref(), Some("7"));
        assert_eq!(raw.sandbox.unwrap().runtime.as_deref(), Some("2024-01-01"));
    }

    #[test]
    fn errors_name_the_variable_or_the_files_line() {
        let e = layered_from::<Raw>(None, "T_", vars(&[("T_NO_SUCH_KEY", "1")])).unwrap_err();
        let e = e.to_string();
        assert!(
            e.contains("T_NO_SUCH_KEY") && e.contains("no_such_key"),
            "{e}"
        );
        let e = layered_from::<Raw>(None, "T_", vars(&[("T_HEARTBEAT_MS", "soon")])).unwrap_err();
        assert!(e.to_string().contains("T_HEARTBEAT_MS"), "{e}");
        let (_d, path) = file("id = \"a\"\nbogus = 1\n");
        let e = layered_from::<Raw>(Some(&path), "T_", vars(&[]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 2") && e.contains("bogus") && e.contains("c.toml"),
            "{e}"
        );
        let e = layered_from::<Raw>(Some(Path::new("/no/such/file.toml")), "T_", vars(&[]))
            .unwrap_err();
        assert!(matches!(e, LayerError::Read { .. }), "{e}");
    }

    #[derive(Debug, serde::Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Pool {
        seeds: String,
        locks: String,
    }

    #[derive(Debug, serde::Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Required {
        name: String,
        pool: Option<Pool>,
    }

    /// Regression: each variable was checked against the whole configuration on its own, so
    /// a table whose required keys come from two variables, or a file that leaves a required
    /// key to a variable, was refused.
    #[test]
    fn variables_may_complete_what_the_file_or_another_variable_began() {
        let r: Required = layered_from(
            None,
            "T_",
            vars(&[
                ("T_POOL__LOCKS", "/l"),
                ("T_POOL__SEEDS", "/s"),
                ("T_NAME", "x"),
            ]),
        )
        .unwrap();
        let pool = Pool {
            seeds: "/s".into(),
            locks: "/l".into(),
        };
        assert_eq!(
            r,
            Required {
                name: "x".into(),
                pool: Some(pool)
            }
        );
        let (_d, path) = file("pool = { seeds = \"/s\", locks = \"/l\" }\n");
        let r: Required = layered_from(Some(&path), "T_", vars(&[("T_NAME", "y")])).unwrap();
        assert_eq!(r.name, "y");
        // Left incomplete, the error names the variable that began the table.
        let e = layered_from::<Required>(
            None,
            "T_",
            vars(&[("T_POOL__LOCKS", "/l"), ("T_NAME", "x")]),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("T_POOL__LOCKS") && e.contains("seeds"), "{e}");
        // And a file that misses what no variable gives is reported at the file.
        let (_d, path) = file("pool = { seeds = \"/s\", locks = \"/l\" }\n");
        let e = layered_from::<Required>(Some(&path), "T_", vars(&[]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("c.toml") && e.contains("name"), "{e}");
    }

    #[test]
    fn merge_replaces_values_and_merges_tables() {
        let mut base: toml::Table = toml::from_str("a = 1\n[t]\nx = 1\ny = 2\n").unwrap();
        merge(&mut base, toml::from_str("a = 2\n[t]\ny = 3\n").unwrap());
        assert_eq!(base, toml::from_str("a = 2\n[t]\nx = 1\ny = 3\n").unwrap());
    }
}
