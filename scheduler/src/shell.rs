//! The state task: the one owner of the engine. It turns inputs into engine events, runs the
//! engine once per burst, and carries its effects out without awaiting NATS round trips
//! itself: dispatches go to the dispatcher, rejections and results to tracked tasks, acks to
//! the acker. It holds each action message until the engine acks, naks or rejects it.

use crate::dispatcher::{Outgoing, Publish};
use crate::held::Incoming;
use crate::lease::Fence;
use crate::metrics as m;
use async_nats::jetstream::{self, AckKind};
use async_nats::HeaderMap;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tangram_core::engine::{Delivery, Observation, Reject};
use tangram_core::{Effect, Engine, Event, Now};
use tangram_shared::codec::Encoding;
use tangram_shared::{subject, ActionResult};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn, Instrument};

/// How long a stopping scheduler waits for the outcomes of dispatches already handed out.
const DISPATCH_DRAIN: Duration = Duration::from_secs(5);
/// Attempts at storing a result or rejection the engine publishes (backoff doubling from
/// 100 ms, capped: about 30 s in all); the result's `Nats-Msg-Id` makes repeats harmless.
const RESULT_ATTEMPTS: u32 = 10;
/// Dead-letter records keep at most this much of the original payload.
const DEADLETTER_PAYLOAD_CAP: usize = 64 * 1024;

/// What the other tasks send the state task.
#[derive(Debug)]
pub(crate) enum Input {
    /// An action message and what the intake made of it.
    Message(Box<Incoming>, Event),
    /// Anything else for the engine.
    Engine(Event),
    /// Someone asked for the status report.
    Status(oneshot::Sender<tangram_shared::status::Status>),
}

/// Ack-type replies to action messages, sent in order by one task.
#[derive(Debug)]
enum Reply {
    Ack(Box<Incoming>),
    Nak(Box<Incoming>),
    Progress(Box<jetstream::Message>),
}

/// The engine's clock: monotonic since start, and wall time for result timestamps.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    start: Instant,
}

impl Clock {
    pub(crate) fn new() -> Self {
        Self {
            start: Instant::now(),
        }
    }
    pub(crate) fn now(&self) -> Now {
        Now {
            ms: self.start.elapsed().as_millis() as u64,
            unix_us: unix_us(),
        }
    }
    fn at(&self, ms: u64) -> Instant {
        self.start + Duration::from_millis(ms)
    }
}

pub(crate) struct Shell {
    engine: Engine,
    clock: Clock,
    js: jetstream::Context,
    /// Action messages the engine has not finished with, by delivery (stream sequence).
    messages: HashMap<Delivery, Box<Incoming>>,
    dispatches: mpsc::UnboundedSender<Publish>,
    replies: mpsc::UnboundedSender<Reply>,
    replies_rx: Option<mpsc::UnboundedReceiver<Reply>>,
    tasks: TaskTracker,
    wake_at: Option<u64>,
    fence: Arc<Fence>,
    dispatch_stream: jetstream::stream::Stream,
    to_self: mpsc::Sender<Input>,
    gate: Arc<crate::gate::Gate>,
}

/// What the state task is wired to.
pub(crate) struct ShellIo {
    pub(crate) js: jetstream::Context,
    pub(crate) dispatch_stream: jetstream::stream::Stream,
    /// Its own input channel, for lookups it starts.
    pub(crate) to_self: mpsc::Sender<Input>,
    pub(crate) dispatches: mpsc::UnboundedSender<Publish>,
    pub(crate) fence: Arc<Fence>,
    pub(crate) tasks: TaskTracker,
    pub(crate) gate: Arc<crate::gate::Gate>,
}

impl Shell {
    pub(crate) fn new(engine: Engine, io: ShellIo) -> Self {
        let (replies, replies_rx) = mpsc::unbounded_channel();
        Self {
            engine,
            clock: Clock::new(),
            js: io.js,
            messages: HashMap::new(),
            dispatches: io.dispatches,
            replies,
            replies_rx: Some(replies_rx),
            tasks: io.tasks,
            wake_at: None,
            fence: io.fence,
            dispatch_stream: io.dispatch_stream,
            to_self: io.to_self,
            gate: io.gate,
        }
    }

