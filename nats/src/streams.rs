//! Stream configuration that the operator owns. The bundled definitions (`streams/*.json`)
//! plus the operator's settings (replicas, limits) say what a stream should be when it is
//! first created. After that the stream's stored configuration is the operator's: a process
//! creates what is missing and reports every difference it finds (a [`Drift`], logged as a
//! warning), and never changes a stream that exists, so an edit made with the `nats` CLI or
//! the JetStream API survives every restart.

use crate::SetupError;
use async_nats::jetstream::{self, stream};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// The short names of the streams, as `[streams.<name>]` tables use them.
pub const NAMES: [&str; 5] = ["actions", "results", "dispatch", "deadletter", "history"];

/// Replicas and limits for the streams (`[streams]` in the scheduler's config).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, serde::Serialize)]
pub struct StreamSettings {
    /// Replicas of every stream: 1 on a single server, 3 (or 5) on a cluster. Default 1.
    pub replicas: Option<usize>,
    /// Per-stream limits, by short name (`actions`, `results`, `dispatch`, `deadletter`);
    /// [`StreamSettings::validate`] refuses other names.
    #[serde(flatten)]
    pub limits: BTreeMap<String, StreamLimits>,
}

/// Limits of one stream; absent fields keep the bundled values.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct StreamLimits {
    /// Bytes the stream may hold.
    pub max_bytes: Option<i64>,
    /// How long a message is kept, seconds (the history's window; the backlog streams keep
    /// unprocessed work for as long as it takes).
    pub max_age_s: Option<u64>,
    /// Messages one subject may hold: on `actions`, the backlog of one job's actions of one
    /// kind (its subject is `tangram.v1.action.<job>.<kind>`), refused past it.
    pub max_msgs_per_subject: Option<i64>,
}

impl StreamSettings {
    /// Checks names and values, for a clear error before anything connects.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(r) = self.replicas {
            if !(1..=5).contains(&r) {
                return Err(format!("streams.replicas must be 1 to 5, not {r}"));
            }
        }
        for (name, l) in &self.limits {
            if !NAMES.contains(&name.as_str()) {
                return Err(format!(
                    "[streams.{name}]: no such stream (streams are {})",
                    NAMES.join(", ")
                ));
            }
            if l.max_bytes.is_some_and(|b| b <= 0) {
                return Err(format!("streams.{name}.max_bytes must be positive"));
            }
            if l.max_age_s == Some(0) {
                return Err(format!("streams.{name}.max_age_s must be positive"));
            }
            if l.max_msgs_per_subject.is_some_and(|n| n <= 0) {
                return Err(format!(
                    "streams.{name}.max_msgs_per_subject must be positive"
                ));
            }
        }
        Ok(())
    }
}

/// A difference between a stream as stored and as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drift {
    /// The stream.
    pub stream: String,
    /// The field.
    pub field: &'static str,
    /// Its stored value.
    pub stored: String,
    /// Its configured value.
    pub configured: String,
}

impl std::fmt::Display for Drift {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "stream {} has {} = {} where the configuration says {}",
            self.stream, self.field, self.stored, self.configured
        )
    }
}

/// The streams as configured: the bundled definitions with `settings` applied.
pub fn desired(settings: &StreamSettings) -> Result<Vec<stream::Config>, SetupError> {
    let mut out = crate::stream_configs()?;
    for (short, config) in NAMES.iter().zip(out.iter_mut()) {
        if let Some(r) = settings.replicas {
            config.num_replicas = r;
        }
        if let Some(l) = settings.limits.get(*short) {
            if let Some(b) = l.max_bytes {
                config.max_bytes = b;
            }
            if let Some(s) = l.max_age_s {
                config.max_age = Duration::from_secs(s);
            }
            if let Some(n) = l.max_msgs_per_subject {
                config.max_messages_per_subject = n;
            }
        }
    }
    Ok(out)
}

/// The fields the bundled definitions set, stored against configured.
pub fn drift(stored: &stream::Config, configured: &stream::Config) -> Vec<Drift> {
    let mut out = Vec::new();
    let mut check = |field: &'static str, s: String, c: String| {
        if s != c {
            out.push(Drift {
                stream: configured.name.clone(),
                field,
                stored: s,
                configured: c,
            });
        }
    };
    check(
        "subjects",
        format!("{:?}", stored.subjects),
        format!("{:?}", configured.subjects),
    );
    check(
        "retention",
        format!("{:?}", stored.retention),
        format!("{:?}", configured.retention),
    );
    check(
        "storage",
        format!("{:?}", stored.storage),
        format!("{:?}", configured.storage),
    );
    check(
        "discard",
        format!("{:?}", stored.discard),
        format!("{:?}", configured.discard),
    );
    check(
        "max_bytes",
        stored.max_bytes.to_string(),
        configured.max_bytes.to_string(),
    );
    check(
        "max_age",
        format!("{:?}", stored.max_age),
        format!("{:?}", configured.max_age),
    );
    check(
        "max_msg_size",
        stored.max_message_size.to_string(),
        configured.max_message_size.to_string(),
    );
    // 0 and -1 both mean no limit (the server stores -1).
    let unlimited = |n: i64| if n <= 0 { -1 } else { n };
    check(
        "max_msgs_per_subject",
        unlimited(stored.max_messages_per_subject).to_string(),
        unlimited(configured.max_messages_per_subject).to_string(),
    );
    let sources = |c: &stream::Config| {
        c.sources
            .iter()
            .flatten()
            .map(|s| s.name.clone())
            .collect::<Vec<_>>()
    };
    check(
        "sources",
        format!("{:?}", sources(stored)),
        format!("{:?}", sources(configured)),
    );
    check(
        "num_replicas",
        stored.num_replicas.max(1).to_string(),
        configured.num_replicas.max(1).to_string(),
    );
    check(
        "allow_direct",
        stored.allow_direct.to_string(),
        configured.allow_direct.to_string(),
    );
    if !configured.duplicate_window.is_zero() {
        check(
            "duplicate_window",
            format!("{:?}", stored.duplicate_window),
            format!("{:?}", configured.duplicate_window),
        );
    }
    out
}

