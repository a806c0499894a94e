//! The Docker executor: the only module that calls bollard. [`DockerRuntime`] is the worker's
//! sandbox runtime; [`ReplicaContainers`] runs model replicas packaged as images.
//!
//! A sandbox is a long-lived container whose PID 1 is a small shell loop (see [`KEEPER`])
//! hardened by default: no network, read-only root, tmpfs `/work` and `/tmp`, all
//! capabilities dropped, no-new-privileges, non-root user, pids, memory and file limits.
//! Commands run through `docker exec`; files are written by piping a tar archive into
//! `tar -x` inside the container (the root is read-only and `/work` is a tmpfs, which the
//! archive API cannot reach).

use crate::config::SandboxConfig;
use crate::containment::Containment;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::models::{ContainerCreateBody, ContainerUpdateBody, HostConfig, ResourcesUlimits};
use bollard::query_parameters::{
    CreateContainerOptions, InspectContainerOptions, ListContainersOptions, RemoveContainerOptions,
    StartContainerOptions,
};
use bollard::Docker;
use futures::StreamExt;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;
use tangram_shared::SandboxOpen;
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

pub use crate::sandbox::ExecOutput;
pub use exec::{
    exec_token, files_archive, files_failed, files_stdin, with_files_wrapper, FILES_FAILED_EXIT,
    FILES_FAILED_MARK, FILES_WRAPPER,
};
pub use replicas::{ReplicaContainers, LABEL_REPLICA};
pub use runtime::DockerRuntime;

mod exec;
pub mod images;
pub mod pull;
mod replicas;
mod runtime;

/// Labels every sandbox carries.
pub const LABEL_WORKER: &str = "tangram.worker";
/// Label naming the cluster (NATS URL) a sandbox's worker served.
pub const LABEL_CLUSTER: &str = "tangram.cluster";
/// Owning job.
pub const LABEL_JOB: &str = "tangram.job";
/// Owning trajectory.
pub const LABEL_TRAJECTORY: &str = "tangram.trajectory";

/// PID 1 of every sandbox: waits forever and reaps orphans (dash's `wait` reaps any child).
/// It must not be an init that exits with its child (like docker-init): the timeout kill
/// (`kill -9 -1`) reaches every process but PID 1, and the sandbox has to survive it. It
/// ignores every signal it can (dash otherwise catches SIGINT while it waits, and ended on
/// it), and the kernel drops a signal sent to a PID namespace's init from inside the
/// namespace unless the init catches it (SIGKILL included): so a command's `kill -TERM 1`,
/// `kill -INT 1` or `kill -9 1` cannot end the sandbox and turn its trajectory's next
/// commands into errors. The worker's forced removal (SIGKILL from the host) still ends it.
pub const KEEPER: &str =
    "trap '' HUP INT QUIT TERM USR1 USR2 ALRM PIPE; while :; do sleep 3600 & wait $!; done";

/// CFS quota of a parked sandbox: 1% of one core (Docker's minimum is 1 ms per period).
pub const PARKED_QUOTA_US: i64 = 1_000;

