//! `tangram replay`: a recorded run, read back from the retained streams. `jobs` lists what is
//! there; `export` turns a job into the simulator's trace format; `run` re-publishes it into a
//! cluster under a new job and reports every action whose outcome differs; `deadletter` lists
//! rejected messages and re-submits a corrected one.

mod deadletter;
mod export;
mod run;

use crate::streams::{self, Scan};
use anyhow::{bail, Context as _};
use std::collections::{BTreeMap, HashMap};
use tangram_shared::{subject, Action, ActionKind, ActionResult};

/// `tangram replay`'s subcommands.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum ReplayWhat {
    /// The jobs the actions stream holds: actions, trajectories, first and last submission.
    Jobs {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        cluster: crate::connect::ClusterArgs,
    },
    /// Write a recorded job as a simulator trace (JSON lines, docs/SIMULATOR.md), for
    /// `tangram simulate --trace`.
    Export(export::ExportArgs),
    /// Re-publish a recorded job into a cluster under a new job and fresh ids, keeping each
    /// trajectory's order and think gaps, and report every action whose outcome or exit
    /// code differs from the recording.
    Run(run::RunArgs),
    /// Dead-letter records: list them, show one, re-submit a corrected one.
    Deadletter {
        #[command(subcommand)]
        what: deadletter::DeadletterWhat,
    },
}

/// Which recorded actions (shared by `export` and `run`).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Selection {
    /// The recorded job (`tangram replay jobs` lists them).
    #[arg(long)]
    pub(crate) job: String,
    /// Only actions submitted at or after this time: RFC 3339, Unix seconds, or an age
    /// (`90s`, `30m`, `12h`, `7d`).
    #[arg(long)]
    pub(crate) since: Option<String>,
    /// Only actions submitted before this time (same forms as --since).
    #[arg(long)]
    pub(crate) until: Option<String>,
    /// Only these trajectories, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub(crate) trajectory: Vec<String>,
    /// Only these kinds, comma-separated (sandbox_open, sandbox_exec, sandbox_close, reward,
    /// api). Leaving out opens and closes of a replayed run leaves its execs without sandboxes.
    #[arg(long, value_delimiter = ',')]
    pub(crate) kind: Vec<String>,
    /// Refuse to read more than this many actions.
    #[arg(long, default_value_t = 1_000_000)]
    pub(crate) max: usize,
}

/// One recorded action with its result.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub action: Action,
    /// When the actions stream stored it, Unix microseconds.
    pub submitted_us: u64,
    pub result: Option<ActionResult>,
}

impl Recorded {
    /// When its result was produced, Unix microseconds.
    pub fn finished_us(&self) -> Option<u64> {
        self.result
            .as_ref()
            .map(|r| r.finished_at_ms.saturating_mul(1000))
            .filter(|&t| t > 0)
    }
}

/// A time argument: RFC 3339, Unix seconds, or an age before `now_us`.
pub fn parse_time(s: &str, now_us: u64) -> anyhow::Result<u64> {
    let s = s.trim();
    if let Ok(secs) = s.parse::<f64>() {
        return Ok((secs * 1e6) as u64);
    }
    let unit = |suffix: char, us: f64| -> Option<u64> {
        let n: f64 = s.strip_suffix(suffix)?.parse().ok()?;
        Some(now_us.saturating_sub((n * us) as u64))
    };
    if let Some(t) = unit('s', 1e6)
        .or_else(|| unit('m', 60e6))
        .or_else(|| unit('h', 3600e6))
        .or_else(|| unit('d', 86400e6))
    {
        return Ok(t);
    }
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .with_context(|| {
            format!("{s:?} is not a time: give RFC 3339 (2026-12-01T22:00:00Z), Unix seconds, or an age (30m)")
        })?;
    Ok(streams::unix_us(t))
}

