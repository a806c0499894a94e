//! Fencing: a worker the scheduler declared lost (silent past its grace, as in a network
//! partition) may still be alive, holding sandboxes and running actions that the scheduler
//! has settled and may have placed again elsewhere. The leader records the lost instance in
//! its bucket (`fence.<worker>`); the worker reads that record about once a second and, on
//! finding its own instance there, fences itself:
//!
//! - its sandboxes are removed (the scheduler counts them lost; their trajectories open new
//!   ones), which ends the commands running in them;
//! - what still runs is orphaned: heartbeats no longer list it and its results are dropped
//!   (the scheduler published `worker_lost` for each);
//! - it takes a new instance id, so its next heartbeat joins the fleet afresh;
//! - dispatches addressed to the fenced instance are refused (`fenced_instance`).
//!
//! A record naming another instance (an earlier run of this worker) is remembered too, so
//! that dispatches addressed to that instance are refused rather than run.

use super::{unix_us, Worker};
use crate::metrics as m;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// How often the fence record is read.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// A fresh instance id: the process and the time, in hex.
pub(crate) fn new_instance_id() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{:x}-{:x}-{n}", std::process::id(), unix_us())
}

/// Reads the fence record until `stop`, fencing this worker when it names this instance.
pub(super) async fn watch(worker: Arc<Worker>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(CHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The drain deadline whose sandboxes were closed already.
    let mut drained: Option<u64> = None;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Some(fenced) = worker.results.fence_record(&worker.config.id).await {
            worker.fence(&fenced).await;
        }
        let drain_by = worker
            .results
            .cordon_record(&worker.config.id)
            .await
            .and_then(|c| c.drain_by_unix_ms);
        match drain_by {
            Some(by) if unix_us() / 1000 >= by && drained != Some(by) => {
                drained = Some(by);
                worker.close_all_sandboxes("drained").await;
            }
            Some(_) => {}
            None => drained = None,
        }
    }
}

impl Worker {
    /// Acts on a fence record naming `fenced`; true when it was this instance, which is then
    /// fenced: sandboxes removed, running actions orphaned, a new instance id taken.
    pub(crate) async fn fence(&self, fenced: &str) -> bool {
        let (new, sandboxes) = {
            let mut st = self.state.lock().expect("state lock");
            let mut instance = self.instance.lock().expect("instance lock");
            let current = *instance == fenced;
            st.admissions.fence(fenced, current);
            if !current {
                return false;
            }
            self.era.fetch_add(1, Ordering::SeqCst);
            *instance = new_instance_id();
            // Taken under the same lock: the new instance starts with none.
            let sandboxes: Vec<_> = st.sandboxes.drain().map(|(_, s)| s).collect();
            (instance.clone(), sandboxes)
        };
        m::fenced();
        warn!(
            fenced,
            new = %new,
            "the scheduler declared this instance lost: removing its sandboxes, dropping the results of what it ran, rejoining as a new instance"
        );
        self.remove_sandboxes(sandboxes, "fenced").await;
        info!(instance = %new, "rejoined as a new instance");
        true
    }

    /// Removes every sandbox this worker holds (the commands running in them end as
    /// `sandbox_lost`); `why` is for the log.
    pub(crate) async fn close_all_sandboxes(&self, why: &'static str) {
        let sandboxes: Vec<_> = self
            .state
            .lock()
            .expect("state lock")
            .sandboxes
            .drain()
            .map(|(_, s)| s)
            .collect();
        self.remove_sandboxes(sandboxes, why).await;
    }

    async fn remove_sandboxes(
        &self,
        sandboxes: Vec<Arc<super::execute::Sandbox>>,
        why: &'static str,
    ) {
        if sandboxes.is_empty() {
            return;
        }
        info!(count = sandboxes.len(), why, "removing sandboxes");
        if let Some(runtime) = &self.sandboxes {
            for s in sandboxes {
                if let Err(e) = runtime.remove(&s.handle).await {
                    warn!(error = %e, why, "removing a sandbox");
                }
            }
        }
    }
}
