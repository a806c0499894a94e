//! Sandbox images pulled from a registry (issue 15): a real registry with basic auth on
//! loopback (`deploy/install-registry.sh`), images pushed to it from the local sandbox image,
//! and a real worker whose `sandbox.pull` allow-list and credentials file say what it may
//! pull. An open of an allowed image pulls it and the sandbox runs; one outside the list, or
//! unknown to the registry, is rejected with the reason; a registry outage is an infra error.

use std::time::Duration;
use tangram_shared::{ActionSpec, InfraCode, Outcome, RejectCode};
use tangram_tests::build::{close, exec, open};
use tangram_tests::registry::{self, Registry};
use tangram_tests::Cluster;

const T: Duration = Duration::from_secs(120);
const LOCAL: &str = tangram_worker::config::DEFAULT_IMAGE;

/// An open of `image` for trajectory `t` of `job`.
fn open_image(id: &str, job: &str, t: &str, image: &str) -> tangram_shared::Action {
    let mut a = open(id, job, t);
    if let ActionSpec::SandboxOpen(o) = &mut a.spec {
        o.image = Some(image.to_string());
    }
    a
}

/// A small image of its own (a shell, 20 MB of random bytes: an id and a size of its own);
/// returns its local name.
fn distinct_image(name: &str) -> anyhow::Result<String> {
    tangram_tests::registry::small_image(&format!("tangram-test/{name}"), 20)
}

fn present(image: &str) -> bool {
    std::process::Command::new("docker")
        .args(["image", "inspect", image])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// False (after saying why) when the registry is not installed; under CI that fails the test.
fn registry_installed() -> bool {
    if registry::binary().is_some() {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| !v.is_empty()) {
        panic!("{}", registry::MISSING);
    }
    eprintln!("SKIPPED: {}", registry::MISSING);
    false
}

/// A cluster with one worker `id` that may pull from `reg`'s `tangram/*` with its
/// credentials, under `budget_mb` when given; and a client of `job` once the worker reports.
async fn pulling_worker(
    reg: &Registry,
    id: &str,
    job: &str,
    budget_mb: Option<u64>,
) -> anyhow::Result<(Cluster, tangram_tests::Client)> {
    let mut cluster = Cluster::start(&[]).await?;
    start_pulling_worker(&mut cluster, reg, id, budget_mb)?;
    let c = cluster.client(job).await?;
    c.wait_for_workers(&[id], T).await?;
    Ok((cluster, c))
}

/// Starts worker `id` in `cluster`, allowed to pull `reg`'s `tangram/*` with its credentials.
fn start_pulling_worker(
    cluster: &mut Cluster,
    reg: &Registry,
    id: &str,
    budget_mb: Option<u64>,
) -> anyhow::Result<()> {
    let raw = tangram_worker::config::RawConfig {
        id: Some(id.into()),
        nats_url: Some(cluster.nats.url()),
        cores: Some("0-1".into()),
        mem_mb: Some(4096),
        heartbeat_ms: Some(200),
        shutdown_grace_ms: Some(2000),
        sandbox: Some(tangram_worker::config::RawSandbox {
            pull: Some(vec![format!("{}/tangram/*", reg.addr)]),
            registry_auth_file: Some(reg.auth_file()?.display().to_string()),
            image_budget_mb: budget_mb,
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut config = raw.validate()?;
    config.credentials = cluster.credentials(&format!("worker-{id}"));
    cluster.start_worker_config(config);
    Ok(())
}

/// Removes the pulled images when the test ends, whatever happened.
struct Untag(Vec<String>);
impl Drop for Untag {
    fn drop(&mut self) {
        for image in &self.0 {
            let _ = std::process::Command::new("docker")
                .args(["rmi", "-f", image])
                .output();
        }
    }
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_goes_to_the_worker_holding_its_image_and_ignoring_images_spreads_it(
) -> anyhow::Result<()> {
    if !registry_installed() {
        return Ok(());
    }
    tangram_tests::init_logging();
    let reg = Registry::start("tangram", "s3cret")?;
    let n = std::process::id();
    let small = distinct_image(&format!("place-{n}"))?;
    let image = reg.push(&small, &format!("tangram/place:{n}"))?;
    let _untag = Untag(vec![image.clone(), small.clone()]);
    let ok = Outcome::Completed { exit_code: 0 };
    for aware in [true, false] {
        // Both workers share this machine's Docker daemon: once one pulled the image, the
        // other finds it too, so the runs differ in placement only.
        let _ = std::process::Command::new("docker")
            .args(["rmi", "-f", &image])
            .output();
        let mut cluster = Cluster::start_without_scheduler(&[]).await?;
        start_pulling_worker(&mut cluster, &reg, "place-a", None)?;
        start_pulling_worker(&mut cluster, &reg, "place-b", None)?;
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
    if !registry_installed() {
        return Ok(());
    }
    tangram_tests::init_logging();
    let reg = Registry::start("tangram", "s3cret")?;
    let n = std::process::id();
    let small = distinct_image(&format!("prepull-{n}"))?;
    let image = reg.push(&small, &format!("tangram/prepull:{n}"))?;
    let _untag = Untag(vec![image.clone(), small.clone()]);
    // With users and permissions: the worker may answer pre-pulls, an operator and a job's
    // rollout may ask.
    let mut cluster = Cluster::start_secured_with(&[], &["pre-a"], &["pre"]).await?;
    start_pulling_worker(&mut cluster, &reg, "pre-a", None)?;
    let c = cluster.client("pre").await?;
    c.wait_for_workers(&["pre-a"], T).await?;

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
    let other = format!("{}/other/app:{n}", reg.addr);
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
    if !registry_installed() {
        return Ok(());
    }
    tangram_tests::init_logging();
    let reg = Registry::start("tangram", "s3cret")?;
    let n = std::process::id();
    let small = distinct_image(&format!("share-{n}"))?;
    let image = reg.push(&small, &format!("tangram/share:{n}"))?;
    let _untag = Untag(vec![image.clone(), small.clone()]);
    let (_cluster, c) = pulling_worker(&reg, "share-a", "share", None).await?;
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
    // One pull served them all: each open reports that pull, to the microsecond.
    assert!(pulls[0] > 0, "{pulls:?}");
    assert!(pulls.iter().all(|&p| p == pulls[0]), "{pulls:?}");
    Ok(())
}

/// Starts worker `id` on the Docker daemon at `docker_host` (the machine's own when `None`),
/// with `image` as its default and `reg`'s `tangram/*` allowed.
fn start_worker_on(
    cluster: &mut Cluster,
    reg: &Registry,
    id: &str,
    docker_host: Option<&str>,
    image: &str,
) -> anyhow::Result<()> {
    let raw = tangram_worker::config::RawConfig {
        id: Some(id.into()),
        nats_url: Some(cluster.nats.url()),
        cores: Some("0-1".into()),
        mem_mb: Some(4096),
        heartbeat_ms: Some(200),
        shutdown_grace_ms: Some(2000),
        sandbox: Some(tangram_worker::config::RawSandbox {
            image: Some(image.into()),
            docker_host: docker_host.map(str::to_string),
            pull: Some(vec![format!("{}/tangram/*", reg.addr)]),
            registry_auth_file: Some(reg.auth_file()?.display().to_string()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut config = raw.validate()?;
    config.credentials = cluster.credentials(&format!("worker-{id}"));
    cluster.start_worker_config(config);
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
        start_worker_on(&mut cluster, &reg, "two-a", None, &base)?;
        start_worker_on(&mut cluster, &reg, "two-b", Some(&second.socket), &base)?;
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
