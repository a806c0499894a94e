//! The warm pool on the in-memory runtime, on paused time.

use super::*;
use crate::sandbox::InMemorySandboxes;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

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

/// A runtime that records what the pool asks of it, and refuses to start `refused`.
#[derive(Debug, Default)]
struct Recording {
    inner: InMemorySandboxes,
    started: Mutex<Vec<(Option<String>, u64)>>,
    resized: Mutex<Vec<(String, u64)>>,
    refused: Option<String>,
}

impl SandboxRuntime for Recording {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Noop
    }
    fn validate(&self) -> BoxFuture<'_, Result<(), SandboxError>> {
        self.inner.validate()
    }
    fn recover(&self) -> BoxFuture<'_, Result<usize, SandboxError>> {
        self.inner.recover()
    }
    fn start<'a>(
        &'a self,
        key: &'a SandboxKey,
        open: &'a SandboxOpen,
        parking: &'a str,
    ) -> BoxFuture<'a, Result<SandboxHandle, SandboxError>> {
        Box::pin(async move {
            if open.image.is_some() && open.image == self.refused {
                return Err(SandboxError::ImageRefused("not allowed".into()));
            }
            self.started
                .lock()
                .unwrap()
                .push((open.image.clone(), open.workdir_mb));
            self.inner.start(key, open, parking).await
        })
    }
    fn grant<'a>(
        &'a self,
        s: &'a SandboxHandle,
        cpus: &'a str,
        quota: i64,
        widening: bool,
    ) -> BoxFuture<'a, Result<(), SandboxError>> {
        self.inner.grant(s, cpus, quota, widening)
    }
    fn exec<'a>(
        &'a self,
        s: &'a SandboxHandle,
        r: ExecRequest<'a>,
    ) -> BoxFuture<'a, Result<ExecOutput, SandboxError>> {
        self.inner.exec(s, r)
    }
    fn resize<'a>(
        &'a self,
        s: &'a SandboxHandle,
        memory_mb: u64,
    ) -> BoxFuture<'a, Result<(), SandboxError>> {
        self.resized.lock().unwrap().push((s.id.clone(), memory_mb));
        Box::pin(async { Ok(()) })
    }
    fn stop<'a>(&'a self, s: &'a SandboxHandle) -> BoxFuture<'a, ()> {
        self.inner.stop(s)
    }
    fn remove<'a>(&'a self, s: &'a SandboxHandle) -> BoxFuture<'a, Result<(), SandboxError>> {
        self.inner.remove(s)
    }
}

fn recording_pool(
    rt: Recording,
    min: usize,
    max: usize,
) -> (
    Arc<Recording>,
    Arc<WarmPool>,
    CancellationToken,
    tokio::task::JoinHandle<()>,
) {
    let rt = Arc::new(rt);
    let pool = Arc::new(WarmPool::with_pressure(
        rt.clone(),
        "img",
        "0",
        min,
        max,
        Box::new(|| false),
    ));
    let stop = CancellationToken::new();
    let task = tokio::spawn(pool.clone().run(stop.clone()));
    (rt, pool, stop, task)
}

async fn until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(600);
    while !done() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A held-out run of opens asking 256 MB found the pool full and created every one cold.
#[tokio::test(start_paused = true)]
async fn an_open_with_its_own_memory_and_environment_claims_a_parked_sandbox_fitted_to_it() {
    let (rt, pool, stop, task) = recording_pool(Recording::default(), 1, 2);
    until("one parked", || pool.report().ready == 1).await;
    let mut open = SandboxOpen {
        memory_mb: 256,
        ..Default::default()
    };
    open.env.insert("LANG".into(), "C".into());
    let h = pool.start(&key("t1"), &open, "0").await.unwrap();
    let r = pool.report();
    assert_eq!((r.hits, r.misses), (1, 0), "{r:?}");
    assert_eq!(*rt.resized.lock().unwrap(), vec![(h.id.clone(), 256)]);
    assert_eq!(h.env, vec!["LANG=C".to_string()]);
    // The default memory needs no fitting.
    until("parked again", || pool.report().ready >= 1).await;
    let h2 = pool
        .start(&key("t2"), &SandboxOpen::default(), "0")
        .await
        .unwrap();
    assert_eq!(pool.report().hits, 2);
    assert_eq!(rt.resized.lock().unwrap().len(), 1);
    assert!(
        h2.env.is_empty(),
        "nothing of the previous open's environment"
    );
    stop.cancel();
    task.await.unwrap();
}

