//! Image-aware placement on real parts: a registry on loopback, workers that pull from it,
//! and (for two image stores, as two hosts have) a second Docker daemon: an open goes where
//! its image is, and ignoring images costs pulls.

use std::time::Duration;
use tangram_shared::Outcome;
use tangram_tests::build::{close, open};
use tangram_tests::images::{
    open_image, registry_installed, registry_with_image, start_worker_on, Untag,
};
use tangram_tests::registry::Registry;
use tangram_tests::Cluster;

const T: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_goes_to_the_worker_holding_its_image_and_ignoring_images_spreads_it(
) -> anyhow::Result<()> {
    let Some((reg, image, _untag)) = registry_with_image("place")? else {
        return Ok(());
    };
    let ok = Outcome::Completed { exit_code: 0 };
    for aware in [true, false] {
        // Both workers share this machine's Docker daemon: once one pulled the image, the
        // other finds it too, so the runs differ in placement only.
        let _ = std::process::Command::new("docker")
            .args(["rmi", "-f", &image])
            .output();
        let mut cluster = Cluster::start_without_scheduler(&[]).await?;
        start_worker_on(&mut cluster, &reg, "place-a", None, None, None)?;
        start_worker_on(&mut cluster, &reg, "place-b", None, None, None)?;
        let mut config = tangram_scheduler::Config::with_nats_url(cluster.nats.url());
        config.image_locality = aware;
        // Load counts little next to a pull here: the holder wins while it has room.
        config.image_load_ms = 100;
        cluster.start_scheduler_config(config);
        let c = cluster.client("place").await?;
        c.wait_for_scheduler_to_know(&["place-a", "place-b"], T)
            .await?;
        let worker =
            |r: &tangram_shared::ActionResult| r.placement.as_ref().map(|p| p.worker.to_string());
        // The first open of the image: no worker holds it; it is pulled where it lands.
        let r1 = c.run(&open_image("o1", "place", "t1", &image), T).await?;
        assert_eq!(r1.outcome, ok, "{r1:?}");
        assert!(r1.timing.pull_us > 0, "{:?}", r1.timing);
        // The second, with the first sandbox still open: the other worker is emptier.
        let r2 = c.run(&open_image("o2", "place", "t2", &image), T).await?;
        assert_eq!(r2.outcome, ok, "{r2:?}");
        if aware {
            assert_eq!(worker(&r2), worker(&r1), "image-aware: where the image is");
        } else {
            assert_ne!(
                worker(&r2),
                worker(&r1),
                "ignoring images: the emptier worker"
            );
        }
        // An open of the default image spreads as before, either way.
        let r3 = c.run(&open("o3", "place", "t3"), T).await?;
        assert_eq!(r3.outcome, ok, "{r3:?}");
        if aware {
            assert_ne!(
                worker(&r3),
                worker(&r1),
                "the default image goes to the emptier worker"
            );
        }
        for t in ["t1", "t2", "t3"] {
            let r = c.run(&close(&format!("c-{t}"), "place", t), T).await?;
            assert_eq!(r.outcome, ok, "{r:?}");
        }
        cluster.shutdown().await?;
    }
    Ok(())
}

