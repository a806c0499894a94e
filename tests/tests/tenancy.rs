//! Many jobs and workers on one fleet, against a real secured cluster (the users and
//! permissions `tangram up` writes): no credential speaks for another.

use std::time::Duration;
use tangram_nats::auth;
use tangram_shared::codec::{encode, Encoding};
use tangram_shared::{subject, Heartbeat, Outcome, WorkerId};
use tangram_tests::build::{exec, open};
use tangram_tests::{Client, Cluster, WorkerSpec};

const T: Duration = Duration::from_secs(60);

/// `f`'s outcome if it has one within 2 s (a request the server drops for want of permission
/// has none).
async fn within<F: std::future::Future>(f: F) -> Result<F::Output, tokio::time::error::Elapsed> {
    tokio::time::timeout(Duration::from_secs(2), f).await
}

/// Regression (seen live): the scheduler took a heartbeat's worker from its body, so worker
/// b's credential, publishing on its own subject (the only one it may), made worker a look
/// restarted (its running `sleep` settled `worker_lost`, its sandbox forgotten) and invented
/// a ghost with 4,096 cores that took the next opens. The subject now says who speaks; a body
/// naming anyone else is refused and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_credential_cannot_speak_for_another_worker_or_invent_one() -> anyhow::Result<()> {
    let c = Cluster::start_secured_with(&[WorkerSpec::new("imp-a")], &["imp-b"], &[]).await?;
    let op = Client::connect_with(&c.nats.url(), "jobA", &c.credentials("operator")).await?;
    op.wait_for_workers(&["imp-a"], T).await?;
    let r = op.run(&open("o1", "jobA", "t1"), T).await?;
    assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
    let long = exec("long", "jobA", "t1", &["sleep", "6"], 1, 1);
    op.submit(&long).await?;
    let real = op.wait_until_running("imp-a", &long.id, T).await?;

    // Worker b, on its own subject: a's heartbeat from a new instance that runs nothing and
    // holds no sandbox, and a ghost with 4,096 cores; then, as itself, draining (so that
    // nothing is placed on it), which the scheduler takes in after the forged ones.
    let b = auth::connect(
        &c.nats.url(),
        "worker-imp-b",
        &c.credentials("worker-imp-b"),
    )
    .await?;
    let mut restarted = real.clone();
    restarted.instance = "forged".into();
    restarted.seq += 1_000;
    restarted.running.clear();
    restarted.finished.clear();
    restarted.sandboxes.clear();
    let mut ghost = restarted.clone();
    ghost.worker = WorkerId::new("ghost")?;
    ghost.instance = "ghost".into();
    ghost.cores = 4_096;
    ghost.mem_mb = 1 << 22;
    let mut itself = restarted.clone();
    itself.worker = WorkerId::new("imp-b")?;
    itself.instance = "imp-b".into();
    itself.draining = true;
    let own = subject::heartbeat(&WorkerId::new("imp-b")?);
    let body = |hb: &Heartbeat| -> anyhow::Result<bytes::Bytes> {
        Ok(encode(hb, Encoding::Msgpack)?.into())
    };
    for _ in 0..3 {
        b.publish(own.clone(), body(&restarted)?).await?;
        b.publish(own.clone(), body(&ghost)?).await?;
    }
    b.flush().await?;
    // Until the scheduler has heard b as itself (repeated: core NATS may drop one under load).
    let mut heard = None;
    for _ in 0..30 {
        b.publish(own.clone(), body(&itself)?).await?;
        b.flush().await?;
        let s = op.status().await?;
        if s.workers.iter().any(|w| w.id == "imp-b") {
            heard = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let status = heard.ok_or_else(|| anyhow::anyhow!("the scheduler never heard imp-b"))?;
    assert!(
        !status.workers.iter().any(|w| w.id == "ghost"),
        "a ghost joined the fleet: {:?}",
        status.workers
    );

    // Worker a's exec ends as it ran, its sandbox is still known, and a new sandbox goes to
    // a worker that exists.
    let r = op.result(&long.id, T).await?;
    assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
    let r = op
        .run(&exec("next", "jobA", "t1", &["echo", "ok"], 1, 1), T)
        .await?;
    assert_eq!(r.stdout, "ok\n", "{r:?}");
    let r = op.run(&open("o2", "jobA", "t2"), T).await?;
    assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
    assert_eq!(
        r.placement.as_ref().map(|p| p.worker.as_str()),
        Some("imp-a"),
        "{r:?}"
    );
    c.shutdown().await
}

/// Regression (seen live): rollout credentials, per-job ones included, could pull from the
/// scheduler's results consumer (jobA's seed received a jobB result), delete it (jobB's next
/// exec was `no_sandbox` until the leader died) or redefine its filter to one job's results.
/// Those consumer subjects are denied to every rollout role by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_rollout_can_pull_from_delete_or_redefine_the_schedulers_results_consumer(
) -> anyhow::Result<()> {
    use async_nats::jetstream::consumer::pull;
    let c = Cluster::start_secured(&[WorkerSpec::new("sc-a")], &["jobA", "jobB"]).await?;
    let op = Client::connect_with(&c.nats.url(), "jobB", &c.credentials("operator")).await?;
    op.wait_for_workers(&["sc-a"], T).await?;
    let r = op.run(&open("o1", "jobB", "t1"), T).await?;
    assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
    let name = subject::SCHEDULER_RESULTS_CONSUMER;
    for role in ["rollout-jobA", "rollout"] {
        let nc = auth::connect(&c.nats.url(), role, &c.credentials(role)).await?;
        let js = async_nats::jetstream::new(nc.clone());
        let stream = js.get_stream_no_info(subject::RESULTS_STREAM).await?;
        let pulled = within(nc.request(
            format!(
                "$JS.API.CONSUMER.MSG.NEXT.{}.{name}",
                subject::RESULTS_STREAM
            ),
            r#"{"batch":1,"no_wait":true}"#.into(),
        ))
        .await;
        assert!(!matches!(pulled, Ok(Ok(_))), "{role} pulled: {pulled:?}");
        let redefined = within(stream.create_consumer(pull::Config {
            durable_name: Some(name.into()),
            filter_subject: "tangram.v1.result.jobA.>".into(),
            ..Default::default()
        }))
        .await;
        assert!(!matches!(redefined, Ok(Ok(_))), "{role} redefined it");
        let deleted = within(stream.delete_consumer(name)).await;
        assert!(!matches!(deleted, Ok(Ok(_))), "{role} deleted it");
        // The unnamed form (nats-py's and nats.go's ordered consumers), its name in the body.
        let body = serde_json::json!({
            "stream_name": subject::RESULTS_STREAM,
            "config": {
                "name": name,
                "filter_subject": "tangram.v1.result.jobA.>",
                "ack_policy": "explicit",
                "deliver_policy": "all",
            },
        });
        let answer = within(nc.request(
            format!("$JS.API.CONSUMER.CREATE.{}", subject::RESULTS_STREAM),
            serde_json::to_vec(&body)?.into(),
        ))
        .await;
        if let Ok(Ok(m)) = &answer {
            let v: serde_json::Value = serde_json::from_slice(&m.payload)?;
            assert!(v.get("error").is_some(), "{role} redefined it by body: {v}");
        }
    }
    // Untouched, and results still reach the scheduler.
    let info = op
        .js
        .get_stream(subject::RESULTS_STREAM)
        .await?
        .consumer_info(name)
        .await?;
    assert_eq!(info.config.filter_subject, "tangram.v1.result.>");
    let r = op
        .run(&exec("e1", "jobB", "t1", &["echo", "ok"], 1, 1), T)
        .await?;
    assert_eq!(r.stdout, "ok\n", "{r:?}");
    c.shutdown().await
}