/// A Docker failure.
#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    /// The image is not present and this worker pulls no images (`sandbox.pull` is empty).
    #[error("image {0:?} is not present on this worker; build or load it first (deploy/build-sandbox-image.sh builds the default), or allow pulls from its registry (sandbox.pull)")]
    NoImage(String),
    /// The image is absent and could not be pulled.
    #[error("{0}")]
    Pull(#[from] pull::PullError),
    /// The configured OCI runtime is registered without arguments sandboxes need.
    #[error("{0}")]
    RuntimeArgs(String),
    /// The daemon does not know the configured OCI runtime.
    #[error("sandbox runtime {want:?} is not configured in the Docker daemon (it has: {known})")]
    NoRuntime {
        /// The runtime asked for.
        want: String,
        /// The daemon's runtimes.
        known: String,
    },
    /// The container is gone.
    #[error("container {0} no longer exists")]
    Gone(String),
    /// Any other Docker API error.
    #[error("docker: {0}")]
    Api(#[from] bollard::errors::Error),
    /// Writing to the exec's stdin failed.
    #[error("exec stdin: {0}")]
    Io(#[from] std::io::Error),
}

impl DockerError {
    fn from_api(e: bollard::errors::Error, container: &str) -> Self {
        match &e {
            bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            } => DockerError::Gone(container.to_string()),
            // Stopped: its PID 1 ended (killed from the host, or out of memory). Nothing runs
            // in it again.
            bollard::errors::Error::DockerResponseServerError {
                status_code: 409,
                message,
            } if message.contains("is not running") => DockerError::Gone(container.to_string()),
            _ => DockerError::Api(e),
        }
    }
}

/// How long a command may run, how much of its output is kept, and how to kill it.
#[derive(Debug, Clone, Copy)]
pub struct RunLimits<'a> {
    /// After this every process in the sandbox but init is killed.
    pub timeout: Duration,
    /// Stdout and stderr are each cut at this many bytes.
    pub cap: usize,
    /// The sandbox's cgroups, for the kill from outside (see [`DockerSandboxes::kill_tree`]).
    pub containment: Option<&'a Containment>,
}

/// A created sandbox.
#[derive(Debug, Clone)]
pub struct Created {
    /// Container id.
    pub id: String,
    /// Host PID of its init process (for the cgroup paths).
    pub pid: i64,
    /// How long pulling its image took, µs (0: the image was there).
    pub pull_us: u64,
}

/// A container left behind by an earlier run of this worker.
#[derive(Debug, Clone)]
pub struct Leftover {
    /// Container id.
    pub id: String,
    /// Its labels.
    pub labels: HashMap<String, String>,
}

/// The Docker side of the worker.
#[derive(Debug, Clone)]
pub struct DockerSandboxes {
    docker: Docker,
    worker: String,
    config: SandboxConfig,
    pulls: pull::Pulls,
    /// When a sandbox last used each image, for the image collector.
    last_used: std::sync::Arc<std::sync::Mutex<HashMap<String, tokio::time::Instant>>>,
    /// The images held, as last listed (for heartbeats).
    held: std::sync::Arc<std::sync::Mutex<Vec<tangram_shared::ImageReport>>>,
}

impl DockerSandboxes {
    /// Connects to the local daemon and checks it answers.
    pub async fn connect(worker: &str, config: SandboxConfig) -> Result<Self, DockerError> {
        let docker = match config.docker_host.as_deref() {
            Some(socket) => Docker::connect_with_unix(socket, 120, bollard::API_DEFAULT_VERSION)?,
            None => Docker::connect_with_local_defaults()?,
        };
        docker.ping().await?;
        Ok(Self {
            docker,
            worker: worker.to_string(),
            config,
            pulls: pull::Pulls::default(),
            last_used: Default::default(),
            held: Default::default(),
        })
    }

    /// Fails unless the daemon knows the configured OCI runtime (none configured: its
    /// default, always known).
    pub async fn check_runtime(&self) -> Result<(), DockerError> {
        let Some(want) = &self.config.runtime else {
            return Ok(());
        };
        let info = self.docker.info().await?;
        let runtimes = info.runtimes.unwrap_or_default();
        let known: Vec<String> = runtimes.keys().cloned().collect();
        if let Some(rt) = runtimes.get(want) {
            if self.config.gvisor() {
                let args = rt.runtime_args.clone().unwrap_or_default();
                let has = |a: &str| args.iter().any(|x| x == a);
                if !has("--network=none") {
                    return Err(DockerError::RuntimeArgs(format!(
                        "the daemon's runsc runtime lacks --network=none (it has {args:?}): \
                         gVisor's network stack refuses to start in a container without a \
                         network; deploy/install-runsc.sh registers it with the arguments \
                         sandboxes need"
                    )));
                }
                if !has("--oci-seccomp") {
                    tracing::warn!(
                        ?args,
                        "the daemon's runsc runtime lacks --oci-seccomp: \
                        Docker's seccomp profile does not apply inside gVisor, so sandboxed \
                        code may use unshare, keyctl and the like against gVisor's kernel"
                    );
                }
            }
            Ok(())
        } else {
            Err(DockerError::NoRuntime {
                want: want.clone(),
                known: known.join(", "),
            })
        }
    }

