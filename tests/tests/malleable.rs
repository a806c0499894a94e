//! `tangram-v2` live: a running exec's cores change while it runs (malleable grants), on a
//! real worker with Docker sandboxes and cgroup grants.

use std::time::Duration;
use tangram_shared::{ActionId, Outcome};
use tangram_tests::build::{close, exec, open};
use tangram_tests::{Cluster, WorkerSpec};

const T: Duration = Duration::from_secs(60);

/// Container ids of a worker's sandboxes.
fn sandboxes_of(worker: &str) -> Vec<String> {
    tangram_tests::running_containers(worker, &[])
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
    // Running for real, on both cores: its first `sleep 0.1` is a process of its own, so its
    // first `nproc` has printed. (The shell's own command line names `sleep 0.1` too, before
    // any sample: waiting for that let the arrival come first under a loaded CI run, and the
    // wide phase was never seen.)
    let probing = tangram_tests::eventually(T, || {
        sandboxes_of("mall-a").iter().any(|id| {
            let top = std::process::Command::new("docker")
                .args(["top", id])
                .output();
            top.is_ok_and(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .any(|l| l.trim_end().ends_with(" sleep 0.1") && !l.contains("seq"))
            })
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

/// Regression (found by the engine's property test once it drove failovers): a new leader
/// booked an exec that the old one had re-sized at its stored dispatch's grant, since the
/// re-size message is consumed from the dispatch stream when the worker applies it. Widened
/// from one core to two, the exec was booked at one, and the next exec went to the core it
/// held, failing `infra_error: grant`. Heartbeats now list each re-sized exec's cores
/// (`resized`), and the new leader books what the worker holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_books_a_re_sized_exec_at_the_width_it_runs() -> anyhow::Result<()> {
    let mut cluster =
        Cluster::start_with_policy(&[WorkerSpec::new("mall-r")], "tangram-v2").await?;
    let c = cluster.client("rl").await?;
    c.wait_for_workers(&["mall-r"], T).await?;
    for t in ["t1", "t2"] {
        let r = c.run(&open(&format!("open-{t}"), "rl", t), T).await?;
        assert!(matches!(r.outcome, Outcome::Completed { .. }), "{r:?}");
    }
    // One exec holds a core (it cannot widen); the long one gets the other, and is widened
    // to both when the first ends. Its stored dispatch still says one core.
    let first = exec("first", "rl", "t1", &["sleep", "1"], 1, 1);
    c.submit(&first).await?;
    c.wait_until_running("mall-r", &first.id, T).await?;
    let long = exec("long", "rl", "t2", &["sleep", "12"], 1, 2);
    c.submit(&long).await?;
    let hb = c.wait_until_running("mall-r", &long.id, T).await?;
    assert!(hb.resized.is_empty(), "{hb:?}");
    c.result(&first.id, T).await?;
    c.wait_for_heartbeat(T, "the long exec reported widened", |hb| {
        hb.worker.as_str() == "mall-r" && hb.resized.get(&long.id) == Some(&2)
    })
    .await?;
    cluster
        .restart_scheduler_with(|config| config.policy = "tangram-v2".into())
        .await?;
    // Booked at the two cores it holds (the worker would make an exec placed on one of them
    // wait for it, so the booking is what this checks).
    c.wait_for_status(T, "the long exec adopted at two cores", |s| {
        s.epoch >= 2
            && s.running.get("sandbox_exec") == Some(&1)
            && s.workers
                .iter()
                .any(|w| w.id == "mall-r" && w.cores_used == 2)
    })
    .await?;
    // No core is free until the long exec ends: the next one waits for it, then runs.
    let next = c.run(&exec("next", "rl", "t1", &["true"], 1, 1), T).await?;
    assert!(
        matches!(next.outcome, Outcome::Completed { exit_code: 0 }),
        "{next:?}"
    );
    let r = c.result(&long.id, T).await?;
    assert!(
        matches!(r.outcome, Outcome::Completed { exit_code: 0 }),
        "{r:?}"
    );
    for id in [&first.id, &long.id, &next.id] {
        let n = c.results(id, 2, Duration::from_millis(500)).await?.len();
        assert_eq!(n, 1, "{id} has {n} results");
    }
    for t in ["t1", "t2"] {
        c.run(&close(&format!("close-{t}"), "rl", t), T).await?;
    }
    cluster.shutdown().await?;
    Ok(())
}

/// A backlog an earlier leader left, written to the stream as it would have been: `long`
/// (`sleep 60`, 1 to `max` cores), dispatched to worker `rs-w` at one core under epoch 1,
/// then each of `regrants` (epoch, cores, the leader's sequence) in order. The stream
/// sequences of the dispatch and of each re-size.
async fn backlog(
    js: &async_nats::jetstream::Context,
    max: u32,
    regrants: &[(u64, u32, u64)],
) -> anyhow::Result<(tangram_shared::Action, u64, Vec<u64>)> {
    use tangram_shared::codec::{encode, Encoding};
    use tangram_shared::{subject, Dispatch, Grant, Regrant};
    tangram_nats::ensure_streams(js, &Default::default()).await?;
    let w = tangram_tests::build::worker("rs-w");
    let long = exec("long", "rs", "t1", &["sleep", "60"], 1, max);
    let dispatch = Dispatch {
        epoch: 1,
        attempt: 1,
        action: long.clone(),
        grant: Grant {
            cores: 1,
            mem_mb: 256,
        },
        submitted_at_us: 1,
        result_encoding: Encoding::Msgpack,
        instance: None,
        gpu: None,
    };
    let body = encode(&dispatch, Encoding::Msgpack)?;
    let d_seq = js
        .publish(subject::dispatch(&w, &long.id), body.into())
        .await?
        .await?
        .sequence;
    let mut seqs = Vec::new();
    for &(epoch, cores, seq) in regrants {
        let r = Regrant {
            epoch,
            id: long.id.clone(),
            attempt: 1,
            grant: Grant { cores, mem_mb: 256 },
            seq,
        };
        let body = encode(&r, Encoding::Msgpack)?;
        let ack = js.publish(subject::regrant(&w, &long.id), body.into());
        seqs.push(ack.await?.await?.sequence);
    }
    Ok((long, d_seq, seqs))
}

/// Worker `rs-w`'s heartbeats (`cores` cores, `long` running in `t1`'s sandbox), published
/// every 200 ms as the worker would, from the report the test changes as it goes:
/// (dispatch_seq, the exec's re-sized cores).
fn heartbeats(
    nats: async_nats::Client,
    id: ActionId,
    cores: u32,
    known_epoch: u64,
    reports: tokio::sync::watch::Receiver<(u64, Option<u32>)>,
) -> tokio::task::JoinHandle<()> {
    use tangram_shared::codec::{encode, Encoding};
    use tangram_shared::{subject, Heartbeat, SandboxRef};
    let w = tangram_tests::build::worker("rs-w");
    tokio::spawn(async move {
        for n in 1..=600u64 {
            let (dispatch_seq, resized) = *reports.borrow();
            let hb = Heartbeat {
                worker: w.clone(),
                instance: "i1".into(),
                seq: n,
                interval_ms: 200,
                cores,
                mem_mb: 4096,
                running: vec![id.clone()],
                finished: vec![],
                dispatch_seq,
                known_epoch,
                sandboxes: vec![SandboxRef {
                    job: tangram_shared::JobId::new("rs").unwrap(),
                    trajectory: tangram_shared::TrajectoryId::new("t1").unwrap(),
                    mem_mb: 256,
                    open: None,
                    idle_timeout_ms: None,
                }],
                draining: false,
                gpus: None,
                services: vec![],
                providers: vec![],
                warm: None,
                images: vec![],
                resized: resized.map(|c| (id.clone(), c)).into_iter().collect(),
            };
            let body = encode(&hb, Encoding::Msgpack).unwrap();
            let _ = nats.publish(subject::heartbeat(&w), body.into()).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

/// Cores in use on `rs-w`, as the leader's status says.
fn used_on_rs_w(s: &tangram_shared::status::Status) -> Option<u32> {
    s.workers
        .iter()
        .find(|x| x.id == "rs-w")
        .map(|x| x.cores_used)
}

/// Regression (found by the engine's property test): a re-size an earlier leader stored and
/// its worker had not taken yet was left out of the new leader's backlog scan, so the exec
/// was booked at the width its worker reported, and a widening on its way took cores the new
/// leader gave to new work. Here the backlog holds an exec dispatched at one core to `rs-w`
/// and widened to two after it. The worker's heartbeats list the exec at one core, the
/// re-size not taken in: the new leader books two. Then the heartbeats are past the re-size
/// and report the exec at one core (the worker had no spare core for the second): one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_size_left_in_the_backlog_is_booked_by_the_next_leader() -> anyhow::Result<()> {
    let mut cluster = Cluster::start_without_scheduler(&[]).await?;
    let nats = async_nats::connect(cluster.nats.url()).await?;
    let js = async_nats::jetstream::new(nats.clone());
    let (long, d_seq, r_seqs) = backlog(&js, 2, &[(1, 2, 1)]).await?;
    let (report, reports) = tokio::sync::watch::channel((d_seq, None::<u32>));
    let beats = heartbeats(nats.clone(), long.id.clone(), 2, 1, reports);
    let mut config = tangram_scheduler::Config::with_nats_url(cluster.nats.url());
    config.policy = "tangram-v2".into();
    cluster.start_scheduler_config(config);
    let c = cluster.client("rs").await?;
    // Booked at its reported width, one core, without the re-size: this waits out T.
    c.wait_for_status(T, "the widening on its way booked", |s| {
        s.running.get("sandbox_exec") == Some(&1) && used_on_rs_w(s) == Some(2)
    })
    .await?;
    // Taken in, applied as far as the worker could: booked as it runs.
    report.send_replace((r_seqs[0], Some(1)));
    c.wait_for_status(T, "booked as the worker runs it", |s| {
        used_on_rs_w(s) == Some(1)
    })
    .await?;
    beats.abort();
    cluster.shutdown().await?;
    Ok(())
}

/// Regression (found in review of the epoch rule): the backlog scan read only the last re-size
/// stored for a dispatch. Here leader 2 widened the exec to three cores, and then a late
/// re-size of deposed leader 1 (to two) was stored after it. The worker knows epoch 2: it will
/// apply leader 2's widening and drop leader 1's. The scan read leader 1's, and the new
/// leader booked the exec at one core (the worker's report, since it drops that re-size):
/// two cores short of what the worker runs once it takes the widening in. The scan now reads
/// every re-size of the dispatch and books the one the worker ends on, the newest by epoch
/// and sequence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backlog_scan_books_the_re_size_its_worker_ends_on_not_the_last_stored(
) -> anyhow::Result<()> {
    let mut cluster = Cluster::start_without_scheduler(&[]).await?;
    let nats = async_nats::connect(cluster.nats.url()).await?;
    let js = async_nats::jetstream::new(nats.clone());
    let (long, d_seq, r_seqs) = backlog(&js, 3, &[(2, 3, 1), (1, 2, 7)]).await?;
    // Leader 2's epoch is the stored one: the leader started here is the third.
    let store = js
        .create_key_value(async_nats::jetstream::kv::Config {
            bucket: tangram_shared::subject::SCHEDULER_BUCKET.into(),
            history: 1,
            ..Default::default()
        })
        .await?;
    store
        .put(tangram_shared::subject::EPOCH_KEY, "2".into())
        .await?;
    let (report, reports) = tokio::sync::watch::channel((d_seq, None::<u32>));
    let beats = heartbeats(nats.clone(), long.id.clone(), 3, 2, reports);
    let mut config = tangram_scheduler::Config::with_nats_url(cluster.nats.url());
    config.policy = "tangram-v2".into();
    cluster.start_scheduler_config(config);
    let c = cluster.client("rs").await?;
    c.wait_for_status(T, "leader 2's widening booked", |s| {
        s.running.get("sandbox_exec") == Some(&1) && used_on_rs_w(s) == Some(3)
    })
    .await?;
    // Both taken in: the widening applied, the late re-size dropped.
    report.send_replace((r_seqs[1], Some(3)));
    c.wait_for_status(T, "booked as the worker runs it", |s| {
        used_on_rs_w(s) == Some(3) && s.epoch == 3
    })
    .await?;
    beats.abort();
    cluster.shutdown().await?;
    Ok(())
}