/// Regression (seen live): a worker's credential could create its dispatch consumer with any
/// filter (the filter travelled in the request's body) and read every worker's dispatches:
/// every job's files, environment and stdin. It may now create it only in the form that names
/// the filter in the request subject, with its own dispatches as the filter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_cannot_read_another_workers_dispatches() -> anyhow::Result<()> {
    use async_nats::jetstream::consumer::pull;
    let c = Cluster::start_secured_with(&[WorkerSpec::new("df-a")], &["df-b"], &[]).await?;
    let op = Client::connect_with(&c.nats.url(), "jobA", &c.credentials("operator")).await?;
    op.wait_for_workers(&["df-a"], T).await?;
    let nc = auth::connect(&c.nats.url(), "worker-df-b", &c.credentials("worker-df-b")).await?;
    let js = async_nats::jetstream::new(nc.clone());
    let stream = js.get_stream_no_info(subject::DISPATCH_STREAM).await?;
    let own = subject::worker_consumer(&WorkerId::new("df-b")?);
    // Worker c has not joined: no consumer of its dispatches exists yet (on this work-queue
    // stream the server refuses a filter overlapping another consumer's, a's included).
    let other = "tangram.v1.dispatch.df-c.>";
    // The filter in the request subject.
    let made = within(stream.create_consumer(pull::Config {
        durable_name: Some(own.clone()),
        filter_subject: other.into(),
        ..Default::default()
    }))
    .await;
    assert!(
        !matches!(made, Ok(Ok(_))),
        "worker b made its consumer over c's dispatches"
    );
    // The filter in the body only.
    let body = serde_json::json!({
        "stream_name": subject::DISPATCH_STREAM,
        "config": {"durable_name": own, "filter_subject": other, "ack_policy": "explicit"},
    });
    let answer = within(nc.request(
        format!("$JS.API.CONSUMER.CREATE.{}.{own}", subject::DISPATCH_STREAM),
        serde_json::to_vec(&body)?.into(),
    ))
    .await;
    if let Ok(Ok(m)) = &answer {
        let v: serde_json::Value = serde_json::from_slice(&m.payload)?;
        assert!(v.get("error").is_some(), "worker b made its consumer: {v}");
    }
    // Its own, as the worker makes it, still works.
    let made = within(tangram_nats::worker_consumer(&js, &WorkerId::new("df-b")?)).await;
    assert!(matches!(made, Ok(Ok(_))), "{made:?}");
    let info = op
        .js
        .get_stream(subject::DISPATCH_STREAM)
        .await?
        .consumer_info(&own)
        .await?;
    assert_eq!(info.config.filter_subject, "tangram.v1.dispatch.df-b.>");
    c.shutdown().await
}