    pub(crate) async fn run(&mut self, mut rx: mpsc::Receiver<Input>, shutdown: CancellationToken) {
        if let Some(rx) = self.replies_rx.take() {
            self.tasks
                .spawn(replier(rx).instrument(tracing::info_span!("acks")));
        }
        let mut burst: Vec<Event> = Vec::new();
        loop {
            let wake = self.wake_at.map(|ms| self.clock.at(ms));
            let first = tokio::select! {
                _ = shutdown.cancelled() => break,
                input = rx.recv() => match input { Some(i) => Some(i), None => break },
                _ = async {
                    match wake {
                        Some(t) => tokio::time::sleep_until(t).await,
                        None => std::future::pending().await,
                    }
                } => None,
            };
            burst.clear();
            if let Some(input) = first {
                self.take(input, &mut burst);
            } else {
                self.wake_at = None;
                burst.push(Event::Tick);
            }
            // Coalesce a burst: what is already waiting is decided in one cycle.
            while burst.len() < 4096 {
                match rx.try_recv() {
                    Ok(input) => self.take(input, &mut burst),
                    Err(_) => break,
                }
            }
            if burst.is_empty() {
                continue;
            }
            let t0 = Instant::now();
            let effects = self.engine.handle_all(burst.drain(..), self.clock.now());
            m::cycle_seconds(t0.elapsed().as_secs_f64());
            self.apply(effects);
        }
        // Stopping: queued actions go back at once, nothing more is launched, and the
        // dispatches already handed out are seen through (stored: acked, so the next
        // scheduler does not dispatch them again; failed: handed back), within a bound.
        let effects = self.engine.handle(Event::Shutdown, self.clock.now());
        self.apply(effects);
        let deadline = Instant::now() + DISPATCH_DRAIN;
        while self.engine.dispatching_count() > 0 {
            let input = tokio::select! {
                i = rx.recv() => match i { Some(i) => i, None => break },
                _ = tokio::time::sleep_until(deadline) => break,
            };
            let mut burst = Vec::new();
            self.take(input, &mut burst);
            let effects = self.engine.handle_all(burst, self.clock.now());
            self.apply(effects);
        }
    }

    fn take(&mut self, input: Input, burst: &mut Vec<Event>) {
        match input {
            Input::Message(msg, event) => {
                // The intake counted it in the gate when it sent it.
                let delivery = match &event {
                    Event::Arrived(a) => a.delivery,
                    Event::Bad(b) => b.delivery,
                    _ => {
                        self.gate.release(msg.payload().len());
                        return;
                    }
                };
                if msg.is_taken_back() && self.messages.contains_key(&delivery) {
                    // Delivered to this term meanwhile: the delivery is the one to answer.
                    self.gate.release(msg.payload().len());
                    return;
                }
                // A redelivery replaces the message the ack is expected on.
                if let Some(old) = self.messages.insert(delivery, msg) {
                    self.gate.release(old.payload().len());
                }
                burst.push(event);
            }
            Input::Engine(event) => burst.push(event),
            Input::Status(reply) => {
                let _ = reply.send(self.engine.status(self.clock.now()));
            }
        }
    }