    /// True when sandboxes run under gVisor (see [`SandboxConfig::gvisor`]).
    pub fn gvisor(&self) -> bool {
        self.config.gvisor()
    }

    /// The default image of this worker.
    pub fn default_image(&self) -> &str {
        &self.config.image
    }

    /// True when the image is present locally.
    pub async fn has_image(&self, image: &str) -> Result<bool, DockerError> {
        match self.docker.inspect_image(image).await {
            Ok(_) => Ok(true),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Makes `image` present: `None` when it was already, else pulls it (under the allow-list,
    /// with the worker's credentials, one pull per image at a time, then the disk budget's
    /// collection) and returns how long the pull took, µs.
    pub async fn ensure_image(&self, image: &str) -> Result<Option<u64>, DockerError> {
        if let Some(why) = self.config.pull.open_refusal(image, &self.config.image) {
            crate::metrics::image_pull("refused", None);
            return Err(DockerError::Pull(pull::PullError::Refused(format!(
                "image {image:?} may not be opened: {why}"
            ))));
        }
        if self.has_image(image).await? {
            return Ok(None);
        }
        if self.config.pull.allow.is_empty() {
            return Err(DockerError::NoImage(image.to_string()));
        }
        let pull_us = self
            .pulls
            .pull(&self.docker, &self.config.pull, image)
            .await?;
        tracing::info!(image, pull_ms = pull_us / 1000, "pulled a sandbox image");
        self.after_pull(image).await;
        Ok(Some(pull_us))
    }

    /// Creates and starts a parked sandbox for `open` (the default image when it names none).
    pub async fn create(
        &self,
        job: &str,
        trajectory: &str,
        open: &SandboxOpen,
        parking_cores: &str,
    ) -> Result<Created, DockerError> {
        let image = open.image.as_deref().unwrap_or(&self.config.image);
        let (memory_mb, workdir_mb, env) = (open.memory_mb, open.workdir_mb, &open.env);
        let pull_us = self.ensure_image(image).await?.unwrap_or(0);
        self.used(image);
        // Unique per open: a trajectory's earlier sandbox may still be being removed (a
        // fence or a drain removes them while new opens arrive), and a fixed name would
        // collide with it. Leftovers of earlier instances are found by their labels.
        static OPENS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = OPENS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!(
            "tangram-{}-{job}-{trajectory}-{:x}-{n:x}",
            self.worker,
            std::process::id()
        );
        let labels = HashMap::from([
            (LABEL_WORKER.to_string(), self.worker.clone()),
            (LABEL_CLUSTER.to_string(), self.config.cluster.clone()),
            (LABEL_JOB.to_string(), job.to_string()),
            (LABEL_TRAJECTORY.to_string(), trajectory.to_string()),
        ]);
        let memory = (memory_mb as i64) << 20;
        let host_config = HostConfig {
            memory: Some(memory),
            memory_swap: Some(memory),
            // Started without the parked quota: at 1% of a core the container's start (runc
            // init and the keeper's shell) took 1.1 s instead of 0.18 s. Parked right after.
            cpuset_cpus: Some(parking_cores.to_string()),
            // Under gVisor the host's pids limit would count gVisor's own threads and stub
            // processes, not the sandbox's processes, and reaching it ends gVisor's kernel
            // (a shell fork bomb ended the sandbox with exit 2 in 5 s, reported as lost): the
            // memory limit bounds a fork bomb there instead (out of memory, the command's
            // outcome).
            pids_limit: (!self.config.gvisor()).then_some(self.config.pids_limit),
            network_mode: Some("none".into()),
            readonly_rootfs: Some(true),
            tmpfs: Some(HashMap::from([
                (
                    "/work".to_string(),
                    format!("rw,exec,nosuid,nodev,size={workdir_mb}m,mode=1777"),
                ),
                (
                    "/tmp".to_string(),
                    "rw,nosuid,nodev,size=16m,mode=1777".to_string(),
                ),
            ])),
            cap_drop: Some(vec!["ALL".into()]),
            security_opt: Some(vec!["no-new-privileges".into()]),
            init: Some(false),
            ulimits: Some(vec![
                ResourcesUlimits {
                    name: Some("nofile".into()),
                    soft: Some(self.config.nofile as i64),
                    hard: Some(self.config.nofile as i64),
                },
                // No core dumps: a crashing program's memory image stays out of /work and /tmp.
                ResourcesUlimits {
                    name: Some("core".into()),
                    soft: Some(0),
                    hard: Some(0),
                },
            ]),
            runtime: self.config.runtime.clone(),
            binds: (!self.config.mounts.is_empty()).then(|| self.config.mounts.clone()),
            ..Default::default()
        };
        let body = ContainerCreateBody {
            image: Some(image.to_string()),
            // The keeper as the entrypoint: an image's own ENTRYPOINT never runs in its
            // place (its CMD is not used either once the entrypoint is set).
            entrypoint: Some(vec!["/bin/sh".into(), "-c".into(), KEEPER.into()]),
            user: Some(self.config.user.clone()),
            working_dir: Some("/work".into()),
            env: Some(crate::sandbox::env_list(env)),
            labels: Some(labels),
            network_disabled: Some(true),
            host_config: Some(host_config),
            ..Default::default()
        };
        let created = match self
            .docker
            .create_container(
                Some(CreateContainerOptions {
                    name: Some(name.clone()),
                    ..Default::default()
                }),
                body,
            )
            .await
        {
            Ok(c) => c,
            Err(e) => {
                // The engine may have made it before the answer was lost: by its name.
                let _ = force_remove(&self.docker, &name).await;
                return Err(e.into());
            }
        };
        let id = created.id;
        if let Err(e) = self
            .docker
            .start_container(&id, None::<StartContainerOptions>)
            .await
        {
            let _ = self.remove(&id).await;
            return Err(e.into());
        }
        // Parked through Docker, so that its record (which a later update, a memory resize
        // among them, writes back whole) says parked too. Under gVisor, which Docker cannot
        // update, through the cgroup files below (and Docker never updates it later).
        if !self.config.gvisor() {
            if let Err(e) = self.update_cpus(&id, parking_cores, PARKED_QUOTA_US).await {
                let _ = self.remove(&id).await;
                return Err(e);
            }
        }
        let pid = match self.init_pid(&id).await {
            Ok(pid) => pid,
            Err(e) => {
                let _ = self.remove(&id).await;
                return Err(e);
            }
        };
        if self.config.gvisor() {
            let parked = crate::cgroup::CgroupCpu::for_pid(pid)
                .and_then(|c| c.apply(parking_cores, PARKED_QUOTA_US, false));
            if let Err(e) = parked {
                let _ = self.remove(&id).await;
                return Err(DockerError::Io(e));
            }
        }
        Ok(Created { id, pid, pull_us })
    }

    /// The host PID of a running container's init (under gVisor, its sandbox process).
    async fn init_pid(&self, id: &str) -> Result<i64, DockerError> {
        let info = self
            .docker
            .inspect_container(id, None::<InspectContainerOptions>)
            .await
            .map_err(|e| DockerError::from_api(e, id))?;
        Ok(info.state.and_then(|s| s.pid).unwrap_or(0))
    }

    /// Grants or parks cores through Docker's update API.
    pub async fn update_cpus(
        &self,
        id: &str,
        cpus: &str,
        quota_us: i64,
    ) -> Result<(), DockerError> {
        let body = ContainerUpdateBody {
            cpuset_cpus: Some(cpus.to_string()),
            cpu_period: Some(crate::cgroup::PERIOD_US),
            cpu_quota: Some(quota_us),
            ..Default::default()
        };
        self.docker
            .update_container(id, body)
            .await
            .map_err(|e| DockerError::from_api(e, id))
    }

    /// Sets the container's memory limit (swap included, so there is none), up or down.
    pub async fn update_memory(&self, id: &str, memory_mb: u64) -> Result<(), DockerError> {
        if self.config.gvisor() {
            let pid = self.init_pid(id).await?;
            return crate::memcg::MemoryCgroup::for_pid(pid)
                .and_then(|c| c.set(memory_mb << 20))
                .map_err(DockerError::Io);
        }
        let memory = (memory_mb as i64) << 20;
        let body = ContainerUpdateBody {
            memory: Some(memory),
            memory_swap: Some(memory),
            ..Default::default()
        };
        self.docker
            .update_container(id, body)
            .await
            .map_err(|e| DockerError::from_api(e, id))
    }

    /// Removes a sandbox (and its tmpfs contents).
    pub async fn remove(&self, id: &str) -> Result<(), DockerError> {
        force_remove(&self.docker, id).await
    }

    /// True when the container exists and runs.
    pub async fn is_running(&self, id: &str) -> bool {
        match self
            .docker
            .inspect_container(id, None::<InspectContainerOptions>)
            .await
        {
            Ok(info) => info.state.and_then(|s| s.running).unwrap_or(false),
            Err(_) => false,
        }
    }

    /// Containers labelled with this worker's id and cluster (or with no cluster label:
    /// sandboxes of versions before it).
    pub async fn leftovers(&self) -> Result<Vec<Leftover>, DockerError> {
        let list = labelled(&self.docker, LABEL_WORKER, &self.worker).await?;
        Ok(list
            .into_iter()
            .filter(|c| {
                same_cluster(
                    c.labels.as_ref().and_then(|l| l.get(LABEL_CLUSTER)),
                    &self.config.cluster,
                )
            })
            .filter_map(|c| {
                Some(Leftover {
                    id: c.id?,
                    labels: c.labels.unwrap_or_default(),
                })
            })
            .collect())
    }
}

/// Whether a sandbox labelled `label` belongs to the cluster `ours` (an unlabelled one is
/// from an older worker, which could only have been ours).
fn same_cluster(label: Option<&String>, ours: &str) -> bool {
    label.is_none_or(|l| l == ours)
}

/// Monotonic microseconds since `t`.
pub fn us_since(t: Instant) -> u64 {
    t.elapsed().as_micros() as u64
}

/// Removes a container whether it runs or not, with its anonymous volumes; one already gone
/// is not an error.
pub(crate) async fn force_remove(docker: &Docker, id: &str) -> Result<(), DockerError> {
    match docker
        .remove_container(
            id,
            Some(RemoveContainerOptions {
                force: true,
                v: true,
                ..Default::default()
            }),
        )
        .await
    {
        Ok(()) => Ok(()),
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Containers (running or not) carrying `label=value`.
pub(crate) async fn labelled(
    docker: &Docker,
    label: &str,
    value: &str,
) -> Result<Vec<bollard::models::ContainerSummary>, DockerError> {
    let filters = HashMap::from([("label".to_string(), vec![format!("{label}={value}")])]);
    Ok(docker
        .list_containers(Some(ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        }))
        .await?)
}

#[cfg(test)]
mod cluster_tests {
    #[test]
    fn a_sandbox_of_another_cluster_with_the_same_worker_id_is_not_a_leftover() {
        let other = "nats://127.0.0.1:4333".to_string();
        let ours = "nats://127.0.0.1:4222";
        assert!(!super::same_cluster(Some(&other), ours));
        assert!(super::same_cluster(Some(&ours.to_string()), ours));
        assert!(
            super::same_cluster(None, ours),
            "pre-label sandboxes stay ours"
        );
    }
}