/// Regression (seen live): any image already on a worker's host could be opened whatever the
/// pull allow-list said (another job's private task image, or an infrastructure image), and
/// an image's own ENTRYPOINT ran as the sandbox's PID 1 in place of the keeper (a local
/// `tangram/nats` tag opened with nats-server as PID 1). An open may now name only the default
/// image or one that `sandbox.pull` or `sandbox.images` allows, and the keeper is always the
/// entrypoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_names_only_allowed_images_and_the_keeper_is_always_pid_1() -> anyhow::Result<()> {
    use tangram_tests::images::{distinct_image, open_image, Untag};
    let pid = std::process::id();
    // On the host, not allowed: the default image under another name.
    let forbidden = format!("tangram-test/forbidden-{pid}:1");
    // Allowed, with an entrypoint of its own.
    let base = distinct_image(&format!("entry-base-{pid}"))?;
    let entry = format!("tangram-test/entrypoint-{pid}:1");
    let _untag = Untag(vec![forbidden.clone(), entry.clone(), base.clone()]);
    let default = tangram_worker::config::DEFAULT_IMAGE;
    let tagged = std::process::Command::new("docker")
        .args(["tag", default, &forbidden])
        .output()?;
    anyhow::ensure!(tagged.status.success(), "{tagged:?}");
    let dockerfile = format!("FROM {base}\nENTRYPOINT [\"/bin/sleep\", \"3600\"]\n");
    let mut build = std::process::Command::new("docker")
        .args(["build", "-q", "-t", &entry, "-"])
        .env("DOCKER_BUILDKIT", "0")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    {
        use std::io::Write;
        build
            .stdin
            .take()
            .expect("piped")
            .write_all(dockerfile.as_bytes())?;
    }
    let built = build.wait_with_output()?;
    anyhow::ensure!(built.status.success(), "{built:?}");

    let mut cluster = Cluster::start(&[]).await?;
    cluster.start_sandbox_worker(
        "img-a",
        tangram_worker::config::RawSandbox {
            images: Some(vec![format!("docker.io/tangram-test/entrypoint-{pid}")]),
            ..Default::default()
        },
    )?;
    let c = cluster.client("img").await?;
    c.wait_for_workers(&["img-a"], T).await?;
    let r = c.run(&open_image("o1", "img", "t1", &forbidden), T).await?;
    match &r.outcome {
        Outcome::Rejected { code, reason } => {
            assert_eq!(*code, tangram_shared::RejectCode::InvalidField, "{r:?}");
            assert!(reason.contains("may not be opened"), "{reason}");
        }
        o => panic!("an image outside the rules was opened: {o:?}"),
    }
    let r = c.run(&open_image("o2", "img", "t2", &entry), T).await?;
    assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
    let r = c
        .run(
            &exec(
                "comm",
                "img",
                "t2",
                &["/bin/sh", "-c", "read c < /proc/1/comm; echo $c"],
                1,
                1,
            ),
            T,
        )
        .await?;
    assert_eq!(r.stdout, "sh\n", "PID 1 is not the keeper: {r:?}");
    let r = c.run(&open("o3", "img", "t3"), T).await?;
    assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
    cluster.shutdown().await
}

