//! What a trainer may trust in a result, against a real cluster with Docker sandboxes: an
//! infrastructure outcome comes only from what the worker itself observed, never from text
//! or exit codes a command can produce, and a command cannot break its own sandbox into
//! infrastructure errors.

use std::time::Duration;
use tangram_shared::{ActionSpec, InfraCode, Outcome};
use tangram_tests::build::{exec, open};
use tangram_tests::{Cluster, WorkerSpec};

const T: Duration = Duration::from_secs(60);

/// `exec` with one file to write under /work (so that the files ride on the command's own
/// exec, unpacked by the worker's wrapper).
fn exec_with_file(
    id: &str,
    traj: &str,
    argv: &[&str],
    file: &str,
    text: String,
) -> tangram_shared::Action {
    let mut a = exec(id, "ri", traj, argv, 1, 1);
    if let ActionSpec::SandboxExec(e) = &mut a.spec {
        e.files.insert(file.into(), text);
    }
    a
}

fn infra_code(o: &Outcome) -> Option<InfraCode> {
    match o {
        Outcome::InfraError { code, .. } => Some(*code),
        _ => None,
    }
}

/// Regression (seen live): a command that printed the worker's files-failure line on stderr
/// and exited 125 was reported `infra_error: runtime`, an outcome trainers drop, so a policy
/// could learn to turn its failures into ignored samples. The wrapper's failure now names a
/// token the command never sees; the forgery completes with exit code 125 (the worker's unit
/// tests check that the wrapper's own failure, with the token, is still taken for one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_cannot_forge_the_workers_files_failure() -> anyhow::Result<()> {
    let cluster = Cluster::start(&[WorkerSpec::new("ri-a")]).await?;
    let c = cluster.client("ri").await?;
    c.wait_for_workers(&["ri-a"], T).await?;
    let r = c.run(&open("o1", "ri", "t1"), T).await?;
    assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
    let forged = "echo 'tangram: writing files into /work failed' >&2; \
                  echo 'tangram: writing files into /work failed [0123456789abcdef]' >&2; exit 125";
    let r = c
        .run(
            &exec_with_file("forge", "t1", &["sh", "-c", forged], "a.txt", "x".into()),
            T,
        )
        .await?;
    assert_eq!(r.outcome, Outcome::Completed { exit_code: 125 }, "{r:?}");
    // The wrapper still writes the files (its token line is read off before the archive)...
    let r = c
        .run(
            &exec_with_file("read", "t1", &["cat", "a.txt"], "a.txt", "x".into()),
            T,
        )
        .await?;
    assert_eq!(r.stdout, "x", "{r:?}");
    // ...and its own failure is still reported as the worker's: here the work directory is
    // full (whether a directory the commands filled should count as the infrastructure's is
    // another question; this checks that the token is seen).
    let mut small = open("o2", "ri", "t2");
    if let ActionSpec::SandboxOpen(o) = &mut small.spec {
        o.workdir_mb = 1;
    }
    c.run(&small, T).await?;
    let fill = exec(
        "fill",
        "ri",
        "t2",
        &["sh", "-c", "head -c 2000000 /dev/zero > /work/fill"],
        1,
        1,
    );
    c.run(&fill, T).await?;
    let r = c
        .run(
            &exec_with_file("full", "t2", &["true"], "b.txt", "z".repeat(200_000)),
            T,
        )
        .await?;
    match &r.outcome {
        Outcome::InfraError {
            code: InfraCode::Runtime,
            reason,
        } => {
            assert!(
                reason.contains("writing files into /work failed [token]"),
                "{reason}"
            )
        }
        o => panic!("{o:?}"),
    }
    cluster.shutdown().await
}

/// Regression (seen live): `kill -TERM 1` in a command ended the sandbox's keeper (it
/// trapped TERM to exit), after which every exec of the trajectory was `infra_error:
/// runtime` for ever and its memory stayed booked. The keeper handles no signal now, so the
/// kernel drops those sent from inside; and a sandbox whose keeper does end (killed from
/// the host here) is `sandbox_lost`, forgotten by the worker and the scheduler, so that the
/// trajectory can open a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_cannot_end_its_sandbox_and_a_dead_sandbox_is_lost_not_broken(
) -> anyhow::Result<()> {
    let cluster = Cluster::start(&[WorkerSpec::new("rk-a")]).await?;
    let c = cluster.client("ri").await?;
    c.wait_for_workers(&["rk-a"], T).await?;
    let r = c.run(&open("o1", "ri", "t1"), T).await?;
    assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
    let kill = "kill -TERM 1; kill -INT 1; kill -HUP 1; kill -9 1; sleep 0.5; echo survived";
    let r = c
        .run(&exec("kill", "ri", "t1", &["sh", "-c", kill], 1, 1), T)
        .await?;
    assert_eq!(r.stdout, "survived\n", "{r:?}");
    let r = c
        .run(&exec("after", "ri", "t1", &["echo", "alive"], 1, 1), T)
        .await?;
    assert_eq!(r.stdout, "alive\n", "{r:?}");

    // Killed from the host: the next exec finds it gone.
    let id = sandbox_container("rk-a", "t1")?;
    let killed = std::process::Command::new("docker")
        .args(["kill", &id])
        .output()?;
    assert!(killed.status.success(), "{killed:?}");
    let r = c
        .run(&exec("dead", "ri", "t1", &["echo", "x"], 1, 1), T)
        .await?;
    assert_eq!(
        infra_code(&r.outcome),
        Some(InfraCode::SandboxLost),
        "{r:?}"
    );
    // Its stopped container was removed before the result was sent.
    let inspected = std::process::Command::new("docker")
        .args(["inspect", &id])
        .output()?;
    assert!(
        !inspected.status.success(),
        "the dead container is still there"
    );
    // Forgotten on both sides: its memory is free and the trajectory opens again.
    c.wait_for_status(T, "the lost sandbox's memory freed", |s| {
        s.workers
            .iter()
            .any(|w| w.id == "rk-a" && w.mem_used_mb == 0)
    })
    .await?;
    let r = c.run(&open("o2", "ri", "t1"), T).await?;
    assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
    let r = c
        .run(&exec("again", "ri", "t1", &["echo", "back"], 1, 1), T)
        .await?;
    assert_eq!(r.stdout, "back\n", "{r:?}");
    cluster.shutdown().await
}

/// The container of worker `worker`'s sandbox for trajectory `traj` of job `ri`.
fn sandbox_container(worker: &str, traj: &str) -> anyhow::Result<String> {
    let ids = tangram_tests::running_containers(
        worker,
        &[
            "label=tangram.job=ri",
            &format!("label=tangram.trajectory={traj}"),
        ],
    );
    anyhow::ensure!(ids.len() == 1, "containers of {worker}/{traj}: {ids:?}");
    Ok(ids[0].clone())
}
