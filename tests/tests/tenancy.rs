//! Many jobs and workers on one fleet, against a real secured cluster (the users and
//! permissions `tangram up` writes): no credential speaks for another.

use std::time::Duration;
use tangram_nats::auth;
use tangram_shared::codec::{encode, Encoding};
use tangram_shared::{subject, Heartbeat, Outcome, WorkerId};
use tangram_tests::build::{exec, open};
use tangram_tests::{Client, Cluster, WorkerSpec};

const T: Duration = Duration::from_secs(60);

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
