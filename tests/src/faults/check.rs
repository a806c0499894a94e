//! Counting: every acknowledged action against its stored results and its effects.

use super::workload::Submitted;
use async_nats::jetstream;
use futures::StreamExt;
use std::collections::BTreeMap;
use std::time::Duration;
use tangram_shared::codec::{self, Encoding};
use tangram_shared::{subject, ActionResult, InfraCode, Outcome};

/// Counts for one kind of action, or for all.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Tally {
    /// Acknowledged by JetStream.
    pub acked: usize,
    /// Exactly one result, effects consistent with it.
    pub ok: usize,
    /// No result, or "completed" with no effect.
    pub lost: usize,
    /// More than one result or more than one effect.
    pub duplicated: usize,
    /// Results that said `worker_lost` although the effect happened: allowed (the work may
    /// have run), counted to show how often the answer is conservative.
    pub worker_lost_after_effect: usize,
}

impl Tally {
    fn add(&mut self, o: &Tally) {
        self.acked += o.acked;
        self.ok += o.ok;
        self.lost += o.lost;
        self.duplicated += o.duplicated;
        self.worker_lost_after_effect += o.worker_lost_after_effect;
    }
}

/// What one run found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// The fault.
    pub fault: &'static str,
    /// Every kind together.
    pub total: Tally,
    /// By action kind.
    pub by_kind: BTreeMap<&'static str, Tally>,
    /// Outcomes of the stored results, by label (`completed`, `infra_error:worker_lost`...).
    pub outcomes: BTreeMap<String, usize>,
    /// Up to ten lost action ids, and up to ten duplicated ones, for a person to follow.
    pub examples: Vec<String>,
    /// Seconds from the workload's start to the fault.
    pub struck_at_s: f64,
    /// Seconds from the workload's start to the end of the fault.
    pub recovered_at_s: f64,
    /// Seconds the whole workload took.
    pub total_s: f64,
    /// The longest time no result came, in seconds: how long the fault stalled the
    /// rollouts.
    pub longest_stall_s: f64,
    /// Ids of the lost and duplicated actions.
    #[serde(skip)]
    pub flagged: Vec<String>,
    /// When something was lost or duplicated: the fleet's log lines that name those actions.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<String>,
}

impl Report {
    /// The report with the run's times: when the fault struck and ended, the whole run,
    /// its longest stall (all from the workload's start).
    pub(super) fn timed(
        self,
        started: tokio::time::Instant,
        struck_at: std::time::Duration,
        recovered_at: std::time::Duration,
        longest_stall: std::time::Duration,
    ) -> Self {
        Self {
            struck_at_s: struck_at.as_secs_f64(),
            recovered_at_s: recovered_at.as_secs_f64(),
            total_s: started.elapsed().as_secs_f64(),
            longest_stall_s: longest_stall.as_secs_f64(),
            ..self
        }
    }

    /// True when nothing was lost or duplicated.
    pub fn clean(&self) -> bool {
        self.total.lost == 0 && self.total.duplicated == 0
    }
}

/// The effects that happened, by action id.
#[derive(Debug, Default)]
pub struct Effects {
    /// Marks sandbox execs left (one line per run); `None` where execs leave none (the
    /// `noop` runtime), so that only their results are counted.
    pub execs: Option<BTreeMap<String, usize>>,
    /// Inputs the reward replicas scored.
    pub rewards: BTreeMap<String, usize>,
    /// Requests the provider served (by their `id` query parameter).
    pub calls: BTreeMap<String, usize>,
}

impl Effects {
    /// Reads the exec marks (where execs leave them) and the replicas' request log (one id
    /// per line), and counts the provider's requests by their targets.
    pub fn read(
        exec_marks: Option<&std::path::Path>,
        replica_log: &std::path::Path,
        api_targets: impl IntoIterator<Item = String>,
    ) -> Self {
        let mut calls: BTreeMap<String, usize> = BTreeMap::new();
        for target in api_targets {
            if let Some(id) = query_value(&target, "id") {
                *calls.entry(id).or_default() += 1;
            }
        }
        Self {
            execs: exec_marks.map(count_lines),
            rewards: count_lines(replica_log),
            calls,
        }
    }
}