/// Creates every missing stream as configured; leaves existing ones as they are stored and
/// returns (and logs) how they differ from the configuration.
pub async fn ensure(
    js: &jetstream::Context,
    settings: &StreamSettings,
) -> Result<Vec<Drift>, SetupError> {
    if let Some(name) = old_layout(js).await? {
        return Err(SetupError::OldLayout { name });
    }
    let mut drifts = Vec::new();
    for config in desired(settings)? {
        let name = config.name.clone();
        let stored = match js.get_stream(&name).await {
            Ok(s) => s,
            Err(e)
                if matches!(e.kind(), jetstream::context::GetStreamErrorKind::JetStream(j)
                    if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND) =>
            {
                match js.create_stream(config.clone()).await {
                    Ok(_) => continue,
                    // Another process created it in between: judge it as found.
                    Err(e) if crate::created_meanwhile(&e) => {
                        js.get_stream(&name)
                            .await
                            .map_err(|source| SetupError::Lookup {
                                name: name.clone(),
                                source,
                            })?
                    }
                    Err(source) => return Err(SetupError::Stream { name, source }),
                }
            }
            Err(source) => return Err(SetupError::Lookup { name, source }),
        };
        let mut stored = stored;
        let info = stored.info().await.map_err(|e| SetupError::Info {
            name: name.clone(),
            why: e.to_string(),
        })?;
        for d in drift(&info.config, &config) {
            tracing::warn!(stream = %d.stream, field = d.field, stored = %d.stored,
                configured = %d.configured,
                "stream differs from the configuration; left as stored (the operator's edit wins)");
            drifts.push(d);
        }
    }
    Ok(drifts)
}

/// The first backlog stream that has the old layout (limits retention), if any.
pub async fn old_layout(js: &jetstream::Context) -> Result<Option<String>, crate::SetupError> {
    use tangram_shared::subject;
    for name in [subject::ACTIONS_STREAM, subject::DISPATCH_STREAM] {
        match js.get_stream(name).await {
            Ok(s) => {
                if s.cached_info().config.retention == stream::RetentionPolicy::Limits {
                    return Ok(Some(name.to_string()));
                }
            }
            Err(e) if not_found(&e) => {}
            Err(source) => {
                return Err(crate::SetupError::Lookup {
                    name: name.to_string(),
                    source,
                })
            }
        }
    }
    Ok(None)
}

pub(crate) fn not_found(e: &jetstream::context::GetStreamError) -> bool {
    matches!(e.kind(), jetstream::context::GetStreamErrorKind::JetStream(j)
        if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_apply_replicas_and_limits_to_the_bundled_definitions() {
        let settings: StreamSettings =
            toml_like(r#"{"replicas": 3, "actions": {"max_bytes": 1024, "max_age_s": 60}}"#);
        settings.validate().unwrap();
        let d = desired(&settings).unwrap();
        assert!(d.iter().all(|c| c.num_replicas == 3));
        let actions = d.iter().find(|c| c.name == "TANGRAM_ACTIONS").unwrap();
        assert_eq!(actions.max_bytes, 1024);
        assert_eq!(actions.max_age, Duration::from_secs(60));
        let results = d.iter().find(|c| c.name == "TANGRAM_RESULTS").unwrap();
        assert_eq!(
            results.max_bytes,
            4 << 30,
            "untouched streams keep the bundled limits"
        );
    }

    #[test]
    fn bad_settings_are_refused_with_the_field() {
        let e = toml_like::<StreamSettings>(r#"{"replicas": 0}"#)
            .validate()
            .unwrap_err();
        assert!(e.contains("replicas"), "{e}");
        let e = toml_like::<StreamSettings>(r#"{"action": {"max_bytes": 5}}"#)
            .validate()
            .unwrap_err();
        assert!(e.contains("no such stream"), "{e}");
        let e = toml_like::<StreamSettings>(r#"{"results": {"max_bytes": -1}}"#)
            .validate()
            .unwrap_err();
        assert!(e.contains("max_bytes"), "{e}");
    }

    #[test]
    fn drift_names_each_differing_field_and_nothing_else() {
        let configured = desired(&StreamSettings::default()).unwrap().remove(0);
        assert!(drift(&configured, &configured).is_empty());
        let mut stored = configured.clone();
        stored.max_bytes = 1 << 20;
        stored.num_replicas = 3;
        stored.description = Some("edited".into()); // not a field we own
        let d = drift(&stored, &configured);
        let fields: Vec<_> = d.iter().map(|d| d.field).collect();
        assert_eq!(fields, ["max_bytes", "num_replicas"]);
        assert!(d[0].to_string().contains("TANGRAM_ACTIONS"), "{}", d[0]);
    }

    fn toml_like<T: serde::de::DeserializeOwned>(json: &str) -> T {
        serde_json::from_str(json).unwrap()
    }
}
