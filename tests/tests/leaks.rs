//! No leaked sandboxes, against a real secured cluster with Docker sandboxes: an idle
//! sandbox is closed with a notice on its job's results subject, `tangram close --job`
//! closes one job's sandboxes and no other's, a rollout that stops renewing its job's lease
//! has its sandboxes closed, and a job's credential can close only its own job's.

use std::process::Command;
use std::time::Duration;
use tangram_core::engine::close_id;
use tangram_shared::{subject, Action, ActionSpec, JobId, Outcome, RejectCode, TrajectoryId};
use tangram_tests::build::{exec, open};
use tangram_tests::{built_binary, Client, Cluster, WorkerSpec};

const T: Duration = Duration::from_secs(60);

fn job_client_creds(c: &Cluster, job: &str) -> tangram_nats::auth::Credentials {
    c.credentials(&format!("rollout-{job}"))
}

/// Waits, as the operator, until the workers heartbeat (job credentials cannot see them).
async fn wait_for(c: &Cluster, workers: &[&str]) -> anyhow::Result<()> {
    let op = Client::connect_with(&c.nats.url(), "ops", &c.credentials("operator")).await?;
    op.wait_for_workers(workers, T).await
}

async fn job_client(c: &Cluster, job: &str) -> anyhow::Result<Client> {
    Client::connect_with(&c.nats.url(), job, &job_client_creds(c, job)).await
}

/// The scheduler's close of `traj`'s sandbox, opened by `open_id` (its reason is checked on
/// the result's side: the id is the sandbox's, whatever the reason).
fn scheduler_close(job: &str, traj: &str, open_id: &str) -> Action {
    let id = close_id(
        &JobId::new(job).unwrap(),
        &TrajectoryId::new(traj).unwrap(),
        open_id,
    );
    let mut a = tangram_tests::build::close(id.as_str(), job, traj);
    a.id = id;
    a
}

/// The job's containers on the worker, of this cluster only.
fn sandboxes_of(c: &Cluster, worker: &str, job: &str) -> usize {
    let cluster = format!("label=tangram.cluster={}", c.nats.url());
    tangram_tests::running_containers(worker, &[&cluster, &format!("label=tangram.job={job}")])
        .len()
}

fn ok(r: &tangram_shared::ActionResult) {
    assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
}

/// Regression (issue 30): there was no idle timeout, so a rollout that crashed left its
/// sandboxes holding memory until someone closed them by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_sandbox_is_closed_with_a_notice_on_its_jobs_subject() -> anyhow::Result<()> {
    let c = Cluster::start_secured(&[WorkerSpec::new("lk-a")], &["lkA"]).await?;
    let a = job_client(&c, "lkA").await?;
    wait_for(&c, &["lk-a"]).await?;
    let mut o = open("o-idle", "lkA", "t1");
    if let ActionSpec::SandboxOpen(s) = &mut o.spec {
        s.idle_timeout_ms = Some(3_000);
    }
    ok(&a.run(&o, T).await?);
    ok(&a.run(&open("o-kept", "lkA", "t2"), T).await?);
    // Used every second for longer than the timeout: t1 stays.
    for i in 0..5 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        ok(&a
            .run(&exec(&format!("x{i}"), "lkA", "t1", &["true"], 1, 1), T)
            .await?);
    }
    assert_eq!(sandboxes_of(&c, "lk-a", "lkA"), 2);
    // Then left alone: the close's result reaches the job's subject, read with the job's
    // own credential, and the container is gone.
    let close = scheduler_close("lkA", "t1", "o-idle");
    let notice = a.result(&close.id, T).await?;
    ok(&notice);
    assert!(
        tangram_tests::eventually(T, || sandboxes_of(&c, "lk-a", "lkA") == 1).await,
        "the idle sandbox's container is still there"
    );
    let r = a
        .run(&exec("late", "lkA", "t1", &["true"], 1, 1), T)
        .await?;
    match &r.outcome {
        Outcome::Rejected { code, reason } => {
            assert_eq!(*code, RejectCode::NoSandbox);
            assert!(reason.contains("idle_timeout"), "{reason}");
        }
        o => panic!("a command to the closed sandbox: {o:?}"),
    }
    // The other sandbox (the fleet's 30-minute default) is untouched.
    ok(&a
        .run(&exec("kept", "lkA", "t2", &["true"], 1, 1), T)
        .await?);
    c.shutdown().await
}

