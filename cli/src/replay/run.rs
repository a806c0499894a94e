//! `tangram replay run`: re-publishes a recorded job into a cluster under a new job and fresh
//! ids. Each trajectory keeps its order and its think gaps (divided by `--speed`): an action
//! that the recording submitted after its predecessor's result waits for the replayed
//! predecessor's result and then the recorded gap; one submitted while its predecessor still
//! ran follows it by the recorded submission gap. Every replayed result is compared with the
//! recorded one (outcome, exit code, reject or infra code), and each difference is reported.

use super::{by_trajectory, Recorded, Selection};
use crate::inspect::outcome_text;
use anyhow::Context as _;
use futures::StreamExt as _;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tangram_shared::codec::{self, Encoding};
use tangram_shared::{subject, Action, ActionId, ActionResult, JobId, Outcome};
use tokio::sync::oneshot;
use tokio::time::Instant;

/// `tangram replay run`'s options.
#[derive(Debug, clap::Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    sel: Selection,
    /// NATS URL of the cluster to replay into (may be the same cluster).
    #[arg(long)]
    into: String,
    /// nkey seed file for the target cluster [default: the source's credentials].
    #[arg(long)]
    into_nkey_file: Option<PathBuf>,
    /// The new job's name [default: <job>-r<unix seconds>].
    #[arg(long = "as")]
    as_job: Option<String>,
    /// Speed-up of think gaps and start offsets (2 replays twice as fast).
    #[arg(long, default_value_t = 1.0)]
    speed: f64,
    /// Seconds to wait for each result beyond the action's own timeout.
    #[arg(long, default_value_t = 300.0)]
    wait_s: f64,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Also write the JSON report to this file.
    #[arg(long)]
    report: Option<PathBuf>,
    #[command(flatten)]
    cluster: crate::connect::ClusterArgs,
}

/// One replayed action, beside its recording.
#[derive(Debug, Clone, Serialize)]
pub struct Compared {
    pub trajectory: String,
    pub kind: String,
    pub recorded_id: String,
    pub replayed_id: String,
    pub recorded: String,
    pub replayed: String,
    pub recorded_act_s: Option<f64>,
    pub replayed_act_s: Option<f64>,
    pub same: bool,
}

/// The replay's report.
#[derive(Debug, Serialize)]
pub struct Report {
    pub job: String,
    pub replayed_as: String,
    pub into: String,
    pub actions: usize,
    pub same: usize,
    pub differ: usize,
    /// Mean ACT per kind, seconds: recorded, replayed.
    pub mean_act_s: BTreeMap<String, (f64, f64)>,
    pub wall_s: f64,
    pub differences: Vec<Compared>,
}

/// Whether two results ended the same way: the same outcome, with the same exit code, or
/// the same reject or infrastructure code. Output and timing are not compared.
pub fn same_outcome(recorded: Option<&ActionResult>, replayed: Option<&ActionResult>) -> bool {
    match (recorded.map(|r| &r.outcome), replayed.map(|r| &r.outcome)) {
        (None, None) => true,
        (Some(a), Some(b)) => match (a, b) {
            (Outcome::Completed { exit_code: x }, Outcome::Completed { exit_code: y })
            | (Outcome::OutOfMemory { exit_code: x }, Outcome::OutOfMemory { exit_code: y }) => {
                x == y
            }
            (Outcome::Rejected { code: x, .. }, Outcome::Rejected { code: y, .. }) => x == y,
            (Outcome::InfraError { code: x, .. }, Outcome::InfraError { code: y, .. }) => x == y,
            (Outcome::TimedOut, Outcome::TimedOut) => true,
            _ => false,
        },
        _ => false,
    }
}

fn describe(r: Option<&ActionResult>, err: Option<&str>) -> String {
    match (r, err) {
        (Some(r), _) => outcome_text(r),
        (None, Some(e)) => format!("no result: {e}"),
        (None, None) => "no result".into(),
    }
}

