//! Backpressure instead of silent loss: a full action stream turns publishers away with a
//! typed error and keeps what it holds; the queue's depth and estimated wait are reported.

use std::time::Duration;
use tangram_shared::subject;
use tangram_tests::build::open;
use tangram_tests::{repo_root, Cluster, WorkerSpec};

/// Submits `ids` as `sandbox_close` actions of job `job` through the Python client (no
/// sandbox exists, so each one is answered `rejected` at once: a result without Docker), and
/// prints `accepted <id>` / `refused <id> <reason>` / `result <id> <outcome>` lines.
const SUBMIT_PY: &str = r#"
import asyncio, os, sys
from tangram_client import Tangram, TangramBackpressure

async def main():
    t = await Tangram.connect(os.environ["TANGRAM_NATS_URL"], job=sys.argv[1], publish_retries=0)
    accepted = []
    for action_id in sys.argv[2:]:
        try:
            await t.submit("traj-" + action_id, {"kind": "sandbox_close"}, action_id=action_id)
            accepted.append(action_id)
            print("accepted", action_id, flush=True)
        except TangramBackpressure as e:
            print("refused", action_id, e.reason, flush=True)
    for action_id in accepted:
        r = await t.result(action_id, wait_s=30)
        print("result", action_id, r.outcome.value, flush=True)
    await t.close()

asyncio.run(main())
"#;

fn run_python(url: &str, job: &str, ids: &[&str]) -> anyhow::Result<String> {
    let python = repo_root().join("tools/venv/bin/python");
    let out = std::process::Command::new(python)
        .arg("-c")
        .arg(SUBMIT_PY)
        .arg(job)
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_action_stream_refuses_new_actions_and_keeps_the_stored_ones() -> anyhow::Result<()>
{
    let cluster = Cluster::start(&[WorkerSpec::new("bp-cpu")]).await?;
    let c = cluster.client("bp").await?;
    c.wait_for_workers(&["bp-cpu"], Duration::from_secs(30))
        .await?;
    // An operator-sized stream that holds three actions.
    let mut stream = c.js.get_stream(subject::ACTIONS_STREAM).await?;
    let mut config = stream.info().await?.config.clone();
    let (before, first_before) = {
        let st = &stream.info().await?.state;
        (st.messages, st.first_sequence)
    };
    config.max_messages = before as i64 + 3;
    c.js.update_stream(config.clone()).await?;

    let url = cluster.nats.url();
    let ids = ["bp-1", "bp-2", "bp-3", "bp-4", "bp-5"];
    let text = tokio::task::spawn_blocking({
        let url = url.clone();
        move || run_python(&url, "bp", &ids)
    })
    .await??;
    assert_eq!(lines(&text, "accepted"), ["bp-1", "bp-2", "bp-3"], "{text}");
    let refused = lines(&text, "refused");
    assert_eq!(refused.len(), 2, "{text}");
    assert!(refused[0].starts_with("bp-4 maximum"), "{text}");
    // Every accepted action was processed and answered.
    assert_eq!(lines(&text, "result").len(), 3, "{text}");
    // Nothing stored was deleted to make room.
    let state = stream.info().await?.state.clone();
    assert_eq!(state.messages, before + 3);
    assert_eq!(state.first_sequence, first_before.max(1));

    // Room again: the refused ids go through when resubmitted.
    config.max_messages = -1;
    c.js.update_stream(config).await?;
    let text =
        tokio::task::spawn_blocking(move || run_python(&url, "bp", &["bp-4", "bp-5"])).await??;
    assert_eq!(lines(&text, "accepted"), ["bp-4", "bp-5"], "{text}");
    assert_eq!(lines(&text, "result").len(), 2, "{text}");
    cluster.shutdown().await?;
    Ok(())
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
    let st = c
        .wait_for_status(Duration::from_secs(20), "four opens queued", |s| {
            s.queues.get("sandbox_open").is_some_and(|q| q.depth == 4)
        })
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
