//! `tangram bench scheduler`: what one scheduling decision costs.

use serde_json::json;
use tangram_core::sim::Rng;
use tangram_core::{by_name, Constraint, ElasticModel, Pending, Snapshot, Speedup, WorkerView};
use tangram_shared::{ActionId, CpuRange, Demand, WorkerId};
use tokio::time::Instant;

fn cluster(cores: u32) -> Snapshot {
    let nodes = (cores / 256).max(1);
    Snapshot::new(
        (0..nodes)
            .map(|i| WorkerView {
                id: WorkerId::new(format!("n{i:03}")).expect("id"),
                total_cores: cores / nodes,
                free_cores: cores / nodes,
                total_mem_mb: 1 << 30,
                free_mem_mb: 1 << 30,
                accepting: true,
                cordoned: false,
                sandboxes: 0,
            })
            .collect(),
    )
}

fn queue(n: usize, nodes: usize, rng: &mut Rng) -> Vec<Pending> {
    (0..n)
        .map(|i| {
            let p = [0.0, 0.5, 0.9, 0.98][(rng.next_u64() % 4) as usize];
            Pending {
                id: ActionId::new(format!("a{i}")).expect("id"),
                demand: Demand {
                    cores: Some(CpuRange { min: 1, max: 16 }),
                    mem_mb: 0,
                },
                constraint: Constraint::OnWorker(
                    WorkerId::new(format!("n{:03}", rng.next_u64() as usize % nodes)).expect("id"),
                ),
                model: Some(ElasticModel {
                    t1_ms: rng.lognormal(2000.0, 0.6),
                    speedup: Speedup::Amdahl(p),
                }),
                image: None,
            }
        })
        .collect()
}

use tangram_shared::stats::quantile as pct;

/// Runs the benchmark: for each policy, pending size and pool size, `iterations` full
/// re-plans; then incremental decisions (one arrival planned against a busy pool).
pub fn scheduler(json_out: bool, iterations: usize) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    for policy_name in ["tangram", "tangram-v2", "fifo-dop-4"] {
        let policy = by_name(policy_name).expect("known policy");
        for &cores in &[256u32, 4096] {
            for &n in &[100usize, 1000, 10_000] {
                let snap = cluster(cores);
                let mut rng = Rng::new(42);
                let pending = queue(n, snap.workers().len(), &mut rng);
                let iters = if n >= 10_000 {
                    iterations.div_ceil(10).max(5)
                } else {
                    iterations
                };
                let mut lat = Vec::with_capacity(iters);
                let mut launched = 0;
                for _ in 0..iters {
                    let t = Instant::now();
                    let plan = policy.schedule(&snap, &pending, 0);
                    lat.push(t.elapsed().as_secs_f64() * 1e6);
                    launched = plan.launches.len();
                }
                lat.sort_by(f64::total_cmp);
                rows.push(json!({
                    "policy": policy_name, "cores": cores, "pending": n, "iterations": iters,
                    "replan_p50_us": pct(&lat, 0.5), "replan_p99_us": pct(&lat, 0.99), "launched": launched,
                }));
            }
        }
    }
    // Incremental: a pool nearly full, one action arrives, one cycle plans it.
    let mut incr = Vec::new();
    for policy_name in ["tangram", "tangram-v2", "fifo-dop-4"] {
        let policy = by_name(policy_name).expect("known policy");
        let mut snap_workers: Vec<WorkerView> = cluster(4096).workers().to_vec();
        for w in &mut snap_workers {
            w.free_cores = 8;
        }
        let snap = Snapshot::new(snap_workers);
        let mut rng = Rng::new(7);
        let arrivals = queue(20_000, snap.workers().len(), &mut rng);
        let t = Instant::now();
        let mut launched = 0usize;
        for a in &arrivals {
            launched += policy
                .schedule(&snap, std::slice::from_ref(a), 0)
                .launches
                .len();
        }
        let secs = t.elapsed().as_secs_f64();
        incr.push(json!({"policy": policy_name, "decisions": arrivals.len(), "decisions_per_s": arrivals.len() as f64 / secs, "launched": launched}));
    }
    // The whole decision engine (every cycle, and tangram-v2's re-sizing of running execs)
    // on a real workload: the simulator's wall time per action, simulator included.
    let mut engine = Vec::new();
    let workload = tangram_core::sim::AiCoding {
        batch: 1280,
        seed: 1,
        jobs: 1,
    }
    .generate();
    let actions = tangram_core::sim::actions_in(&workload);
    for policy_name in ["tangram", "tangram-v2"] {
        let policy = by_name(policy_name).expect("known policy");
        let t = Instant::now();
        let report = tangram_core::sim::simulate(&workload, policy.as_ref());
        let secs = t.elapsed().as_secs_f64();
        engine.push(
            json!({"policy": policy_name, "workload": "ai-coding B=1280", "actions": actions,
            "completed": report.actions.len(), "us_per_action": secs * 1e6 / actions as f64}),
        );
    }
    if json_out {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &json!({"bench": "scheduler", "replan": rows, "incremental": incr, "engine": engine})
            )?
        );
    } else {
        let mut t = crate::table::new([
            "policy",
            "cores",
            "pending",
            "re-plan p50",
            "re-plan p99",
            "launched",
        ]);
        for r in &rows {
            t.add_row([
                r["policy"].as_str().unwrap_or("").to_string(),
                r["cores"].to_string(),
                r["pending"].to_string(),
                format!("{:.1}us", r["replan_p50_us"].as_f64().unwrap_or(0.0)),
                format!("{:.1}us", r["replan_p99_us"].as_f64().unwrap_or(0.0)),
                r["launched"].to_string(),
            ]);
        }
        print!("{}", crate::table::render(&t, ""));
        for r in &incr {
            println!(
                "{} incremental: {:.0} decisions/s",
                r["policy"].as_str().unwrap_or(""),
                r["decisions_per_s"].as_f64().unwrap_or(0.0)
            );
        }
        for r in &engine {
            println!(
                "{} engine on {}: {:.1} us per action (simulator included)",
                r["policy"].as_str().unwrap_or(""),
                r["workload"].as_str().unwrap_or(""),
                r["us_per_action"].as_f64().unwrap_or(0.0)
            );
        }
    }
    Ok(())
}