/// Every pulled task image was cold: the pool only held the default image.
#[tokio::test(start_paused = true)]
async fn opens_of_an_image_in_demand_grow_a_pool_of_that_image() {
    let (rt, pool, stop, task) = recording_pool(Recording::default(), 1, 8);
    until("one parked", || pool.report().ready == 1).await;
    let task_image = SandboxOpen {
        image: Some("task/image".into()),
        ..Default::default()
    };
    // The first open of it is cold and teaches the pool.
    pool.start(&key("t1"), &task_image, "0").await.unwrap();
    assert_eq!(pool.report().misses, 1);
    until("a parked task image", || {
        rt.started
            .lock()
            .unwrap()
            .iter()
            .filter(|(i, _)| i.as_deref() == Some("task/image"))
            .count()
            >= 2
    })
    .await;
    until("two parked", || pool.report().ready == 3).await;
    let h = pool.start(&key("t2"), &task_image, "0").await.unwrap();
    assert_eq!(pool.report().hits, 1, "{:?}", pool.report());
    assert!(h.id.starts_with("mem-warm-"), "a parked one: {}", h.id);
    // A work directory of its own size is a shape of its own: cold first.
    let big_work = SandboxOpen {
        workdir_mb: 512,
        ..Default::default()
    };
    pool.start(&key("t3"), &big_work, "0").await.unwrap();
    assert_eq!(pool.report().misses, 2);
    until("a parked big workdir", || {
        rt.started
            .lock()
            .unwrap()
            .iter()
            .any(|(i, w)| i.is_none() && *w == 512)
    })
    .await;
    // Demand ages out: a minute later only the default shape's floor stays.
    tokio::time::sleep(WINDOW + Duration::from_secs(5)).await;
    until("back to the floor", || pool.report().ready == 1).await;
    stop.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_image_the_runtime_refuses_gets_no_pool() {
    let rt = Recording {
        refused: Some("private/image".into()),
        ..Default::default()
    };
    let (rt, pool, stop, task) = recording_pool(rt, 1, 8);
    until("one parked", || pool.report().ready == 1).await;
    let refused = SandboxOpen {
        image: Some("private/image".into()),
        ..Default::default()
    };
    for i in 0..3 {
        assert!(pool
            .start(&key(&format!("t{i}")), &refused, "0")
            .await
            .is_err());
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(pool.report().target, 1, "{:?}", pool.report());
    assert_eq!(rt.started.lock().unwrap().len(), 1, "only the default one");
    stop.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_empty_pool_refills_several_at_once() {
    let inner = Arc::new(InMemorySandboxes::with_start_delay(Duration::from_secs(2)));
    let pool = Arc::new(WarmPool::with_pressure(
        inner.clone(),
        "img",
        "0",
        8,
        8,
        Box::new(|| false),
    ));
    let stop = CancellationToken::new();
    let task = tokio::spawn(pool.clone().run(stop.clone()));
    // Eight at 2 s each, REFILL_PARALLEL at a time: two rounds, not eight.
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    assert_eq!(pool.report().ready, 8, "{:?}", pool.report());
    stop.cancel();
    task.await.unwrap();
    assert_eq!(inner.open_count(), 0);
}

#[test]
fn demand_parks_the_default_first_then_the_most_asked_shapes_within_the_ceiling() {
    let t = Instant::now();
    let shape = |i: &str| Shape {
        image: i.into(),
        workdir_mb: 64,
    };
    let default = shape("img");
    let mut d = Demand::default();
    let one_s = Duration::from_secs(1);
    assert_eq!(d.targets(&default, one_s, 2, 8), vec![(default.clone(), 2)]);
    // Three of a at once, one of b, and six more images asked once each.
    for ms in [0, 10, 20] {
        d.record(t + Duration::from_millis(ms), shape("a"));
    }
    d.record(t, shape("b"));
    for i in 0..6 {
        d.record(t, shape(&format!("z{i}")));
    }
    let got = d.targets(&default, one_s, 2, 8);
    assert_eq!(got[0], (default.clone(), 2));
    assert_eq!(got[1], (shape("a"), 4), "3 at once, a quarter on top");
    assert_eq!(got[2], (shape("b"), 2));
    assert_eq!(got.len(), 1 + OTHER_SHAPES, "{got:?}");
    let total: usize = got.iter().map(|(_, n)| n).sum();
    assert_eq!(total, 8, "the ceiling holds: {got:?}");
    // Forgotten and aged out.
    d.forget(&shape("a"));
    assert!(d
        .targets(&default, one_s, 2, 8)
        .iter()
        .all(|(s, _)| s != &shape("a")));
    d.expire(t + WINDOW + Duration::from_secs(1));
    assert_eq!(d.targets(&default, one_s, 2, 8), vec![(default, 2)]);
}

#[test]
fn a_sandbox_environment_sits_under_the_command_environment() {
    let mut cmd = std::collections::BTreeMap::new();
    cmd.insert("LANG".to_string(), "C.UTF-8".to_string());
    let env = crate::sandbox::exec_env(&["LANG=C".into(), "SEED=7".into()], 2, &cmd);
    assert_eq!(env, vec!["SEED=7", "TANGRAM_CPUS=2", "LANG=C.UTF-8"]);
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
