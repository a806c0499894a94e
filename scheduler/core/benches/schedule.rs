//! Criterion benches of one scheduling call: the reference policy against a fixed-DoP
//! baseline, on the same queues. `cargo bench -p tangram-core --bench schedule`.
//! (`tangram bench scheduler` prints the same kind of figures as JSON and a table.)

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use std::hint::black_box;
use tangram_core::sim::Rng;
use tangram_core::{by_name, Constraint, ElasticModel, Pending, Snapshot, Speedup, WorkerView};
use tangram_shared::{ActionId, CpuRange, Demand, WorkerId};

fn cluster(nodes: u32) -> Snapshot {
    Snapshot::new(
        (0..nodes)
            .map(|i| WorkerView {
                id: WorkerId::new(format!("n{i:03}")).unwrap(),
                total_cores: 256,
                free_cores: 256,
                total_mem_mb: 1 << 30,
                free_mem_mb: 1 << 30,
                accepting: true,
                cordoned: false,
                sandboxes: 0,
            })
            .collect(),
    )
}

fn queue(n: usize, nodes: u32) -> Vec<Pending> {
    let mut rng = Rng::new(42);
    (0..n)
        .map(|i| Pending {
            id: ActionId::new(format!("a{i}")).unwrap(),
            demand: Demand {
                cores: Some(CpuRange { min: 1, max: 16 }),
                mem_mb: 0,
            },
            constraint: Constraint::OnWorker(
                WorkerId::new(format!("n{:03}", rng.next_u64() % nodes as u64)).unwrap(),
            ),
            model: Some(ElasticModel {
                t1_ms: rng.lognormal(2000.0, 0.6),
                speedup: Speedup::Amdahl([0.0, 0.5, 0.9, 0.98][(rng.next_u64() % 4) as usize]),
            }),
            image: None,
        })
        .collect()
}

fn replan(c: &mut Criterion) {
    let mut group = c.benchmark_group("replan");
    for (nodes, pending) in [(1u32, 100usize), (1, 1000), (16, 1000)] {
        let snap = cluster(nodes);
        let q = queue(pending, nodes);
        for name in ["tangram", "fifo-dop-4"] {
            let policy = by_name(name).unwrap();
            group.bench_with_input(
                BenchmarkId::new(name, format!("{}cores-{pending}pending", nodes * 256)),
                &q,
                |b, q| b.iter(|| black_box(policy.schedule(&snap, q, 0))),
            );
        }
    }
    group.finish();
}

criterion_group!(benches, replan);
criterion_main!(benches);
