//! Allocate-on-Execution grant latency: Docker's update API vs writing the cgroup files.
//!
//! One parked sandbox; for each mode, N grants (park -> granted: cpuset widened to the
//! granted cores and the CFS quota raised) each followed by a park. Both modes run in the
//! same process on the same container, interleaved in blocks so that drift on the machine hits
//! both alike. Prints a table and one JSON line.
//!
//! `cargo bench -p tangram-worker --bench grant -- [--iterations N] [--cores LIST]`
//! Needs the Docker daemon and the sandbox image (`deploy/build-sandbox-image.sh`).

use std::collections::BTreeMap;
use tangram_shared::SandboxOpen;
use tangram_worker::cgroup::{CgroupCpu, PERIOD_US};
use tangram_worker::config::RawConfig;
use tangram_worker::docker::{DockerSandboxes, PARKED_QUOTA_US};
use tokio::time::Instant;

use tangram_shared::stats::quantile as percentile;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let iterations: usize = arg("--iterations")
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(1000);
    let granted = arg("--cores").unwrap_or_else(|| "0-1".into());
    let ncores = tangram_worker::cpuset::parse(&granted)
        .map_err(anyhow::Error::msg)?
        .len() as i64;
    let parking = "0";

    let config = RawConfig {
        id: Some("bench-grant".into()),
        ..Default::default()
    }
    .validate()?;
    let docker = DockerSandboxes::connect("bench-grant", config.sandbox.clone()).await?;
    let created = docker
        .create(
            "bench",
            "grant",
            &SandboxOpen {
                memory_mb: 256,
                workdir_mb: 16,
                ..Default::default()
            },
            parking,
        )
        .await?;
    let cgroup = CgroupCpu::for_pid(created.pid)?;

    let mut samples: BTreeMap<&str, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    let block = 50;
    let mut done = 0;
    while done < iterations {
        let n = block.min(iterations - done);
        for mode in ["docker", "cgroup"] {
            for _ in 0..n {
                let t = Instant::now();
                match mode {
                    "docker" => {
                        docker
                            .update_cpus(&created.id, &granted, ncores * PERIOD_US)
                            .await?
                    }
                    _ => cgroup.apply(&granted, ncores * PERIOD_US, true)?,
                }
                let grant_us = t.elapsed().as_secs_f64() * 1e6;
                let t = Instant::now();
                match mode {
                    "docker" => {
                        docker
                            .update_cpus(&created.id, parking, PARKED_QUOTA_US)
                            .await?
                    }
                    _ => cgroup.apply(parking, PARKED_QUOTA_US, false)?,
                }
                let park_us = t.elapsed().as_secs_f64() * 1e6;
                let s = samples.entry(mode).or_default();
                s.0.push(grant_us);
                s.1.push(park_us);
            }
        }
        done += n;
    }
    docker.remove(&created.id).await?;

    println!("Allocate-on-Execution grant latency, {iterations} grants per mode, cores {granted}, parking {parking}");
    println!(
        "{:<8} {:>12} {:>12} {:>12} {:>12} {:>12}",
        "mode", "grant p50", "grant p99", "grant mean", "park p50", "park p99"
    );
    let mut json = Vec::new();
    for (mode, (mut g, mut p)) in samples {
        g.sort_by(f64::total_cmp);
        p.sort_by(f64::total_cmp);
        let mean = g.iter().sum::<f64>() / g.len() as f64;
        println!(
            "{mode:<8} {:>10.1}us {:>10.1}us {:>10.1}us {:>10.1}us {:>10.1}us",
            percentile(&g, 0.5),
            percentile(&g, 0.99),
            mean,
            percentile(&p, 0.5),
            percentile(&p, 0.99)
        );
        json.push(format!(
            "{{\"mode\":\"{mode}\",\"grants\":{},\"grant_p50_us\":{:.1},\"grant_p99_us\":{:.1},\"grant_mean_us\":{mean:.1},\"park_p50_us\":{:.1},\"park_p99_us\":{:.1}}}",
            g.len(),
            percentile(&g, 0.5),
            percentile(&g, 0.99),
            percentile(&p, 0.5),
            percentile(&p, 0.99)
        ));
    }
    println!("{{\"bench\":\"grant\",\"results\":[{}]}}", json.join(","));
    Ok(())
}