type Waiters = Arc<Mutex<HashMap<String, oneshot::Sender<ActionResult>>>>;

/// Routes the new job's results, from one subscription, to the actions waiting for them.
async fn route(mut sub: async_nats::Subscriber, waiters: Waiters) {
    while let Some(m) = sub.next().await {
        let enc = m
            .headers
            .as_ref()
            .and_then(|h| h.get(subject::HEADER_CONTENT_TYPE))
            .and_then(|v| Encoding::from_content_type(Some(v.as_str())).ok())
            .unwrap_or(Encoding::Msgpack);
        let Ok(r) = codec::decode::<ActionResult>(&m.payload, enc) else {
            continue;
        };
        if let Some(tx) = waiters
            .lock()
            .ok()
            .and_then(|mut w| w.remove(r.id.as_str()))
        {
            let _ = tx.send(r);
        }
    }
}

struct Ctx {
    js: async_nats::jetstream::Context,
    waiters: Waiters,
    job: JobId,
    stamp: String,
    wait: Duration,
}

/// Publishes one action under the new job; returns a handle that resolves to its result.
async fn publish(
    ctx: &Ctx,
    rec: &Recorded,
    n: usize,
) -> anyhow::Result<tokio::task::JoinHandle<(String, Result<ActionResult, String>)>> {
    let id = ActionId::new(format!("{}-{n}", ctx.stamp))?;
    let action = Action {
        id: id.clone(),
        job: ctx.job.clone(),
        ..rec.action.clone()
    };
    let (tx, rx) = oneshot::channel();
    ctx.waiters
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .insert(id.to_string(), tx);
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(subject::HEADER_MSG_ID, id.as_str());
    headers.insert(subject::HEADER_CONTENT_TYPE, Encoding::Json.content_type());
    ctx.js
        .publish_with_headers(
            subject::action(&action.job, action.kind()),
            headers,
            codec::encode(&action, Encoding::Json)?.into(),
        )
        .await?
        .await
        .with_context(|| format!("the target cluster did not store {id}"))?;
    let wait = ctx.wait + Duration::from_millis(action.timeout_ms);
    Ok(tokio::spawn(async move {
        let r = match tokio::time::timeout(wait, rx).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(_)) => Err("the result subscription closed".to_string()),
            Err(_) => Err(format!("none within {} s", wait.as_secs())),
        };
        (id.to_string(), r)
    }))
}

type Outcomes = Vec<(String, Result<ActionResult, String>)>;

/// Replays one trajectory; returns each action's (new id, result).
async fn trajectory(
    ctx: Arc<Ctx>,
    recs: Vec<Recorded>,
    first: usize,
    start: Instant,
    speed: f64,
) -> anyhow::Result<Outcomes> {
    let scaled = |us: u64| Duration::from_secs_f64(us as f64 / 1e6 / speed);
    type Handle = tokio::task::JoinHandle<(String, Result<ActionResult, String>)>;
    let mut pending: Vec<Option<Handle>> = Vec::new();
    let mut out: Vec<Option<(String, Result<ActionResult, String>)>> = vec![None; recs.len()];
    let mut last_publish = start;
    for i in 0..recs.len() {
        if i == 0 {
            tokio::time::sleep_until(start).await;
        } else {
            let prev = &recs[i - 1];
            match prev.finished_us() {
                Some(f) if recs[i].submitted_us >= f => {
                    if let Some(h) = pending[i - 1].take() {
                        out[i - 1] = Some(h.await?);
                    }
                    tokio::time::sleep(scaled(recs[i].submitted_us - f)).await;
                }
                _ => {
                    let gap = recs[i].submitted_us.saturating_sub(prev.submitted_us);
                    tokio::time::sleep_until(last_publish + scaled(gap)).await;
                }
            }
        }
        last_publish = Instant::now();
        pending.push(Some(publish(&ctx, &recs[i], first + i).await?));
    }
    for (i, h) in pending.into_iter().enumerate() {
        if let Some(h) = h {
            out[i] = Some(h.await?);
        }
    }
    Ok(out.into_iter().flatten().collect())
}