/// Now, Unix microseconds.
#[allow(clippy::disallowed_methods)] // stream timestamps are wall time: ages compare against it
pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Reads the selected actions and their results, oldest first. Actions stored twice under
/// one id (a resubmission after the duplicate window) count once.
pub async fn load(
    js: &async_nats::jetstream::Context,
    sel: &Selection,
) -> anyhow::Result<(Vec<Recorded>, Vec<String>)> {
    let job = tangram_shared::JobId::new(sel.job.clone())
        .map_err(|e| anyhow::anyhow!("job {:?}: {e}", sel.job))?;
    let mut kinds = Vec::new();
    for k in &sel.kind {
        kinds.push(
            ActionKind::parse(k).with_context(|| format!("--kind {k:?}: not an action kind"))?,
        );
    }
    let now = now_us();
    let since = sel
        .since
        .as_deref()
        .map(|s| parse_time(s, now))
        .transpose()?;
    let until = sel
        .until
        .as_deref()
        .map(|s| parse_time(s, now))
        .transpose()?;
    let filters = if kinds.is_empty() {
        vec![format!("{}.action.{job}.>", subject::PREFIX)]
    } else {
        kinds.iter().map(|k| subject::action(&job, *k)).collect()
    };
    let stored = streams::scan(
        js,
        subject::HISTORY_STREAM,
        &Scan {
            filters,
            since_us: since,
            until_us: until,
            headers_only: false,
            max: sel.max,
        },
    )
    .await?;
    let mut notes = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for r in &stored {
        match r.decode::<Action>() {
            Ok(a) => {
                if !sel.trajectory.is_empty()
                    && !sel.trajectory.iter().any(|t| t == a.trajectory.as_str())
                {
                    continue;
                }
                if seen.insert(a.id.clone()) {
                    out.push(Recorded {
                        action: a,
                        submitted_us: r.at_us,
                        result: None,
                    });
                }
            }
            Err(_) => notes.push(format!(
                "message {} on {} is not a valid action (it was dead-lettered); left out",
                r.seq, r.subject
            )),
        }
    }
    if out.is_empty() {
        bail!("no actions of job {job} match (`tangram replay jobs` lists the recorded jobs)");
    }
    let results = streams::scan(
        js,
        subject::RESULTS_STREAM,
        &Scan {
            filters: vec![format!("{}.result.{job}.>", subject::PREFIX)],
            since_us: since,
            max: sel.max.saturating_mul(2),
            ..Default::default()
        },
    )
    .await?;
    let mut by_id: HashMap<String, ActionResult> = HashMap::new();
    for r in &results {
        if let Ok(res) = r.decode::<ActionResult>() {
            by_id.entry(res.id.to_string()).or_insert(res);
        }
    }
    for rec in &mut out {
        rec.result = by_id.remove(rec.action.id.as_str());
    }
    let missing = out.iter().filter(|r| r.result.is_none()).count();
    if missing > 0 {
        notes.push(format!(
            "{missing} actions have no stored result (still running, or expired)"
        ));
    }
    Ok((out, notes))
}

/// Groups recorded actions by trajectory, each in submission order.
pub fn by_trajectory(recs: &[Recorded]) -> BTreeMap<String, Vec<&Recorded>> {
    let mut m: BTreeMap<String, Vec<&Recorded>> = BTreeMap::new();
    for r in recs {
        m.entry(r.action.trajectory.to_string())
            .or_default()
            .push(r);
    }
    for v in m.values_mut() {
        v.sort_by_key(|r| r.submitted_us);
    }
    m
}

pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

/// `tangram replay`.
pub(crate) fn replay(what: ReplayWhat) -> anyhow::Result<()> {
    match what {
        ReplayWhat::Jobs { json, cluster } => jobs(&cluster, json),
        ReplayWhat::Export(a) => export::export(a),
        ReplayWhat::Run(a) => run::run(a),
        ReplayWhat::Deadletter { what } => deadletter::deadletter(what),
    }
}

fn jobs(cluster: &crate::connect::ClusterArgs, json: bool) -> anyhow::Result<()> {
    let (url, creds) = cluster.resolve();
    let stored = runtime()?.block_on(async {
        let client = crate::errors::connect(&url, "tangram-replay", &creds).await?;
        let js = async_nats::jetstream::new(client);
        streams::scan(
            &js,
            subject::HISTORY_STREAM,
            &Scan {
                headers_only: true,
                ..Default::default()
            },
        )
        .await
    })?;
    #[derive(serde::Serialize, Default)]
    struct Job {
        actions: u64,
        first_us: u64,
        last_us: u64,
    }
    let mut jobs: BTreeMap<String, Job> = BTreeMap::new();
    for r in &stored {
        let Some((job, _)) = subject::parse_action(&r.subject) else {
            continue;
        };
        let j = jobs.entry(job.to_string()).or_default();
        if j.actions == 0 {
            j.first_us = r.at_us;
        }
        j.actions += 1;
        j.last_us = r.at_us;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&jobs)?);
        return Ok(());
    }
    let mut t = crate::table::new(["job", "actions", "first (UTC)", "last (UTC)"]);
    crate::table::left(&mut t, &[2, 3]);
    for (name, j) in &jobs {
        t.add_row([
            name.to_string(),
            j.actions.to_string(),
            utc(j.first_us),
            utc(j.last_us),
        ]);
    }
    print!("{}", crate::table::render(&t, ""));
    if jobs.is_empty() {
        println!("(the actions stream is empty)");
    }
    Ok(())
}

/// A Unix-microseconds time as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc(us: u64) -> String {
    time::OffsetDateTime::from_unix_timestamp((us / 1_000_000) as i64)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| us.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_as_ages_unix_seconds_and_rfc3339() {
        let now = 10_000_000_000;
        assert_eq!(parse_time("90s", now).unwrap(), now - 90_000_000);
        assert_eq!(parse_time("2h", now).unwrap(), now - 7_200_000_000);
        assert_eq!(
            parse_time("1700000000", now).unwrap(),
            1_700_000_000_000_000
        );
        assert_eq!(
            parse_time("2023-11-14T22:13:20Z", now).unwrap(),
            1_700_000_000_000_000
        );
        let e = parse_time("yesterday", now).unwrap_err().to_string();
        assert!(e.contains("RFC 3339"), "{e}");
        assert_eq!(utc(1_700_000_000_000_000), "2023-11-14T22:13:20Z");
    }
}
