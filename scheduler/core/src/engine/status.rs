//! The status report (`tangram status`): a read of the engine's state, no decisions.

use super::lifecycle::{ActionState, SandboxState};
use super::{Engine, Now};
use crate::model::{Unplaced, WaitReason};
use std::collections::{BTreeMap, HashMap};
use tangram_shared::stats::quantile;
use tangram_shared::status::*;
use tangram_shared::Timing;
use tangram_shared::{ActionId, ActionSpec};

impl Engine {
    /// The live workers' liveness and bookings, for the metrics.
    pub(crate) fn worker_gauges(&self, now: Now) -> Vec<super::WorkerGauge> {
        let snapshot = self.snapshot();
        self.workers
            .iter()
            .map(|(id, w)| {
                let view = snapshot.worker(id);
                super::WorkerGauge {
                    worker: id.clone(),
                    heartbeat_age_s: now.ms.saturating_sub(w.last_seen_ms) as f64 / 1e3,
                    cores: w.hb.cores,
                    cores_booked: view.map_or(0, |v| v.total_cores - v.free_cores),
                    mem_mb: w.hb.mem_mb,
                    mem_booked_mb: view.map_or(0, |v| v.total_mem_mb - v.free_mem_mb),
                }
            })
            .collect()
    }

    /// The status report as of `now`.
    pub fn status(&self, now: Now) -> Status {
        let started = self.started_ms.unwrap_or(now.ms);
        let mut st = Status {
            epoch: self.config.epoch,
            policy: self.config.policy.clone(),
            uptime_s: now.ms.saturating_sub(started) as f64 / 1e3,
            sandboxes: self.sandboxes.values().filter(|s| s.holds()).count(),
            queues: self.queues(now),
            ..Default::default()
        };
        for ((job, _), s) in self.sandboxes.iter().filter(|(_, s)| s.holds()) {
            let j = st.jobs.entry(job.to_string()).or_default();
            j.sandboxes += 1;
            j.mem_mb += s.mem_mb;
        }
        for (id, w) in &self.workers {
            st.workers.push(WorkerStatus {
                id: id.to_string(),
                cores: w.hb.cores,
                // The CPU pool's report fills in what is used.
                cores_used: 0,
                mem_mb: w.hb.mem_mb,
                mem_used_mb: 0,
                gpus: w
                    .hb
                    .gpus
                    .as_ref()
                    .map_or(0, |g| g.groups.iter().map(|x| x.len() as u32).sum()),
                gpu_source: w.hb.gpus.as_ref().map(|g| g.source.clone()),
                last_seen_s: now.ms.saturating_sub(w.last_seen_ms) as f64 / 1e3,
                draining: w.hb.draining,
                cordoned: self.cordons.contains_key(id),
                drain_by_unix_ms: self.cordons.get(id).and_then(|c| c.drain_by_unix_ms),
                running: self
                    .actions
                    .values()
                    .filter(|e| e.placed().is_some_and(|(pw, _)| pw == id))
                    .count() as u32,
                sandboxes: self
                    .sandboxes
                    .values()
                    .filter(|s| &s.worker == id && s.state != super::lifecycle::SandboxState::Lost)
                    .count() as u32,
                warm: w.hb.warm,
                images: w.hb.images.clone(),
            });
        }
        for e in self.actions.values() {
            let kind = e.action.kind().as_str().to_string();
            match e.placed() {
                None => *st.queued.entry(kind).or_default() += 1,
                Some(_) => *st.running.entry(kind).or_default() += 1,
            }
        }
        st.waiting = self.waiting();
        self.pools.report(&self.held(), &mut st);
        let mut by_kind: BTreeMap<&str, Vec<&Timing>> = BTreeMap::new();
        for (k, t, _) in &self.recent {
            by_kind.entry(k.as_str()).or_default().push(t);
        }
        for (k, ts) in by_kind {
            let n = ts.len();
            let mut acts: Vec<f64> = ts.iter().map(|t| t.act_us as f64 / 1e6).collect();
            acts.sort_by(f64::total_cmp);
            let mean = |f: &dyn Fn(&Timing) -> u64| {
                ts.iter().map(|t| f(t) as f64).sum::<f64>() / n as f64 / 1e6
            };
            st.recent.insert(
                k.to_string(),
                ActStats {
                    count: n,
                    mean_s: acts.iter().sum::<f64>() / n as f64,
                    p50_s: quantile(&acts, 0.5),
                    p99_s: quantile(&acts, 0.99),
                    queued_s: mean(&|t| t.queued_us),
                    overhead_s: mean(&|t| t.overhead_us),
                    exec_s: mean(&|t| t.exec_us),
                },
            );
        }
        st
    }
}

