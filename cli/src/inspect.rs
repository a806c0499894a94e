//! `tangram inspect <action-id>`: one action's whole story from the retained streams: the
//! action as stored, every dispatch, the result (or results: more than one is a defect and is
//! said so), any dead-letter record, and a timeline with the ACT split.

use crate::streams::{self, Record, Scan};
use anyhow::Context as _;
use serde::Serialize;
use tangram_shared::{subject, ActionResult, Dispatch, GpuRoute, Grant, Timing};

mod lookup;
mod render;

pub use lookup::lookup;
pub use render::render;

/// The header dead-letter records carry the action id in (when it could be read).
pub const HEADER_DLQ_ACTION: &str = "Tangram-Action-Id";

/// `tangram inspect`'s options.
#[derive(Debug, clap::Args)]
pub(crate) struct InspectArgs {
    /// The action id.
    id: String,
    /// The action's job, when known: narrows every lookup to that job's subjects.
    #[arg(long)]
    job: Option<String>,
    /// Print the story as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    cluster: crate::connect::ClusterArgs,
}

/// The action as stored on the actions stream.
#[derive(Debug, Serialize)]
pub struct StoredAction {
    pub seq: u64,
    pub subject: String,
    pub stored_at_us: u64,
    pub encoding: &'static str,
    /// The message decoded as JSON (whatever it holds, even when it is not a valid action).
    pub body: serde_json::Value,
}

/// One dispatch.
#[derive(Debug, Serialize)]
pub struct DispatchRecord {
    pub seq: u64,
    pub stored_at_us: u64,
    pub worker: String,
    pub epoch: u64,
    pub attempt: u32,
    pub instance: Option<String>,
    pub grant: Grant,
    pub gpu: Option<GpuRoute>,
}

/// One result.
#[derive(Debug, Serialize)]
pub struct ResultRecord {
    pub seq: u64,
    pub stored_at_us: u64,
    pub result: ActionResult,
}

/// One dead-letter record naming the action.
#[derive(Debug, Serialize)]
pub struct DeadLetter {
    pub seq: u64,
    pub stored_at_us: u64,
    pub code: String,
    pub reason: String,
    pub worker: Option<String>,
    pub original_subject: Option<String>,
}

/// A moment in the action's life.
#[derive(Debug, Serialize, PartialEq)]
pub struct Moment {
    pub at_us: u64,
    pub what: String,
}

/// Everything the streams hold about one action.
#[derive(Debug, Serialize)]
pub struct Story {
    pub id: String,
    pub job: Option<String>,
    pub action: Option<StoredAction>,
    pub dispatches: Vec<DispatchRecord>,
    pub results: Vec<ResultRecord>,
    pub deadletters: Vec<DeadLetter>,
    pub timeline: Vec<Moment>,
    /// The result's ACT split (queued + overhead + exec), when there is a result.
    pub act: Option<Timing>,
    /// What looks wrong: no result, more than one, a result with no stored action.
    pub notes: Vec<String>,
}

/// The job token of a result or action subject (`tangram.v1.<what>.<job>.<...>`).
fn job_token(subject: &str) -> Option<&str> {
    subject.split('.').nth(3)
}

