//! The process around the terms: connecting, setting up the streams, campaigning for the
//! leader lease, a term as leader ([`crate::term`]) while it is held, standing by after a
//! term ends, and shutdown.

use crate::config::Config;
use crate::lease::{self, Fence, LeaseConfig};
use anyhow::Context as _;
use async_nats::jetstream::{self, kv};
use std::sync::Arc;
use std::time::Duration;
use tangram_shared::subject;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

/// Terms failed on NATS in a row before the process gives up and exits.
const MAX_FAILED_TERMS: u32 = 8;

/// Counts a term that failed on NATS and waits before the next campaign: 1 s, doubling, at
/// most 30 s, spread at random (`tangram_nats::backoff`). The error is returned (the process exits) once MAX_FAILED_TERMS fail in a
/// row, about two and a half minutes.
async fn term_failed(failed: &mut u32, e: anyhow::Error) -> anyhow::Result<()> {
    *failed += 1;
    if *failed >= MAX_FAILED_TERMS {
        return Err(e.context(format!("{failed} terms in a row failed")));
    }
    error!(error = %format!("{e:#}"), "standing by after a failed term");
    crate::metrics::term_failed();
    let wait =
        tangram_nats::backoff::backoff(*failed, Duration::from_secs(1), Duration::from_secs(30));
    tokio::time::sleep(wait).await;
    Ok(())
}

/// How long the streams may take to become available at start (a cluster forming).
const STREAMS_WITHIN: Duration = Duration::from_secs(60);

