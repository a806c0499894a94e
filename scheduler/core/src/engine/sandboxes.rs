//! The planning cycle's sandbox step: each queued sandbox action resolved, in queue order,
//! to where it may run (its trajectory's sandbox's worker, or anywhere for an open), a
//! rejection, or a wait (its sandbox still opening or being closed, its job at a cap).

use super::lifecycle::{SandboxKey, SandboxState};
use super::Engine;
use crate::model::{Constraint, Pending};
use std::collections::HashSet;
use tangram_shared::{ActionId, ActionKind, RejectCode, Rejection};

impl Engine {
    /// Sandbox actions: resolve each to a constraint from its trajectory's sandbox (or a
    /// rejection, or a wait), in queue order, for the CPU pool.
    pub(super) fn plan_sandboxes(
        &self,
        rejections: &mut Vec<(ActionId, Rejection)>,
        forget: &mut Vec<SandboxKey>,
        dropped: &mut Vec<SandboxKey>,
    ) -> Vec<Pending> {
        let mut pending = Vec::with_capacity(self.queue.len());
        let mut queued_opens: HashSet<SandboxKey> = HashSet::new();
        let mut images: Option<super::images::ImageIndex> = None;
        // What each job holds, and what this cycle's opens and execs add (caps per job).
        let mut used = if self.any_caps() {
            Some(self.job_use())
        } else {
            None
        };
        for id in &self.queue {
            let e = &self.actions[id];
            let a = &e.action;
            let key = (a.job.clone(), a.trajectory.clone());
            let sandbox = self.sandboxes.get(&key);
            let constraint = match a.kind() {
                ActionKind::Reward | ActionKind::Api => continue,
                ActionKind::SandboxOpen => {
                    let exists = sandbox.is_some_and(|s| s.state != SandboxState::Lost);
                    if exists && self.closing_asked(&key) {
                        continue; // the scheduler is closing it: the open goes after
                    }
                    if exists || !queued_opens.insert(key) {
                        rejections.push((
                            a.id.clone(),
                            Rejection::new(
                                RejectCode::SandboxExists,
                                format!(
                                    "trajectory {} of job {} already has a sandbox; close it first",
                                    a.trajectory, a.job
                                ),
                            ),
                        ));
                        continue;
                    }
                    if let Some(used) = &mut used {
                        if let Some(why) = self.never_fits(e) {
                            let rejection = Rejection::new(RejectCode::Unsatisfiable, why);
                            rejections.push((a.id.clone(), rejection));
                            continue;
                        }
                        let u = used.entry(a.job.clone()).or_default();
                        let mem_mb = a.demand().mem_mb;
                        if self.open_over_cap(&a.job, *u, mem_mb).is_some() {
                            continue; // waits for its job to close a sandbox
                        }
                        u.sandboxes += 1;
                        u.mem_mb += mem_mb;
                        u.cores += self.provisioning.trajectory_cores().unwrap_or(0);
                    }
                    e.pin.clone().map_or(Constraint::Any, Constraint::OnWorker)
                }
                ActionKind::SandboxExec | ActionKind::SandboxClose => match sandbox {
                    // A command for a sandbox the scheduler is closing waits for the close,
                    // and is then told why (it would race the close on the worker).
                    Some(s)
                        if s.state == SandboxState::Open
                            && a.kind() == ActionKind::SandboxExec
                            && self.closing_asked(&key) =>
                    {
                        continue
                    }
                    Some(s)
                        if s.state == SandboxState::Open
                            && a.kind() == ActionKind::SandboxClose =>
                    {
                        if let Some(why) = self.stale_close(&key, a) {
                            rejections.push((
                                a.id.clone(),
                                Rejection::new(
                                    RejectCode::NoSandbox,
                                    format!("the scheduler's close of trajectory {} of job {} is dropped: {why}", a.trajectory, a.job),
                                ),
                            ));
                            dropped.push(key.clone());
                            continue;
                        }
                        Constraint::OnWorker(s.worker.clone())
                    }
                    Some(s) if s.state == SandboxState::Open => {
                        Constraint::OnWorker(s.worker.clone())
                    }
                    Some(s) if s.state == SandboxState::Lost => {
                        if a.kind() == ActionKind::SandboxClose {
                            forget.push(key.clone());
                        }
                        rejections.push((
                            a.id.clone(),
                            Rejection::new(
                                RejectCode::NoSandbox,
                                format!(
                                    "the sandbox of trajectory {} of job {} {} ({}); open a new one",
                                    a.trajectory, a.job, self.sandbox_loss(&s.worker), s.worker
                                ),
                            ),
                        ));
                        continue;
                    }
                    // Wait for the open to finish or for the close ahead to take effect.
                    Some(_) => continue,
                    None if queued_opens.contains(&key) => continue,
                    // Just started: the heartbeats that list sandboxes may still be coming.
                    None if !self.settled_in => continue,
                    None => {
                        let why = match self.closed_because(&key) {
                            Some(reason) => format!(
                                "the sandbox of trajectory {} of job {} was closed by the scheduler ({}); open a new one",
                                a.trajectory,
                                a.job,
                                reason.as_str()
                            ),
                            None => format!(
                                "trajectory {} of job {} has no open sandbox; send sandbox_open first",
                                a.trajectory, a.job
                            ),
                        };
                        rejections.push((a.id.clone(), Rejection::new(RejectCode::NoSandbox, why)));
                        continue;
                    }
                },
            };
            let mut demand = a.demand();
            let per_command = self.provisioning.trajectory_cores().is_none();
            if let (Some(used), Some(range), true) = (&mut used, &mut demand.cores, per_command) {
                if let Some(why) = self.never_fits(e) {
                    let rejection = Rejection::new(RejectCode::Unsatisfiable, why);
                    rejections.push((a.id.clone(), rejection));
                    continue;
                }
                let u = used.entry(a.job.clone()).or_default();
                if let Some(left) = self.cores_left(&a.job, *u) {
                    if left < range.min {
                        continue; // waits for its job's commands to end
                    }
                    range.max = range.max.min(left);
                    u.cores += range.max;
                }
            }
            let model = self.model_of(e);
            let image = match super::lifecycle::open_image(a) {
                Some(key)
                    if self.config.image_locality
                        && self.provisioning.trajectory_cores().is_none() =>
                {
                    let index = images.get_or_insert_with(|| self.image_index());
                    Some(index.need(key, &self.config))
                }
                _ => None,
            };
            pending.push(Pending {
                id: a.id.clone(),
                demand,
                constraint,
                model,
                image,
            });
        }
        pending
    }
}
