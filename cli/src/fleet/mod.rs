//! `tangram bench fleet`: the real scheduler process (a leader and a standby) and a real
//! nats-server under hundreds of workers and tens of thousands of open sandboxes, on one
//! machine. The workers are real too (`tangram-worker`: their own NATS connections, dispatch
//! consumers and heartbeats), on the benchmark-only `noop` runtime, many to a process
//! (`--bench-replicas`), so that hundreds fit beside the scheduler.
//!
//! For each worker count of the sweep, a fresh cluster: every lane's sandbox opened, the
//! scheduler's cost of the heartbeats alone (idle), then actions at the asked rate (execs,
//! and trajectories ending and starting), the status answer timed meanwhile, then the leader
//! SIGKILLed and the time until the standby leads and answers an exec on a sandbox opened
//! under the old leader. Every submitted action must have exactly one stored result.

mod cluster;
mod density;
mod load;
mod opens;
mod report;
mod usage;

pub use density::{density, DensityArgs};
pub use opens::{opens, OpensArgs};

use anyhow::{bail, Context as _};
use cluster::{Cluster, Shape};
use load::{Lanes, Load};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tangram_shared::stats::quantile;
use tangram_shared::status::Status;
use tokio::time::Instant;
use usage::{usage, usage_of};

/// Options of `tangram bench fleet`.
#[derive(Debug, clap::Args)]
pub struct FleetArgs {
    /// Worker counts to measure, one fresh cluster each.
    #[arg(long, value_delimiter = ',', default_value = "10,50,100,250,500")]
    pub workers: Vec<u32>,
    /// Cores each worker declares (the noop runtime books them and runs nothing).
    #[arg(long, default_value_t = 64)]
    pub cores: u32,
    /// Sandboxes open at once across the fleet (one lane, a trajectory at a time, each).
    #[arg(long, default_value_t = 20_000)]
    pub sandboxes: usize,
    /// Actions a second offered in the steady phase.
    #[arg(long, default_value_t = 2000.0)]
    pub rate: f64,
    /// Length of the steady phase, seconds.
    #[arg(long, default_value_t = 60)]
    pub duration_s: u64,
    /// Every this many actions of a lane, its trajectory ends (close) and the next opens.
    #[arg(long, default_value_t = 20)]
    pub churn: u32,
    /// Opens in flight at once while the sandboxes are opened.
    #[arg(long, default_value_t = 512)]
    pub open_in_flight: usize,
    /// Heartbeat period of every worker, ms.
    #[arg(long, default_value_t = 1000)]
    pub heartbeat_ms: u64,
    /// JetStream sync: `always` (what nats/server.conf ships) or `default` (the server's).
    #[arg(long, default_value = "always", value_parser = ["always", "default"])]
    pub sync: String,
    /// Scheduler groups sharing the server, each a NATS account with its own leader and
    /// standby, its share of the workers, sandboxes and rate, and its own job.
    #[arg(long, default_value_t = 1)]
    pub groups: u32,
    /// Of the turns that do not end a trajectory, the percentage that are `reward` actions
    /// (served by each group's GPU worker with the reference replica).
    #[arg(long, default_value_t = 5)]
    pub reward_pct: u32,
    /// Of those turns, the percentage that are `api` calls (a search through the fleet's
    /// provider quota, to a rate-limited stand-in).
    #[arg(long, default_value_t = 5)]
    pub api_pct: u32,
    /// Declared GPUs of each group's GPU worker, a reward replica on each at most.
    #[arg(long, default_value_t = 4)]
    pub gpus: u32,
    /// The api provider's quota, requests a second across the fleet [default: twice the
    /// api calls offered].
    #[arg(long)]
    pub api_rate: Option<f64>,
    /// No authentication: by default every process connects with its own role's nkey (each
    /// worker its own, the load as the job's rollout role), as a secured fleet does.
    #[arg(long)]
    pub no_auth: bool,
    /// Skip the leader failover.
    #[arg(long)]
    pub no_failover: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Write the curves against workers as SVG.
    #[arg(long)]
    pub picture: Option<PathBuf>,
    /// nats-server binary [default: tools/bin/nats-server above the working directory, then PATH].
    #[arg(long, env = "TANGRAM_NATS_SERVER")]
    pub nats_server: Option<PathBuf>,
}

