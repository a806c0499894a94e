//! Backpressure instead of silent loss: a full action stream turns publishers away with a
//! typed error and keeps what it holds; the queue's depth and estimated wait are reported.

use std::time::Duration;
use tangram_shared::subject;
use tangram_tests::build::open;
use tangram_tests::{repo_root, Cluster, WorkerSpec};

/// Submits `ids` as `sandbox_close` actions of job `job` through the Python client (no
/// sandbox exists, so each one is answered `rejected` at once: a result without Docker), and
/// prints `accepted <id>` / `refused <id> <reason>` lines, then with `wait` waits for the
/// accepted ones' results (`result <id> <outcome>`).
const SUBMIT_PY: &str = r#"
import asyncio, os, sys
from tangram_client import Tangram, TangramBackpressure

async def main():
    t = await Tangram.connect(os.environ["TANGRAM_NATS_URL"], job=sys.argv[1], publish_retries=0)
    accepted = []
    for action_id in sys.argv[3:]:
        try:
            await t.submit("traj-" + action_id, {"kind": "sandbox_close"}, action_id=action_id)
            accepted.append(action_id)
            print("accepted", action_id, flush=True)
        except TangramBackpressure as e:
            print("refused", action_id, e.reason, flush=True)
    for action_id in accepted if sys.argv[2] == "wait" else []:
        r = await t.result(action_id, wait_s=30)
        print("result", action_id, r.outcome.value, flush=True)
    await t.close()

asyncio.run(main())
"#;

fn run_python(url: &str, job: &str, ids: &[&str], wait: bool) -> anyhow::Result<String> {
    let python = repo_root().join("tools/venv/bin/python");
    let out = std::process::Command::new(python)
        .arg("-c")
        .arg(SUBMIT_PY)
        .arg(job)
        .arg(if wait { "wait" } else { "no-wait" })
        .args(ids)
        .env("TANGRAM_NATS_URL", url)
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    anyhow::ensure!(
        out.status.success(),
        "python failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(text)
}

fn lines<'a>(text: &'a str, tag: &str) -> Vec<&'a str> {
    text.lines()
        .filter_map(|l| l.strip_prefix(tag).map(str::trim))
        .collect()
}

/// The backlog holds unprocessed actions only: while the scheduler is down a full backlog
/// refuses new actions with the typed error and keeps what it holds; once the scheduler
/// has processed them they leave it, and the same limit takes the refused ones, with no
/// operator purging anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_backlog_refuses_new_actions_keeps_the_stored_ones_and_drains_by_itself(
) -> anyhow::Result<()> {
    let mut cluster = Cluster::start(&[WorkerSpec::new("bp-cpu")]).await?;
    let c = cluster.client("bp").await?;
    c.wait_for_workers(&["bp-cpu"], Duration::from_secs(30))
        .await?;
    cluster.stop_scheduler().await?;
    // An operator-sized backlog of three actions.
    let mut stream = c.js.get_stream(subject::ACTIONS_STREAM).await?;
    let mut config = stream.info().await?.config.clone();
    assert_eq!(
        stream.info().await?.state.messages,
        0,
        "nothing unprocessed"
    );
    config.max_messages = 3;
    c.js.update_stream(config.clone()).await?;

    let url = cluster.nats.url();
    let ids = ["bp-1", "bp-2", "bp-3", "bp-4", "bp-5"];
    let text = tokio::task::spawn_blocking({
        let url = url.clone();
        move || run_python(&url, "bp", &ids, false)
    })
    .await??;
    assert_eq!(lines(&text, "accepted"), ["bp-1", "bp-2", "bp-3"], "{text}");
    let refused = lines(&text, "refused");
    assert_eq!(refused.len(), 2, "{text}");
    assert!(refused[0].starts_with("bp-4 maximum"), "{text}");
    // Nothing stored was deleted to make room.
    assert_eq!(stream.info().await?.state.messages, 3);

    // The scheduler back: every accepted action is answered, and leaves the backlog.
    cluster.start_scheduler();
    for id in ["bp-1", "bp-2", "bp-3"] {
        c.result(&tangram_shared::ActionId::new(id)?, Duration::from_secs(30))
            .await?;
    }
    // Room again under the same limit: the refused ids go through when resubmitted.
    let text = tokio::task::spawn_blocking(move || run_python(&url, "bp", &["bp-4", "bp-5"], true))
        .await??;
    assert_eq!(lines(&text, "accepted"), ["bp-4", "bp-5"], "{text}");
    assert_eq!(lines(&text, "result").len(), 2, "{text}");
    cluster.shutdown().await?;
    Ok(())
}

