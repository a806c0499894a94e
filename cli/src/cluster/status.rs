//! `tangram status`, and the status request that `up`, `cordon`, `images` and `replay export`
//! share: one NATS request to the scheduler, and its answer as tables.

use anyhow::Context as _;
use std::collections::BTreeMap;
use std::time::Duration;
use tangram_shared::status::Status;

/// Asks the scheduler for its status.
pub fn fetch_status(
    url: &str,
    creds: &tangram_nats::auth::Credentials,
    timeout: Duration,
) -> anyhow::Result<Status> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let client = tokio::time::timeout(
            timeout,
            tangram_nats::auth::connect(url, "tangram-cli", creds),
        )
        .await
        .context("connecting to NATS timed out")??;
        Ok(tangram_nats::status::fetch(&client, timeout).await?.status)
    })
}

/// Workers listed one by one in `tangram status`'s tables, at most.
const TABLE_WORKERS: usize = 50;

/// The one line that sums a fleet up when its workers are more than the tables list.
/// Why queued actions wait, the most common reason first; `None` when nothing waits.
fn waiting_table(
    waiting: &std::collections::BTreeMap<String, usize>,
) -> Option<comfy_table::Table> {
    if waiting.is_empty() {
        return None;
    }
    let mut rows: Vec<(&String, &usize)> = waiting.iter().collect();
    rows.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let mut t = crate::table::new(["waiting for", "actions"]);
    crate::table::left(&mut t, &[0]);
    for (why, n) in rows {
        t.add_row([why.to_string(), n.to_string()]);
    }
    Some(t)
}

fn fleet_summary(workers: &[tangram_shared::status::WorkerStatus]) -> Option<String> {
    if workers.len() <= TABLE_WORKERS {
        return None;
    }
    let sum = |f: fn(&tangram_shared::status::WorkerStatus) -> u64| -> u64 {
        workers.iter().map(f).sum()
    };
    Some(format!(
        "fleet: {} workers, cores {} / {} used, memory {} / {} MiB used, {} running, {} sandboxes",
        workers.len(),
        sum(|w| w.cores_used as u64),
        sum(|w| w.cores as u64),
        sum(|w| w.mem_used_mb),
        sum(|w| w.mem_mb),
        sum(|w| w.running as u64),
        sum(|w| w.sandboxes as u64),
    ))
}

/// What `tangram status` says after a worker's row: stopping, draining, cordoned.
fn worker_state(w: &tangram_shared::status::WorkerStatus) -> String {
    if w.draining {
        "stopping".into()
    } else if let Some(by) = w.drain_by_unix_ms {
        let left_s = by.saturating_sub(crate::connect::unix_ms()) / 1000;
        format!(
            "draining ({} running, {} sandboxes, closed in {left_s} s)",
            w.running, w.sandboxes
        )
    } else if w.cordoned {
        format!(
            "cordoned ({} running, {} sandboxes)",
            w.running, w.sandboxes
        )
    } else {
        String::new()
    }
}

