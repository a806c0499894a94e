//! Reading a workload trace (JSON lines, one trajectory per line) and a cluster file, for
//! `tangram simulate --trace` and `--cluster`. The format is documented in
//! `docs/SIMULATOR.md`; `tangram replay --export-trace` writes it.

use super::{SimAction, SimCall, SimStep, SimTrajectory};
use crate::{ServiceSpec, Speedup};
use serde::Deserialize;
use std::collections::BTreeMap;
use tangram_shared::CpuRange;

/// A trace or cluster file that does not read: where, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceError {
    /// Where: "trace line 3, step 1", "cluster file", "provider \"search\"".
    pub at: String,
    /// What is wrong there.
    pub what: String,
}

impl std::fmt::Display for TraceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.at, self.what)
    }
}

impl std::error::Error for TraceError {}

fn err<T>(at: impl Into<String>, what: impl Into<String>) -> Result<T, TraceError> {
    Err(TraceError {
        at: at.into(),
        what: what.into(),
    })
}

fn cluster_file(text: &str) -> Result<ClusterFile, TraceError> {
    serde_json::from_str(text).or_else(|e| err("cluster file", e.to_string()))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TraceLine {
    job: String,
    trajectory: String,
    #[serde(default)]
    start_s: f64,
    steps: Vec<TraceStep>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TraceStep {
    #[serde(default)]
    think_s: f64,
    action: TraceAction,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TraceAction {
    kind: String,
    #[serde(default)]
    demand: BTreeMap<String, f64>,
    #[serde(default)]
    elastic: Option<TraceElastic>,
    t1_s: f64,
    #[serde(default)]
    speedup: Option<TraceSpeedup>,
    #[serde(default)]
    service: Option<String>,
    #[serde(default)]
    provider: Option<String>,
    /// The tool the action runs; the learner's key with the job.
    #[serde(default)]
    tool: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TraceElastic {
    resource: String,
    min: u32,
    max: u32,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
enum TraceSpeedup {
    Amdahl(f64),
    Power(f64),
    Table(Vec<(u32, f64)>),
}

/// Parses a JSON-lines trace.
pub fn parse_trace(text: &str) -> Result<Vec<SimTrajectory>, TraceError> {
    let mut out = Vec::new();
    for (no, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let t: TraceLine = match serde_json::from_str(line) {
            Ok(t) => t,
            Err(e) => return err(format!("trace line {}", no + 1), e.to_string()),
        };
        let mut steps = Vec::new();
        for (i, s) in t.steps.into_iter().enumerate() {
            let a = s.action;
            let at = || format!("trace line {}, step {i}", no + 1);
            let call = match a.kind.as_str() {
                "sandbox_exec" => SimCall::Cpu,
                "reward" => match a.service.clone() {
                    Some(service) => SimCall::Reward { service },
                    None => return err(at(), "a reward step names its service"),
                },
                "api" => match a.provider.clone() {
                    Some(provider) => SimCall::Api { provider },
                    None => return err(at(), "an api step names its provider"),
                },
                other => {
                    return err(
                        at(),
                        format!("unknown action kind {other:?}; sandbox_exec, reward or api"),
                    )
                }
            };
            let cpu = a.demand.get("cpu").copied().unwrap_or(1.0).max(1.0) as u32;
            let cores = match a.elastic {
                Some(e) if e.resource == "cpu" => {
                    if e.min == 0 || e.min > e.max {
                        return err(
                            at(),
                            format!("elastic range [{}, {}] needs 1 <= min <= max", e.min, e.max),
                        );
                    }
                    CpuRange {
                        min: e.min,
                        max: e.max,
                    }
                }
                Some(e) => {
                    return err(
                        at(),
                        format!(
                            "elastic resource {:?} is not modelled; only \"cpu\"",
                            e.resource
                        ),
                    )
                }
                None => CpuRange { min: cpu, max: cpu },
            };
            if a.t1_s.is_nan() || a.t1_s <= 0.0 {
                return err(at(), "t1_s must be positive");
            }
            let speedup = match a.speedup {
                None => Speedup::Amdahl(0.0),
                Some(TraceSpeedup::Amdahl(p)) => Speedup::Amdahl(p),
                Some(TraceSpeedup::Power(x)) => Speedup::Power(x),
                Some(TraceSpeedup::Table(t)) => Speedup::Table(t),
            };
            steps.push(SimStep {
                think_ms: s.think_s.max(0.0) * 1e3,
                action: SimAction {
                    call,
                    tool: a.tool.unwrap_or_else(|| "exec".into()),
                    cores,
                    t1_ms: a.t1_s * 1e3,
                    speedup,
                },
            });
        }
        out.push(SimTrajectory {
            job: t.job,
            id: t.trajectory,
            start_ms: t.start_s.max(0.0) * 1e3,
            steps,
        });
    }
    Ok(out)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClusterFile {
    nodes: Vec<NodeGroup>,
    #[serde(default)]
    services: Vec<ServiceEntry>,
    #[serde(default)]
    providers: Vec<ProviderEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProviderEntry {
    name: String,
    rate: f64,
    #[serde(default = "one")]
    burst: u32,
    #[serde(default = "conc_default")]
    concurrency: u32,
}

fn conc_default() -> u32 {
    64
}

/// The providers a cluster file declares.
pub fn parse_providers(text: &str) -> Result<Vec<crate::quota::ProviderQuota>, TraceError> {
    let c = cluster_file(text)?;
    c.providers
        .into_iter()
        .map(|p| {
            if p.rate.is_nan() || p.rate <= 0.0 || p.burst == 0 || p.concurrency == 0 {
                return err(
                    format!("provider {:?}", p.name),
                    "rate must be above 0, burst and concurrency at least 1",
                );
            }
            Ok(crate::quota::ProviderQuota {
                name: p.name,
                rate_per_s: p.rate,
                burst: p.burst,
                concurrency: p.concurrency,
                slow_ms: None,
            })
        })
        .collect()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServiceEntry {
    name: String,
    #[serde(default = "one")]
    gpus: u32,
    #[serde(default = "restore_default")]
    restore_s: f64,
    #[serde(default = "slots_default")]
    slots: u32,
}

fn restore_default() -> f64 {
    0.2
}
fn slots_default() -> u32 {
    8
}

/// Parses a cluster file for a GPU workload: per node, its GPUs as NVLink groups of up to 8,
/// and the services when the file declares any.
pub type GpuCluster = (Vec<Vec<u8>>, Option<Vec<ServiceSpec>>);

/// Parses a cluster file for a GPU workload (see [`GpuCluster`]).
pub fn parse_gpu_cluster(text: &str) -> Result<GpuCluster, TraceError> {
    let c = cluster_file(text)?;
    let mut nodes = Vec::new();
    for g in c.nodes {
        let mut groups = Vec::new();
        let mut left = g.gpu;
        while left > 0 {
            let take = [8u32, 4, 2, 1]
                .into_iter()
                .find(|&c| c <= left)
                .unwrap_or(1);
            groups.push(take as u8);
            left -= take;
        }
        for _ in 0..g.count {
            if !groups.is_empty() {
                nodes.push(groups.clone());
            }
        }
    }
    if nodes.is_empty() {
        return err("cluster file", "the cluster has no GPUs");
    }
    let services = if c.services.is_empty() {
        None
    } else {
        let mut out = Vec::new();
        for s in c.services {
            if !u8::try_from(s.gpus).is_ok_and(|g| tangram_shared::CHUNK_SIZES.contains(&g)) {
                return err(
                    format!("service {:?}", s.name),
                    format!("gpus must be 1, 2, 4 or 8, not {}", s.gpus),
                );
            }
            out.push(ServiceSpec {
                name: s.name,
                gpus: s.gpus as u8,
                restore_ms: (s.restore_s.max(0.0) * 1e3) as u64,
                slots: s.slots.max(1),
            });
        }
        Some(out)
    };
    Ok((nodes, services))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeGroup {
    #[serde(default = "one")]
    count: u32,
    #[serde(default)]
    cpu: u32,
    #[serde(default)]
    mem_mb: u64,
    #[serde(default)]
    gpu: u32,
}

fn one() -> u32 {
    1
}

/// Parses a cluster file into cores per node. Services and providers are accepted and
/// reported as not yet modelled.
pub fn parse_cluster(text: &str) -> Result<(Vec<u32>, Vec<String>), TraceError> {
    let c = cluster_file(text)?;
    let mut notes = Vec::new();
    if !c.services.is_empty() || !c.providers.is_empty() {
        notes.push("services and providers in the cluster file are read by mopd, deepsearch and traces with reward or api steps; ai-coding uses the nodes' cores only".into());
    }
    let mut nodes = Vec::new();
    for g in c.nodes {
        let _ = (g.mem_mb, g.gpu);
        // A GPU-only node (a GPU worker's host) runs no sandboxes: no trajectory goes there.
        if g.cpu > 0 {
            nodes.extend(std::iter::repeat_n(g.cpu, g.count as usize));
        }
    }
    if nodes.is_empty() && c.services.is_empty() {
        return err("cluster file", "the cluster has no CPU cores");
    }
    Ok((nodes, notes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_only_node_takes_no_trajectories() {
        let (nodes, _) = parse_cluster(
            r#"{"nodes": [{"count": 1, "cpu": 2}, {"count": 1, "cpu": 0, "gpu": 1}],
                "services": [{"name": "judge"}]}"#,
        )
        .unwrap();
        assert_eq!(nodes, [2]);
    }

    #[test]
    fn the_documented_trace_line_parses_and_unsupported_kinds_are_explained() {
        let line = r#"{"job": "j1", "trajectory": "t17", "start_s": 0.5, "steps": [{"think_s": 2.5, "action": {"kind": "sandbox_exec", "demand": {"cpu": 1, "mem_mb": 512}, "elastic": {"resource": "cpu", "min": 1, "max": 16}, "t1_s": 1.2, "speedup": {"amdahl": 0.8}}}, {"think_s": 1.0, "action": {"kind": "sandbox_exec", "t1_s": 0.6, "speedup": {"table": [[1, 1.0], [8, 0.5]]}}}]}"#;
        let t = parse_trace(line).unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].start_ms, 500.0);
        assert_eq!(t[0].steps[0].action.cores, CpuRange { min: 1, max: 16 });
        assert_eq!(t[0].steps[0].action.speedup, Speedup::Amdahl(0.8));
        assert_eq!(
            t[0].steps[1].action.speedup,
            Speedup::Table(vec![(1, 1.0), (8, 0.5)])
        );
        let reward = r#"{"job": "j1", "trajectory": "t1", "steps": [{"think_s": 1.0, "action": {"kind": "reward", "service": "judge", "demand": {"gpu": 1}, "t1_s": 0.6}}, {"action": {"kind": "api", "provider": "search", "t1_s": 0.3}}]}"#;
        let t = parse_trace(reward).unwrap();
        assert_eq!(
            t[0].steps[0].action.call,
            SimCall::Reward {
                service: "judge".into()
            }
        );
        assert_eq!(
            t[0].steps[1].action.call,
            SimCall::Api {
                provider: "search".into()
            }
        );
        let nameless = r#"{"job": "j1", "trajectory": "t1", "steps": [{"action": {"kind": "reward", "t1_s": 0.6}}]}"#;
        assert!(parse_trace(nameless)
            .unwrap_err()
            .to_string()
            .contains("service"));
        let bad_t1 = "\n{\"job\": \"j\", \"trajectory\": \"t\", \"steps\": [{\"action\": {\"kind\": \"sandbox_exec\", \"t1_s\": 0}}]}";
        assert_eq!(
            parse_trace(bad_t1).unwrap_err().to_string(),
            "trace line 2, step 0: t1_s must be positive"
        );
        let (nodes, notes) = parse_cluster(r#"{"nodes": [{"count": 2, "cpu": 8, "mem_mb": 1000, "gpu": 0}], "services": [{"name": "judge", "gpus": 1, "restore_s": 0.2}]}"#).unwrap();
        assert_eq!(nodes, vec![8, 8]);
        assert_eq!(notes.len(), 1);
    }
}