    fn apply(&mut self, effects: Vec<Effect>) {
        // The engine asks for a wake-up whenever something is due; none means nothing is.
        self.wake_at = None;
        for effect in effects {
            match effect {
                Effect::Dispatch { worker, dispatch } => {
                    let _ = self
                        .dispatches
                        .send(Publish::Dispatch(Outgoing { worker, dispatch }));
                }
                Effect::Ack(d) => self.reply(d, Reply::Ack),
                Effect::Nak(d) => self.reply(d, Reply::Nak),
                Effect::Progress(d) => {
                    if let Some(msg) = self.messages.get(&d).and_then(|m| m.delivery()) {
                        let _ = self.replies.send(Reply::Progress(Box::new(msg)));
                    }
                }
                Effect::Reject(r) => {
                    let Some(msg) = self.let_go(r.message.delivery) else {
                        continue;
                    };
                    let js = self.js.clone();
                    self.tasks
                        .spawn(reject(js, msg, r).instrument(tracing::info_span!("reject")));
                }
                Effect::PublishResult { result, encoding } => {
                    let js = self.js.clone();
                    let fence = self.fence.clone();
                    let dispatches = self.dispatch_stream.clone();
                    self.tasks.spawn(
                        async move {
                            // A result on a worker's behalf speaks for the leader only, and
                            // is tried for as long as this scheduler leads: the action's
                            // dispatch stays in the backlog until the result is stored, so
                            // the next leader settles it if this one cannot.
                            loop {
                                if !fence.holds() {
                                    warn!(action = %result.id, "not the leader any more; result left to the next one (its dispatch is in the backlog)");
                                    return;
                                }
                                match tangram_nats::publish_result(
                                    &js,
                                    &result,
                                    encoding,
                                    RESULT_ATTEMPTS,
                                )
                                .await
                                {
                                    Ok(()) => break,
                                    Err(e @ tangram_nats::PublishError::Encode(_)) => {
                                        // Never storable: trying again cannot help.
                                        warn!(action = %result.id, error = %e, "result not stored");
                                        return;
                                    }
                                    Err(e) => {
                                        warn!(action = %result.id, error = %e, "result not stored yet; trying again while this scheduler leads");
                                    }
                                }
                            }
                            crate::adopt::forget_dispatches(&dispatches, &result.id).await;
                        }
                        .instrument(tracing::info_span!("result")),
                    );
                }
                Effect::FetchDispatch { worker, id } => {
                    let stream = self.dispatch_stream.clone();
                    let tx = self.to_self.clone();
                    self.tasks.spawn(
                        async move {
                            let event = match crate::adopt::dispatch_to(&stream, &worker, &id).await
                            {
                                Some(d) => Event::Adopt {
                                    worker,
                                    dispatch: Box::new(d),
                                },
                                None => Event::AdoptFailed { id },
                            };
                            let _ = tx.send(Input::Engine(event)).await;
                        }
                        .instrument(tracing::info_span!("adopt")),
                    );
                }
                Effect::Fence { worker, instance } => {
                    let js = self.js.clone();
                    let fence = self.fence.clone();
                    self.tasks.spawn(
                        write_fence(js, fence, worker, instance)
                            .instrument(tracing::info_span!("fence")),
                    );
                }
                Effect::Regrant { worker, regrant } => {
                    // Through the dispatcher, in order with the dispatches: a narrowing must
                    // reach the worker before the dispatch that takes the cores it frees.
                    let _ = self.dispatches.send(Publish::Regrant { worker, regrant });
                }
                Effect::WakeAt(ms) => self.wake_at = Some(ms),
                Effect::Observe(o) => observe(o),
            }
        }
    }

    /// The engine is done with an action message: it leaves memory (and the gate).
    fn let_go(&mut self, d: Delivery) -> Option<Box<Incoming>> {
        let msg = self.messages.remove(&d)?;
        self.gate.release(msg.payload().len());
        Some(msg)
    }

    fn reply(&mut self, d: Delivery, make: fn(Box<Incoming>) -> Reply) {
        if let Some(msg) = self.let_go(d) {
            let _ = self.replies.send(make(msg));
        }
    }
}

/// Wall-clock time, for the timestamps written into results.
#[allow(clippy::disallowed_methods)] // wall time is what a timestamp is
fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Records that `instance` of `worker` was declared lost, where the worker looks
/// (`fence.<worker>` in the scheduler's bucket). Retried for about 30 s while this
/// scheduler leads: a worker that never reads it keeps being ignored by this leader, and a
/// dispatch addressed to the instance is refused by it once it does.
async fn write_fence(
    js: jetstream::Context,
    fence: Arc<Fence>,
    worker: tangram_shared::WorkerId,
    instance: String,
) {
    let key = tangram_shared::subject::fence_key(&worker);
    for attempt in 0..10u32 {
        if attempt > 0 {
            // 500 ms, doubling, at most 4 s, spread.
            let wait = tangram_nats::backoff::backoff(
                attempt,
                Duration::from_millis(500),
                Duration::from_secs(4),
            );
            tokio::time::sleep(wait).await;
        }
        if !fence.holds() {
            warn!(%worker, "not the leader any more; fence record left to the next one");
            return;
        }
        let put = async {
            let store = js
                .get_key_value(tangram_shared::subject::SCHEDULER_BUCKET)
                .await
                .map_err(|e| e.to_string())?;
            store
                .put(&key, instance.clone().into())
                .await
                .map_err(|e| e.to_string())
        };
        match tokio::time::timeout(Duration::from_secs(5), put).await {
            Ok(Ok(_)) => {
                info!(%worker, %instance, "worker instance fenced");
                m::worker_fenced();
                return;
            }
            Ok(Err(e)) => warn!(%worker, attempt, error = %e, "writing the fence record"),
            Err(_) => warn!(%worker, attempt, "writing the fence record timed out"),
        }
    }
    warn!(%worker, %instance, "fence record not written; the instance is ignored by this leader only");
}

/// Sends acks in the order the engine decided them; each is one publish, no round trip.
async fn replier(mut rx: mpsc::UnboundedReceiver<Reply>) {
    while let Some(reply) = rx.recv().await {
        let (msg, kind) = match reply {
            Reply::Ack(m) => (m, AckKind::Ack),
            Reply::Nak(m) => (m, AckKind::Nak(None)),
            Reply::Progress(m) => (Box::new(Incoming::Delivered(*m)), AckKind::Progress),
        };
        let sent = tokio::time::timeout(Duration::from_secs(1), msg.reply(kind)).await;
        if !matches!(sent, Ok(Ok(()))) {
            warn!(subject = %msg.subject(), "ack not sent; the action may be redelivered (and deduplicated)");
        }
    }
}