/// Runs the scheduler until `shutdown` is cancelled: as a standby until it holds the leader
/// lease, then as leader until it stops or loses the lease (then a standby again).
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let client =
        tangram_nats::auth::connect(&config.nats_url, "tangram-scheduler", &config.credentials)
            .await?;
    let js = jetstream::new(client.clone());
    // A NATS cluster that is still forming has no JetStream leader yet: keep trying a while.
    let deadline = tokio::time::Instant::now() + STREAMS_WITHIN;
    let drifts = loop {
        match tangram_nats::ensure_streams(&js, &config.streams).await {
            Ok(d) => break d,
            Err(e) if tokio::time::Instant::now() < deadline && !shutdown.is_cancelled() => {
                warn!(error = %e, "setting up the streams; trying again");
                tokio::time::sleep(tangram_nats::backoff::jitter(Duration::from_secs(1))).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    crate::metrics::stream_drift(drifts.len());
    let store = scheduler_store(&js, config.streams.replicas.unwrap_or(1)).await?;
    // The lease on a connection of its own: on a busy server, a renewal queued behind the
    // term's own traffic on one connection (intake, acks, dispatches, heartbeats) came back
    // too late and the term ended.
    let lease_client = tangram_nats::auth::connect(
        &config.nats_url,
        "tangram-scheduler-lease",
        &config.credentials,
    )
    .await?;
    let lease_store = jetstream::new(lease_client)
        .get_key_value(subject::SCHEDULER_BUCKET)
        .await
        .context("opening the scheduler KV bucket for the lease")?;
    let lease_config = LeaseConfig {
        id: config.id.clone(),
        ttl: config.lease_ttl,
    };
    info!(id = %config.id, "scheduler starting");
    // (role, epoch) for the health endpoints: a standby is as ready as a leader.
    let role = Arc::new(std::sync::Mutex::new(("standby", 0u64)));
    if let Some(addr) = config.health_addr {
        let (client, role) = (client.clone(), role.clone());
        let check: tangram_health::Check = Arc::new(move || {
            let connected = client.connection_state() == async_nats::connection::State::Connected;
            let (r, epoch) = *role.lock().unwrap_or_else(|e| e.into_inner());
            tangram_health::Readiness {
                ready: connected,
                detail: serde_json::json!({
                    "component": "scheduler",
                    "role": r,
                    "epoch": epoch,
                    "nats": if connected { "connected" } else { "disconnected" },
                }),
            }
        });
        tangram_health::serve(addr, check, shutdown.clone())
            .await
            .with_context(|| format!("binding the health endpoints on {addr}"))?;
    }
    // Terms that failed on NATS in a row: the wait before campaigning again doubles, and
    // after MAX_FAILED_TERMS the process exits with the error (a permanent fault, such as a
    // permission, must surface; a supervisor restarts it).
    let mut failed_terms = 0u32;
    while let Some(mut held) = lease::campaign(&lease_store, &lease_config, &shutdown).await {
        let epoch = match next_epoch(&store).await {
            Ok(e) => e,
            Err(e) => {
                // The bucket is unreachable (a cluster moving its leaders): give the lease up
                // and campaign again after a pause, rather than exiting.
                lease::release(held).await;
                term_failed(&mut failed_terms, e.context("taking the next epoch")).await?;
                continue;
            }
        };
        held.record.epoch = epoch;
        info!(epoch, "leading");
        *role.lock().unwrap_or_else(|e| e.into_inner()) = ("leader", epoch);
        crate::metrics::leader(true, epoch);
        // The term ends on shutdown or when the lease is lost; the fence stops dispatches
        // the moment renewals stop succeeding, before a standby can take over.
        let term = shutdown.child_token();
        // Three quarters of the TTL, counted from each renewal's sending (see `Fence`).
        let fence = Fence::since(config.lease_ttl * 3 / 4, held.taken_at);
        let holder = tokio::spawn(lease::hold(
            held,
            lease_config.clone(),
            fence.clone(),
            term.clone(),
            term.clone(),
        ));
        let led =
            crate::term::lead(&client, &js, &store, &config, epoch, fence, term.clone()).await;
        term.cancel();
        let _ = holder.await;
        crate::metrics::leader(false, epoch);
        *role.lock().unwrap_or_else(|e| e.into_inner()) = ("standby", epoch);
        if shutdown.is_cancelled() {
            // Stopping: a term cut short while it was still setting up (its NATS calls
            // waiting out an outage) has nothing left to retry, and the stop asked for is
            // done (regression: a test's scheduler stopped right after a NATS restart
            // returned the term's "creating consumer: timed out" as the stop's error).
            if let Err(e) = led {
                warn!(error = %format!("{e:#}"), epoch, "the last term ended with an error while stopping");
            }
            break;
        }
        match led {
            Ok(()) => {
                failed_terms = 0;
                warn!(epoch, "lost the leader lease; standing by");
            }
            // Starting or running the term failed on NATS (a consumer not created in time
            // while the cluster elects stream leaders): the lease was released when the term
            // ended; stand by and campaign again, so that one slow election does not leave
            // the fleet without a scheduler where nothing restarts it.
            Err(e) => term_failed(&mut failed_terms, e.context(format!("term {epoch}"))).await?,
        }
    }
    // Drain: unsubscribe (no more deliveries to this process) and flush. Bounded: NATS may be
    // gone, and SIGTERM must still end the process.
    let _ = tokio::time::timeout(Duration::from_secs(3), client.drain()).await;
    info!("scheduler stopped");
    Ok(())
}

/// The scheduler's KV bucket (epoch, leader lease, standbys), created when missing.
async fn scheduler_store(js: &jetstream::Context, replicas: usize) -> anyhow::Result<kv::Store> {
    match js.get_key_value(subject::SCHEDULER_BUCKET).await {
        Ok(s) => Ok(s),
        Err(_) => js
            .create_key_value(kv::Config {
                bucket: subject::SCHEDULER_BUCKET.into(),
                description: "scheduler epoch, leader lease and standbys".into(),
                history: 1,
                storage: jetstream::stream::StorageType::File,
                num_replicas: replicas,
                ..Default::default()
            })
            .await
            .context("creating the scheduler KV bucket"),
    }
}

/// Bumps the scheduler epoch in KV; every dispatch carries it so workers can refuse a stale
/// scheduler's decisions.
async fn next_epoch(store: &kv::Store) -> anyhow::Result<u64> {
    for _ in 0..16 {
        let entry = store.entry(subject::EPOCH_KEY).await?;
        let (current, revision) = match entry {
            Some(e) => {
                let text = String::from_utf8_lossy(&e.value).to_string();
                (text.trim().parse::<u64>().unwrap_or(0), Some(e.revision))
            }
            None => (0, None),
        };
        let next = current + 1;
        let written = match revision {
            Some(rev) => store
                .update(subject::EPOCH_KEY, next.to_string().into(), rev)
                .await
                .is_ok(),
            None => store
                .create(subject::EPOCH_KEY, next.to_string().into())
                .await
                .is_ok(),
        };
        if written {
            return Ok(next);
        }
    }
    anyhow::bail!("could not bump the scheduler epoch: another scheduler keeps racing for it")
}
