//! Jobs sharing one fleet, live, on a real secured cluster with Docker sandboxes: a job that
//! floods opens and output does not hold another job's commands back. Its backlog past its
//! cap of queued actions is refused `queue_full` (so the stream keeps being read for the
//! other job), its sandboxes stop at its caps, and the other job's commands get the cores
//! that free up first (weighted fair order).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tangram_core::engine::JobCaps;
use tangram_shared::{ActionSpec, Outcome, RejectCode};
use tangram_tests::build::{exec, open};
use tangram_tests::{Client, Cluster, WorkerSpec};

const T: Duration = Duration::from_secs(120);

async fn job_client(c: &Cluster, job: &str) -> anyhow::Result<Client> {
    Client::connect_with(
        &c.nats.url(),
        job,
        &c.credentials(&format!("rollout-{job}")),
    )
    .await
}

/// Calm's mean ACT and mean wait (queueing and the worker's overhead: what scheduling adds to
/// the command itself), ms, over `n` one-core commands run one after another in its sandbox.
async fn calm_mean_ms(calm: &Client, tag: &str, n: usize) -> anyhow::Result<(f64, f64)> {
    let (mut act, mut wait) = (0u64, 0u64);
    for i in 0..n {
        let r = calm
            .run(
                &exec(&format!("calm-{tag}-{i}"), "calm", "t1", &["true"], 1, 1),
                T,
            )
            .await?;
        assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
        act += r.timing.act_us;
        wait += r.timing.queued_us + r.timing.overhead_us;
    }
    let mean = |us: u64| us as f64 / n as f64 / 1e3;
    Ok((mean(act), mean(wait)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_flooding_opens_and_output_does_not_hold_another_jobs_commands_back(
) -> anyhow::Result<()> {
    let mut c = Cluster::start_secured(&[WorkerSpec::new("fair-cpu")], &["flood", "calm"]).await?;
    // The flood may queue 40 actions and hold 2 sandboxes and 1 core; the scheduler holds 200.
    c.stop_scheduler().await?;
    let mut config = tangram_scheduler::Config::with_nats_url(c.nats.url());
    config.max_queued_actions = 200;
    config.max_queued_per_job = 40;
    let flood_caps = JobCaps {
        max_sandboxes: Some(2),
        max_cores: Some(1),
        ..JobCaps::default()
    };
    config.job_caps = BTreeMap::from([("flood".to_string(), flood_caps)]);
    c.start_scheduler_config(config);
    let op = Client::connect_with(&c.nats.url(), "ops", &c.credentials("operator")).await?;
    op.wait_for_workers(&["fair-cpu"], T).await?;
    let calm = job_client(&c, "calm").await?;
    let flood = job_client(&c, "flood").await?;

    let r = calm.run(&open("calm-open", "calm", "t1"), T).await?;
    assert_eq!(r.outcome, Outcome::Completed { exit_code: 0 }, "{r:?}");
    let alone = calm_mean_ms(&calm, "alone", 20).await?;

    // The flood, first of opens: 300 at once, each willing to wait 5 s in the queue. Calm's
    // commands meanwhile.
    for i in 0..300 {
        let mut o = open(&format!("flood-open-{i}"), "flood", &format!("f{i}"));
        o.queue_timeout_ms = Some(5_000);
        flood.submit(&o).await?;
    }
    let opens = calm_mean_ms(&calm, "opens", 20).await?;
    // Every open gets exactly one result: the flood's first two open (its cap of sandboxes),
    // those past its 40 queued are refused at once, and the rest wait out their 5 s.
    let (mut opened, mut full, mut late) = (Vec::new(), 0usize, 0usize);
    for i in 0..300 {
        let id = tangram_shared::ActionId::new(format!("flood-open-{i}"))?;
        let r = flood.result(&id, T).await?;
        match r.outcome {
            Outcome::Completed { exit_code: 0 } => opened.push(format!("f{i}")),
            Outcome::Rejected {
                code: RejectCode::QueueFull,
                ..
            } => full += 1,
            Outcome::Rejected {
                code: RejectCode::QueueTimeout,
                ..
            } => late += 1,
            other => panic!("flood-open-{i}: {other:?}"),
        }
    }
    assert_eq!(opened, ["f0", "f1"], "the flood holds its cap of sandboxes");
    // At most 40 queued at once: 38 to 40 waited (as the first two left the queue).
    assert!(
        (38..=40).contains(&late),
        "the queued rest timed out: {late}"
    );
    assert_eq!(full + late, 298, "refused past 40 queued: {full}");
    let stop = Arc::new(AtomicBool::new(false));
    let outputs = Arc::new(AtomicUsize::new(0));
    let mut pumps = Vec::new();
    for t in opened.clone() {
        let (flood, stop, outputs) = (
            job_client(&c, "flood").await?,
            stop.clone(),
            outputs.clone(),
        );
        pumps.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let mut a = exec(
                    &format!("flood-out-{t}-{i}"),
                    "flood",
                    &t,
                    &["sh", "-c", "head -c 786432 /dev/urandom | base64 -w 0"],
                    1,
                    1,
                );
                if let ActionSpec::SandboxExec(e) = &mut a.spec {
                    e.cpus.max = 2;
                }
                let r = flood.run(&a, T).await?;
                assert!(matches!(r.outcome, Outcome::Completed { .. }), "{r:?}");
                outputs.fetch_add(r.stdout.len(), Ordering::Relaxed);
                i += 1;
            }
            anyhow::Ok(())
        }));
    }
    // Both pumps going.
    assert!(
        tangram_tests::eventually(T, || outputs.load(Ordering::Relaxed) > 4 << 20).await,
        "the flood's commands run"
    );
    let output = calm_mean_ms(&calm, "output", 20).await?;
    stop.store(true, Ordering::Relaxed);
    for p in pumps {
        p.await??;
    }
    // Alone again, after the flood: the machine's own drift is not counted against it.
    let after = calm_mean_ms(&calm, "after", 20).await?;
    let alone = ((alone.0 + after.0) / 2.0, (alone.1 + after.1) / 2.0);
    eprintln!(
        "calm's mean ACT (wait): alone {:.1} ms ({:.1}), beside the flood of opens {:.1} ms ({:.1}, \
         {:.2}x), beside its output {:.1} ms ({:.1}, {:.2}x); flood output {} MiB; load average {}",
        alone.0,
        alone.1,
        opens.0,
        opens.1,
        opens.0 / alone.0,
        output.0,
        output.1,
        output.0 / alone.0,
        outputs.load(Ordering::Relaxed) >> 20,
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim()
    );
    // Held back, calm would wait behind the flood's backlog: seconds, not milliseconds.
    assert!(
        opens.0 <= alone.0 * 1.25,
        "calm beside the flood of opens: {opens:?}, alone {alone:?}"
    );
    assert!(
        output.1 <= alone.1 + 10.0,
        "calm's wait beside the output: {output:?}, alone {alone:?}"
    );
    // The command itself shares this machine's two cores with NATS, the scheduler, the worker
    // and the flood's commands (1.14x to 1.28x measured; docs/BENCHMARKS.md).
    assert!(
        output.0 <= alone.0 * 1.5,
        "calm beside the output: {output:?}, alone {alone:?}"
    );
    c.shutdown().await?;
    Ok(())
}