/// One job's backlog cannot take the whole backlog: past its per-job-and-kind count its
/// actions are refused while another job's are taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_backlog_is_capped_apart_from_other_jobs() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(&[]).await?;
    let a = cluster.client("capa").await?;
    let b = cluster.client("capb").await?;
    cluster.stop_scheduler().await?;
    let mut stream = a.js.get_stream(subject::ACTIONS_STREAM).await?;
    let mut config = stream.info().await?.config.clone();
    config.max_messages_per_subject = 2;
    a.js.update_stream(config).await?;
    use tangram_tests::build::close;
    a.submit(&close("capa-1", "capa", "t1")).await?;
    a.submit(&close("capa-2", "capa", "t2")).await?;
    let err = a
        .submit(&close("capa-3", "capa", "t3"))
        .await
        .expect_err("job capa's backlog is full");
    assert!(
        err.to_string().contains("maximum messages per subject"),
        "{err}"
    );
    b.submit(&close("capb-1", "capb", "t1")).await?;
    assert_eq!(stream.info().await?.state.messages, 3);
    cluster.start_scheduler();
    for id in ["capa-1", "capa-2"] {
        a.result(&tangram_shared::ActionId::new(id)?, Duration::from_secs(30))
            .await?;
    }
    b.result(
        &tangram_shared::ActionId::new("capb-1")?,
        Duration::from_secs(30),
    )
    .await?;
    // Processed, the job's backlog has room again. An action leaves the stream when the
    // scheduler acks it, which can come a moment after its result is seen (a loaded CI run
    // submitted in that moment and met the cap): wait for the stream to empty, bounded, so a
    // stream that kept processed actions still fails here.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while stream.info().await?.state.messages > 0 {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "processed actions stayed in the stream: {:?}",
            stream.info().await?.state
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    a.run(&close("capa-3", "capa", "t3"), Duration::from_secs(30))
        .await?;
    cluster.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reports_queue_depth_and_an_estimated_wait_per_kind() -> anyhow::Result<()> {
    // No worker: opens queue up and stay queued.
    let cluster = Cluster::start(&[]).await?;
    let c = cluster.client("bpq").await?;
    for i in 0..4 {
        let a = open(&format!("bpq-open-{i}"), "bpq", &format!("t{i}"));
        c.submit(&a).await?;
    }
    // Queued, and why they wait: for want of a worker. (Until the term has read its dispatch
    // backlog they wait for that instead, for a moment at the start: a loaded CI run took its
    // status in that moment, so the reason is waited for, not read once.)
    let st = c
        .wait_for_status(
            Duration::from_secs(20),
            "four opens queued for want of a worker",
            |s| {
                s.queues.get("sandbox_open").is_some_and(|q| q.depth == 4)
                    && s.waiting.get("no worker has registered") == Some(&4)
            },
        )
        .await?;
    let q = &st.queues["sandbox_open"];
    assert!(q.oldest_wait_s >= 0.0);
    // Nothing completed yet: the wait cannot be estimated, and says so.
    assert_eq!(q.est_wait_s, None);
    assert_eq!(st.backlog, Some(0));
    cluster.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_queued_actions_the_rest_wait_in_the_stream_and_all_run() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(&[]).await?;
    cluster
        .restart_scheduler_with(|c| c.max_queued_actions = 3)
        .await?;
    let c = cluster.client("bpm").await?;
    let ids: Vec<String> = (0..8).map(|i| format!("bpm-open-{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        c.submit(&open(id, "bpm", &format!("t{i}"))).await?;
    }
    // No worker yet: the scheduler holds three, the stream the other five.
    let st = c
        .wait_for_status(
            Duration::from_secs(20),
            "three held, five in the stream",
            |s| s.queued.get("sandbox_open") == Some(&3) && s.backlog == Some(5),
        )
        .await?;
    assert_eq!(st.queues["sandbox_open"].depth, 3);
    // A worker joins: every action runs, none lost to the bound.
    cluster.start_worker(WorkerSpec::new("bpm-cpu"))?;
    for id in &ids {
        let r = c
            .result(
                &tangram_shared::ActionId::new(id.as_str())?,
                Duration::from_secs(60),
            )
            .await?;
        assert!(
            matches!(
                r.outcome,
                tangram_shared::Outcome::Completed { exit_code: 0 }
            ),
            "{id}: {:?}",
            r.outcome
        );
    }
    cluster.shutdown().await?;
    Ok(())
}
