//! End to end: a real nats-server, the scheduler, workers and the real Docker daemon.
//! Worker ids are unique per test, because a starting worker removes its id's leftovers.

use std::time::Duration;
use tangram_shared::{ActionSpec, CpuRange, InfraCode, Outcome, RejectCode};
use tangram_tests::build::{close, exec, open};
use tangram_tests::gvisor::Runtime;
use tangram_tests::{containers_of, Cluster, WorkerSpec};
use tokio::time::Instant;

const T: Duration = Duration::from_secs(60);

mod restarts;

fn exit_code(o: &Outcome) -> i32 {
    match o {
        Outcome::Completed { exit_code } => *exit_code,
        other => panic!("expected completed, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_lifecycle_exec_output_files_and_exit_codes() -> anyhow::Result<()> {
    let cluster = Cluster::start(&[WorkerSpec::new("life-a"), WorkerSpec::new("life-b")]).await?;
    let c = cluster.client("job1").await?;
    c.wait_for_workers(&["life-a", "life-b"], T).await?;

    let r = c.run(&open("o1", "job1", "t1"), T).await?;
    assert_eq!(exit_code(&r.outcome), 0, "{r:?}");
    let worker = r.placement.clone().expect("placement").worker;
    assert_eq!(containers_of(worker.as_str()), 1);

    // stdout and exit code of a real python3.
    let r = c
        .run(
            &exec("e1", "job1", "t1", &["python3", "-c", "print(6*7)"], 1, 1),
            T,
        )
        .await?;
    assert_eq!(
        (exit_code(&r.outcome), r.stdout.as_str()),
        (0, "42\n"),
        "{r:?}"
    );
    let p = r.placement.clone().expect("placement");
    assert_eq!((p.worker.clone(), p.cores), (worker.clone(), 1));
    assert!(r.timing.exec_us > 0 && r.timing.act_us >= r.timing.exec_us + r.timing.overhead_us);

    // Files written before the command; the command writes another file...
    let mut write = exec(
        "e2",
        "job1",
        "t1",
        &[
            "python3",
            "-c",
            "open('out.txt','w').write(open('in.txt').read().upper())",
        ],
        1,
        1,
    );
    if let ActionSpec::SandboxExec(e) = &mut write.spec {
        e.files.insert("in.txt".into(), "hello sandbox".into());
    }
    assert_eq!(exit_code(&c.run(&write, T).await?.outcome), 0);
    // ...which a second exec in the same container sees.
    let r = c
        .run(&exec("e3", "job1", "t1", &["cat", "out.txt"], 1, 1), T)
        .await?;
    assert_eq!(r.stdout, "HELLO SANDBOX");

    // The granted core count, as env and as the {cpus} placeholder.
    let r = c
        .run(
            &exec(
                "e4",
                "job1",
                "t1",
                &["sh", "-c", "echo $TANGRAM_CPUS {cpus} $(nproc)"],
                2,
                2,
            ),
            T,
        )
        .await?;
    assert_eq!(r.stdout, "2 2 2\n", "{r:?}");
    assert_eq!(r.placement.expect("placement").cpuset, "0-1");

    // A non-zero exit is a completed action, with stderr.
    let r = c
        .run(
            &exec(
                "e5",
                "job1",
                "t1",
                &[
                    "python3",
                    "-c",
                    "import sys; sys.stderr.write('bad'); sys.exit(3)",
                ],
                1,
                1,
            ),
            T,
        )
        .await?;
    assert_eq!((exit_code(&r.outcome), r.stderr.as_str()), (3, "bad"));

    // stdin reaches the command.
    let mut rev = exec(
        "e6",
        "job1",
        "t1",
        &["python3", "-c", "import sys; print(sys.stdin.read()[::-1])"],
        1,
        1,
    );
    if let ActionSpec::SandboxExec(e) = &mut rev.spec {
        e.stdin = Some("abc".into());
    }
    assert_eq!(c.run(&rev, T).await?.stdout, "cba\n");

    // Output over the cap is cut and flagged.
    let r = c
        .run(
            &exec(
                "e7",
                "job1",
                "t1",
                &["python3", "-c", "print('x' * 3_000_000)"],
                1,
                1,
            ),
            T,
        )
        .await?;
    assert!(
        r.truncated && r.stdout.len() == 1 << 20,
        "{} bytes",
        r.stdout.len()
    );

    // Hardening: no network, read-only root, not root.
    let r = c
        .run(
            &exec(
                "e8",
                "job1",
                "t1",
                &[
                    "sh",
                    "-c",
                    "id -u; touch /etc/x 2>/dev/null || echo ro; ls /sys/class/net",
                ],
                1,
                1,
            ),
            T,
        )
        .await?;
    assert_eq!(r.stdout, "65534\nro\nlo\n", "{r:?}");

    // Close removes the container.
    let r = c.run(&close("c1", "job1", "t1"), T).await?;
    assert_eq!(exit_code(&r.outcome), 0);
    assert_eq!(containers_of(worker.as_str()), 0);
    cluster.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_kills_the_whole_process_tree_and_the_sandbox_survives() -> anyhow::Result<()> {
    let cluster = Cluster::start(&[WorkerSpec::new("tmo-a")]).await?;
    let c = cluster.client("job1").await?;
    c.run(&open("o1", "job1", "t1"), T).await?;
    let script =
        "sleep 300 & (sleep 300 &) ; setsid sleep 300 & python3 -c 'import time; time.sleep(300)'";
    let mut a = exec("slow", "job1", "t1", &["sh", "-c", script], 1, 1);
    a.timeout_ms = 1500;
    let t = Instant::now();
    let r = c.run(&a, T).await?;
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "took {:?}",
        t.elapsed()
    );
    // Nothing but the keeper is left, and the sandbox still runs commands (regression: with
    // docker-init as PID 1 the kill took the keeper's child and the whole container down).
    let r = c
        .run(
            &exec(
                "ps",
                "job1",
                "t1",
                &[
                    "sh",
                    "-c",
                    "ps -e -o args= | grep -cE '^sleep 300$|^python3' || true",
                ],
                1,
                1,
            ),
            T,
        )
        .await?;
    assert_eq!(r.stdout.trim(), "0", "survivors: {r:?}");
    cluster.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_rejection_and_a_dead_letter_and_nothing_crashes() -> anyhow::Result<()> {
    let cluster = Cluster::start(&[WorkerSpec::new("bad-a")]).await?;
    let c = cluster.client("job1").await?;
    c.wait_for_workers(&["bad-a"], T).await?;
    let subj = "tangram.v1.action.job1.sandbox_exec";
    let mut cases: Vec<(&str, RejectCode)> = Vec::new();

    c.publish_raw(
        subj,
        Some("garbage"),
        None,
        b"\xc1\xc1\xc1 not msgpack".to_vec(),
    )
    .await?;
    cases.push(("garbage", RejectCode::Undecodable));
    let unknown = br#"{"id":"unknown","job":"job1","trajectory":"t1","spec":{"kind":"teleport"}}"#;
    c.publish_raw(
        "tangram.v1.action.job1.teleport",
        Some("unknown"),
        Some("application/json"),
        unknown.to_vec(),
    )
    .await?;
    cases.push(("unknown", RejectCode::UnknownKind));
    let missing =
        br#"{"id":"missing","job":"job1","trajectory":"t1","spec":{"kind":"sandbox_exec"}}"#;
    c.publish_raw(
        subj,
        Some("missing"),
        Some("application/json"),
        missing.to_vec(),
    )
    .await?;
    cases.push(("missing", RejectCode::InvalidField));
    let mut big = exec("big", "job1", "t1", &["true"], 1, 1);
    if let ActionSpec::SandboxExec(e) = &mut big.spec {
        e.files.insert("blob.txt".into(), "x".repeat(2 << 20));
    }
    c.submit(&big).await?;
    cases.push(("big", RejectCode::Oversized));
    c.submit(&open("open-t9", "job1", "t9")).await?;
    // Memory no worker has: 1 TiB.
    let mut huge = open("huge", "job1", "t8");
    if let ActionSpec::SandboxOpen(o) = &mut huge.spec {
        o.memory_mb = 1 << 20;
    }
    c.submit(&huge).await?;
    cases.push(("huge", RejectCode::Unsatisfiable));
    c.submit(&exec("nosandbox", "job1", "t-none", &["true"], 1, 1))
        .await?;
    cases.push(("nosandbox", RejectCode::NoSandbox));
    let mut many = exec("manycores", "job1", "t9", &["true"], 64, 64);
    many.timeout_ms = 1000;
    c.submit(&many).await?;
    cases.push(("manycores", RejectCode::Unsatisfiable));

    for (id, code) in &cases {
        let r = c.result(&tangram_shared::ActionId::new(*id)?, T).await?;
        match &r.outcome {
            Outcome::Rejected { code: got, reason } => {
                assert_eq!(got, code, "{id}: {reason}");
                assert!(!reason.is_empty());
            }
            other => panic!("{id}: expected rejected, got {other:?}"),
        }
    }
    let dead = c.dead_letters_once(T, |d| d.len() >= cases.len()).await?;
    assert_eq!(dead.len(), cases.len(), "{dead:?}");
    // An undecodable payload without any id still lands in the dead-letter stream.
    c.publish_raw(subj, None, None, b"\xc1".to_vec()).await?;
    // And the system still works.
    let r = c
        .run(&exec("after", "job1", "t9", &["echo", "ok"], 1, 1), T)
        .await?;
    assert_eq!(r.stdout, "ok\n", "{r:?}");
    let dead = c.dead_letters_once(T, |d| d.len() > cases.len()).await?;
    assert_eq!(dead.len(), cases.len() + 1, "{dead:?}");
    cluster.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_cores_run_two_cpu_bound_processes_faster_than_one() -> anyhow::Result<()> {
    two_cores_faster_than_one(Runtime::Runc).await
}

/// Allocate-on-Execution under gVisor: the grant is written to the sandbox's cgroup, which
/// holds gVisor's kernel and the processes running the sandboxed code, so the second core
/// is used there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_cores_run_two_cpu_bound_processes_faster_than_one_under_gvisor() -> anyhow::Result<()>
{
    two_cores_faster_than_one(Runtime::Gvisor).await
}

async fn two_cores_faster_than_one(rt: Runtime) -> anyhow::Result<()> {
    let cluster = rt.cluster("par-a").await?;
    let c = cluster.client("job1").await?;
    c.wait_for_workers(&["par-a"], T).await?;
    c.run(&open("o1", "job1", "t1"), T).await?;
    let burn = "python3 -c 'n=0\nfor i in range(12_000_000): n+=i'";
    let script = format!("{burn} & {burn} & wait");
    // Interleaved and repeated; the best of each is compared, so a noisy neighbour on the
    // machine has to hit every run of one setting to change the verdict.
    let mut best = [f64::MAX, f64::MAX];
    for round in 0..2 {
        for (slot, cores) in [(0usize, 1u32), (1, 2)] {
            let id = format!("r{round}-c{cores}");
            let r = c
                .run(
                    &exec(&id, "job1", "t1", &["sh", "-c", &script], cores, cores),
                    T,
                )
                .await?;
            assert_eq!(exit_code(&r.outcome), 0, "{r:?}");
            assert_eq!(r.placement.expect("placement").cores, cores);
            best[slot] = best[slot].min(r.timing.exec_us as f64 / 1e6);
        }
    }
    let exec_s = best;
    let ratio = exec_s[0] / exec_s[1];
    eprintln!(
        "{rt:?}: 1 core: {:.2} s, 2 cores: {:.2} s, speedup {ratio:.2}",
        exec_s[0], exec_s[1]
    );
    // Ideal is 2x; on a shared 2-vCPU VM we have measured 1.45x to 2.05x. 1.25x still means
    // the second core was granted and used; a missed grant gives about 1.0x.
    assert!(ratio > 1.25, "2 cores gave only {ratio:.2}x ({exec_s:?})");
    cluster.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn execs_follow_their_sandbox_across_two_workers() -> anyhow::Result<()> {
    let mut a = WorkerSpec::new("spread-a");
    let mut b = WorkerSpec::new("spread-b");
    a.mem_mb = 1024;
    b.mem_mb = 1024;
    b.grant_mode = tangram_worker::config::GrantMode::Docker;
    let cluster = Cluster::start(&[a, b]).await?;
    let c = cluster.client("job1").await?;
    c.wait_for_workers(&["spread-a", "spread-b"], T).await?;
    let mut homes = Vec::new();
    for t in 0..4 {
        let r = c
            .run(&open(&format!("o{t}"), "job1", &format!("t{t}")), T)
            .await?;
        homes.push(r.placement.expect("placement").worker);
    }
    assert_eq!(
        homes.iter().filter(|w| w.as_str() == "spread-a").count(),
        2,
        "{homes:?}"
    );
    assert_eq!(
        homes.iter().filter(|w| w.as_str() == "spread-b").count(),
        2,
        "{homes:?}"
    );
    // A fifth sandbox does not fit in memory anywhere now: it waits, then runs after a close.
    c.submit(&open("o4", "job1", "t4")).await?;
    for (t, home) in homes.iter().enumerate() {
        let r = c
            .run(
                &exec(
                    &format!("e{t}"),
                    "job1",
                    &format!("t{t}"),
                    &["sh", "-c", "echo $TANGRAM_CPUS"],
                    1,
                    2,
                ),
                T,
            )
            .await?;
        assert_eq!(
            &r.placement.as_ref().expect("placement").worker,
            home,
            "exec left its sandbox"
        );
        assert_eq!(exit_code(&r.outcome), 0, "{r:?}");
    }
    c.run(&close("c0", "job1", "t0"), T).await?;
    let r = c.result(&tangram_shared::ActionId::new("o4")?, T).await?;
    assert_eq!(exit_code(&r.outcome), 0);
    assert_eq!(r.placement.expect("placement").worker, homes[0]);
    cluster.shutdown().await
}

/// An exec's elastic core range travels as `cpus: {min, max}` (docs/PROTOCOL.md) and is the
/// action's core demand; left out, it is exactly one core; a zero or inverted range is refused.
/// Checked against JSON written by hand, not against the builder the suites use.
#[test]
fn exec_ranges_are_part_of_the_contract() {
    use tangram_shared::codec::{self, Encoding};
    let exec_json = |cpus: &str| {
        let json = format!(
            r#"{{"id":"x","job":"j","trajectory":"t","spec":{{"kind":"sandbox_exec","argv":["true"]{cpus}}}}}"#
        );
        codec::decode::<tangram_shared::Action>(json.as_bytes(), Encoding::Json)
            .unwrap_or_else(|e| panic!("{json}: {e:?}"))
    };
    let limits = tangram_shared::Limits::default();
    let ranged = exec_json(r#","cpus":{"min":1,"max":4}"#);
    assert_eq!(ranged.demand().cores, Some(CpuRange { min: 1, max: 4 }));
    assert!(ranged.validate(&limits).is_ok());
    let unranged = exec_json("");
    assert_eq!(unranged.demand().cores, Some(CpuRange { min: 1, max: 1 }));
    for bad in [
        r#","cpus":{"min":0,"max":2}"#,
        r#","cpus":{"min":4,"max":2}"#,
    ] {
        assert!(exec_json(bad).validate(&limits).is_err(), "{bad} accepted");
    }
    // The suites' builder writes the same field.
    let built = codec::encode(&exec("x", "j", "t", &["true"], 1, 4), Encoding::Json).unwrap();
    let built: serde_json::Value = serde_json::from_slice(&built).unwrap();
    assert_eq!(
        built["spec"]["cpus"],
        serde_json::json!({"min": 1, "max": 4})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_that_do_not_fit_the_workdir_are_an_infra_error_with_the_reason() -> anyhow::Result<()>
{
    let cluster = Cluster::start(&[WorkerSpec::new("full-a")]).await?;
    let c = cluster.client("job1").await?;
    let mut small = open("o1", "job1", "t1");
    if let ActionSpec::SandboxOpen(o) = &mut small.spec {
        o.workdir_mb = 1;
    }
    assert_eq!(exit_code(&c.run(&small, T).await?.outcome), 0);
    let fill = c
        .run(
            &exec(
                "fill",
                "job1",
                "t1",
                &["sh", "-c", "head -c 700000 /dev/zero > fill"],
                1,
                1,
            ),
            T,
        )
        .await?;
    assert_eq!(exit_code(&fill.outcome), 0, "{fill:?}");
    let mut big = exec("big", "job1", "t1", &["cat", "big.txt"], 1, 1);
    if let ActionSpec::SandboxExec(e) = &mut big.spec {
        e.files.insert("big.txt".into(), "y".repeat(500_000));
    }
    let r = c.run(&big, T).await?;
    match &r.outcome {
        Outcome::InfraError {
            code: InfraCode::Runtime,
            reason,
        } => assert!(reason.contains("workdir_mb"), "{reason}"),
        other => panic!("expected an infra error, got {other:?}"),
    }
    // A small file still goes through on the same sandbox once there is room.
    c.run(
        &exec("rm", "job1", "t1", &["rm", "-f", "fill", "big.txt"], 1, 1),
        T,
    )
    .await?;
    let mut ok = exec("ok", "job1", "t1", &["cat", "small.txt"], 1, 1);
    if let ActionSpec::SandboxExec(e) = &mut ok.spec {
        e.files.insert("small.txt".into(), "fits".into());
    }
    assert_eq!(c.run(&ok, T).await?.stdout, "fits");
    cluster.shutdown().await
}

/// The benchmark-only `noop` runtime: the whole action path (scheduler, dispatch, admission,
/// grants, results) with no container behind it. Commands do not run: an exec that would print
/// and fail reports exit 0 and no output, and no container is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_noop_runtime_completes_every_action_without_running_anything() -> anyhow::Result<()> {
    let mut spec = WorkerSpec::new("noop-a");
    spec.sandbox_runtime = tangram_worker::sandbox::RuntimeKind::Noop;
    let cluster = Cluster::start(&[spec]).await?;
    let c = cluster.client("job1").await?;
    c.wait_for_workers(&["noop-a"], T).await?;
    let r = c.run(&open("o1", "job1", "t1"), T).await?;
    assert_eq!(exit_code(&r.outcome), 0, "{r:?}");
    assert_eq!(containers_of("noop-a"), 0);
    for i in 0..3 {
        let id = format!("e{i}");
        let r = c
            .run(
                &exec(&id, "job1", "t1", &["sh", "-c", "echo hi; exit 3"], 1, 1),
                T,
            )
            .await?;
        assert_eq!(exit_code(&r.outcome), 0, "{r:?}");
        assert_eq!((r.stdout.as_str(), r.stderr.as_str()), ("", ""));
        let p = r.placement.expect("placement");
        assert_eq!((p.worker.as_str(), p.cores), ("noop-a", 1));
    }
    let r = c.run(&close("c1", "job1", "t1"), T).await?;
    assert_eq!(exit_code(&r.outcome), 0, "{r:?}");
    // The sandbox is gone with the close: an exec on it now finds none.
    let r = c
        .run(&exec("late", "job1", "t1", &["true"], 1, 1), T)
        .await?;
    assert!(!matches!(r.outcome, Outcome::Completed { .. }), "{r:?}");
    cluster.shutdown().await
}