/// Runs the sweep and prints the report; an error when an action was lost or doubled, or
/// the status answer broke.
pub fn fleet(a: FleetArgs) -> anyhow::Result<()> {
    if a.workers.is_empty() || a.workers.contains(&0) {
        bail!("--workers takes worker counts of at least 1, such as 10,50,100");
    }
    if a.groups == 0 || a.workers.iter().any(|&w| w < a.groups) {
        bail!("--groups must be at least 1 and at most the smallest worker count");
    }
    if a.sandboxes == 0 || a.rate <= 0.0 || a.duration_s == 0 {
        bail!("--sandboxes, --rate and --duration-s must be positive");
    }
    if a.reward_pct + a.api_pct > 100 {
        bail!("--reward-pct and --api-pct add up to more than 100");
    }
    if a.reward_pct > 0 && a.gpus == 0 {
        bail!("--reward-pct needs GPUs to serve the reward service: give --gpus");
    }
    let mixed = a.reward_pct + a.api_pct > 0;
    // The api calls offered a second, roughly (closes and opens take some turns).
    let api_rate = a
        .api_rate
        .unwrap_or((a.rate * f64::from(a.api_pct) / 100.0 * 2.0).max(10.0));
    let nats = crate::nats_server::find(a.nats_server.as_ref())?;
    let load_before = crate::pipeline::loadavg();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut rows = Vec::new();
    for &workers in &a.workers {
        eprintln!("fleet: {workers} workers, {} sandboxes ...", a.sandboxes);
        let per_worker = a.sandboxes.div_ceil(workers as usize) as u64;
        let shape = Shape {
            workers,
            cores: a.cores,
            // Room for every lane's sandbox, and for a churning lane's next one.
            mem_mb: (per_worker * 2 + 8) * load::SANDBOX_MB,
            heartbeat_ms: a.heartbeat_ms,
            sync: a.sync.clone(),
            groups: a.groups,
            auth: !a.no_auth,
            // The GPU worker serves both the reward service and the api provider.
            gpus: if mixed { a.gpus.max(1) } else { 0 },
            api_rate,
        };
        let cluster = Cluster::start(&nats, &shape)?;
        let measured = rt.block_on(async {
            let budget = Duration::from_secs(a.duration_s * 3 + 600);
            let groups = (0..cluster.groups.len()).map(|g| measure(&cluster, g, &a));
            tokio::time::timeout(budget, futures::future::join_all(groups))
                .await
                .with_context(|| format!("{workers} workers: the run took longer than {budget:?}"))
        });
        let measured = match measured {
            Ok(rows) => rows.into_iter().collect::<anyhow::Result<Vec<Value>>>(),
            Err(e) => Err(e),
        };
        match measured {
            Ok(r) => rows.extend(r),
            Err(e) => bail!("{e:#}\n{}", cluster.log_tails()),
        }
        drop(cluster);
    }
    let out = json!({
        "bench": "fleet",
        "cores_per_worker": a.cores,
        "sandboxes": a.sandboxes,
        "rate": a.rate,
        "duration_s": a.duration_s,
        "sync": a.sync,
        "groups": a.groups,
        "heartbeat_ms": a.heartbeat_ms,
        "auth": if a.no_auth { "none" } else { "per-role nkeys" },
        "mix": {"reward_pct": a.reward_pct, "api_pct": a.api_pct, "gpus": a.gpus, "api_rate": api_rate},
        "load_avg_before": load_before,
        "load_avg_after": crate::pipeline::loadavg(),
        "rows": rows,
    });
    if let Some(path) = &a.picture {
        std::fs::write(path, report::picture(&out)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        report::print_table(&out);
    }
    let broken: Vec<String> = rows
        .iter()
        .filter(|r| {
            r["results"]["missing"].as_u64() != Some(0)
                || r["results"]["duplicated"].as_u64() != Some(0)
                || r["status"]["answered"].as_bool() != Some(true)
                || r["anonymous_connection_refused"].as_bool() == Some(false)
        })
        .map(|r| r["workers"].to_string())
        .collect();
    if !broken.is_empty() {
        bail!(
            "actions lost or doubled, no status answer, or an anonymous connection let in, at {} workers",
            broken.join(", ")
        );
    }
    Ok(())
}

/// One status request: the answer, its size in bytes and how long it took.
async fn status(client: &async_nats::Client) -> anyhow::Result<(Status, usize, Duration)> {
    status_within(client, Duration::from_secs(10)).await
}

async fn status_within(
    client: &async_nats::Client,
    within: Duration,
) -> anyhow::Result<(Status, usize, Duration)> {
    let t = Instant::now();
    let f = tangram_nats::status::fetch(client, within).await?;
    Ok((f.status, f.bytes, t.elapsed()))
}

/// Waits until the leader's status lists every worker; the status then.
async fn wait_for_fleet(
    client: &async_nats::Client,
    n: usize,
    within: Duration,
) -> anyhow::Result<Status> {
    let deadline = Instant::now() + within;
    let mut last = String::from("no answer");
    while Instant::now() < deadline {
        match status(client).await {
            Ok((s, _, _)) if s.workers.len() >= n && s.leader.is_some() => return Ok(s),
            Ok((s, _, _)) => last = format!("{} of {n} workers listed", s.workers.len()),
            Err(e) => last = format!("{e:#}"),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    bail!("the fleet did not come up within {within:?}: {last}")
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e4).round() / 10.0
}

/// Runs the `docker` CLI; its standard output, or an error with its standard error.
fn docker(args: &[&str]) -> anyhow::Result<String> {
    let out = std::process::Command::new("docker").args(args).output()?;
    if !out.status.success() {
        bail!(
            "docker {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// p50 and p99 of `v` (milliseconds), rounded.
fn pcts(mut v: Vec<f64>) -> Value {
    v.sort_by(f64::total_cmp);
    let r = |x: f64| (x * 100.0).round() / 100.0;
    json!({"p50": r(quantile(&v, 0.5)), "p99": r(quantile(&v, 0.99)), "n": v.len()})
}

/// One scheduler group of the cluster under its share of the load: its row of the report.
async fn measure(cluster: &Cluster, g: usize, a: &FleetArgs) -> anyhow::Result<Value> {
    let group = &cluster.groups[g];
    // The sweep's axis counts the noop workers; heartbeats come from the GPU worker too.
    let all_workers = group.worker_ids.len() as u32;
    let workers = all_workers - u32::from(group.gpu_worker.is_some());
    let share = cluster.groups.len();
    let sandboxes = a.sandboxes.div_ceil(share);
    let rate = a.rate / share as f64;
    let load = Load::start(
        &cluster.url,
        group.seed(&format!("rollout-{}", load::JOB)).as_deref(),
        group.seed("operator").as_deref(),
    )
    .await?;
    let came_up = Instant::now();
    let st = wait_for_fleet(
        load.client(),
        group.worker_ids.len(),
        Duration::from_secs(120),
    )
    .await?;
    // A group sees its own workers and no other's.
    if let Some(w) = st
        .workers
        .iter()
        .find(|w| !group.worker_ids.contains(&w.id))
    {
        bail!(
            "group {g}'s status lists {}, a worker of another group",
            w.id
        );
    }
    let up_s = came_up.elapsed().as_secs_f64();
    // With roles on, a connection without credentials must be refused: what the run
    // measured is the secured configuration.
    let anonymous_refused = if group.creds.is_some() {
        let tried = tokio::time::timeout(Duration::from_secs(5), async_nats::connect(&cluster.url));
        Some(!matches!(tried.await, Ok(Ok(_))))
    } else {
        None
    };
    let leader = st
        .leader
        .as_ref()
        .map(|l| l.id.clone())
        .context("no leader in the status")?;
    let leader_pid = cluster
        .scheduler_pid(&leader)
        .with_context(|| format!("the leader {leader} is not one of ours"))?;
    let nats_pid = cluster.nats_pid().context("nats-server is gone")?;
    let worker_pids = group.worker_pids.clone();

    // Every lane's sandbox.
    let lanes = Lanes::new(
        sandboxes,
        a.churn,
        load::Mix {
            reward_pct: a.reward_pct,
            api_pct: a.api_pct,
        },
    );
    let t = Instant::now();
    let opened = lanes.open_all(&load, a.open_in_flight).await;
    let open_s = t.elapsed().as_secs_f64();
    let opened_ok = opened.iter().filter(|s| s.completed).count();
    if opened_ok < sandboxes {
        bail!("only {opened_ok} of {sandboxes} sandboxes opened");
    }

    // The heartbeats alone: the leader's CPU while nothing else happens.
    let idle_s = 10.0;
    let before = usage(leader_pid);
    tokio::time::sleep(Duration::from_secs_f64(idle_s)).await;
    let idle_cpu = usage(leader_pid).cpu_s - before.cpu_s;
    let heartbeats = idle_s * all_workers as f64 * 1000.0 / a.heartbeat_ms as f64;

    // The steady phase, with the status asked every few seconds meanwhile.
    let (sched0, nats0, workers0) = (usage(leader_pid), usage(nats_pid), usage_of(&worker_pids));
    let status_probe = {
        let client = load.client().clone();
        let every = Duration::from_secs(5);
        let until = Instant::now() + Duration::from_secs(a.duration_s);
        tokio::spawn(async move {
            let mut out = Vec::new();
            while Instant::now() < until {
                tokio::time::sleep(every).await;
                out.push(
                    status(&client)
                        .await
                        .map(|(s, bytes, took)| (s.sandboxes, bytes, took)),
                );
            }
            out
        })
    };
    let phase = lanes
        .run(&load, rate, Duration::from_secs(a.duration_s))
        .await;
    let (sched1, nats1, workers1) = (usage(leader_pid), usage(nats_pid), usage_of(&worker_pids));
    let statuses = status_probe.await?;
    let answered: Vec<&(usize, usize, Duration)> =
        statuses.iter().filter_map(|r| r.as_ref().ok()).collect();
    let status_failed = statuses.iter().filter(|r| r.is_err()).count();
    let actions = phase.samples.len();
    let to_dispatch: Vec<f64> = phase
        .samples
        .iter()
        .filter_map(|s| {
            s.dispatched
                .map(|d| ms(d.saturating_duration_since(s.stored)))
        })
        .collect();
    let to_result: Vec<f64> = phase
        .samples
        .iter()
        .map(|s| ms(s.answered.saturating_duration_since(s.stored)))
        .collect();
    let stored: Vec<f64> = phase
        .samples
        .iter()
        .map(|s| ms(s.stored.saturating_duration_since(s.published)))
        .collect();
    let completed = phase.samples.iter().filter(|s| s.completed).count();

    // Failover: the leader SIGKILLed, with every sandbox open.
    let failover = if a.no_failover {
        Value::Null
    } else {
        failover(cluster, &load, &lanes, &leader).await?
    };

    let (one, missing, duplicated) = load.count_results(Duration::from_secs(300)).await?;
    use std::sync::atomic::Ordering::Relaxed;
    let cpu_per_action_us = (sched1.cpu_s - sched0.cpu_s) * 1e6 / actions.max(1) as f64;
    let phase_s = phase.seconds;
    Ok(json!({
        "workers": workers,
        "gpu_workers": u32::from(group.gpu_worker.is_some()),
        "group": g,
        "worker_processes": worker_pids.len(),
        "sandboxes": sandboxes,
        "fleet_up_s": (up_s * 10.0).round() / 10.0,
        "anonymous_connection_refused": anonymous_refused,
        "opens": {
            "seconds": (open_s * 100.0).round() / 100.0,
            "per_s": (opened.len() as f64 / open_s).round(),
            "latency_ms": pcts(opened.iter().map(|s| ms(s.answered.saturating_duration_since(s.stored))).collect()),
        },
        "heartbeats": {
            "per_s": heartbeats / idle_s,
            "scheduler_cpu_share": (idle_cpu / idle_s * 1000.0).round() / 1000.0,
            "scheduler_us_per_heartbeat": (idle_cpu * 1e6 / heartbeats.max(1.0)).round(),
        },
        "steady": {
            "offered_per_s": rate,
            "actions": actions,
            "completed": completed,
            "by_kind": phase.by_kind,
            "by_kind_stored_to_result_ms": phase.by_kind_ms.iter().map(|(k, v)| (*k, pcts(v.clone()))).collect::<std::collections::BTreeMap<_, _>>(),
            "actions_per_s": (actions as f64 / phase_s).round(),
            "behind": phase.behind,
            "refused": load.refused.load(Relaxed),
            "unanswered": load.unanswered.load(Relaxed),
            "publish_to_stored_ms": pcts(stored),
            "stored_to_dispatch_ms": pcts(to_dispatch),
            "stored_to_result_ms": pcts(to_result),
        },
        "scheduler": {
            "cpu_us_per_action": cpu_per_action_us.round(),
            "cpu_share": ((sched1.cpu_s - sched0.cpu_s) / phase_s * 1000.0).round() / 1000.0,
            "rss_mib": (sched1.rss_mib * 10.0).round() / 10.0,
        },
        "nats": {
            "cpu_share": ((nats1.cpu_s - nats0.cpu_s) / phase_s * 1000.0).round() / 1000.0,
            "rss_mib": (nats1.rss_mib * 10.0).round() / 10.0,
        },
        "worker_processes_cpu_share": ((workers1.cpu_s - workers0.cpu_s) / phase_s * 1000.0).round() / 1000.0,
        "worker_processes_rss_mib": workers1.rss_mib.round(),
        "status": {
            "answered": status_failed == 0 && !answered.is_empty(),
            "asked": statuses.len(),
            "failed": status_failed,
            "bytes": answered.iter().map(|r| r.1).max().unwrap_or(0),
            "max_ms": answered.iter().map(|r| ms(r.2)).fold(0.0, f64::max),
            "sandboxes_listed": answered.last().map(|r| r.0),
        },
        "failover": failover,
        "results": {
            "submitted": load.submitted.lock().expect("lock").len(),
            "exactly_one": one,
            "missing": missing,
            "duplicated": duplicated,
        },
    }))
}

/// SIGKILLs the leader, and at once submits an exec on a sandbox opened under it. The times
/// from the kill until: the standby holds the lease (read from the scheduler's bucket); its
/// status answers as leader; the exec's result arrives.
async fn failover(
    cluster: &Cluster,
    load: &Arc<Load>,
    lanes: &Arc<Lanes>,
    leader: &str,
) -> anyhow::Result<Value> {
    let js = async_nats::jetstream::new(load.client().clone());
    let bucket = js
        .get_key_value(tangram_shared::subject::SCHEDULER_BUCKET)
        .await
        .context("the scheduler's bucket")?;
    // Only the process: the cluster keeps its slot so that it is not killed twice.
    let pid = cluster
        .scheduler_pid(leader)
        .context("the leader is gone")?;
    crate::cluster::signal(pid, rustix::process::Signal::KILL)?;
    let killed = Instant::now();
    let probe = {
        let (lanes, load) = (lanes.clone(), load.clone());
        tokio::spawn(async move { lanes.probe(&load).await })
    };
    let deadline = killed + Duration::from_secs(60);
    let holder = |e: Option<async_nats::jetstream::kv::Entry>| {
        e.and_then(|e| {
            serde_json::from_slice::<tangram_shared::status::LeaderRecord>(&e.value).ok()
        })
        .map(|r| r.id)
    };
    let lease = loop {
        if Instant::now() > deadline {
            bail!("no scheduler took the lease within 60 s of killing {leader}");
        }
        let h = holder(
            bucket
                .entry(tangram_shared::subject::LEADER_KEY)
                .await
                .ok()
                .flatten(),
        );
        if h.is_some_and(|h| h != leader) {
            break killed.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let leads = loop {
        if Instant::now() > deadline {
            bail!("no new leader answered status within 60 s of killing {leader}");
        }
        // Asked often: a request that met the dead leader's interest would otherwise wait
        // out its whole timeout.
        if let Ok((s, _, _)) = status_within(load.client(), Duration::from_secs(1)).await {
            if s.leader.as_ref().is_some_and(|l| l.id != leader) {
                break killed.elapsed();
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let probe = probe
        .await?
        .context("the probe exec after the failover got no result")?;
    let answered = probe.answered.saturating_duration_since(killed);
    Ok(json!({
        "lease_taken_s": (lease.as_secs_f64() * 100.0).round() / 100.0,
        "new_leader_s": (leads.as_secs_f64() * 100.0).round() / 100.0,
        "exec_answered_s": (answered.as_secs_f64() * 100.0).round() / 100.0,
        "probe_completed": probe.completed,
    }))
}