/// `tangram close --job` (the operator's CLI) closes every sandbox of the job and none of
/// another's; a job's own credential may close its own job's, and not another job's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_job_closes_its_sandboxes_and_no_other_jobs() -> anyhow::Result<()> {
    let c = Cluster::start_secured(&[WorkerSpec::new("lk-b")], &["cjA", "cjB"]).await?;
    let a = job_client(&c, "cjA").await?;
    let b = job_client(&c, "cjB").await?;
    wait_for(&c, &["lk-b"]).await?;
    for t in ["t1", "t2"] {
        ok(&a.run(&open(&format!("oa-{t}"), "cjA", t), T).await?);
    }
    ok(&b.run(&open("ob-t1", "cjB", "t1"), T).await?);

    // cjA's credential asking to close cjB's sandboxes: refused by the server, unanswered.
    let nc =
        tangram_nats::auth::connect(&c.nats.url(), "cjA", &job_client_creds(&c, "cjA")).await?;
    let asked = tokio::time::timeout(
        Duration::from_secs(2),
        nc.request(subject::close_job(&JobId::new("cjB")?), Vec::new().into()),
    )
    .await;
    assert!(
        !matches!(asked, Ok(Ok(_))),
        "cjA's credential was answered on cjB's close subject"
    );

    let state = tempfile::tempdir()?;
    let seed = state.path().join("operator.nk");
    std::fs::copy(
        c.creds.as_ref().expect("secured").join("operator.nk"),
        &seed,
    )?;
    let out = Command::new(built_binary("tangram"))
        .args(["close", "--job", "cjA", "--nats-url", &c.nats.url()])
        .arg("--nkey-file")
        .arg(&seed)
        .arg("--state-dir")
        .arg(state.path())
        .output()?;
    let text = tangram_tests::output_text(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("closing 2 sandboxes of job cjA"), "{text}");
    for (t, o) in [("t1", "oa-t1"), ("t2", "oa-t2")] {
        let close = scheduler_close("cjA", t, o);
        ok(&a.result(&close.id, T).await?);
    }
    assert!(
        tangram_tests::eventually(T, || sandboxes_of(&c, "lk-b", "cjA") == 0).await,
        "cjA's containers are still there: {}",
        String::from_utf8_lossy(
            &Command::new("docker")
                .args(["ps", "-a", "--format", "{{.Names}} {{.Status}} {{.Labels}}"])
                .output()?
                .stdout
        )
    );
    assert_eq!(sandboxes_of(&c, "lk-b", "cjB"), 1);
    ok(&b.run(&exec("xb", "cjB", "t1", &["true"], 1, 1), T).await?);

    // cjB's own credential closes cjB's.
    let nb =
        tangram_nats::auth::connect(&c.nats.url(), "cjB", &job_client_creds(&c, "cjB")).await?;
    let reply = nb
        .request(subject::close_job(&JobId::new("cjB")?), Vec::new().into())
        .await?;
    let reply: tangram_shared::status::CloseJobReply = serde_json::from_slice(&reply.payload)?;
    assert_eq!(reply.closing, 1);
    assert!(
        tangram_tests::eventually(T, || sandboxes_of(&c, "lk-b", "cjB") == 0).await,
        "cjB's container is still there"
    );
    c.shutdown().await
}

/// A rollout that renews its job's lease and then stops (it crashed) has its sandboxes
/// closed once the lease runs out; a job that never took a lease keeps its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_rollout_stops_renewing_its_lease_has_its_sandboxes_closed(
) -> anyhow::Result<()> {
    let c = Cluster::start_secured(&[WorkerSpec::new("lk-c")], &["lsA", "lsB"]).await?;
    let a = job_client(&c, "lsA").await?;
    let b = job_client(&c, "lsB").await?;
    wait_for(&c, &["lk-c"]).await?;
    ok(&a.run(&open("oa", "lsA", "t1"), T).await?);
    ok(&b.run(&open("ob", "lsB", "t1"), T).await?);
    let nc =
        tangram_nats::auth::connect(&c.nats.url(), "lsA", &job_client_creds(&c, "lsA")).await?;
    let renew = serde_json::to_vec(&tangram_shared::status::Lease { ttl_ms: 2_000 })?;
    for _ in 0..4 {
        nc.publish(subject::lease(&JobId::new("lsA")?), renew.clone().into())
            .await?;
        nc.flush().await?;
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    assert_eq!(
        sandboxes_of(&c, "lk-c", "lsA"),
        1,
        "closed while the lease was renewed"
    );
    // The rollout stops.
    let close = scheduler_close("lsA", "t1", "oa");
    ok(&a.result(&close.id, T).await?);
    assert!(
        tangram_tests::eventually(T, || sandboxes_of(&c, "lk-c", "lsA") == 0).await,
        "lsA's container is still there"
    );
    assert_eq!(sandboxes_of(&c, "lk-c", "lsB"), 1);
    c.shutdown().await
}
