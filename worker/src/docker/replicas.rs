//! Model replica containers: the fleet's own serving engines, run through the same daemon.

use super::{force_remove, labelled, DockerError};
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{CreateContainerOptions, StartContainerOptions};
use bollard::Docker;
use futures::StreamExt;
use std::collections::HashMap;

/// Label on model replica containers: the worker that started them.
pub const LABEL_REPLICA: &str = "tangram.replica-of";

/// Model replica containers on a GPU worker. Unlike sandboxes these run the fleet's own
/// serving engines (trusted images): host networking, so the replica listens on the port the
/// worker chose, and the chunk's GPUs through a Docker device request.
#[derive(Debug, Clone)]
pub struct ReplicaContainers {
    docker: Docker,
    worker: String,
}

impl ReplicaContainers {
    /// Connects to the local daemon.
    pub async fn connect(worker: &str) -> Result<Self, DockerError> {
        let docker = Docker::connect_with_local_defaults()?;
        docker.ping().await?;
        Ok(Self {
            docker,
            worker: worker.to_string(),
        })
    }

    /// Removes replica containers an earlier run of this worker left; returns how many.
    pub async fn remove_leftovers(&self) -> Result<usize, DockerError> {
        let list = labelled(&self.docker, LABEL_REPLICA, &self.worker).await?;
        let mut n = 0;
        for c in list {
            if let Some(id) = c.id {
                self.remove(&id).await?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Starts a replica container. `gpus` are passed through a device request when `real_gpus`
    /// (NVML found them); declared GPUs (tests, CPU-only hosts) only set `CUDA_VISIBLE_DEVICES`.
    #[allow(clippy::too_many_arguments)]
    pub async fn start(
        &self,
        service: &str,
        port: u16,
        image: &str,
        args: &[String],
        mounts: &[String],
        gpus: &[u32],
        real_gpus: bool,
    ) -> Result<String, DockerError> {
        let name = format!("tangram-replica-{}-{service}-{port}", self.worker);
        let gpu_list = gpus
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let host_config = HostConfig {
            network_mode: Some("host".into()),
            binds: (!mounts.is_empty()).then(|| mounts.to_vec()),
            device_requests: real_gpus.then(|| {
                vec![bollard::models::DeviceRequest {
                    driver: Some("nvidia".into()),
                    device_ids: Some(gpus.iter().map(u32::to_string).collect()),
                    capabilities: Some(vec![vec!["gpu".into()]]),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        };
        let body = ContainerCreateBody {
            image: Some(image.to_string()),
            cmd: Some(args.to_vec()),
            env: Some(vec![
                format!("TANGRAM_SERVICE={service}"),
                // With a device request the container sees only its GPUs, renumbered from 0.
                format!(
                    "CUDA_VISIBLE_DEVICES={}",
                    if real_gpus {
                        (0..gpus.len())
                            .map(|i| i.to_string())
                            .collect::<Vec<_>>()
                            .join(",")
                    } else {
                        gpu_list
                    }
                ),
            ]),
            labels: Some(HashMap::from([(
                LABEL_REPLICA.to_string(),
                self.worker.clone(),
            )])),
            host_config: Some(host_config),
            ..Default::default()
        };
        let id = self
            .docker
            .create_container(
                Some(CreateContainerOptions {
                    name: Some(name),
                    ..Default::default()
                }),
                body,
            )
            .await?
            .id;
        if let Err(e) = self
            .docker
            .start_container(&id, None::<StartContainerOptions>)
            .await
        {
            let _ = self.remove(&id).await;
            return Err(e.into());
        }
        Ok(id)
    }

    /// Completes when the container stops (or cannot be watched any more).
    pub async fn wait(&self, id: &str) {
        let mut s = self
            .docker
            .wait_container(id, None::<bollard::query_parameters::WaitContainerOptions>);
        while let Some(r) = s.next().await {
            if r.is_err() {
                break;
            }
        }
    }

    /// Removes a replica container, running or not.
    pub async fn remove(&self, id: &str) -> Result<(), DockerError> {
        force_remove(&self.docker, id).await
    }
}