/// Builds the story from the records the lookups found (pure: no I/O).
pub fn build(
    id: &str,
    action: Option<&Record>,
    dispatches: &[Record],
    results: &[Record],
    deadletters: &[Record],
) -> Story {
    let mut notes = Vec::new();
    let action = action.map(|r| StoredAction {
        seq: r.seq,
        subject: r.subject.clone(),
        stored_at_us: r.at_us,
        encoding: r.encoding().content_type(),
        body: r.decode::<serde_json::Value>().unwrap_or_else(|e| {
            serde_json::Value::String(format!("(undecodable: {e:#}; {} bytes)", r.payload.len()))
        }),
    });
    let dispatches: Vec<DispatchRecord> = dispatches
        .iter()
        .filter_map(|r| match r.decode::<Dispatch>() {
            Ok(d) => Some(DispatchRecord {
                seq: r.seq,
                stored_at_us: r.at_us,
                worker: r.subject.split('.').nth(3).unwrap_or("?").to_string(),
                epoch: d.epoch,
                attempt: d.attempt,
                instance: d.instance,
                grant: d.grant,
                gpu: d.gpu,
            }),
            Err(e) => {
                notes.push(format!("dispatch {}: {e:#}", r.seq));
                None
            }
        })
        .collect();
    let results: Vec<ResultRecord> = results
        .iter()
        .filter_map(|r| match r.decode::<ActionResult>() {
            Ok(result) => Some(ResultRecord {
                seq: r.seq,
                stored_at_us: r.at_us,
                result,
            }),
            Err(e) => {
                notes.push(format!("result {}: {e:#}", r.seq));
                None
            }
        })
        .collect();
    let deadletters: Vec<DeadLetter> = deadletters
        .iter()
        .map(|r| DeadLetter {
            seq: r.seq,
            stored_at_us: r.at_us,
            code: r.subject.rsplit('.').next().unwrap_or_default().to_string(),
            reason: r
                .header(subject::HEADER_DLQ_REASON)
                .unwrap_or_default()
                .to_string(),
            worker: r.header(subject::HEADER_DLQ_WORKER).map(str::to_string),
            original_subject: r.header(subject::HEADER_DLQ_SUBJECT).map(str::to_string),
        })
        .collect();

    let mut timeline = Vec::new();
    if let Some(a) = &action {
        timeline.push(Moment {
            at_us: a.stored_at_us,
            what: format!("submitted on {}", a.subject),
        });
    }
    for d in &dispatches {
        timeline.push(Moment {
            at_us: d.stored_at_us,
            what: format!(
                "dispatched to {} (epoch {}, attempt {}, {} cores{})",
                d.worker,
                d.epoch,
                d.attempt,
                d.grant.cores,
                d.gpu.as_ref().map_or(String::new(), |g| format!(
                    ", {} on group {} GPUs {}..{}{}",
                    g.service,
                    g.chunk.group,
                    g.chunk.start,
                    u32::from(g.chunk.start) + u32::from(g.chunk.len),
                    if g.restore { ", restoring it" } else { "" }
                ))
            ),
        });
    }
    for d in &deadletters {
        timeline.push(Moment {
            at_us: d.stored_at_us,
            what: format!("dead-lettered: {} ({})", d.code, d.reason),
        });
    }
    for r in &results {
        let t = r.result.timing;
        let finished_us = r.result.finished_at_ms.saturating_mul(1000);
        if r.result.placement.is_some() && finished_us > 0 {
            timeline.push(Moment {
                at_us: finished_us.saturating_sub(t.exec_us + t.overhead_us),
                what: format!(
                    "started on {} (after {:.3} s queued)",
                    r.result
                        .placement
                        .as_ref()
                        .map_or("?", |p| p.worker.as_str()),
                    t.queued_us as f64 / 1e6
                ),
            });
        }
        timeline.push(Moment {
            at_us: r.stored_at_us,
            what: format!("result stored: {}", outcome_text(&r.result)),
        });
    }
    timeline.sort_by_key(|m| m.at_us);

    let job = action
        .as_ref()
        .and_then(|a| job_token(&a.subject))
        .or_else(|| results.first().map(|r| r.result.job.as_str()))
        .map(str::to_string);
    match results.len() {
        0 if deadletters.is_empty() => notes.push(
            "no result is stored: the action is queued or running, or its result expired".into(),
        ),
        0 => notes.push("no result is stored beside the dead-letter record".into()),
        1 => {}
        n => notes.push(format!(
            "{n} results are stored for one action: a duplicate (please report it)"
        )),
    }
    if action.is_none() {
        notes.push("the action itself is not in the actions stream (expired, or never stored under this id)".into());
    }
    Story {
        id: id.to_string(),
        job,
        act: results.first().map(|r| r.result.timing),
        action,
        dispatches,
        results,
        deadletters,
        timeline,
        notes,
    }
}

/// An outcome in a few words.
pub fn outcome_text(r: &ActionResult) -> String {
    use tangram_shared::Outcome;
    match &r.outcome {
        Outcome::Completed { exit_code } => format!("completed, exit {exit_code}"),
        Outcome::TimedOut => "timed out".into(),
        Outcome::OutOfMemory { exit_code } => format!("out of memory, exit {exit_code}"),
        Outcome::Rejected { code, reason } => format!("rejected {}: {reason}", code.as_str()),
        Outcome::InfraError { code, reason } => format!("infra_error {code:?}: {reason}"),
    }
}

