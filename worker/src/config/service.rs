//! One `[[service]]` entry of a GPU worker's config: a model service, the serving engine it
//! runs, how a replica starts, and its size and slots. A leaf: the services that run it and
//! the config that reads it both use it.

use serde::Deserialize;

/// The serving engine a service runs, which decides the lifecycle and scoring calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Driver {
    /// vLLM with `--enable-sleep-mode`: `/sleep?level=1`, `/wake_up`, `/is_sleeping`;
    /// scores through `/pooling`.
    Vllm,
    /// SGLang: `/release_memory_occupation`, `/resume_memory_occupation`; scores through
    /// `/classify`.
    Sglang,
    /// The reference replica shipped in `services/reference-replica/`.
    Reference,
}

/// One `[[service]]` entry of the worker's config.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceConfig {
    /// Name reward actions use.
    pub name: String,
    /// Serving engine.
    pub driver: Driver,
    /// How to start a replica as a process; `{port}`, `{service}` and `{gpus}` are
    /// replaced. The process also gets `CUDA_VISIBLE_DEVICES` set to its chunk's GPUs.
    #[serde(default)]
    pub command: Vec<String>,
    /// Or: a container image (present locally) that runs a replica, with `args` as its
    /// command (placeholders as in `command`). It runs with host networking; the chunk's GPUs
    /// are passed through a Docker device request when NVML found them.
    #[serde(default)]
    pub image: Option<String>,
    /// The container's command, with `image`.
    #[serde(default)]
    pub args: Vec<String>,
    /// Bind mounts for the container (`host:container[:ro]`), with `image`.
    #[serde(default)]
    pub mounts: Vec<String>,
    /// GPUs per replica: 1, 2, 4 or 8.
    #[serde(default = "one")]
    pub gpus: u8,
    /// Host memory the service's state takes, in MiB (for operators; reported in logs).
    #[serde(default)]
    pub host_mem_mb: u64,
    /// Expected restore time, ms (the scheduler's first estimate; measured restores refine it).
    #[serde(default = "restore_default")]
    pub restore_ms: u64,
    /// Requests one replica serves at once.
    #[serde(default = "slots_default")]
    pub slots: u32,
    /// How long a new replica may take to answer its health check, ms.
    #[serde(default = "start_default")]
    pub start_timeout_ms: u64,
    /// Engine model name passed in scoring requests (vLLM and SGLang need it).
    #[serde(default)]
    pub model: Option<String>,
    /// Environment of a replica process, on top of [`REPLICA_PASSTHROUGH`] and the GPU
    /// variables the worker sets. Nothing else of the worker's environment (its credentials
    /// included) reaches a replica.
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
}

/// Variables of the worker's environment a replica process inherits: what an interpreter
/// or a CUDA runtime needs to start, nothing that grants access.
pub const REPLICA_PASSTHROUGH: &[&str] = &[
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "TZ",
    "TMPDIR",
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "CUDA_HOME",
    "HF_HOME",
];

fn one() -> u8 {
    1
}
fn restore_default() -> u64 {
    500
}
fn slots_default() -> u32 {
    8
}
fn start_default() -> u64 {
    60_000
}

impl ServiceConfig {
    /// Checks the entry.
    pub fn check(&self) -> Result<(), String> {
        if self.name.is_empty() || self.name.len() > 128 {
            return Err("service.name must have 1 to 128 characters".into());
        }
        if !tangram_shared::CHUNK_SIZES.contains(&self.gpus) {
            return Err(format!(
                "service {:?}: gpus must be 1, 2, 4 or 8, not {}",
                self.name, self.gpus
            ));
        }
        if self.command.is_empty() {
            return Err(format!("service {:?}: command is empty", self.name));
        }
        if !self.command.iter().any(|a| a.contains("{port}")) {
            return Err(format!(
                "service {:?}: command must take the replica's port as {{port}}",
                self.name
            ));
        }
        if self.slots == 0 {
            return Err(format!("service {:?}: slots must be at least 1", self.name));
        }
        Ok(())
    }
}
