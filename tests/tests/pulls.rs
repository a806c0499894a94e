//! Sandbox images pulled from a registry (issue 15): a real registry with basic auth on
//! loopback (`deploy/install-registry.sh`), images pushed to it from the local sandbox image,
//! and a real worker whose `sandbox.pull` allow-list and credentials file say what it may
//! pull. An open of an allowed image pulls it and the sandbox runs; one outside the list, or
//! unknown to the registry, is rejected with the reason; a registry outage is an infra error.

use std::time::Duration;
use tangram_shared::{InfraCode, Outcome, RejectCode};
use tangram_tests::build::{close, exec};
use tangram_tests::images::{
    distinct_image, open_image, present, pulling_worker, registry_installed, registry_with_image,
    start_worker_on, Untag,
};
use tangram_tests::registry::Registry;
use tangram_tests::Cluster;

const T: Duration = Duration::from_secs(120);
const LOCAL: &str = tangram_worker::config::DEFAULT_IMAGE;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_pulls_an_allowed_image_and_refuses_or_fails_the_rest_clearly() -> anyhow::Result<()>
{
    if !registry_installed() {
        return Ok(());
    }
    tangram_tests::init_logging();
    let mut reg = Registry::start("tangram", "s3cret")?;
    let tag = format!("t{}", std::process::id());
    let small = distinct_image(&format!("pull-{tag}"))?;
    let pulled = reg.push(&small, &format!("tangram/pulltest:{tag}"))?;
    let later = reg.push(&small, &format!("tangram/pulltest:{tag}-later"))?;
    let _untag = Untag(vec![pulled.clone(), later.clone(), small.clone()]);

    let (_cluster, c) = pulling_worker(&reg, "pull-a", "pulls", None).await?;

    // Allowed and in the registry: pulled with the worker's credentials, and the sandbox runs.
    let r = c.run(&open_image("o1", "pulls", "t1", &pulled), T).await?;
    assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
    assert!(r.timing.pull_us > 0, "the pull is reported: {:?}", r.timing);
    assert!(r.timing.pull_us <= r.timing.overhead_us, "{:?}", r.timing);
    // The worker advertises what it holds: the default image and the pulled one.
    let mut advertised = Vec::new();
    for _ in 0..100 {
        let st = c.status().await?;
        advertised = st
            .workers
            .iter()
            .filter(|w| w.id == "pull-a")
            .flat_map(|w| w.images.iter().map(|i| i.reference.clone()))
            .collect();
        if advertised.contains(&pulled) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        advertised.contains(&pulled) && advertised.iter().any(|r| r == LOCAL),
        "{advertised:?}"
    );
    let r = c
        .run(
            &exec("x1", "pulls", "t1", &["sh", "-c", "echo $((6 * 7))"], 1, 1),
            T,
        )
        .await?;
    assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
    assert_eq!(r.stdout.trim(), "42");

    // Outside the allow-list: rejected before any pull, saying why.
    let other = format!("{}/other/app:1", reg.addr);
    let r = c.run(&open_image("o2", "pulls", "t2", &other), T).await?;
    match &r.outcome {
        Outcome::Rejected { code, reason } => {
            assert_eq!(*code, RejectCode::InvalidField);
            assert!(reason.contains("allow-list"), "{reason}");
        }
        o => panic!("{o:?}"),
    }
    // Allowed but unknown to the registry: rejected, saying so.
    let unknown = format!("{}/tangram/nope:1", reg.addr);
    let r = c.run(&open_image("o3", "pulls", "t3", &unknown), T).await?;
    match &r.outcome {
        Outcome::Rejected { code, reason } => {
            assert_eq!(*code, RejectCode::InvalidField);
            assert!(reason.contains("not in its registry"), "{reason}");
        }
        o => panic!("{o:?}"),
    }

    // The registry goes down: an allowed image the worker lacks is an infra error.
    reg.stop();
    let r = c.run(&open_image("o4", "pulls", "t4", &later), T).await?;
    match &r.outcome {
        Outcome::InfraError { code, reason } => {
            assert_eq!(*code, InfraCode::Runtime);
            assert!(reason.contains("pulling image"), "{reason}");
        }
        o => panic!("{o:?}"),
    }
    // The worker is still serving: the image it pulled before opens again at once.
    let r = c.run(&open_image("o5", "pulls", "t5", &pulled), T).await?;
    assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
    assert_eq!(r.timing.pull_us, 0, "nothing was pulled: {:?}", r.timing);
    // Closed, the sandboxes go: nothing of this worker is left behind.
    for t in ["t1", "t5"] {
        let r = c.run(&close(&format!("c-{t}"), "pulls", t), T).await?;
        assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
    }
    assert_eq!(tangram_tests::containers_of("pull-a"), 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pulled_images_over_the_disk_budget_go_least_recently_used_first_never_one_in_use(
) -> anyhow::Result<()> {
    if !registry_installed() {
        return Ok(());
    }
    tangram_tests::init_logging();
    let reg = Registry::start("tangram", "s3cret")?;
    let n = std::process::id();
    let (local_a, local_b) = (
        distinct_image(&format!("gc-a-{n}"))?,
        distinct_image(&format!("gc-b-{n}"))?,
    );
    let a = reg.push(&local_a, &format!("tangram/gc:a{n}"))?;
    let b = reg.push(&local_b, &format!("tangram/gc:b{n}"))?;
    let _untag = Untag(vec![a.clone(), b.clone(), local_a.clone(), local_b.clone()]);
    // Each image is about 23 MB (its layers counted in full): one fits the budget, two do
    // not.
    let (_cluster, c) = pulling_worker(&reg, "gc-a", "gc", Some(35)).await?;
    let ok = Outcome::Completed { exit_code: 0 };

    // a is pulled, used, and let go.
    let r = c.run(&open_image("o1", "gc", "t1", &a), T).await?;
    assert_eq!(r.outcome, ok, "{r:?}");
    let r = c.run(&close("c1", "gc", "t1"), T).await?;
    assert_eq!(r.outcome, ok, "{r:?}");
    // Pulling b takes the images over the budget: a, unused, goes; b stays.
    let r = c.run(&open_image("o2", "gc", "t2", &b), T).await?;
    assert_eq!(r.outcome, ok, "{r:?}");
    assert!(!present(&a), "{a} was kept over the budget");
    assert!(present(&b));
    // Pulling a again goes over the budget, but b is in use (t2's sandbox): both stay.
    let r = c.run(&open_image("o3", "gc", "t3", &a), T).await?;
    assert_eq!(r.outcome, ok, "{r:?}");
    assert!(
        present(&a) && present(&b),
        "an image in use or just pulled was removed"
    );
    for t in ["t2", "t3"] {
        let r = c.run(&close(&format!("c-{t}"), "gc", t), T).await?;
        assert_eq!(r.outcome, ok, "{r:?}");
    }
    assert_eq!(tangram_tests::containers_of("gc-a"), 0);
    Ok(())
}

/// `tangram images prepull` with these arguments against `cluster`; its exit status and
/// parsed JSON replies.
fn prepull_cli(
    cluster: &Cluster,
    seed: &str,
    args: &[&str],
) -> anyhow::Result<(bool, Vec<serde_json::Value>)> {
    let creds = cluster.creds.as_ref().expect("a secured cluster");
    let out = std::process::Command::new(tangram_tests::built_binary("tangram"))
        .args(["images", "prepull", "--json", "--timeout-s", "60"])
        .args(args)
        .arg("--nats-url")
        .arg(cluster.nats.url())
        .arg("--nkey-file")
        .arg(creds.join(seed))
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let replies = serde_json::from_str(&stdout).map_err(|e| {
        anyhow::anyhow!(
            "prepull printed no JSON ({e}):\n{}",
            tangram_tests::output_text(&out)
        )
    })?;
    Ok((out.status.success(), replies))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepull_makes_an_image_present_so_the_open_pulls_nothing() -> anyhow::Result<()> {
    let Some((reg, image, _untag)) = registry_with_image("prepull")? else {
        return Ok(());
    };
    // With users and permissions: the worker may answer pre-pulls, an operator and a job's
    // rollout may ask.
    let mut cluster = Cluster::start_secured_with(&[], &["pre-a"], &["pre"]).await?;
    start_worker_on(&mut cluster, &reg, "pre-a", None, None, None)?;
    let c = cluster.client("pre").await?;
    // The CLI picks workers from the scheduler's status: wait until it lists this one
    // (regression: a heartbeat seen by the test, not yet by the scheduler, and the CLI found
    // "no CPU worker taking new work").
    c.wait_for_scheduler_to_know(&["pre-a"], T).await?;

    let (ok, replies) = prepull_cli(&cluster, "operator.nk", &["--workers", "1", &image])?;
    assert!(ok, "{replies:?}");
    assert_eq!(replies.len(), 1, "{replies:?}");
    assert_eq!(replies[0]["worker"], "pre-a");
    assert_eq!(replies[0]["outcome"], "pulled", "{replies:?}");
    assert!(replies[0]["pull_ms"].is_u64(), "{replies:?}");
    // Asked again, by the job's rollout: present, nothing pulled.
    let (ok, replies) = prepull_cli(&cluster, "rollout-pre.nk", &["--worker", "pre-a", &image])?;
    assert!(ok, "{replies:?}");
    assert_eq!(replies[0]["outcome"], "present", "{replies:?}");
    // Outside the allow-list: refused with the reason, and the command fails.
    let other = format!("{}/other/app:{}", reg.addr, std::process::id());
    let (ok, replies) = prepull_cli(&cluster, "operator.nk", &[&other])?;
    assert!(!ok);
    assert_eq!(replies[0]["outcome"], "refused", "{replies:?}");
    assert!(
        replies[0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("allow")),
        "{replies:?}"
    );
    // A malformed request gets a readable refusal, and the worker keeps answering.
    let nc = tangram_nats::auth::connect(
        &cluster.nats.url(),
        "prepull-test",
        &cluster.credentials("operator"),
    )
    .await?;
    let reply = nc
        .request("tangram.v1.prepull.pre-a", "not json".into())
        .await?;
    let reply: serde_json::Value = serde_json::from_slice(&reply.payload)?;
    assert_eq!(reply["outcome"], "refused", "{reply}");
    assert!(
        reply["error"].as_str().is_some_and(|e| e.contains("JSON")),
        "{reply}"
    );
    // The open finds the image: no pull on its path.
    let r = c.run(&open_image("o1", "pre", "t1", &image), T).await?;
    assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
    assert_eq!(r.timing.pull_us, 0, "{:?}", r.timing);
    cluster.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opens_of_one_image_at_once_share_one_pull() -> anyhow::Result<()> {
    let Some((reg, image, _untag)) = registry_with_image("share")? else {
        return Ok(());
    };
    let (cluster, c) = pulling_worker(&reg, "share-a", "share", None).await?;
    // Three opens of the image at once, on the one worker.
    let (a, b, d) = (
        open_image("o1", "share", "t1", &image),
        open_image("o2", "share", "t2", &image),
        open_image("o3", "share", "t3", &image),
    );
    let (r1, r2, r3) = tokio::join!(c.run(&a, T), c.run(&b, T), c.run(&d, T));
    let pulls: Vec<u64> = [r1?, r2?, r3?]
        .iter()
        .map(|r| {
            assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
            r.timing.pull_us
        })
        .collect();
    // One pull served them: each open that waited for it reports that pull, to the
    // microsecond (an open placed after it ended finds the image and reports none).
    let distinct: std::collections::BTreeSet<u64> =
        pulls.iter().copied().filter(|&p| p > 0).collect();
    assert_eq!(distinct.len(), 1, "one pull, not one per open: {pulls:?}");
    // Closed, the sandboxes go (regression: this test left its three sandboxes running).
    for t in ["t1", "t2", "t3"] {
        let r = c.run(&close(&format!("c-{t}"), "share", t), T).await?;
        assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
    }
    assert_eq!(tangram_tests::containers_of("share-a"), 0);
    cluster.shutdown().await?;
    Ok(())
}
