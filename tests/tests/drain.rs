//! `tangram cordon`, `drain` and `uncordon` against a real cluster, through the CLI binary.

use std::process::Command;
use std::time::Duration;
use tangram_shared::{ActionResult, Outcome, RejectCode};
use tangram_tests::build::{exec, open};
use tangram_tests::{built_binary, containers_of, Cluster, WorkerSpec};

const T: Duration = Duration::from_secs(60);

fn placed(r: &ActionResult) -> String {
    assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
    r.placement.clone().expect("placement").worker.to_string()
}

/// Runs `tangram <args> --nats-url <url>` with an empty state directory (no credentials).
fn tangram(url: &str, state: &std::path::Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(built_binary("tangram"))
        .args(args)
        .args(["--nats-url", url, "--state-dir"])
        .arg(state)
        .output()
        .expect("running tangram");
    (out.status.success(), tangram_tests::output_text(&out))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cordoned_worker_keeps_its_sandboxes_and_a_drain_empties_it() -> anyhow::Result<()> {
    let cluster = Cluster::start(&[WorkerSpec::new("dr-a"), WorkerSpec::new("dr-b")]).await?;
    let c = cluster.client("drain").await?;
    c.wait_for_workers(&["dr-a", "dr-b"], T).await?;
    let state = tempfile::tempdir()?;
    let url = cluster.nats.url();
    let a = placed(&c.run(&open("o1", "drain", "t1"), T).await?);
    let b = if a == "dr-a" { "dr-b" } else { "dr-a" };

    let (ok, text) = tangram(&url, state.path(), &["cordon", &a]);
    assert!(ok, "{text}");
    c.wait_for_status(T, "cordoned", |st| {
        st.workers.iter().any(|w| w.id == a && w.cordoned)
    })
    .await?;
    // New sandboxes go elsewhere; the cordoned worker's own keeps running commands there.
    for (id, t) in [("o2", "t2"), ("o3", "t3")] {
        assert_eq!(placed(&c.run(&open(id, "drain", t), T).await?), b);
    }
    let r = c
        .run(&exec("x1", "drain", "t1", &["true"], 1, 1), T)
        .await?;
    assert_eq!(placed(&r), a);

    // Drain with a 2 s deadline: the command waits until the worker is empty.
    let (ok, text) = tangram(&url, state.path(), &["drain", &a, "--deadline-s", "2"]);
    assert!(ok, "{text}");
    assert!(text.contains("drained"), "{text}");
    assert!(
        tangram_tests::eventually(T, || containers_of(&a) == 0).await,
        "the drained worker's sandbox is still there"
    );
    let r = c
        .run(&exec("x2", "drain", "t1", &["true"], 1, 1), T)
        .await?;
    match &r.outcome {
        Outcome::Rejected {
            code: RejectCode::NoSandbox,
            reason,
        } => assert!(reason.contains("drained"), "{reason}"),
        other => panic!("expected no_sandbox after the drain, got {other:?}"),
    }
    let (ok, text) = tangram(&url, state.path(), &["status"]);
    assert!(ok && text.contains("draining"), "{text}");

    // Uncordoned, it takes new sandboxes again (it is the emptier worker now).
    let (ok, text) = tangram(&url, state.path(), &["uncordon", &a]);
    assert!(ok, "{text}");
    c.wait_for_status(T, "uncordoned", |st| {
        st.workers.iter().any(|w| w.id == a && !w.cordoned)
    })
    .await?;
    assert_eq!(placed(&c.run(&open("o4", "drain", "t4"), T).await?), a);
    cluster.shutdown().await
}