fn observe(o: Observation) {
    match o {
        Observation::Received(kind) => m::received(kind.map_or("unknown", |k| k.as_str())),
        Observation::Duplicate => m::duplicate(),
        Observation::Rejected(code) => m::rejected(code),
        Observation::Dispatched { kind, queued_s } => m::dispatched(kind.as_str(), queued_s),
        Observation::Result { outcome, code } => m::result(outcome, code),
        Observation::Act { kind, timing } => m::act(kind, timing),
        Observation::Workers(live) => m::workers(&live),
        Observation::Adopted(kind) => {
            info!(
                kind = kind.as_str(),
                "took over an action an earlier leader dispatched"
            );
            m::adopted(kind.as_str())
        }
        Observation::Queues(q) => m::queues(&q),
        Observation::Unreachable { gap_ms } => {
            warn!(
                gap_ms,
                "NATS answered again after a gap; worker graces restarted, nobody declared lost for it"
            );
            m::nats_gap()
        }
        Observation::FencedHeartbeat => m::fenced_heartbeat(),
        Observation::Cordons(n) => m::cordons(n),
        Observation::WorkerLost => {
            warn!("worker lost: no heartbeat within the grace period");
            m::worker_lost()
        }
        Observation::Cycle {
            queued,
            running,
            workers,
        } => m::gauges(queued, running, workers),
        Observation::GpuRoute {
            service,
            restore,
            evictions,
        } => m::gpu_route(&service, restore, evictions),
        Observation::Gpus { total, resident } => m::gpus(total, resident),
        Observation::Provider {
            name,
            rate,
            inflight,
            waiting,
        } => m::provider(&name, rate, inflight, waiting),
        Observation::ApiAdmitted { provider, job } => m::api_admitted(&provider, &job),
    }
}

/// Stores the dead-letter record, then tells the submitter (when it can be addressed), then
/// acks the message: whoever sees a rejection can find it in the dead-letter stream.
async fn reject(js: jetstream::Context, msg: Box<Incoming>, r: Box<Reject>) {
    info!(subject = %msg.subject(), code = r.message.rejection.code.as_str(), reason = %r.message.rejection.reason, "action rejected");
    let mut headers = HeaderMap::new();
    headers.insert(subject::HEADER_DLQ_CODE, r.message.rejection.code.as_str());
    // Header values cannot hold line breaks.
    let reason: String = r
        .message
        .rejection
        .reason
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    headers.insert(subject::HEADER_DLQ_REASON, reason.as_str());
    headers.insert(subject::HEADER_DLQ_SUBJECT, msg.subject());
    if let Some(id) = &r.message.id {
        let id: String = id.chars().filter(|c| !c.is_control()).take(256).collect();
        headers.insert(subject::HEADER_DLQ_ACTION, id.as_str());
    }
    headers.insert(
        subject::HEADER_CONTENT_TYPE,
        r.message.encoding.content_type(),
    );
    let payload = msg
        .payload()
        .slice(..msg.payload().len().min(DEADLETTER_PAYLOAD_CAP));
    match js
        .publish_with_headers(
            subject::deadletter(r.message.rejection.code),
            headers,
            payload,
        )
        .await
    {
        Ok(f) => {
            if let Err(e) = f.await {
                warn!(error = %e, "dead-letter publish not acknowledged");
            }
        }
        Err(e) => warn!(error = %e, "dead-letter publish failed"),
    }
    if let Some(result) = &r.result {
        if !publish_result(&js, result, r.message.encoding).await {
            // The submitter would never hear: hand the message back to be rejected again.
            let _ = msg.reply(AckKind::Nak(None)).await;
            return;
        }
    }
    if let Err(e) = msg.reply(AckKind::Ack).await {
        warn!(subject = %msg.subject(), error = %e, "ack failed; the action may be redelivered (and deduplicated)");
    }
}

/// Stores a result; false when it could not be.
async fn publish_result(
    js: &jetstream::Context,
    result: &ActionResult,
    encoding: Encoding,
) -> bool {
    match tangram_nats::publish_result(js, result, encoding, RESULT_ATTEMPTS).await {
        Ok(()) => true,
        Err(e) => {
            warn!(action = %result.id, error = %e, "result not stored");
            false
        }
    }
}
