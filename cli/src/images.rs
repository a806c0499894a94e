//! `tangram images prepull`: sandbox images made present on workers ahead of a step, so
//! that its opens find them (and image-aware placement sends the opens there). Each chosen
//! worker is asked on `tangram.v1.prepull.<worker>`; it pulls under its own allow-list,
//! credentials and disk budget, as for an open, and answers what came of it.

use crate::connect::ClusterArgs;
use clap::{Args, Subcommand};
use std::time::Duration;
use tangram_shared::image::{ImageRef, PrepullOutcome, PrepullReply, PrepullRequest};
use tangram_shared::{subject, WorkerId};

/// `tangram images ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum ImagesCommand {
    /// Pull images on workers ahead of the opens that will name them.
    Prepull(PrepullArgs),
}

/// `tangram images prepull`'s options.
#[derive(Debug, Args)]
pub(crate) struct PrepullArgs {
    /// Image references, as sandbox opens name them.
    #[arg(required = true)]
    images: Vec<String>,
    /// How many workers should hold each image: those holding it already count, the rest
    /// are the least loaded that take new work [default: every CPU worker].
    #[arg(long, conflicts_with = "worker")]
    workers: Option<usize>,
    /// These workers (repeatable), instead of a count.
    #[arg(long)]
    worker: Vec<String>,
    /// How long to wait for the pulls, seconds.
    #[arg(long, default_value_t = 600.0)]
    timeout_s: f64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    cluster: ClusterArgs,
}

pub(crate) fn run(cmd: ImagesCommand) -> anyhow::Result<()> {
    match cmd {
        ImagesCommand::Prepull(a) => prepull(a),
    }
}

fn prepull(a: PrepullArgs) -> anyhow::Result<()> {
    if !(a.timeout_s.is_finite() && a.timeout_s > 0.0) {
        crate::usage!("--timeout-s must be a positive number of seconds");
    }
    for image in &a.images {
        if let Err(why) = ImageRef::parse(image) {
            crate::usage!("{why}");
        }
    }
    let mut named = Vec::new();
    for w in &a.worker {
        named.push(
            WorkerId::new(w.clone())
                .map_err(|e| anyhow::anyhow!("worker {w:?}: {e}"))?
                .to_string(),
        );
    }
    let (url, creds) = a.cluster.resolve();
    let status = crate::cluster::fetch_status(&url, &creds, Duration::from_secs(5))?;
    let mut plan: Vec<(String, String)> = Vec::new();
    for image in &a.images {
        let chosen = if named.is_empty() {
            tangram_core::engine::prepull_targets(&status.workers, image, a.workers)
        } else {
            named.clone()
        };
        if chosen.is_empty() {
            anyhow::bail!("no CPU worker taking new work to pull {image} on");
        }
        plan.extend(chosen.into_iter().map(|w| (w, image.clone())));
    }
    let timeout = Duration::from_secs_f64(a.timeout_s);
    let replies = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(ask_all(&url, &creds, &plan, timeout))?;
    let bad = replies
        .iter()
        .filter(|r| !matches!(r.outcome, PrepullOutcome::Present | PrepullOutcome::Pulled))
        .count();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&replies)?);
    } else {
        let mut t = crate::table::new(["worker", "outcome", "pull", "image / error"]);
        crate::table::left(&mut t, &[1, 3]);
        for r in &replies {
            let outcome = serde_json::to_value(r.outcome)?;
            t.add_row([
                r.worker.to_string(),
                outcome.as_str().unwrap_or("?").to_string(),
                r.pull_ms
                    .map_or_else(String::new, |ms| format!("{:.1}s", ms as f64 / 1e3)),
                r.error.as_deref().unwrap_or(&r.image).to_string(),
            ]);
        }
        print!("{}", crate::table::render(&t, ""));
    }
    if bad > 0 {
        anyhow::bail!("{bad} of {} pre-pulls did not complete", replies.len());
    }
    Ok(())
}

/// Asks every (worker, image) at once; a worker that does not answer in `timeout` is
/// reported as failed.
async fn ask_all(
    url: &str,
    creds: &tangram_nats::auth::Credentials,
    plan: &[(String, String)],
    timeout: Duration,
) -> anyhow::Result<Vec<PrepullReply>> {
    let client = crate::errors::connect(url, "tangram-cli", creds).await?;
    let asks = plan.iter().map(|(worker, image)| {
        let client = client.clone();
        async move {
            let failed = |why: String| {
                PrepullReply::not_done(worker.as_str(), image.as_str(), PrepullOutcome::Failed, why)
            };
            let body = match serde_json::to_vec(&PrepullRequest {
                image: image.clone(),
            }) {
                Ok(b) => b,
                Err(e) => return failed(e.to_string()),
            };
            let request = async_nats::Request::new()
                .payload(body.into())
                .timeout(Some(timeout));
            match client
                .send_request(subject::prepull_of(worker), request)
                .await
            {
                Ok(msg) => serde_json::from_slice(&msg.payload)
                    .unwrap_or_else(|e| failed(format!("unreadable answer: {e}"))),
                Err(e) => failed(format!("no answer from {worker}: {e}")),
            }
        }
    });
    Ok(futures::future::join_all(asks).await)
}
