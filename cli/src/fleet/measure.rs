//! One scheduler group of the fleet under its share of the load: what it measures (ACT,
//! throughput, resources per process, what the stream kept) and the leader failover it
//! takes at the end.

use super::*;

/// One scheduler group of the cluster under its share of the load: its row of the report.
pub(super) async fn measure(cluster: &Cluster, g: usize, a: &FleetArgs) -> anyhow::Result<Value> {
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
