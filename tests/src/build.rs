//! Builds actions tersely.

use std::collections::BTreeMap;
use tangram_shared::{
    Action, ActionId, ActionSpec, CpuRange, JobId, SandboxClose, SandboxExec, SandboxOpen,
    TrajectoryId, WorkerId,
};

fn action(id: &str, job: &str, traj: &str, spec: ActionSpec) -> Action {
    Action {
        queue_timeout_ms: None,
        id: ActionId::new(id).expect("id"),
        job: JobId::new(job).expect("job"),
        trajectory: TrajectoryId::new(traj).expect("trajectory"),
        timeout_ms: 30_000,
        spec,
    }
}
/// `sandbox_open` with defaults.
pub fn open(id: &str, job: &str, traj: &str) -> Action {
    action(
        id,
        job,
        traj,
        ActionSpec::SandboxOpen(SandboxOpen::default()),
    )
}
/// `sandbox_exec` of argv with cores [min, max].
pub fn exec(id: &str, job: &str, traj: &str, argv: &[&str], min: u32, max: u32) -> Action {
    action(
        id,
        job,
        traj,
        ActionSpec::SandboxExec(SandboxExec {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            cpus: CpuRange { min, max },
            files: BTreeMap::new(),
            env: BTreeMap::new(),
            stdin: None,
        }),
    )
}
/// `reward` on `service`.
pub fn reward(id: &str, job: &str, traj: &str, service: &str, inputs: &[&str]) -> Action {
    action(
        id,
        job,
        traj,
        ActionSpec::Reward(tangram_shared::Reward {
            service: service.into(),
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            options: BTreeMap::new(),
        }),
    )
}
/// `api` GET of `path` on `provider`, with `job=<job>` in the query.
pub fn api(id: &str, job: &str, traj: &str, provider: &str, path: &str) -> Action {
    action(
        id,
        job,
        traj,
        ActionSpec::Api(tangram_shared::Api {
            provider: provider.into(),
            method: "GET".into(),
            path: path.into(),
            query: BTreeMap::from([("job".to_string(), job.to_string())]),
            body: None,
            headers: BTreeMap::new(),
        }),
    )
}
/// `sandbox_close`.
pub fn close(id: &str, job: &str, traj: &str) -> Action {
    action(
        id,
        job,
        traj,
        ActionSpec::SandboxClose(SandboxClose::default()),
    )
}
/// A worker id.
pub fn worker(id: &str) -> WorkerId {
    WorkerId::new(id).expect("worker id")
}
