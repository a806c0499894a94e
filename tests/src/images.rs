//! What the image tests share: opens of an image, small images of their own pushed to a
//! registry, workers allowed to pull from it, and cleanup of the images they made.

use crate::build::open;
use crate::registry::{self, Registry};
use crate::{Client, Cluster};
use tangram_shared::ActionSpec;

/// An open of `image` for trajectory `t` of `job`.
pub fn open_image(id: &str, job: &str, t: &str, image: &str) -> tangram_shared::Action {
    let mut a = open(id, job, t);
    if let ActionSpec::SandboxOpen(o) = &mut a.spec {
        o.image = Some(image.to_string());
    }
    a
}

/// A small image of its own (a shell, 20 MB of random bytes: an id and a size of its own);
/// returns its local name.
pub fn distinct_image(name: &str) -> anyhow::Result<String> {
    crate::registry::small_image(&format!("tangram-test/{name}"), 20)
}

pub fn present(image: &str) -> bool {
    std::process::Command::new("docker")
        .args(["image", "inspect", image])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// False (after saying why) when the registry is not installed; under CI that fails the test.
pub fn registry_installed() -> bool {
    if registry::binary().is_some() {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| !v.is_empty()) {
        panic!("{}", registry::MISSING);
    }
    eprintln!("SKIPPED: {}", registry::MISSING);
    false
}

/// A cluster with one worker `id` that may pull from `reg`'s `tangram/*` with its
/// credentials, under `budget_mb` when given; and a client of `job` once the worker reports.
pub async fn pulling_worker(
    reg: &Registry,
    id: &str,
    job: &str,
    budget_mb: Option<u64>,
) -> anyhow::Result<(Cluster, Client)> {
    let mut cluster = Cluster::start(&[]).await?;
    start_worker_on(&mut cluster, reg, id, None, None, budget_mb)?;
    let c = cluster.client(job).await?;
    c.wait_for_workers(&[id], std::time::Duration::from_secs(120))
        .await?;
    Ok((cluster, c))
}

/// A registry with one small image of its own pushed as `tangram/<name>:<pid>`: the registry,
/// the pushed reference, and the guard that removes the images. `None` (the test skips) when
/// the registry is not installed outside CI.
pub fn registry_with_image(name: &str) -> anyhow::Result<Option<(Registry, String, Untag)>> {
    if !registry_installed() {
        return Ok(None);
    }
    crate::init_logging();
    let reg = Registry::start("tangram", "s3cret")?;
    let n = std::process::id();
    let small = distinct_image(&format!("{name}-{n}"))?;
    let image = reg.push(&small, &format!("tangram/{name}:{n}"))?;
    let untag = Untag(vec![image.clone(), small]);
    Ok(Some((reg, image, untag)))
}

/// Removes the pulled images when the test ends, whatever happened.
#[derive(Debug)]
pub struct Untag(pub Vec<String>);
impl Drop for Untag {
    fn drop(&mut self) {
        for image in &self.0 {
            let _ = std::process::Command::new("docker")
                .args(["rmi", "-f", image])
                .output();
        }
    }
}

/// Starts worker `id` in `cluster`, allowed to pull `reg`'s `tangram/*` with its credentials,
/// under `budget_mb` when given; on the Docker daemon at `docker_host` (the machine's own when
/// `None`), with `image` as its default (the worker's default when `None`).
pub fn start_worker_on(
    cluster: &mut Cluster,
    reg: &Registry,
    id: &str,
    docker_host: Option<&str>,
    image: Option<&str>,
    budget_mb: Option<u64>,
) -> anyhow::Result<()> {
    cluster.start_sandbox_worker(
        id,
        tangram_worker::config::RawSandbox {
            image: image.map(str::to_string),
            docker_host: docker_host.map(str::to_string),
            pull: Some(vec![format!("{}/tangram/*", reg.addr)]),
            registry_auth_file: Some(reg.auth_file()?.display().to_string()),
            image_budget_mb: budget_mb,
            ..Default::default()
        },
    )?;
    Ok(())
}
