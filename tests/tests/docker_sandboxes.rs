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
