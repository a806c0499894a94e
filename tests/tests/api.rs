//! External API quota end to end: a local rate-limited HTTP server started by each test,
//! a worker that calls it with the fleet's credential, and the scheduler's pooled quota.

use std::time::Duration;
use tangram_shared::{ActionId, Outcome, RejectCode};
use tangram_tests::api_server::{search_provider, RateLimitedApi};
use tangram_tests::build::api;
use tangram_tests::Cluster;
use tangram_worker::providers::ProviderConfig;

const T: Duration = Duration::from_secs(60);

fn provider(
    url: &str,
    rate: f64,
    burst: u32,
    concurrency: u32,
    cred: &std::path::Path,
) -> ProviderConfig {
    ProviderConfig {
        credential_file: Some(cred.to_path_buf()),
        timeout_ms: 10_000,
        allow_headers: vec!["accept".into()],
        max_body_bytes: 64,
        ..search_provider(url, rate, burst, concurrency)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_jobs_share_a_pooled_quota_by_weight_without_a_single_violation() -> anyhow::Result<()>
{
    let (rate, burst) = (40.0, 4);
    let server = RateLimitedApi::start(rate, burst as f64, Duration::from_millis(20)).await?;
    let dir = tempfile::tempdir()?;
    let cred = dir.path().join("search.key");
    std::fs::write(&cred, "test-secret\n")?;
    let mut cluster = Cluster::start(&[]).await?;
    cluster
        .restart_scheduler_with(|c| {
            c.job_weights.insert("alpha".into(), 3.0);
            c.job_weights.insert("beta".into(), 1.0);
        })
        .await?;
    cluster.start_api_worker(
        "api-share",
        vec![provider(&server.url, rate, burst, 8, &cred)],
    )?;
    let a = cluster.client("alpha").await?;
    let b = cluster.client("beta").await?;
    a.wait_for_workers(&["api-share"], T).await?;
    // Both jobs backlogged: 120 calls each, from 40 trajectories each, submitted at once.
    let n = 120;
    for i in 0..n {
        a.submit(&api(
            &format!("a{i}"),
            "alpha",
            &format!("t{}", i % 40),
            "search",
            "/search",
        ))
        .await?;
        b.submit(&api(
            &format!("b{i}"),
            "beta",
            &format!("t{}", i % 40),
            "search",
            "/search",
        ))
        .await?;
    }
    let mut ok = 0;
    for i in 0..n {
        for (c, id) in [(&a, format!("a{i}")), (&b, format!("b{i}"))] {
            let r = c.result(&ActionId::new(id)?, T).await?;
            assert!(matches!(r.outcome, Outcome::Completed { .. }), "{r:?}");
            let http = r.http.expect("reply");
            ok += (http.status == 200) as usize;
            // The reply is capped, and headers outside the allow-list do not come back.
            assert!(http.body.len() <= 64);
            assert!(!http.headers.contains_key("x-internal"));
            assert!(!format!("{:?}", r.stdout).contains("test-secret"));
        }
    }
    assert_eq!(
        server.violations(),
        0,
        "the provider saw requests beyond its rate"
    );
    assert_eq!(ok, 2 * n, "every call got a 200");
    let seen = server.seen();
    assert!(
        seen.iter()
            .all(|s| s.auth.as_deref() == Some("Bearer test-secret")),
        "the fleet's credential is sent"
    );
    // While both are backlogged (the first 140 calls: alpha's 120 end near 160), alpha gets
    // 3/4 and beta 1/4, each within 10% of its weight.
    let share = server.share(140);
    let alpha = share.get("alpha").copied().unwrap_or(0) as f64 / 140.0;
    let beta = share.get("beta").copied().unwrap_or(0) as f64 / 140.0;
    assert!(
        (alpha - 0.75).abs() <= 0.075 && (beta - 0.25).abs() <= 0.025,
        "shares {share:?}"
    );
    // The observed rate stays at the configured one.
    let span = seen.last().unwrap().at - seen.first().unwrap().at;
    let observed = (seen.len() - 1) as f64 / span.as_secs_f64();
    eprintln!("observed {observed:.2}/s; shares of the first 140: {share:?}");
    assert!(observed <= rate * 1.02, "observed {observed:.1}/s");
    assert!(
        observed >= rate * 0.8,
        "the quota is used, not wasted: {observed:.1}/s"
    );
    cluster.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_never_exceeds_the_providers_cap() -> anyhow::Result<()> {
    let server = RateLimitedApi::start(1000.0, 100.0, Duration::from_millis(200)).await?;
    let dir = tempfile::tempdir()?;
    let cred = dir.path().join("k");
    std::fs::write(&cred, "k\n")?;
    let mut cluster = Cluster::start(&[]).await?;
    // Two workers can call it; the cap of 3 holds for the fleet, not per worker.
    cluster.start_api_worker("api-c1", vec![provider(&server.url, 1000.0, 100, 3, &cred)])?;
    cluster.start_api_worker("api-c2", vec![provider(&server.url, 1000.0, 100, 3, &cred)])?;
    let c = cluster.client("rl").await?;
    c.wait_for_workers(&["api-c1", "api-c2"], T).await?;
    for i in 0..24 {
        c.submit(&api(
            &format!("c{i}"),
            "rl",
            &format!("t{i}"),
            "search",
            "/search",
        ))
        .await?;
    }
    for i in 0..24 {
        let r = c.result(&ActionId::new(format!("c{i}"))?, T).await?;
        assert_eq!(r.http.map(|h| h.status), Some(200));
    }
    assert_eq!(
        server.max_inflight(),
        3,
        "the cap is reached and never passed"
    );
    cluster.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_answering_429_is_backed_off_and_then_recovers() -> anyhow::Result<()> {
    let rate = 50.0;
    let server = RateLimitedApi::start(rate, 5.0, Duration::from_millis(5)).await?;
    let dir = tempfile::tempdir()?;
    let cred = dir.path().join("k");
    std::fs::write(&cred, "k\n")?;
    let mut cluster = Cluster::start(&[]).await?;
    cluster.start_api_worker("api-429", vec![provider(&server.url, rate, 5, 16, &cred)])?;
    let c = cluster.client("rl").await?;
    c.wait_for_workers(&["api-429"], T).await?;
    // The provider tightens to 10/s; a steady backlog keeps coming.
    server.tighten(Some(10.0));
    let total = 400;
    for i in 0..total {
        c.submit(&api(
            &format!("q{i}"),
            "rl",
            &format!("t{}", i % 50),
            "search",
            "/search",
        ))
        .await?;
    }
    let t0 = server.elapsed();
    tokio::time::sleep(Duration::from_secs(5)).await;
    server.tighten(None);
    let t1 = server.elapsed();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let seen = server.seen();
    let in_window = |from: Duration, to: Duration, status: Option<u16>| {
        seen.iter()
            .filter(|s| s.at >= from && s.at < to && status.is_none_or(|st| s.status == st))
            .count()
    };
    // Without adaptation the 40/s excess over 5 s would be about 200 refusals.
    let refused = in_window(t0, t1, Some(429));
    let served = in_window(t0, t1, Some(200));
    assert!(refused > 0, "the tightened provider pushed back");
    assert!(
        refused <= 50,
        "the scheduler backed off: {refused} refusals in 5 s"
    );
    assert!(
        served >= 25,
        "and kept using what the provider allows: {served} served in 5 s"
    );
    // Lifted: the rate climbs back past the tightened limit towards the configured one.
    let recovered = in_window(
        t1 + Duration::from_secs(4),
        t1 + Duration::from_secs(5),
        None,
    );
    eprintln!("tightened 5 s: {refused} refused, {served} served; recovered to {recovered}/s");
    assert!(recovered >= 20, "recovered to {recovered}/s");
    assert_eq!(server.violations(), 0);
    // Everything still ends with a result.
    for i in 0..total {
        let r = c.result(&ActionId::new(format!("q{i}"))?, T).await?;
        assert!(r.http.is_some(), "{r:?}");
    }
    cluster.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_providers_disallowed_paths_and_headers_are_rejected_with_the_reason(
) -> anyhow::Result<()> {
    let server = RateLimitedApi::start(100.0, 10.0, Duration::from_millis(1)).await?;
    let dir = tempfile::tempdir()?;
    let cred = dir.path().join("k");
    std::fs::write(&cred, "k\n")?;
    let mut cluster = Cluster::start(&[]).await?;
    cluster.start_api_worker("api-rej", vec![provider(&server.url, 100.0, 10, 4, &cred)])?;
    let c = cluster.client("rl").await?;
    c.wait_for_workers(&["api-rej"], T).await?;
    let r = c.run(&api("r1", "rl", "t", "nope", "/search"), T).await?;
    match &r.outcome {
        Outcome::Rejected { code, reason } => {
            assert_eq!(*code, RejectCode::UnknownProvider);
            assert!(
                reason.contains("nope") && reason.contains("search"),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
    let r = c
        .run(&api("r2", "rl", "t", "search", "/admin/delete"), T)
        .await?;
    match &r.outcome {
        Outcome::Rejected { code, reason } => {
            assert_eq!(*code, RejectCode::NotAllowed);
            assert!(
                reason.contains("/admin/delete") && reason.contains("GET /search"),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
    let mut with_header = api("r3", "rl", "t", "search", "/search");
    if let tangram_shared::ActionSpec::Api(a) = &mut with_header.spec {
        a.headers
            .insert("Authorization".into(), "Bearer stolen".into());
    }
    let r = c.run(&with_header, T).await?;
    assert!(
        matches!(
            &r.outcome,
            Outcome::Rejected {
                code: RejectCode::NotAllowed,
                ..
            }
        ),
        "{r:?}"
    );
    assert!(
        server.seen().is_empty(),
        "nothing rejected reached the provider"
    );
    let rejected = |dl: &[(String, String)]| {
        dl.iter()
            .filter(|(code, _)| code == "not_allowed" || code == "unknown_provider")
            .count()
    };
    let dl = c.dead_letters_once(T, |d| rejected(d) >= 3).await?;
    assert_eq!(rejected(&dl), 3, "{dl:?}");
    let r = c.run(&api("r4", "rl", "t", "search", "/search"), T).await?;
    assert_eq!(r.http.map(|h| h.status), Some(200));
    cluster.shutdown().await?;
    Ok(())
}
