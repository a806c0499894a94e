//! Heartbeats: what this worker offers and holds, every period and once more when it stops.

use super::Worker;
use crate::metrics as m;
use std::sync::Arc;
use tangram_shared::codec::{self, Encoding};
use tangram_shared::{subject, ActionId, Heartbeat, SandboxRef};
use tokio_util::sync::CancellationToken;
use tracing::warn;

pub(super) async fn heartbeats(
    worker: Arc<Worker>,
    client: async_nats::Client,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(worker.config.heartbeat);
    // After a stall, one heartbeat, not one per missed period: the scheduler takes at most
    // 40 a second from a worker.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seq = 0;
    let mut said_draining = false;
    loop {
        let draining = worker.draining.clone();
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
            // The moment draining starts, say so (once, then every period as usual).
            _ = draining.cancelled(), if !said_draining => said_draining = true,
        }
        seq += 1;
        let draining = worker.draining.is_cancelled();
        send_heartbeat(&worker, &client, seq, draining).await;
    }
}

/// Reads the GPUs' use every `period` for the metrics, until `stop`. An NVML call takes
/// microseconds, so it is made in place; a failed reading is logged once and retried.
pub(super) async fn gpu_samples(
    sampler: Arc<dyn crate::gpu::GpuSampler>,
    period: std::time::Duration,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(period);
    let mut failing = false;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        match sampler.sample() {
            Ok(samples) => {
                failing = false;
                m::gpu_samples(&samples);
            }
            Err(e) if !failing => {
                failing = true;
                warn!(error = %e, "reading GPU use from NVML");
            }
            Err(_) => {}
        }
    }
}

pub(super) async fn send_heartbeat(
    worker: &Worker,
    client: &async_nats::Client,
    seq: u64,
    draining: bool,
) {
    let hb = heartbeat_of(worker, seq, draining);
    match codec::encode(&hb, Encoding::Msgpack) {
        Ok(bytes) => {
            if let Err(e) = client
                .publish(subject::heartbeat(&worker.config.id), bytes.into())
                .await
            {
                warn!(error = %e, "heartbeat publish failed");
            }
        }
        Err(e) => warn!(error = %e, "encoding a heartbeat"),
    }
}

/// The heartbeat the worker sends now.
pub(super) fn heartbeat_of(worker: &Worker, seq: u64, draining: bool) -> Heartbeat {
    let st = worker.state.lock().expect("state lock");
    let mut sandboxes: Vec<SandboxRef> = st
        .sandboxes
        .iter()
        .filter_map(|(key, s)| {
            Some(SandboxRef {
                job: tangram_shared::JobId::new(key.job.clone()).ok()?,
                trajectory: tangram_shared::TrajectoryId::new(key.trajectory.clone()).ok()?,
                mem_mb: s.mem_mb,
                open: Some(s.open.clone()),
                idle_timeout_ms: s.idle_timeout_ms,
            })
        })
        .collect();
    sandboxes.sort();
    let mut running: Vec<ActionId> = st.admissions.running.iter().cloned().collect();
    running.sort();
    let finished = st.admissions.lately_finished();
    // Re-sized execs' cores now (a new leader books these), and those of admitted execs
    // that will start at a re-sized width.
    let mut resized: std::collections::BTreeMap<ActionId, u32> = st
        .execs
        .iter()
        .filter(|(_, s)| s.seq > 0)
        .map(|(id, s)| (id.clone(), s.cores.len() as u32))
        .collect();
    for (id, r) in &st.early {
        if st.admissions.running.contains(id) {
            resized.entry(id.clone()).or_insert(r.grant.cores.max(1));
        }
    }
    m::sandboxes(sandboxes.len());
    Heartbeat {
        worker: worker.config.id.clone(),
        instance: worker.instance.lock().expect("instance lock").clone(),
        seq,
        interval_ms: worker.config.heartbeat.as_millis() as u64,
        cores: if worker.sandboxes.is_some() {
            worker.config.cores.len() as u32
        } else {
            0
        },
        mem_mb: if worker.sandboxes.is_some() {
            worker.config.mem_mb
        } else {
            0
        },
        running,
        finished,
        dispatch_seq: st.admissions.dispatch_seq,
        known_epoch: st.admissions.known_epoch(),
        sandboxes,
        draining,
        gpus: worker.inventory.clone(),
        services: worker
            .services
            .as_ref()
            .map(|s| s.report())
            .unwrap_or_default(),
        providers: worker
            .providers
            .as_ref()
            .map(|p| p.report())
            .unwrap_or_default(),
        warm: worker.sandboxes.as_ref().and_then(|s| s.warm()),
        images: worker
            .sandboxes
            .as_ref()
            .map(|s| s.images())
            .unwrap_or_default(),
        resized,
    }
}