/// Classifies every acknowledged action.
pub(super) async fn classify(
    fault: &'static str,
    effects: &Effects,
    client: &crate::Client,
    submitted: Vec<Submitted>,
) -> anyhow::Result<Report> {
    let stored = stored_results(client).await?;
    let Effects {
        execs,
        rewards,
        calls,
    } = effects;
    let mut by_kind: BTreeMap<&'static str, Tally> = BTreeMap::new();
    let mut outcomes = BTreeMap::new();
    let mut examples = Vec::new();
    let mut flagged = Vec::new();
    for s in &submitted {
        let id = s.id.as_str();
        let results = stored.get(id).map(Vec::as_slice).unwrap_or_default();
        let effects = match s.kind {
            "exec" => execs.as_ref().map(|m| m.get(id).copied().unwrap_or(0)),
            "reward" => Some(rewards.get(id).copied().unwrap_or(0)),
            "api" => Some(calls.get(id).copied().unwrap_or(0)),
            _ => None,
        };
        for r in results {
            *outcomes.entry(outcome_label(&r.outcome)).or_default() += 1;
        }
        let t = by_kind.entry(s.kind).or_default();
        t.acked += 1;
        let completed = results
            .first()
            .is_some_and(|r| matches!(r.outcome, Outcome::Completed { .. }));
        let worker_lost = results.first().is_some_and(|r| {
            matches!(
                r.outcome,
                Outcome::InfraError {
                    code: InfraCode::WorkerLost,
                    ..
                }
            )
        });
        if results.len() > 1 || effects.is_some_and(|e| e > 1) {
            t.duplicated += 1;
            flagged.push(id.to_string());
            if examples.len() < 20 {
                examples.push(format!(
                    "duplicated {id}: {} results, {effects:?} effects",
                    results.len()
                ));
            }
        } else if results.is_empty() || (completed && effects == Some(0)) {
            t.lost += 1;
            flagged.push(id.to_string());
            if examples.len() < 20 {
                examples.push(format!(
                    "lost {id}: {} results ({:?}), {effects:?} effects",
                    results.len(),
                    results.first().map(|r| &r.outcome)
                ));
            }
        } else {
            t.ok += 1;
            if worker_lost && effects == Some(1) {
                t.worker_lost_after_effect += 1;
            }
        }
    }
    let mut total = Tally::default();
    for t in by_kind.values() {
        total.add(t);
    }
    Ok(Report {
        fault,
        total,
        by_kind,
        outcomes,
        examples,
        struck_at_s: 0.0,
        recovered_at_s: 0.0,
        total_s: 0.0,
        longest_stall_s: 0.0,
        flagged,
        evidence: Vec::new(),
    })
}

fn outcome_label(o: &Outcome) -> String {
    match o {
        Outcome::Rejected { code, .. } => format!("rejected:{}", code.as_str()),
        Outcome::InfraError { code, .. } => {
            let code = serde_json::to_value(code)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            format!("infra_error:{code}")
        }
        o => o.label().to_string(),
    }
}

/// Every result stored for the client's job, by action id.
async fn stored_results(
    client: &crate::Client,
) -> anyhow::Result<BTreeMap<String, Vec<ActionResult>>> {
    let stream = client.js.get_stream(subject::RESULTS_STREAM).await?;
    let filter = format!("tangram.v1.result.{}.>", client.job);
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::OrderedConfig {
            filter_subject: filter,
            ..Default::default()
        })
        .await?;
    let mut pending = consumer.cached_info().num_pending;
    let mut messages = consumer.messages().await?;
    let mut out: BTreeMap<String, Vec<ActionResult>> = BTreeMap::new();
    while pending > 0 {
        let m = tokio::time::timeout(Duration::from_secs(10), messages.next())
            .await
            .map_err(|_| anyhow::anyhow!("reading stored results stalled"))?
            .ok_or_else(|| anyhow::anyhow!("result stream ended"))??;
        let enc = Encoding::from_content_type(
            m.headers
                .as_ref()
                .and_then(|h| h.get(subject::HEADER_CONTENT_TYPE))
                .map(|v| v.as_str()),
        )?;
        let r: ActionResult = codec::decode(&m.payload, enc)?;
        out.entry(r.id.to_string()).or_default().push(r);
        pending = m.info().map(|i| i.pending).unwrap_or(0) as u64;
    }
    Ok(out)
}

fn count_lines(path: &std::path::Path) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for line in std::fs::read_to_string(path).unwrap_or_default().lines() {
        let line = line.trim();
        if !line.is_empty() {
            *out.entry(line.to_string()).or_default() += 1;
        }
    }
    out
}

fn query_value(target: &str, key: &str) -> Option<String> {
    let (_, q) = target.split_once('?')?;
    q.split('&')
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_found_by_key() {
        assert_eq!(
            query_value("GET /search?job=j&id=t1-a0", "id").as_deref(),
            Some("t1-a0")
        );
        assert_eq!(query_value("GET /search?job=j", "id"), None);
        assert_eq!(query_value("GET /search", "id"), None);
    }
}
