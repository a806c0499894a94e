//! Caps per job: the most sandboxes, sandbox memory and cores one job may hold at once, so
//! that one job cannot take the whole fleet (a job that opens sandboxes for all the memory
//! and never closes them would block every other job's opens until their idle timeout).
//!
//! An open that would take its job past a cap waits in the queue (the status report says
//! which cap) until the job closes something; one that could never fit its job's caps is
//! rejected. An exec is granted at most the cores its job has left under its cap, and a
//! malleable policy widens a job's execs only into what is left; one whose least width does
//! not fit now waits, one that never could is rejected. Under `static`, where a command runs
//! on its sandbox's cores, the cores cap bounds the sandboxes' cores instead.
//!
//! Within one planning cycle an exec takes its widest allowed width from what its job has
//! left before the pool places anything, so an exec that cannot be placed this cycle may
//! hold back its job's others until the next (its job only; never another job).

use super::lifecycle::{Entry, SandboxState};
use super::Engine;
use std::collections::HashMap;
use tangram_shared::{ActionSpec, JobId};

/// One job's caps; `None`: no cap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JobCaps {
    /// Sandboxes open or opening.
    pub max_sandboxes: Option<u32>,
    /// Memory of those sandboxes, MiB.
    pub max_sandbox_mem_mb: Option<u64>,
    /// Cores held by its running commands (and, under `static`, by its sandboxes).
    pub max_cores: Option<u32>,
    /// Actions queued at the scheduler (past it, arrivals are rejected `queue_full`); the
    /// fleet's [`super::EngineConfig::max_queued_per_job`] when not set.
    pub max_queued: Option<u32>,
    /// Reward calls running at once on the GPU pool (each holds a replica slot).
    pub max_gpu_calls: Option<u32>,
}

/// The key of [`super::EngineConfig::job_caps`] whose caps apply to every job not listed.
pub const EVERY_JOB: &str = "*";

/// What a job holds now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct JobUse {
    pub(crate) sandboxes: u32,
    pub(crate) mem_mb: u64,
    pub(crate) cores: u32,
}

impl Engine {
    /// The caps of `job`: its own, else those of every job, else none.
    pub(crate) fn caps_of(&self, job: &JobId) -> JobCaps {
        let caps = &self.config.job_caps;
        caps.get(job.as_str())
            .or_else(|| caps.get(EVERY_JOB))
            .copied()
            .unwrap_or_default()
    }

    /// Whether any job has a cap (when none has, nothing is counted).
    pub(crate) fn any_caps(&self) -> bool {
        !self.config.job_caps.is_empty()
    }

    /// What each job holds now: sandboxes that hold capacity, and cores booked by launched
    /// actions.
    pub(crate) fn job_use(&self) -> HashMap<JobId, JobUse> {
        let mut out: HashMap<JobId, JobUse> = HashMap::new();
        for ((job, _), s) in &self.sandboxes {
            if !s.holds() {
                continue;
            }
            let u = out.entry(job.clone()).or_default();
            u.sandboxes += 1;
            u.mem_mb += s.mem_mb;
            u.cores += s.cores;
        }
        for e in self.actions.values() {
            if let Some((_, booking)) = e.placed() {
                let cores = booking.counted_cores();
                if cores > 0 {
                    out.entry(e.action.job.clone()).or_default().cores += cores;
                }
            }
        }
        out
    }

    /// Cores a job's launched actions (and, under `static`, its sandboxes) hold now.
    pub fn job_cores(&self, job: &JobId) -> u32 {
        self.job_use().get(job).map_or(0, |u| u.cores)
    }

    /// Why an open of `mem_mb` by a job holding `u` must wait for its job to close
    /// something, if it must.
    pub(crate) fn open_over_cap(&self, job: &JobId, u: JobUse, mem_mb: u64) -> Option<String> {
        let caps = self.caps_of(job);
        if caps.max_sandboxes.is_some_and(|m| u.sandboxes + 1 > m) {
            return Some(format!(
                "job {job} at its cap of {} sandboxes",
                caps.max_sandboxes.unwrap_or(0)
            ));
        }
        if caps
            .max_sandbox_mem_mb
            .is_some_and(|m| u.mem_mb + mem_mb > m)
        {
            return Some(format!(
                "job {job} at its cap of {} MiB of sandboxes",
                caps.max_sandbox_mem_mb.unwrap_or(0)
            ));
        }
        let held = self.provisioning.trajectory_cores().unwrap_or(0);
        if held > 0 && caps.max_cores.is_some_and(|m| u.cores + held > m) {
            return Some(format!(
                "job {job} at its cap of {} cores",
                caps.max_cores.unwrap_or(0)
            ));
        }
        None
    }

    /// Why a sandbox action can never fit its job's caps, if it cannot: an open larger than
    /// the memory cap (or, under `static`, than the cores cap), an exec whose least width is
    /// past the cores cap.
    pub(crate) fn never_fits(&self, e: &Entry) -> Option<String> {
        let caps = self.caps_of(&e.action.job);
        let job = &e.action.job;
        let held = self.provisioning.trajectory_cores();
        match &e.action.spec {
            ActionSpec::SandboxOpen(o) => {
                if let Some(max) = caps.max_sandbox_mem_mb.filter(|m| o.memory_mb > *m) {
                    return Some(format!(
                        "memory_mb is {}; job {job}'s sandboxes may hold {max} MiB in all",
                        o.memory_mb
                    ));
                }
                let (cores, max) = (held?, caps.max_cores?);
                (cores > max).then(|| {
                    format!("a sandbox holds {cores} cores here; job {job} may hold {max}")
                })
            }
            ActionSpec::SandboxExec(x) if held.is_none() => {
                let max = caps.max_cores?;
                (x.cpus.min > max).then(|| {
                    format!(
                        "cpus.min is {}; job {job}'s commands may hold {max} cores in all",
                        x.cpus.min
                    )
                })
            }
            _ => None,
        }
    }

    /// The cores a job holding `u` may still be granted under its cap (`None`: no cap).
    pub(crate) fn cores_left(&self, job: &JobId, u: JobUse) -> Option<u32> {
        self.caps_of(job)
            .max_cores
            .map(|m| m.saturating_sub(u.cores))
    }

    /// Why a queued sandbox action of this job waits on its caps, for the status report
    /// (`used`: [`Engine::job_use`], taken once per report; `None` when no job has caps).
    pub(crate) fn cap_wait(
        &self,
        e: &Entry,
        used: Option<&HashMap<JobId, JobUse>>,
    ) -> Option<String> {
        let u = used?.get(&e.action.job).copied().unwrap_or_default();
        match &e.action.spec {
            ActionSpec::SandboxOpen(o) => self.open_over_cap(&e.action.job, u, o.memory_mb),
            // Under `static` a command runs on its sandbox's own cores.
            ActionSpec::SandboxExec(x) if self.provisioning.trajectory_cores().is_none() => {
                let left = self.cores_left(&e.action.job, u)?;
                let open = self
                    .sandbox(&e.action.job, &e.action.trajectory)
                    .is_some_and(|s| s.state == SandboxState::Open);
                (open && left < x.cpus.min).then(|| {
                    format!(
                        "job {} at its cap of {} cores",
                        e.action.job,
                        self.caps_of(&e.action.job).max_cores.unwrap_or(0)
                    )
                })
            }
            _ => None,
        }
    }
}
