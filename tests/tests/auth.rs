//! NATS security (N1-N6 of our checklist) against a real nats-server holding the users and
//! permissions `tangram up` writes: who may say what.
//!
//! A forbidden publish or subscription is not an error the client sees at once (the server
//! answers it asynchronously), so each check sends a forbidden message and then an allowed
//! marker on the same connection: messages of one connection arrive in order, so once the
//! marker is in, a forbidden message that got through would be too.

use futures::StreamExt;
use std::time::Duration;
use tangram_nats::auth::{self, Credentials};
use tangram_shared::{subject, Outcome};
use tangram_tests::build::{exec, open};
use tangram_tests::{Client, Cluster, WorkerSpec};

const T: Duration = Duration::from_secs(60);

async fn nats(c: &Cluster, role: &str) -> anyhow::Result<async_nats::Client> {
    Ok(auth::connect(&c.nats.url(), role, &c.credentials(role)).await?)
}

/// Publishes `forbidden` as `who`, then a marker on `allowed`; returns the subjects the
/// operator saw arrive: the marker's, and any on which a forged message got through.
async fn seen_before_marker(
    c: &Cluster,
    who: &async_nats::Client,
    forbidden: &str,
    allowed: &str,
) -> anyhow::Result<Vec<String>> {
    let op = nats(c, "operator").await?;
    let mut a = op.subscribe(forbidden.to_string()).await?;
    let mut b = op.subscribe(allowed.to_string()).await?;
    op.flush().await?;
    // Core NATS delivers at most once: a round published while a connection was
    // reconnecting under load is gone, so rounds repeat until the marker arrives
    // (regression: one round waited out 60 s twice in a loaded CI run).
    let mut marked = false;
    for _ in 0..30 {
        who.publish(forbidden.to_string(), "forged".into()).await?;
        who.publish(allowed.to_string(), "marker".into()).await?;
        who.flush().await?;
        match tokio::time::timeout(Duration::from_secs(2), b.next()).await {
            Ok(Some(_)) => {
                marked = true;
                break;
            }
            Ok(None) => anyhow::bail!("marker subscription closed"),
            Err(_) => {}
        }
    }
    anyhow::ensure!(marked, "the marker on {allowed} never arrived");
    let mut seen = vec![allowed.to_string()];
    // Anything the forbidden subscription got is already queued behind the marker.
    // (Only the forged payloads count: the real worker's heartbeats share the subject.)
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(50), a.next()).await {
        if m.payload.as_ref() == b"forged" {
            seen.push(m.subject.to_string());
        }
    }
    Ok(seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_without_credentials_or_with_an_unknown_seed_is_refused() -> anyhow::Result<()> {
    let c = Cluster::start_secured(&[], &[]).await?;
    let none = auth::connect(&c.nats.url(), "anon", &Credentials::default()).await;
    let e = none
        .expect_err("no credentials must be refused")
        .to_string();
    assert!(e.contains("requires credentials"), "{e}");
    let dir = tempfile::tempdir()?;
    let stranger = auth::User::generate(auth::Role::Operator);
    let path = dir.path().join("operator.nk");
    std::fs::write(&path, &stranger.seed)?;
    let e = auth::connect(
        &c.nats.url(),
        "stranger",
        &Credentials::from_seed_file(&path),
    )
    .await
    .expect_err("an unknown key must be refused")
    .to_string();
    assert!(e.contains("does not accept this nkey"), "{e}");
    std::fs::write(&path, "not a seed\n")?;
    let e = auth::connect(&c.nats.url(), "bad", &Credentials::from_seed_file(&path))
        .await
        .expect_err("a file without a seed")
        .to_string();
    assert!(e.contains("does not hold an nkey user seed"), "{e}");
    c.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secured_cluster_runs_actions_for_a_rollout() -> anyhow::Result<()> {
    let c = Cluster::start_secured(&[WorkerSpec::new("sec-a")], &["jobA"]).await?;
    let r = Client::connect_with(&c.nats.url(), "jobA", &c.credentials("rollout-jobA")).await?;
    let r1 = r.run(&open("o1", "jobA", "t1"), T).await?;
    assert_eq!(r1.outcome, Outcome::Completed { exit_code: 0 }, "{r1:?}");
    let r2 = r
        .run(&exec("e1", "jobA", "t1", &["echo", "hi"], 1, 1), T)
        .await?;
    assert_eq!(r2.stdout, "hi\n", "{r2:?}");
    // The all-jobs rollout may work for any job.
    let any = Client::connect_with(&c.nats.url(), "jobZ", &c.credentials("rollout")).await?;
    let r3 = any.run(&open("o2", "jobZ", "t1"), T).await?;
    assert_eq!(r3.outcome, Outcome::Completed { exit_code: 0 }, "{r3:?}");
    c.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollouts_and_workers_cannot_forge_dispatches_or_results() -> anyhow::Result<()> {
    let c =
        Cluster::start_secured(&[WorkerSpec::new("n1-a"), WorkerSpec::new("n1-b")], &[]).await?;
    let rollout = nats(&c, "rollout").await?;
    let worker_b = nats(&c, "worker-n1-b").await?;
    let dispatch_a = "tangram.v1.dispatch.n1-a.forged";
    // A rollout can ask for status (the marker) but not dispatch, result or heartbeat.
    for forbidden in [
        dispatch_a,
        "tangram.v1.result.jobA.forged",
        "tangram.v1.heartbeat.n1-a",
    ] {
        let seen = seen_before_marker(&c, &rollout, forbidden, subject::STATUS).await?;
        assert_eq!(seen, [subject::STATUS], "a rollout reached {forbidden}");
    }
    // Worker b heartbeats as itself (the marker) but cannot dispatch to a or speak for it.
    for forbidden in [dispatch_a, "tangram.v1.heartbeat.n1-a"] {
        let seen =
            seen_before_marker(&c, &worker_b, forbidden, "tangram.v1.heartbeat.n1-b").await?;
        assert_eq!(
            seen,
            ["tangram.v1.heartbeat.n1-b"],
            "worker b reached {forbidden}"
        );
    }
    c.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_jobs_rollout_cannot_read_another_jobs_results_or_inboxes() -> anyhow::Result<()> {
    let c = Cluster::start_secured(&[], &["jobA", "jobB"]).await?;
    let op = nats(&c, "operator").await?;
    let a = nats(&c, "rollout-jobA").await?;
    // Subscriptions outside the job are refused; a's own arrive.
    let mut theirs = a.subscribe("tangram.v1.result.jobB.>").await?;
    let mut inbox = a.subscribe("_INBOX.>").await?;
    let mut sched = a.subscribe("_R_scheduler.>").await?;
    let mut b_inbox = a.subscribe("_R_rollout.jobB.>").await?;
    let mut mine = a.subscribe("tangram.v1.result.jobA.>").await?;
    a.flush().await?;
    // Core NATS delivers at most once: a connection that reconnected under load (an auth
    // timeout) misses what was published meanwhile, so the round is repeated until the own
    // message arrives (regression: a single round waited out 60 s in a loaded CI run).
    let mut got = None;
    for _ in 0..30 {
        for s in [
            "tangram.v1.result.jobB.x",
            "_INBOX.abc",
            "_R_scheduler.abc",
            "_R_rollout.jobB.abc",
        ] {
            op.publish(s, "secret".into()).await?;
        }
        op.publish("tangram.v1.result.jobA.x", "mine".into())
            .await?;
        op.flush().await?;
        if let Ok(m) = tokio::time::timeout(Duration::from_secs(2), mine.next()).await {
            got = m;
            break;
        }
    }
    let m = got.expect("own result");
    assert_eq!(m.subject.as_str(), "tangram.v1.result.jobA.x");
    for (name, sub) in [
        ("other job's results", &mut theirs),
        ("_INBOX", &mut inbox),
        ("scheduler inbox", &mut sched),
        ("other job's inbox", &mut b_inbox),
    ] {
        let got = tokio::time::timeout(Duration::from_millis(50), sub.next()).await;
        assert!(!matches!(got, Ok(Some(_))), "{name} was readable");
    }
    // Stored results: a direct get names the subject, so the server holds it to the job.
    let op_js = async_nats::jetstream::new(op.clone());
    tangram_nats::ensure_streams(&op_js, &Default::default()).await?;
    for job in ["jobA", "jobB"] {
        op_js
            .publish(format!("tangram.v1.result.{job}.stored"), "r".into())
            .await?
            .await?;
    }
    let a_js = async_nats::jetstream::new(a.clone());
    let results = a_js.get_stream_no_info(subject::RESULTS_STREAM).await?;
    let own = results
        .direct_get_last_for_subject("tangram.v1.result.jobA.stored")
        .await;
    assert!(own.is_ok(), "{own:?}");
    let other = tokio::time::timeout(
        Duration::from_secs(2),
        results.direct_get_last_for_subject("tangram.v1.result.jobB.stored"),
    )
    .await;
    assert!(
        !matches!(other, Ok(Ok(_))),
        "read another job's stored result"
    );
    // The unnamed consumer create (nats-py's and nats.go's ordered consumers) carries its
    // filter in the body only: the per-job role is refused it, so it cannot aim one at jobB.
    // The all-jobs role, which may read jobB anyway, is allowed it (its standard idiom).
    let create = |deliver: &str, filter: &str| {
        serde_json::json!({"stream_name": subject::RESULTS_STREAM, "config": {
            "deliver_subject": deliver, "filter_subject": filter, "ack_policy": "none",
            "deliver_policy": "all", "inactive_threshold": 5_000_000_000u64}})
        .to_string()
    };
    let legacy = format!("$JS.API.CONSUMER.CREATE.{}", subject::RESULTS_STREAM);
    let mut delivered = a.subscribe("_R_rollout.jobA.pushed").await?;
    a.flush().await?;
    let asked = tokio::time::timeout(
        Duration::from_secs(2),
        a.request(
            legacy.clone(),
            create("_R_rollout.jobA.pushed", "tangram.v1.result.jobB.>").into(),
        ),
    )
    .await;
    assert!(
        !matches!(asked, Ok(Ok(_))),
        "a per-job rollout created an unnamed consumer: {asked:?}"
    );
    let got = tokio::time::timeout(Duration::from_millis(500), delivered.next()).await;
    assert!(!matches!(got, Ok(Some(_))), "jobB's result reached jobA");
    let all = nats(&c, "rollout").await?;
    let mut mine = all.subscribe("_R_rollout.pushed").await?;
    all.flush().await?;
    let reply = all
        .request(
            legacy,
            create("_R_rollout.pushed", "tangram.v1.result.jobB.>").into(),
        )
        .await?;
    let reply: serde_json::Value = serde_json::from_slice(&reply.payload)?;
    assert!(reply.get("error").is_none(), "{reply}");
    // A pushed message keeps the subject it was stored under.
    let m = tokio::time::timeout(T, mine.next()).await?.expect("pushed");
    assert!(m.subject.starts_with("tangram.v1.result.jobB."), "{m:?}");
    c.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollout_and_worker_credentials_cannot_administer_streams() -> anyhow::Result<()> {
    let c = Cluster::start_secured(&[WorkerSpec::new("n3-a")], &[]).await?;
    // The scheduler has created the streams by the time the worker reports.
    let op = Client::connect_with(&c.nats.url(), "x", &c.credentials("operator")).await?;
    op.wait_for_workers(&["n3-a"], T).await?;
    for role in ["rollout", "worker-n3-a"] {
        let js = async_nats::jetstream::new(nats(&c, role).await?);
        for stream in [
            subject::ACTIONS_STREAM,
            subject::DISPATCH_STREAM,
            subject::RESULTS_STREAM,
        ] {
            let deleted =
                tokio::time::timeout(Duration::from_secs(2), js.delete_stream(stream)).await;
            assert!(!matches!(deleted, Ok(Ok(_))), "{role} deleted {stream}");
        }
        let purged = tokio::time::timeout(Duration::from_secs(2), async {
            js.get_stream_no_info(subject::ACTIONS_STREAM)
                .await?
                .purge()
                .await
                .map_err(anyhow::Error::from)
        })
        .await;
        assert!(
            !matches!(purged, Ok(Ok(_))),
            "{role} purged the actions stream"
        );
    }
    for stream in [
        subject::ACTIONS_STREAM,
        subject::DISPATCH_STREAM,
        subject::RESULTS_STREAM,
    ] {
        op.js.get_stream(stream).await?;
    }
    c.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_action_gets_a_clear_error_through_the_client() -> anyhow::Result<()> {
    let c = Cluster::start_secured(&[], &[]).await?;
    let r = Client::connect_with(&c.nats.url(), "big", &c.credentials("rollout")).await?;
    let e = r
        .publish_raw(
            "tangram.v1.action.big.sandbox_exec",
            Some("big-1"),
            None,
            vec![b'x'; 9 << 20],
        )
        .await
        .expect_err("9 MiB is over max_payload");
    assert!(e.to_string().to_lowercase().contains("payload"), "{e}");
    c.shutdown().await
}

/// A request that names another job's results as its reply subject gets no answer, from the
/// scheduler (status) or a worker (pre-pull): answering services publish only to inboxes,
/// so no one can make them publish where they choose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_naming_another_jobs_results_as_its_reply_gets_no_answer() -> anyhow::Result<()> {
    let c = Cluster::start_secured(&[WorkerSpec::new("rs-a")], &["jobA", "jobB"]).await?;
    let op = nats(&c, "operator").await?;
    let a = nats(&c, "rollout-jobA").await?;
    let mut theirs = op.subscribe("tangram.v1.result.jobB.>").await?;
    op.flush().await?;
    let prepull = subject::prepull_of("rs-a");
    // Both services listening: the scheduler knows the worker, and the worker answers.
    c.client("jobA")
        .await?
        .wait_for_scheduler_to_know(&["rs-a"], Duration::from_secs(60))
        .await?;
    let mut listening = false;
    for _ in 0..100 {
        if a.request(prepull.clone(), "{}".into()).await.is_ok() {
            listening = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::ensure!(listening, "the worker never answered a pre-pull");
    a.publish_with_reply(
        subject::STATUS,
        "tangram.v1.result.jobB.spoofed-status",
        "".into(),
    )
    .await?;
    a.publish_with_reply(
        prepull.clone(),
        "tangram.v1.result.jobB.spoofed-prepull",
        r#"{"image": "not a reference!"}"#.into(),
    )
    .await?;
    a.flush().await?;
    // The same requests with inbox replies are answered: both services have read the
    // spoofed ones before these.
    let status = tokio::time::timeout(
        Duration::from_secs(30),
        a.request(subject::STATUS, "".into()),
    )
    .await??;
    assert!(!status.payload.is_empty());
    let answer = tokio::time::timeout(
        Duration::from_secs(30),
        a.request(prepull, r#"{"image": "not a reference!"}"#.into()),
    )
    .await??;
    let answer: serde_json::Value = serde_json::from_slice(&answer.payload)?;
    assert_eq!(answer["outcome"], "refused", "{answer}");
    let spoofed = tokio::time::timeout(Duration::from_millis(500), theirs.next()).await;
    assert!(
        spoofed.is_err(),
        "an answer went to another job's results: {:?}",
        spoofed.ok().flatten().map(|m| m.subject)
    );
    c.shutdown().await
}
