//! The warm pool on the in-memory runtime, on paused time.

use super::*;
use crate::sandbox::InMemorySandboxes;
use std::sync::atomic::{AtomicBool, Ordering};

fn at(base: Instant, ms: &[u64]) -> Vec<Instant> {
    ms.iter()
        .map(|m| base + Duration::from_millis(*m))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn the_target_follows_the_largest_burst_within_a_creation_time() {
    let t = Instant::now();
    let one_s = Duration::from_secs(1);
    // No opens: the floor.
    assert_eq!(target(&[], one_s, 2, 8), 2);
    // Three within a second, then one alone: 3 with a quarter on top.
    assert_eq!(target(&at(t, &[0, 100, 200, 5000]), one_s, 0, 8), 4);
    // Spread out: one at a time.
    assert_eq!(target(&at(t, &[0, 2000, 4000]), one_s, 0, 8), 2);
    // Never above the ceiling.
    let burst: Vec<u64> = (0..40).collect();
    assert_eq!(target(&at(t, &burst), one_s, 0, 8), 8);
}

struct Fixture {
    inner: Arc<InMemorySandboxes>,
    pool: Arc<WarmPool>,
    pressure: Arc<AtomicBool>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

fn fixture(min: usize, max: usize) -> Fixture {
    let inner = Arc::new(InMemorySandboxes::noop());
    let pressure = Arc::new(AtomicBool::new(false));
    let p = pressure.clone();
    let pool = Arc::new(WarmPool::with_pressure(
        inner.clone(),
        "img",
        "0",
        min,
        max,
        Box::new(move || p.load(Ordering::SeqCst)),
    ));
    let stop = CancellationToken::new();
    let task = tokio::spawn(pool.clone().run(stop.clone()));
    Fixture {
        inner,
        pool,
        pressure,
        stop,
        task,
    }
}

impl Fixture {
    async fn until_ready(&self, n: u32) {
        let deadline = Instant::now() + Duration::from_secs(600);
        while self.pool.report().ready != n {
            assert!(
                Instant::now() < deadline,
                "never {n} ready: {:?}",
                self.pool.report()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

fn key(t: &str) -> SandboxKey {
    SandboxKey {
        job: "j".into(),
        trajectory: t.into(),
    }
}

#[tokio::test(start_paused = true)]
async fn an_open_claims_a_parked_sandbox_once_and_the_pool_fills_again() {
    let f = fixture(2, 4);
    f.until_ready(2).await;
    let open = SandboxOpen::default();
    let a = f.pool.start(&key("t1"), &open, "0").await.unwrap();
    let b = f.pool.start(&key("t2"), &open, "0").await.unwrap();
    assert_ne!(a.id, b.id, "one sandbox per trajectory");
    let r = f.pool.report();
    assert_eq!((r.hits, r.misses), (2, 0), "{r:?}");
    // Two opens at once: the pool grows to cover such a burst (2 * 1.25, rounded up).
    f.until_ready(3).await;
    assert_eq!(f.pool.report().target, 3);
    // A claimed sandbox is never handed out again, even after it is closed.
    f.pool.remove(&a).await.unwrap();
    let mut seen = vec![b.id.clone()];
    for i in 0..3 {
        let h = f
            .pool
            .start(&key(&format!("u{i}")), &open, "0")
            .await
            .unwrap();
        assert!(
            !seen.contains(&h.id) && h.id != a.id,
            "{} handed out twice",
            h.id
        );
        seen.push(h.id);
    }
    assert_eq!(f.pool.report().hits, 5);
    f.stop.cancel();
    f.task.await.unwrap();
    // Stopping removes the parked ones; the claimed ones are their trajectories' to close.
    assert_eq!(f.inner.open_count(), seen.len());
    assert_eq!(f.pool.report().ready, 0);
}

#[tokio::test(start_paused = true)]
async fn an_open_the_pool_cannot_serve_creates_its_own_and_counts_no_claim() {
    let f = fixture(1, 2);
    f.until_ready(1).await;
    let mut open = SandboxOpen::default();
    open.env.insert("LANG".into(), "C".into());
    f.pool.start(&key("t1"), &open, "0").await.unwrap();
    let other = SandboxOpen {
        image: Some("another/image".into()),
        ..Default::default()
    };
    f.pool.start(&key("t2"), &other, "0").await.unwrap();
    let r = f.pool.report();
    assert_eq!((r.ready, r.hits, r.misses), (1, 0, 0), "{r:?}");
    // An open of the default image by name matches.
    let named = SandboxOpen {
        image: Some("img".into()),
        ..Default::default()
    };
    f.pool.start(&key("t3"), &named, "0").await.unwrap();
    assert_eq!(f.pool.report().hits, 1);
    f.stop.cancel();
    f.task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn memory_pressure_empties_the_pool_and_relief_fills_it() {
    let f = fixture(3, 3);
    f.until_ready(3).await;
    f.pressure.store(true, Ordering::SeqCst);
    f.until_ready(0).await;
    assert_eq!(f.inner.open_count(), 0, "released, not only forgotten");
    // An open under pressure still works: it creates its own.
    let h = f.pool.start(&key("t1"), &SandboxOpen::default(), "0").await;
    assert!(h.is_ok());
    assert_eq!(f.pool.report().misses, 1);
    f.pressure.store(false, Ordering::SeqCst);
    f.until_ready(3).await;
    f.stop.cancel();
    f.task.await.unwrap();
}

/// `tangram down` left warm-pool containers behind: a stop during a creation dropped the
/// creation, which the daemon finished anyway, and no one removed what it made.
#[tokio::test(start_paused = true)]
async fn a_pool_stopped_while_creating_removes_what_the_creation_makes() {
    let inner = Arc::new(InMemorySandboxes::with_start_delay(Duration::from_secs(2)));
    let pool = Arc::new(WarmPool::with_pressure(
        inner.clone(),
        "img",
        "0",
        1,
        1,
        Box::new(|| false),
    ));
    let stop = CancellationToken::new();
    let task = tokio::spawn(pool.clone().run(stop.clone()));
    // The first creation is under way.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(inner.open_count(), 1);
    assert_eq!(pool.report().ready, 0);
    stop.cancel();
    task.await.unwrap();
    assert_eq!(
        inner.open_count(),
        0,
        "the sandbox being created outlived the pool"
    );
}