/// Compares a replay with its recording (pure).
pub fn compare(
    recs: &[Recorded],
    outcomes: &[(String, Result<ActionResult, String>)],
) -> Vec<Compared> {
    recs.iter()
        .zip(outcomes)
        .map(|(rec, (new_id, got))| {
            let replayed = got.as_ref().ok();
            let act = |r: Option<&ActionResult>| r.map(|r| r.timing.act_us as f64 / 1e6);
            Compared {
                trajectory: rec.action.trajectory.to_string(),
                kind: rec.action.kind().as_str().to_string(),
                recorded_id: rec.action.id.to_string(),
                replayed_id: new_id.clone(),
                recorded: describe(rec.result.as_ref(), None),
                replayed: describe(replayed, got.as_ref().err().map(String::as_str)),
                recorded_act_s: act(rec.result.as_ref()),
                replayed_act_s: act(replayed),
                same: same_outcome(rec.result.as_ref(), replayed),
            }
        })
        .collect()
}

/// `tangram replay run`.
pub(crate) fn run(a: RunArgs) -> anyhow::Result<()> {
    if !(a.speed > 0.0 && a.speed.is_finite()) {
        anyhow::bail!("--speed must be a positive number");
    }
    let (url, creds) = a.cluster.resolve();
    let into_creds = match &a.into_nkey_file {
        // The same TLS settings: --into is usually a cluster of the same fleet.
        Some(f) => tangram_nats::auth::Credentials {
            tls_ca: creds.tls_ca.clone(),
            tls_cert: creds.tls_cert.clone(),
            tls_key: creds.tls_key.clone(),
            ..tangram_nats::auth::Credentials::from_seed_file(f.clone())
        },
        None => creds.clone(),
    };
    let now_s = super::now_us() / 1_000_000;
    let new_job = a
        .as_job
        .clone()
        .unwrap_or_else(|| format!("{}-r{now_s}", a.sel.job));
    let job = JobId::new(new_job.clone()).map_err(|e| anyhow::anyhow!("--as {new_job:?}: {e}"))?;
    let began = Instant::now();
    let spinner = crate::progress::Spinner::start("reading the recording");
    let (compared, recs_len, notes) = super::runtime()?.block_on(async {
        let source = crate::errors::connect(&url, "tangram-replay", &creds).await?;
        let (recs, notes) = super::load(&async_nats::jetstream::new(source), &a.sel).await?;
        spinner.set_message(format!("replaying {} actions as job {job}", recs.len()));
        let target = crate::errors::connect(&a.into, "tangram-replay", &into_creds).await?;
        let waiters: Waiters = Arc::default();
        let sub = target
            .subscribe(format!("{}.result.{job}.>", subject::PREFIX))
            .await?;
        let router = tokio::spawn(route(sub, waiters.clone()));
        let ctx = Arc::new(Ctx {
            js: async_nats::jetstream::new(target),
            waiters,
            job: job.clone(),
            stamp: format!("rp{now_s}"),
            wait: Duration::from_secs_f64(a.wait_s.max(1.0)),
        });
        let t0 = recs.iter().map(|r| r.submitted_us).min().unwrap_or(0);
        let start = Instant::now() + Duration::from_millis(200);
        let mut tasks = Vec::new();
        let mut ordered = Vec::new();
        let mut first = 0;
        for (_, group) in by_trajectory(&recs) {
            let group: Vec<Recorded> = group.into_iter().cloned().collect();
            let offset = Duration::from_secs_f64(
                group[0].submitted_us.saturating_sub(t0) as f64 / 1e6 / a.speed,
            );
            ordered.extend(group.iter().cloned());
            tasks.push(tokio::spawn(trajectory(
                ctx.clone(),
                group.clone(),
                first,
                start + offset,
                a.speed,
            )));
            first += group.len();
        }
        let mut outcomes = Vec::new();
        let total = tasks.len() as u64;
        for (k, t) in tasks.into_iter().enumerate() {
            outcomes.extend(t.await??);
            spinner.set_count(k as u64 + 1, total);
        }
        router.abort();
        spinner.finish();
        anyhow::Ok((compare(&ordered, &outcomes), recs.len(), notes))
    })?;
    let mut mean: BTreeMap<String, (f64, f64, usize, usize)> = BTreeMap::new();
    for c in &compared {
        let e = mean.entry(c.kind.clone()).or_default();
        if let Some(x) = c.recorded_act_s {
            e.0 += x;
            e.2 += 1;
        }
        if let Some(x) = c.replayed_act_s {
            e.1 += x;
            e.3 += 1;
        }
    }
    let same = compared.iter().filter(|c| c.same).count();
    let report = Report {
        job: a.sel.job.clone(),
        replayed_as: new_job,
        into: a.into.clone(),
        actions: recs_len,
        same,
        differ: compared.len() - same,
        mean_act_s: mean
            .into_iter()
            .map(|(k, (r, p, nr, np))| (k, (r / nr.max(1) as f64, p / np.max(1) as f64)))
            .collect(),
        wall_s: began.elapsed().as_secs_f64(),
        differences: compared.into_iter().filter(|c| !c.same).collect(),
    };
    let json = serde_json::to_string_pretty(&report)?;
    if let Some(p) = &a.report {
        std::fs::write(p, &json)?;
    }
    for n in &notes {
        eprintln!("note: {n}");
    }
    if a.json {
        println!("{json}");
    } else {
        print_report(&report);
    }
    if report.differ > 0 {
        std::process::exit(1);
    }
    Ok(())
}

