//! `tangram images prepull`: sandbox images made present on workers ahead of a step, so
//! that its opens find them (and image-aware placement sends the opens there). Each chosen
//! worker is asked on `tangram.v1.prepull.<worker>`; it pulls under its own allow-list,
//! credentials and disk budget, as for an open, and answers what came of it.

use crate::cordon::ClusterArgs;
use clap::{Args, Subcommand};
use std::time::Duration;
use tangram_shared::image::{ImageRef, PrepullOutcome, PrepullReply, PrepullRequest};
use tangram_shared::status::WorkerStatus;
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

/// Which workers should pull `image`: `n` in all, holders first, then the CPU workers
/// taking new work with the fewest sandboxes (ties by id); the chosen that hold it already
/// are asked too (they answer `present` at once).
pub(crate) fn choose(workers: &[WorkerStatus], image: &str, n: Option<usize>) -> Vec<String> {
    let want = ImageRef::canonical_of(image);
    let holds = |w: &WorkerStatus| {
        w.images
            .iter()
            .any(|i| ImageRef::canonical_of(&i.reference) == want)
    };
    let mut eligible: Vec<&WorkerStatus> = workers
        .iter()
        .filter(|w| w.cores > 0 && !w.draining && !w.cordoned && w.drain_by_unix_ms.is_none())
        .collect();
    eligible.sort_by(|a, b| (!holds(a), a.sandboxes, &a.id).cmp(&(!holds(b), b.sandboxes, &b.id)));
    let n = n.unwrap_or(eligible.len());
    eligible.into_iter().take(n).map(|w| w.id.clone()).collect()
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
            choose(&status.workers, image, a.workers)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn w(id: &str, sandboxes: u32, images: &[&str]) -> WorkerStatus {
        let mut s: WorkerStatus = serde_json::from_value(serde_json::json!({
            "id": id, "cores": 4, "cores_used": 0, "mem_mb": 1024, "mem_used_mb": 0,
            "gpus": 0, "last_seen_s": 0.1, "draining": false, "running": 0,
            "sandboxes": sandboxes,
        }))
        .unwrap();
        s.images = images
            .iter()
            .map(|r| tangram_shared::ImageReport {
                reference: r.to_string(),
                id: "sha256:1".into(),
                size_bytes: 1,
            })
            .collect();
        s
    }

    #[test]
    fn holders_count_first_then_the_least_loaded_workers_taking_work() {
        let mut cordoned = w("e", 0, &[]);
        cordoned.cordoned = true;
        let mut gpu = w("g", 0, &[]);
        gpu.cores = 0;
        let fleet = [
            w("a", 5, &[]),
            w("b", 1, &[]),
            w("c", 9, &["docker.io/library/app:1"]),
            w("d", 1, &[]),
            cordoned,
            gpu,
        ];
        assert_eq!(choose(&fleet, "app:1", Some(2)), ["c", "b"]);
        assert_eq!(choose(&fleet, "other:2", Some(3)), ["b", "d", "a"]);
        assert_eq!(choose(&fleet, "app:1", None), ["c", "b", "d", "a"]);
    }
}