/// Two workers that do not share an image store (two Docker daemons, as two hosts), two task
/// images of 60 MB, three trajectories each, opened at once: image-aware placement pulls each
/// image once, placement that ignores images pulls them on both workers. Prints the opens'
/// times (docs/BENCHMARKS.md records a run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_image_stores_image_aware_placement_pulls_each_image_once() -> anyhow::Result<()> {
    if !registry_installed() {
        return Ok(());
    }
    if !tangram_tests::dockerd::available() {
        anyhow::ensure!(
            std::env::var_os("CI").is_none(),
            "dockerd is not on PATH or this is not root: a second Docker daemon cannot start"
        );
        eprintln!("SKIPPED: a second Docker daemon needs dockerd and root");
        return Ok(());
    }
    tangram_tests::init_logging();
    let reg = Registry::start("tangram", "s3cret")?;
    let second = tangram_tests::dockerd::SecondDaemon::start()?;
    let n = std::process::id();
    let base = tangram_tests::registry::small_image(&format!("tangram-test/base-{n}:1"), 0)?;
    second.load(&base)?;
    let (lx, ly) = (
        tangram_tests::registry::small_image(&format!("tangram-test/task-x-{n}:1"), 60)?,
        tangram_tests::registry::small_image(&format!("tangram-test/task-y-{n}:1"), 60)?,
    );
    let x = reg.push(&lx, &format!("tangram/task-x:{n}"))?;
    let y = reg.push(&ly, &format!("tangram/task-y:{n}"))?;
    let _untag = Untag(vec![x.clone(), y.clone(), lx, ly, base.clone()]);
    let ok = Outcome::Completed { exit_code: 0 };
    let mut summary = Vec::new();
    for aware in [true, false] {
        for image in [&x, &y] {
            let _ = std::process::Command::new("docker")
                .args(["rmi", "-f", image])
                .output();
            let _ = second.docker(&["rmi", "-f", image]);
        }
        let mut cluster = Cluster::start_without_scheduler(&[]).await?;
        start_worker_on(&mut cluster, &reg, "two-a", None, Some(&base), None)?;
        start_worker_on(
            &mut cluster,
            &reg,
            "two-b",
            Some(&second.socket),
            Some(&base),
            None,
        )?;
        let mut config = tangram_scheduler::Config::with_nats_url(cluster.nats.url());
        config.image_locality = aware;
        // Two-core workers: the default weight (60 s per sandbox per core) would make any
        // pull cheaper than one more sandbox; here the pulls are what is being saved.
        config.image_load_ms = 100;
        cluster.start_scheduler_config(config);
        let c = cluster.client("two").await?;
        c.wait_for_scheduler_to_know(&["two-a", "two-b"], T).await?;
        let opens: Vec<tangram_shared::Action> = (0..6)
            .map(|i| {
                let image = if i < 3 { &x } else { &y };
                open_image(&format!("o{i}"), "two", &format!("t{i}"), image)
            })
            .collect();
        let results =
            futures::future::join_all(opens.iter().map(|a| c.run(a, Duration::from_secs(120))))
                .await;
        let mut pulled = std::collections::BTreeSet::new();
        let mut open_ms = Vec::new();
        let mut placed = Vec::new();
        for (i, r) in results.into_iter().enumerate() {
            let r = r?;
            assert_eq!(r.outcome, ok, "{r:?}");
            let worker = r.placement.as_ref().map(|p| p.worker.to_string());
            if r.timing.pull_us > 0 {
                pulled.insert((worker.clone(), i < 3));
            }
            open_ms.push(r.timing.act_us as f64 / 1e3);
            placed.push(format!(
                "{}{}",
                worker.as_deref().unwrap_or("?"),
                if r.timing.pull_us > 0 { "+pull" } else { "" }
            ));
        }
        let mean = open_ms.iter().sum::<f64>() / open_ms.len() as f64;
        summary.push(format!(
            "{}: {} pulls, open ACT mean {mean:.0} ms, each {open_ms:.0?}, on {placed:?}",
            if aware {
                "image-aware"
            } else {
                "ignoring images"
            },
            pulled.len()
        ));
        if aware {
            assert_eq!(pulled.len(), 2, "each image pulled once: {pulled:?}");
        } else {
            assert!(
                pulled.len() >= 3,
                "spread opens pull an image twice: {summary:?}"
            );
        }
        for i in 0..6 {
            let r = c
                .run(&close(&format!("c{i}"), "two", &format!("t{i}")), T)
                .await?;
            assert_eq!(r.outcome, ok, "{r:?}");
        }
        cluster.shutdown().await?;
    }
    eprintln!(
        "two image stores, 2 images x 3 opens:\n  {}",
        summary.join("\n  ")
    );
    Ok(())
}

/// Regression: a second daemon told to use no bridge deleted the host's `docker0`, and every
/// `docker build` with a `RUN` step failed afterwards (the image and fleet tests).
#[test]
fn a_second_docker_daemon_leaves_the_hosts_docker0_in_place() -> anyhow::Result<()> {
    if !tangram_tests::dockerd::available() {
        anyhow::ensure!(
            std::env::var_os("CI").is_none(),
            "a second dockerd cannot start here"
        );
        return Ok(());
    }
    let has_docker0 = || {
        std::process::Command::new("ip")
            .args(["link", "show", "docker0"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let before = has_docker0();
    let second = tangram_tests::dockerd::SecondDaemon::start()?;
    second.docker(&["info"])?;
    assert_eq!(
        has_docker0(),
        before,
        "docker0 while the second daemon runs"
    );
    drop(second);
    assert_eq!(
        has_docker0(),
        before,
        "docker0 after the second daemon stopped"
    );
    Ok(())
}
