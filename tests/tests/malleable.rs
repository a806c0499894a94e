//! `tangram-v2` live: a running exec's cores change while it runs (malleable grants), on a
//! real worker with Docker sandboxes and cgroup grants.

use std::time::Duration;
use tangram_shared::{ActionId, Outcome};
use tangram_tests::build::{close, exec, open};
use tangram_tests::{Cluster, WorkerSpec};

const T: Duration = Duration::from_secs(60);

/// Container ids of a worker's sandboxes.
fn sandboxes_of(worker: &str) -> Vec<String> {
    let out = std::process::Command::new("docker")
        .args([
            "ps",
            "-q",
            "--filter",
            &format!("label=tangram.worker={worker}"),
        ])
        .output()
        .expect("docker ps");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_exec_is_narrowed_for_an_arrival_and_widened_again_when_it_ends(
) -> anyhow::Result<()> {
    let cluster = Cluster::start_with_policy(&[WorkerSpec::new("mall-a")], "tangram-v2").await?;
    let c = cluster.client("rl").await?;
    c.wait_for_workers(&["mall-a"], T).await?;
    for t in ["t1", "t2"] {
        let r = c.run(&open(&format!("open-{t}"), "rl", t), T).await?;
        assert!(matches!(r.outcome, Outcome::Completed { .. }), "{r:?}");
    }
    // The long exec reports the cores it may run on (its cpuset, as the kernel applies it)
    // ten times a second for six seconds.
    let probe = "for i in $(seq 60); do nproc; sleep 0.1; done";
    let long = exec("long", "rl", "t1", &["sh", "-c", probe], 1, 2);
    c.submit(&long).await?;
    c.wait_until_running("mall-a", &long.id, T).await?;
    // Running for real (its probe loop is in the container), on both cores.
    let probing = tangram_tests::eventually(T, || {
        sandboxes_of("mall-a").iter().any(|id| {
            let top = std::process::Command::new("docker")
                .args(["top", id])
                .output();
            top.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("sleep 0.1"))
        })
    })
    .await;
    assert!(probing, "the probe never started");
    // An arrival while it holds both cores: it is narrowed to make room.
    let short = c
        .run(&exec("short", "rl", "t2", &["sleep", "1.5"], 1, 2), T)
        .await?;
    assert!(
        matches!(short.outcome, Outcome::Completed { exit_code: 0 }),
        "{short:?}"
    );
    assert_eq!(
        short.placement.as_ref().map(|p| p.cores),
        Some(1),
        "{short:?}"
    );
    let r = c.result(&ActionId::new("long")?, T).await?;
    assert!(
        matches!(r.outcome, Outcome::Completed { exit_code: 0 }),
        "{r:?}"
    );
    let seen: Vec<u32> = r
        .stdout
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    // Wide, then narrow while the short one ran, then wide again once it ended.
    let phases: Vec<u32> = seen.iter().fold(Vec::new(), |mut p, &n| {
        if p.last() != Some(&n) {
            p.push(n);
        }
        p
    });
    assert_eq!(phases, vec![2, 1, 2], "cores seen over time: {seen:?}");
    for t in ["t1", "t2"] {
        c.run(&close(&format!("close-{t}"), "rl", t), T).await?;
    }
    cluster.shutdown().await?;
    Ok(())
}