impl Engine {
    /// Why the actions not running wait, counted by reason: what the last plan said of each
    /// one the CPU policy saw, and for the others what they wait on (a GPU, a quota, their
    /// sandbox, a retry).
    fn waiting(&self) -> BTreeMap<String, usize> {
        let cpu: HashMap<&ActionId, &Unplaced> = self
            .pools
            .cpu
            .unplaced()
            .iter()
            .map(|(i, u)| (i, u))
            .collect();
        let mut out: BTreeMap<String, usize> = BTreeMap::new();
        let used = self.any_caps().then(|| self.job_use());
        for (id, e) in &self.actions {
            let why = match &e.state {
                ActionState::Backoff { .. } => {
                    "a retry: its dispatch failed to be stored twice or more".to_string()
                }
                ActionState::Queued { .. } => match cpu.get(id) {
                    Some(u) => unplaced_reason(u),
                    None => self
                        .cap_wait(e, used.as_ref())
                        .unwrap_or_else(|| self.wait_of(e)),
                },
                _ => continue,
            };
            *out.entry(why).or_default() += 1;
        }
        out
    }

    /// What a queued action that the CPU policy did not judge waits on.
    fn wait_of(&self, e: &super::lifecycle::Entry) -> String {
        if self.stopping {
            return "this scheduler is stopping: handed back to the next".into();
        }
        if self.backlog_pending {
            return "the dispatch backlog to be read (the term just started)".into();
        }
        let a = &e.action;
        match &a.spec {
            ActionSpec::Reward(r) => format!("a GPU replica of service {}", r.service),
            ActionSpec::Api(c) => format!("quota of {}", c.provider),
            ActionSpec::SandboxExec(_) | ActionSpec::SandboxClose(_) => {
                match self.sandbox(&a.job, &a.trajectory).map(|s| s.state) {
                    Some(SandboxState::Opening) => "its sandbox to open".into(),
                    Some(SandboxState::Closing) => "its sandbox's close to finish".into(),
                    None if !self.settled_in => {
                        "the workers' first heartbeats (the scheduler just started)".into()
                    }
                    _ => "its sandbox's open, queued ahead of it".into(),
                }
            }
            ActionSpec::SandboxOpen(_) => "the next planning cycle".into(),
        }
    }
}

/// A CPU policy's reason for not launching, in words that group actions alike (the need,
/// not the best worker's free figure).
fn unplaced_reason(u: &Unplaced) -> String {
    match u {
        Unplaced::MayFitLater(WaitReason::NoWorkers) => "no worker has registered".into(),
        Unplaced::MayFitLater(WaitReason::Cores { need, .. }) => {
            format!("no worker with {need} free cores")
        }
        Unplaced::MayFitLater(WaitReason::Memory { need_mb, .. }) => {
            format!("no worker with {} free", mebibytes(*need_mb))
        }
        Unplaced::MayFitLater(WaitReason::NotAccepting(w)) => {
            format!("worker {w}, which takes no new work now")
        }
        Unplaced::NeverFits(_) => {
            "a worker large enough (none has registered yet; rejected once the fleet is known)"
                .into()
        }
    }
}

/// MiB as an operator reads them: whole GiB as GiB.
fn mebibytes(mb: u64) -> String {
    if mb >= 1024 && mb.is_multiple_of(1024) {
        format!("{} GiB", mb / 1024)
    } else {
        format!("{mb} MiB")
    }
}