/// Regression (issue 30, seen live): `tangram.v1.status` gave every rollout every job's name
/// and sandboxes and every worker's image list (another job's private task images). A
/// rollout role's answer now holds only its own job's part; the operator's holds everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_rollout_reads_only_its_own_job_in_status() -> anyhow::Result<()> {
    let c = Cluster::start_secured(&[WorkerSpec::new("st-a")], &["stA", "stB"]).await?;
    let op = Client::connect_with(&c.nats.url(), "ops", &c.credentials("operator")).await?;
    op.wait_for_workers(&["st-a"], T).await?;
    let a = Client::connect_with(&c.nats.url(), "stA", &c.credentials("rollout-stA")).await?;
    let b = Client::connect_with(&c.nats.url(), "stB", &c.credentials("rollout-stB")).await?;
    let r = a.run(&open("oa", "stA", "t1"), T).await?;
    assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
    let r = b.run(&open("ob", "stB", "t1"), T).await?;
    assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
    let all = op
        .wait_for_status(T, "both jobs' sandboxes", |s| s.jobs.len() == 2)
        .await?;
    assert!(
        all.workers.iter().any(|w| !w.images.is_empty()),
        "the operator sees the workers' images: {all:?}"
    );
    for (client, job) in [(&a, "stA"), (&b, "stB")] {
        let st = client.status().await?;
        assert_eq!(
            st.jobs.keys().collect::<Vec<_>>(),
            vec![job],
            "{job} sees another job in status"
        );
        assert!(
            st.workers
                .iter()
                .all(|w| w.images.is_empty() && w.warm.is_none()),
            "{job} sees workers' images: {:?}",
            st.workers
        );
        // What a rollout paces itself on is still there.
        assert_eq!(st.workers.len(), 1);
        assert_eq!(st.sandboxes, 2);
    }
    c.shutdown().await
}

/// Regression: a job's role could ask for the results stream's info with a subjects filter
/// (in the request body, where permissions cannot look) and read every stored subject: every
/// job's name and action ids. The role no longer has STREAM.INFO; its own client (and the
/// Python client's result feed) starts without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_rollout_cannot_list_another_jobs_subjects_from_stream_info() -> anyhow::Result<()> {
    let c = Cluster::start_secured(&[WorkerSpec::new("si-a")], &["siA", "siB"]).await?;
    let op = Client::connect_with(&c.nats.url(), "ops", &c.credentials("operator")).await?;
    op.wait_for_workers(&["si-a"], T).await?;
    let b = Client::connect_with(&c.nats.url(), "siB", &c.credentials("rollout-siB")).await?;
    let r = b.run(&open("secret-open-of-b", "siB", "t1"), T).await?;
    assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
    let ask = serde_json::json!({"subjects_filter": ">"}).to_string();
    let info = format!("$JS.API.STREAM.INFO.{}", subject::RESULTS_STREAM);
    // The operator reads it: the question does reveal siB's action ids to whoever may ask.
    let nc = auth::connect(&c.nats.url(), "si-op", &c.credentials("operator")).await?;
    let answer = nc.request(info.clone(), ask.clone().into()).await?;
    let text = String::from_utf8_lossy(&answer.payload);
    assert!(
        text.contains("tangram.v1.result.siB.secret-open-of-b"),
        "{text}"
    );
    // siA's role may not ask.
    let nc = auth::connect(&c.nats.url(), "si-a", &c.credentials("rollout-siA")).await?;
    let answer = within(nc.request(info, ask.into())).await;
    assert!(
        !matches!(&answer, Ok(Ok(m)) if !m.payload.is_empty()),
        "siA read the results stream's info: {:?}",
        answer.map(|r| r.map(|m| String::from_utf8_lossy(&m.payload).into_owned()))
    );
    // And siA's own client works without it.
    let a = Client::connect_with(&c.nats.url(), "siA", &c.credentials("rollout-siA")).await?;
    let r = a.run(&open("oa", "siA", "t1"), T).await?;
    assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
    c.shutdown().await
}