fn print_report(r: &Report) {
    println!(
        "replayed job {} as {} into {}: {} actions, {} the same, {} different ({:.1} s)",
        r.job, r.replayed_as, r.into, r.actions, r.same, r.differ, r.wall_s
    );
    let mut t = crate::table::new(["kind", "recorded ACT", "replayed ACT"]);
    for (k, (rec, rep)) in &r.mean_act_s {
        t.add_row([k.to_string(), format!("{rec:.3} s"), format!("{rep:.3} s")]);
    }
    print!("\n{}", crate::table::render(&t, ""));
    if !r.differences.is_empty() {
        println!("\ndifferences:");
        for d in &r.differences {
            println!(
                "  {} {} {} -> {}: recorded {}; replayed {}",
                d.trajectory, d.kind, d.recorded_id, d.replayed_id, d.recorded, d.replayed
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tangram_shared::{InfraCode, RejectCode};

    fn res(o: Outcome) -> ActionResult {
        ActionResult::new(ActionId::new("a").unwrap(), JobId::new("j").unwrap(), o, 0)
    }

    #[test]
    fn outcomes_compare_by_status_and_code_not_by_text() {
        let c0 = res(Outcome::Completed { exit_code: 0 });
        let c1 = res(Outcome::Completed { exit_code: 1 });
        assert!(same_outcome(Some(&c0), Some(&c0.clone())));
        assert!(!same_outcome(Some(&c0), Some(&c1)), "exit codes differ");
        assert!(
            !same_outcome(Some(&c0), None),
            "a missing replayed result differs"
        );
        let r1 = res(Outcome::Rejected {
            code: RejectCode::NoSandbox,
            reason: "a".into(),
        });
        let r2 = res(Outcome::Rejected {
            code: RejectCode::NoSandbox,
            reason: "b".into(),
        });
        assert!(same_outcome(Some(&r1), Some(&r2)), "reasons are prose");
        let i = res(Outcome::InfraError {
            code: InfraCode::Runtime,
            reason: String::new(),
        });
        assert!(!same_outcome(Some(&r1), Some(&i)));
        assert!(!same_outcome(Some(&res(Outcome::TimedOut)), Some(&c0)));
    }
}
