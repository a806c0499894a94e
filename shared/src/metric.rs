//! The shape of a metric definition. Each component declares its metrics once, as a table of
//! these (`metrics.rs` of the scheduler and of the worker), registers that table with its
//! recorder at start, and `docs/METRICS.md` is checked against the same tables. Plain data:
//! the recorder and the exporter stay in the components.

/// The Prometheus type of a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    /// Only goes up (names end in `_total`).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Observations in explicit buckets.
    Histogram,
}

impl MetricType {
    /// The Prometheus name of the type.
    pub fn as_str(self) -> &'static str {
        match self {
            MetricType::Counter => "counter",
            MetricType::Gauge => "gauge",
            MetricType::Histogram => "histogram",
        }
    }
}

/// What a metric's value counts, in base units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricUnit {
    /// Things or events.
    Count,
    /// Seconds.
    Seconds,
    /// Bytes.
    Bytes,
    /// Events per second.
    PerSecond,
    /// A fraction from 0 to 1.
    Ratio,
    /// No quantity: the value is 1 and the labels carry the information.
    Info,
}

impl MetricUnit {
    /// The unit as the reference page writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            MetricUnit::Count => "count",
            MetricUnit::Seconds => "seconds",
            MetricUnit::Bytes => "bytes",
            MetricUnit::PerSecond => "per_second",
            MetricUnit::Ratio => "ratio",
            MetricUnit::Info => "info",
        }
    }
}

/// One metric: its name, type, label names, unit and meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricDef {
    /// Full Prometheus name (`tangram_` prefix, unit suffix, `_total` for counters).
    pub name: &'static str,
    /// Type.
    pub kind: MetricType,
    /// Label names, each with a bounded set of values.
    pub labels: &'static [&'static str],
    /// Unit of the value.
    pub unit: MetricUnit,
    /// What it means, one sentence.
    pub help: &'static str,
}

/// The build of a process, as `tangram_build_info` labels it: the crate version, and the
/// commit it was built from when known ([`crate::build::GIT_SHA`]).
pub const BUILD_INFO: &str = "tangram_build_info";

/// Describes every metric of `defs` to the installed recorder, sets `tangram_build_info` for
/// `component` (its `version` the caller's crate version), and starts each unlabelled
/// counter and gauge at 0, so that its series exists (and `rate` works) before the first
/// event. Called once, right after the recorder is installed.
#[cfg(feature = "recorder")]
pub fn register(defs: &[MetricDef], component: &'static str, version: &'static str) {
    use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, Unit};
    for d in defs {
        let unit = match d.unit {
            MetricUnit::Seconds => Some(Unit::Seconds),
            MetricUnit::Bytes => Some(Unit::Bytes),
            MetricUnit::Count => Some(Unit::Count),
            MetricUnit::PerSecond => Some(Unit::CountPerSecond),
            MetricUnit::Ratio | MetricUnit::Info => None,
        };
        match (d.kind, unit) {
            (MetricType::Counter, Some(u)) => describe_counter!(d.name, u, d.help),
            (MetricType::Counter, None) => describe_counter!(d.name, d.help),
            (MetricType::Gauge, Some(u)) => describe_gauge!(d.name, u, d.help),
            (MetricType::Gauge, None) => describe_gauge!(d.name, d.help),
            (MetricType::Histogram, Some(u)) => describe_histogram!(d.name, u, d.help),
            (MetricType::Histogram, None) => describe_histogram!(d.name, d.help),
        }
        if d.labels.is_empty() {
            match d.kind {
                MetricType::Counter => counter!(d.name).absolute(0),
                MetricType::Gauge => gauge!(d.name).set(0.0),
                MetricType::Histogram => {}
            }
        }
    }
    match crate::build::GIT_SHA {
        Some(sha) => {
            gauge!(BUILD_INFO, "version" => version, "git_sha" => sha, "component" => component)
                .set(1.0)
        }
        None => gauge!(BUILD_INFO, "version" => version, "component" => component).set(1.0),
    }
}

/// Every `"tangram_..."` string literal in the Rust files under `dir`, recursively: the
/// metric names a crate's source uses, for its test that each is in its table.
pub fn names_used_in(dir: &std::path::Path) -> std::io::Result<std::collections::BTreeSet<String>> {
    let mut out = std::collections::BTreeSet::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d)? {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path)?;
                for piece in text.split("\"tangram_").skip(1) {
                    let name: String = piece
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() && piece[name.len()..].starts_with('"') {
                        out.insert(format!("tangram_{name}"));
                    }
                }
            }
        }
    }
    Ok(out)
}

/// What is wrong with a component's metric table, one line each (empty when nothing is):
/// names unique and prefixed `tangram_`; a counter's name, and only a counter's, ends in
/// `_total`; seconds and bytes say so in the name; no `job` label (Prometheus's own); every
/// histogram has buckets in `bucketed`.
pub fn table_problems(defs: &[MetricDef], bucketed: &[&str]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for d in defs {
        if !seen.insert(d.name) {
            problems.push(format!("{} is declared twice", d.name));
        }
        if !d.name.starts_with("tangram_") {
            problems.push(format!("{} lacks the tangram_ prefix", d.name));
        }
        if (d.kind == MetricType::Counter) != d.name.ends_with("_total") {
            problems.push(format!(
                "{}: only counters end in _total, and all do",
                d.name
            ));
        }
        let unit_ok = match d.unit {
            MetricUnit::Seconds => d.name.ends_with("_seconds"),
            MetricUnit::Bytes => d.name.ends_with("_bytes"),
            _ => true,
        };
        if !unit_ok {
            problems.push(format!("{}: its name does not say its unit", d.name));
        }
        if d.labels.contains(&"job") {
            problems.push(format!("{}: the job label is Prometheus's", d.name));
        }
        if d.kind == MetricType::Histogram && !bucketed.contains(&d.name) {
            problems.push(format!("{} has no buckets", d.name));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_that_breaks_each_rule_is_told_so() {
        let def = |name, kind, unit, labels| MetricDef {
            name,
            kind,
            labels,
            unit,
            help: "",
        };
        let good = [
            def(
                "tangram_x_total",
                MetricType::Counter,
                MetricUnit::Count,
                &[],
            ),
            def(
                "tangram_y_seconds",
                MetricType::Histogram,
                MetricUnit::Seconds,
                &[],
            ),
        ];
        assert!(table_problems(&good, &["tangram_y_seconds"]).is_empty());
        let bad = [
            def(
                "tangram_x_total",
                MetricType::Counter,
                MetricUnit::Count,
                &[],
            ),
            def(
                "tangram_x_total",
                MetricType::Counter,
                MetricUnit::Count,
                &[],
            ),
            def("other_total", MetricType::Counter, MetricUnit::Count, &[]),
            def("tangram_g_total", MetricType::Gauge, MetricUnit::Count, &[]),
            def(
                "tangram_wait",
                MetricType::Gauge,
                MetricUnit::Seconds,
                &["job"],
            ),
            def(
                "tangram_h_seconds",
                MetricType::Histogram,
                MetricUnit::Seconds,
                &[],
            ),
        ];
        assert_eq!(table_problems(&bad, &[]).len(), 6);
    }
}