/// `tangram inspect`.
pub(crate) fn inspect(a: InspectArgs) -> anyhow::Result<()> {
    tangram_shared::ActionId::new(a.id.clone())
        .map_err(|e| crate::errors::UsageError(format!("action id {:?}: {e}", a.id)))?;
    let (url, creds) = a.cluster.resolve();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let story = rt.block_on(async {
        let client = crate::errors::connect(&url, "tangram-inspect", &creds).await?;
        let js = async_nats::jetstream::new(client);
        lookup(&js, &a.id, a.job.as_deref()).await
    })?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&story)?);
    } else {
        print!("{}", render(&story));
    }
    if story.action.is_none() && story.results.is_empty() && story.dispatches.is_empty() {
        anyhow::bail!("nothing about {} is in the streams", a.id);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_nats::HeaderMap;
    use tangram_shared::codec::{encode, Encoding};
    use tangram_shared::{
        Action, ActionId, ActionSpec, JobId, Outcome, Placement, SandboxExec, TrajectoryId,
        WorkerId,
    };

    fn rec(seq: u64, subject: &str, at_us: u64, payload: Vec<u8>) -> Record {
        let mut headers = HeaderMap::new();
        headers.insert(subject::HEADER_CONTENT_TYPE, Encoding::Json.content_type());
        Record {
            seq,
            subject: subject.into(),
            at_us,
            headers,
            payload: payload.into(),
        }
    }

    fn action() -> Action {
        Action {
            queue_timeout_ms: None,
            id: ActionId::new("a1").unwrap(),
            job: JobId::new("j").unwrap(),
            trajectory: TrajectoryId::new("t").unwrap(),
            timeout_ms: 1000,
            spec: ActionSpec::SandboxExec(SandboxExec {
                argv: vec!["true".into()],
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_story_orders_its_timeline_and_flags_a_duplicate_result() {
        let a = action();
        let d = Dispatch {
            epoch: 3,
            attempt: 1,
            action: a.clone(),
            grant: Grant {
                cores: 2,
                mem_mb: 0,
            },
            submitted_at_us: 1_000_000,
            result_encoding: Encoding::Json,
            gpu: None,
            instance: Some("i1".into()),
        };
        let mut r = ActionResult::new(
            a.id.clone(),
            a.job.clone(),
            Outcome::Completed { exit_code: 0 },
            3_000,
        )
        .for_action(&a, 1);
        r.timing = Timing::new(500_000, 100_000, 1_000_000);
        r.placement = Some(Placement {
            worker: WorkerId::new("w1").unwrap(),
            cores: 2,
            cpuset: "0-1".into(),
        });
        let stored = rec(
            7,
            "tangram.v1.action.j.sandbox_exec",
            1_000_000,
            encode(&a, Encoding::Json).unwrap(),
        );
        let disp = rec(
            9,
            "tangram.v1.dispatch.w1.a1",
            1_400_000,
            encode(&d, Encoding::Json).unwrap(),
        );
        let res = rec(
            11,
            "tangram.v1.result.j.a1",
            3_010_000,
            encode(&r, Encoding::Json).unwrap(),
        );
        let s = build(
            "a1",
            Some(&stored),
            &[disp],
            std::slice::from_ref(&res),
            &[],
        );
        assert_eq!(s.job.as_deref(), Some("j"));
        assert_eq!(s.dispatches[0].worker, "w1");
        assert_eq!(s.dispatches[0].grant.cores, 2);
        let whats: Vec<_> = s
            .timeline
            .iter()
            .map(|m| m.what.split(' ').next().unwrap())
            .collect();
        assert_eq!(whats, ["submitted", "dispatched", "started", "result"]);
        assert_eq!(
            s.timeline[2].at_us,
            3_000_000 - 1_100_000,
            "started = finished - exec - overhead"
        );
        assert_eq!(s.act.unwrap().act_us, 1_600_000);
        assert!(s.notes.is_empty(), "{:?}", s.notes);
        let text = render(&s);
        assert!(
            text.contains("ACT 1.600 s = queued 0.500 + overhead 0.100 + exec 1.000"),
            "{text}"
        );

        let dup = build("a1", Some(&stored), &[], &[res.clone(), res], &[]);
        assert!(
            dup.notes.iter().any(|n| n.contains("duplicate")),
            "{:?}",
            dup.notes
        );
    }

    #[test]
    fn a_story_without_action_or_result_says_so_and_keeps_undecodable_bodies() {
        let junk = rec(
            1,
            "tangram.v1.action.j.sandbox_exec",
            5,
            b"{not json".to_vec(),
        );
        let mut dl = rec(2, "tangram.v1.deadletter.undecodable", 6, Vec::new());
        dl.headers.insert(subject::HEADER_DLQ_REASON, "bad body");
        let s = build("a1", Some(&junk), &[], &[], &[dl]);
        assert!(s
            .action
            .as_ref()
            .unwrap()
            .body
            .as_str()
            .unwrap()
            .contains("undecodable"));
        assert_eq!(s.deadletters[0].code, "undecodable");
        assert_eq!(s.deadletters[0].reason, "bad body");
        assert!(
            s.notes.iter().any(|n| n.contains("dead-letter")),
            "{:?}",
            s.notes
        );
        let none = build("a1", None, &[], &[], &[]);
        assert_eq!(none.notes.len(), 2, "{:?}", none.notes);
    }
}
