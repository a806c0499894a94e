//! One term as leader: the tasks around the state task, the I/O shell of the engine.
//!
//! Intake decodes and validates action messages and checks for stored results (the duplicate
//! check beyond the stream's window: an in-memory filter, a lookup only when it cannot rule a
//! result out; see [`crate::stored`] and [`crate::intake`]) on its own task, pipelined, in
//! stream order, beside what an earlier leader left unanswered ([`crate::held`]); the state
//! task ([`crate::shell`]) runs the engine; the dispatcher ([`crate::dispatcher`]) stores
//! dispatches and awaits their PubAcks concurrently; results, heartbeats, status requests
//! ([`crate::report`]) and ticks are fed in by their own tasks.
//!
//! Files: `setup.rs` (what a term works with, set up patiently), `feeds.rs` (the tasks that
//! feed the state task). [`lead`] runs a term as a sequence of named steps.

mod feeds;
mod setup;

use crate::channels::Input;
use crate::config::Config;
use crate::dispatcher;
use crate::gate::Gate;
use crate::lease::Fence;
use crate::shell::{Shell, ShellIo};
use crate::stored::StoredResults;
use async_nats::jetstream::{self, kv};
use std::sync::Arc;
use std::time::Duration;
use tangram_core::{Engine, EngineConfig};
use tangram_shared::Limits;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{warn, Instrument};

/// Inputs waiting for the state task; intake pauses when it is full.
const EVENT_CHANNEL: usize = 4096;
/// Stored-result lookups in flight at once on the intake (their answers are taken in order).
const LOOKUPS: usize = 64;
/// How often the engine is ticked (liveness, deadlines, in-progress acks).
const TICK: Duration = Duration::from_millis(250);

/// One term as leader, until `shutdown` (the end of the term) is cancelled.
pub(crate) async fn lead(
    client: &async_nats::Client,
    js: &jetstream::Context,
    store: &kv::Store,
    config: &Config,
    epoch: u64,
    fence: Arc<Fence>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let mut wiring = setup::connect(client, js, &shutdown).await?;
    // What an earlier leader was delivered and never answered, read before this term pulls
    // anything (see `crate::held`).
    let taken_back = crate::held::take_back(&mut wiring.actions, &wiring.actions_stream).await;
    let dispatches = wiring.dispatch_stream.clone();

    let (tx, rx) = mpsc::channel(EVENT_CHANNEL);
    let tasks = TaskTracker::new();
    let gate = Arc::new(Gate::new(
        config.max_queued_actions,
        config.max_queued_bytes,
    ));
    let stored = Arc::new(StoredResults::default());
    let limits = Limits {
        max_timeout_ms: config.max_timeout.as_millis() as u64,
        max_idle_timeout_ms: config.max_sandbox_idle_timeout.as_millis() as u64,
        ..Limits::default()
    };
    let feeds = feeds::Feeds {
        tasks: &tasks,
        tx: &tx,
        gate: &gate,
        stored: &stored,
        shutdown: &shutdown,
    };
    feeds::scans(&wiring, &feeds);
    let intake_stop = shutdown.child_token();
    let max_bytes = config.max_action_bytes;
    feeds::intake(
        &wiring,
        taken_back,
        limits,
        max_bytes,
        &feeds,
        intake_stop.clone(),
    )
    .await?;
    feeds::the_rest(wiring, client, js, store, &feeds).await?;
    feeds::ticks(&feeds, fence.clone());
    let (dispatch_tx, dispatcher_stop) = start_dispatcher(js, &tx, &fence, &tasks);

    let engine = engine_for(config, epoch, limits)?;
    let mut shell = Shell::new(
        engine,
        ShellIo {
            outbox: Arc::new(crate::outbox::Jetstream {
                js: js.clone(),
                dispatches,
            }),
            // The state task's own sender, for answers to lookups it starts.
            to_self: tx,
            dispatches: dispatch_tx,
            fence,
            tasks: tasks.clone(),
            gate,
        },
    );
    shell
        .run(rx, shutdown.clone())
        .instrument(tracing::info_span!("state", epoch))
        .await;
    drop(shell);
    wind_down(intake_stop, dispatcher_stop, tasks).await;
    Ok(())
}

/// The dispatcher: PubAcks awaited concurrently, outcomes back to the state task. Returns
/// its input and what stops it.
fn start_dispatcher(
    js: &jetstream::Context,
    tx: &mpsc::Sender<Input>,
    fence: &Arc<Fence>,
    tasks: &TaskTracker,
) -> (
    mpsc::UnboundedSender<crate::channels::Publish>,
    CancellationToken,
) {
    let (dispatch_tx, dispatch_rx) = mpsc::unbounded_channel();
    let stop = CancellationToken::new();
    tasks.spawn(
        dispatcher::run(
            js.clone(),
            dispatch_rx,
            tx.clone(),
            fence.clone(),
            stop.clone(),
        )
        .instrument(tracing::info_span!("dispatcher")),
    );
    (dispatch_tx, stop)
}

/// The engine a term runs, as configured.
fn engine_for(config: &Config, epoch: u64, limits: Limits) -> anyhow::Result<Engine> {
    Ok(Engine::new(EngineConfig {
        epoch,
        policy: config.policy.clone(),
        static_cores: config.static_cores,
        missed_heartbeats: config.worker_missed_heartbeats,
        settle_ms: config.settle.as_millis() as u64,
        rejoin_ms: config.worker_rejoin.as_millis() as u64,
        job_weights: config.job_weights.clone(),
        job_caps: config.job_caps.clone(),
        max_queued_per_job: Some(config.max_queued_per_job),
        max_queued_bytes_per_job: Some(config.max_queued_bytes_per_job),
        providers: config.providers.clone(),
        services: config.services.clone(),
        limits,
        // Renewals come every quarter lease; the ticker passes each on within a tick.
        reachable_every_ms: (config.lease_ttl / 4 + TICK).as_millis() as u64,
        image_locality: config.image_locality,
        pull_mb_per_s: config.pull_mb_per_s,
        image_load_ms: config.image_load_ms,
        idle_timeout_ms: config.sandbox_idle_timeout.as_millis() as u64,
        // The backlog scan (`adopt::scan_backlog`) says when it is done.
        await_backlog: true,
        ..EngineConfig::default()
    })?)
}

/// Phase two, after the state task stopped: intake has stopped (shutdown cancelled it); the
/// tasks finish, the dispatcher reporting what it still had in flight, within 5 s.
async fn wind_down(
    intake_stop: CancellationToken,
    dispatcher_stop: CancellationToken,
    tasks: TaskTracker,
) {
    intake_stop.cancel();
    dispatcher_stop.cancel();
    tasks.close();
    if tokio::time::timeout(Duration::from_secs(5), tasks.wait())
        .await
        .is_err()
    {
        warn!("scheduler tasks did not stop within 5 s");
    }
}