/// `tangram status`.
pub fn status(
    url: &str,
    creds: &tangram_nats::auth::Credentials,
    json: bool,
) -> anyhow::Result<()> {
    let st = fetch_status(url, creds, Duration::from_secs(5))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&st)?);
        return Ok(());
    }
    println!(
        "scheduler: epoch {}, policy {}, up {:.0} s, {} sandboxes open",
        st.epoch, st.policy, st.uptime_s, st.sandboxes
    );
    if let Some(line) = jobs_line(&st.jobs) {
        println!("{line}");
    }
    if let Some(l) = &st.leader {
        println!("leader: {} (pid {} on {})", l.id, l.pid, l.host);
    }
    if st.standbys.is_empty() {
        println!("standbys: none");
    } else {
        let list: Vec<String> = st
            .standbys
            .iter()
            .map(|s| format!("{} (pid {} on {})", s.id, s.pid, s.host))
            .collect();
        println!("standbys: {}", list.join(", "));
    }
    let mut t = crate::table::new([
        "worker",
        "cores used",
        "memory used (MiB)",
        "GPUs",
        "last seen",
        "state",
    ]);
    crate::table::left(&mut t, &[5]);
    // A fleet of hundreds is summed up and its first workers listed; --json lists every one.
    let shown = &st.workers[..st.workers.len().min(TABLE_WORKERS)];
    if let Some(line) = fleet_summary(&st.workers) {
        println!("{line}");
    }
    for w in shown {
        t.add_row([
            w.id.to_string(),
            format!("{} / {}", w.cores_used, w.cores),
            format!("{} / {}", w.mem_used_mb, w.mem_mb),
            if w.gpus > 0 {
                format!("{} {}", w.gpus, w.gpu_source.as_deref().unwrap_or(""))
                    .trim_end()
                    .to_string()
            } else {
                "-".into()
            },
            format!("{:.1}s", w.last_seen_s),
            worker_state(w),
        ]);
    }
    print!("\n{}", crate::table::render(&t, ""));
    if shown.len() < st.workers.len() {
        println!(
            "(the first {} of {} workers by id; `tangram status --json` lists every one)",
            shown.len(),
            st.workers.len()
        );
    }
    let pools: Vec<_> = shown
        .iter()
        .filter_map(|w| w.warm.map(|p| (w.id.as_str(), p)))
        .collect();
    if !pools.is_empty() {
        let mut t = crate::table::new([
            "warm pool",
            "ready/target",
            "hits",
            "misses",
            "hit rate",
            "memory (MiB)",
        ]);
        for (id, p) in pools {
            let claims = p.hits + p.misses;
            let rate = if claims == 0 {
                "-".to_string()
            } else {
                format!("{:.0}%", 100.0 * p.hits as f64 / claims as f64)
            };
            t.add_row([
                id.to_string(),
                format!("{} / {}", p.ready, p.target),
                p.hits.to_string(),
                p.misses.to_string(),
                rate,
                p.mem_mb.to_string(),
            ]);
        }
        print!("\n{}", crate::table::render(&t, ""));
    }
    let caches: Vec<_> = shown.iter().filter(|w| !w.images.is_empty()).collect();
    if !caches.is_empty() {
        let mut t = crate::table::new(["image cache", "images", "disk (MiB)", "references"]);
        crate::table::left(&mut t, &[3]);
        for w in caches {
            // One image on disk however many references name it.
            let mut ids: BTreeMap<&str, u64> = BTreeMap::new();
            for i in &w.images {
                ids.insert(i.id.as_str(), i.size_bytes);
            }
            let refs: Vec<&str> = w.images.iter().map(|i| i.reference.as_str()).collect();
            t.add_row([
                w.id.to_string(),
                ids.len().to_string(),
                (ids.values().sum::<u64>() >> 20).to_string(),
                refs.join(", "),
            ]);
        }
        print!("\n{}", crate::table::render(&t, ""));
    }
    let fmt = |m: &BTreeMap<String, usize>| {
        if m.is_empty() {
            "none".to_string()
        } else {
            m.iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    println!(
        "\nqueued: {}\nrunning: {}",
        fmt(&st.queued),
        fmt(&st.running)
    );
    if let Some(n) = st.backlog.filter(|n| *n > 0) {
        println!("backlog: {n} action(s) stored and not yet taken in by the scheduler");
    }
    let waiting: Vec<_> = st.queues.iter().filter(|(_, q)| q.depth > 0).collect();
    if !waiting.is_empty() {
        let mut t = crate::table::new(["queue", "depth", "oldest", "est. wait", "done/s"]);
        for (k, q) in waiting {
            let est = q
                .est_wait_s
                .map_or_else(|| "unknown".to_string(), |s| format!("{s:.1} s"));
            t.add_row([
                k.to_string(),
                q.depth.to_string(),
                format!("{:.1} s", q.oldest_wait_s),
                est,
                format!("{:.1}", q.throughput_per_s),
            ]);
        }
        print!("\n{}", crate::table::render(&t, ""));
    }
    if let Some(t) = waiting_table(&st.waiting) {
        print!("\n{}", crate::table::render(&t, ""));
    }
    if !st.services.is_empty() {
        let mut t = crate::table::new(["service", "GPUs", "restore", "busy", "resident on"]);
        crate::table::left(&mut t, &[4]);
        for s in &st.services {
            t.add_row([
                s.name.to_string(),
                s.gpus.to_string(),
                format!("{}ms", s.restore_ms),
                s.busy.to_string(),
                if s.resident.is_empty() {
                    "(evicted: state in host memory)".to_string()
                } else {
                    s.resident.join(", ")
                },
            ]);
        }
        print!("\n{}", crate::table::render(&t, ""));
    }
    for p in &st.providers {
        println!(
            "\nprovider {}: {:.1}/s declared, {:.1}/s in force, {} / {} in flight, admitted {:?}",
            p.name, p.rate_per_s, p.effective_rate_per_s, p.inflight, p.concurrency, p.admitted
        );
    }
    if !st.recent.is_empty() {
        println!("\nrecent ACT (last results, by kind):");
        let mut t = crate::table::new([
            "kind", "count", "mean", "p50", "p99", "queue", "overhead", "exec",
        ]);
        for (k, a) in &st.recent {
            let secs = |v: f64| format!("{v:.3}s");
            t.add_row([
                k.to_string(),
                a.count.to_string(),
                secs(a.mean_s),
                secs(a.p50_s),
                secs(a.p99_s),
                secs(a.queued_s),
                secs(a.overhead_s),
                secs(a.exec_s),
            ]);
        }
        print!("{}", crate::table::render(&t, ""));
    }
    Ok(())
}

/// The jobs holding sandboxes, most memory first: `jobs: a 12 sandboxes (6144 MiB), ...`,
/// the first eight and a count of the rest. `None` when no job holds one.
fn jobs_line(
    jobs: &std::collections::BTreeMap<String, tangram_shared::status::JobStatus>,
) -> Option<String> {
    const SHOWN: usize = 8;
    if jobs.is_empty() {
        return None;
    }
    let mut by_mem: Vec<_> = jobs.iter().collect();
    by_mem.sort_by(|a, b| b.1.mem_mb.cmp(&a.1.mem_mb).then(a.0.cmp(b.0)));
    let mut parts: Vec<String> = by_mem
        .iter()
        .take(SHOWN)
        .map(|(j, s)| {
            let noun = if s.sandboxes == 1 {
                "sandbox"
            } else {
                "sandboxes"
            };
            format!("{j} {} {noun} ({} MiB)", s.sandboxes, s.mem_mb)
        })
        .collect();
    if by_mem.len() > SHOWN {
        parts.push(format!("and {} more", by_mem.len() - SHOWN));
    }
    Some(format!("jobs: {}", parts.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tangram_shared::status::{JobStatus, WorkerStatus};

    #[test]
    fn the_jobs_holding_sandboxes_are_listed_most_memory_first() {
        assert_eq!(jobs_line(&Default::default()), None);
        let mut jobs: std::collections::BTreeMap<String, JobStatus> = (0..10)
            .map(|i| {
                let s = JobStatus {
                    sandboxes: i + 1,
                    mem_mb: 512 * (i as u64 + 1),
                };
                (format!("j{i}"), s)
            })
            .collect();
        jobs.insert(
            "leaky".into(),
            JobStatus {
                sandboxes: 1,
                mem_mb: 65_536,
            },
        );
        let line = jobs_line(&jobs).unwrap();
        assert!(
            line.starts_with("jobs: leaky 1 sandbox (65536 MiB), j9 10 sandboxes (5120 MiB), j8"),
            "{line}"
        );
        assert!(line.ends_with("and 3 more"), "{line}");
    }

    #[test]
    fn a_fleet_larger_than_the_tables_is_summed_up_in_one_line() {
        let fleet = |n: usize| -> Vec<WorkerStatus> {
            (0..n)
                .map(|i| WorkerStatus {
                    id: format!("w{i}"),
                    cores: 4,
                    cores_used: (i % 2) as u32,
                    mem_mb: 1000,
                    mem_used_mb: 10,
                    running: 1,
                    sandboxes: 3,
                    ..Default::default()
                })
                .collect()
        };
        assert_eq!(fleet_summary(&fleet(TABLE_WORKERS)), None);
        let line = fleet_summary(&fleet(60)).expect("summed up");
        assert_eq!(
            line,
            "fleet: 60 workers, cores 30 / 240 used, memory 600 / 60000 MiB used, 60 running, 180 sandboxes"
        );
    }

    #[test]
    fn wait_reasons_are_listed_most_common_first() {
        assert!(waiting_table(&Default::default()).is_none());
        let waiting = [("quota of search", 3), ("no worker with 4 GiB free", 12)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let text = crate::table::render(&waiting_table(&waiting).unwrap(), "");
        let memory = text.find("no worker with 4 GiB free").expect("listed");
        let quota = text.find("quota of search").expect("listed");
        assert!(memory < quota, "{text}");
        assert!(text.contains("12"), "{text}");
    }
}
