//! The worker's Docker sandboxes against the real engine, below the action path.

use tangram_shared::SandboxOpen;
use tangram_worker::config::RawConfig;
use tangram_worker::docker::DockerSandboxes;

/// Regression: on the compose fleet a fenced worker was still removing a trajectory's old
/// sandbox when that trajectory's next open arrived; the new container took the same name,
/// and the open failed with an infra error (`runtime`: the name was in use).
#[tokio::test]
async fn a_trajectorys_new_sandbox_opens_while_its_old_one_is_being_removed() -> anyhow::Result<()>
{
    let config = RawConfig::default().validate()?;
    let docker = DockerSandboxes::connect("race-test-w", config.sandbox.clone()).await?;
    let open = SandboxOpen::default();
    let old = docker.create("j", "t", &open, "0").await?;
    let (removed, new) = tokio::join!(docker.remove(&old.id), docker.create("j", "t", &open, "0"));
    removed?;
    let new = new?;
    assert_ne!(new.id, old.id);
    assert!(docker.is_running(&new.id).await, "the new sandbox runs");
    assert!(!docker.is_running(&old.id).await, "the old one is gone");
    // Deterministically: a second sandbox of the same trajectory, made while the first
    // still runs, leaves the first alone (each is removed by its own id).
    let again = docker.create("j", "t", &open, "0").await?;
    assert!(docker.is_running(&new.id).await, "the first is untouched");
    assert!(docker.is_running(&again.id).await);
    docker.remove(&new.id).await?;
    docker.remove(&again.id).await?;
    Ok(())
}

/// Regression: sandboxes were created with the parked CPU quota (1% of a core) already set,
/// so the container's own start (runc init, the keeper's shell) ran throttled: a creation
/// took 1.1 s where the same container starts in 0.18 s. A new sandbox now starts without a
/// quota and is parked once it runs: its start was never throttled, and both its cgroup and
/// Docker's record say parked.
#[tokio::test]
async fn a_new_sandbox_starts_unthrottled_and_is_parked_once_it_runs() -> anyhow::Result<()> {
    use tangram_worker::cgroup::CgroupCpu;
    let config = RawConfig::default().validate()?;
    let docker = DockerSandboxes::connect("start-quota-w", config.sandbox.clone()).await?;
    let made = docker
        .create("j", "t", &SandboxOpen::default(), "0")
        .await?;
    let checked = async {
        let cpu = CgroupCpu::for_pid(made.pid)?;
        // Started under the parked quota, the start was throttled for 13 periods (1.3 s).
        // Parked right after its start, the keeper's shell may still be finishing its first
        // fork: a period or two at most.
        let throttled = cpu.throttled_periods()?;
        assert!(
            throttled <= 2,
            "the container's start ran under the parked quota: throttled in {throttled} periods"
        );
        let quota = match &cpu {
            CgroupCpu::V1 { cpu, .. } => std::fs::read_to_string(cpu.join("cpu.cfs_quota_us"))?,
            CgroupCpu::V2 { dir } => std::fs::read_to_string(dir.join("cpu.max"))?,
        };
        let parked = tangram_worker::docker::PARKED_QUOTA_US.to_string();
        assert!(
            quota.split_whitespace().next() == Some(parked.as_str()),
            "parked in the cgroup: {quota}"
        );
        let out = std::process::Command::new("docker")
            .args(["inspect", "-f", "{{.HostConfig.CpuQuota}}", &made.id])
            .output()?;
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            parked,
            "Docker's record"
        );
        anyhow::Ok(())
    }
    .await;
    docker.remove(&made.id).await?;
    checked
}
