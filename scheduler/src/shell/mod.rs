//! The state task: the one owner of the engine. It turns inputs into engine events, runs the
//! engine once per burst, and carries its effects out without awaiting NATS round trips
//! itself: dispatches go to the dispatcher, rejections and results to tracked tasks, acks to
//! the acker. It holds each action message until the engine acks, naks or rejects it.

pub(crate) use crate::channels::Input;
use crate::channels::{Outgoing, Publish};
use crate::effects::{observe, publish_for_worker, reject, replier, write_fence, Reply};
use crate::held::Incoming;
use crate::lease::Fence;
use crate::metrics as m;
use crate::outbox::{Answer, Outbox};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tangram_core::engine::Delivery;
use tangram_core::{Effect, Engine, Event, Now};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

/// How long a stopping scheduler waits for the outcomes of dispatches already handed out.
const DISPATCH_DRAIN: Duration = Duration::from_secs(5);

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

#[cfg(test)]
mod tests;

pub(crate) struct Shell {
    engine: Engine,
    clock: Clock,
    outbox: Arc<dyn Outbox>,
    /// Action messages the engine has not finished with, by delivery (stream sequence).
    messages: HashMap<Delivery, Box<Incoming>>,
    dispatches: mpsc::UnboundedSender<Publish>,
    replies: mpsc::UnboundedSender<Reply>,
    replies_rx: Option<mpsc::UnboundedReceiver<Reply>>,
    tasks: TaskTracker,
    wake_at: Option<u64>,
    fence: Arc<Fence>,
    to_self: mpsc::Sender<Input>,
    gate: Arc<crate::gate::Gate>,
}

/// What the state task is wired to.
pub(crate) struct ShellIo {
    /// Its way out to NATS.
    pub(crate) outbox: Arc<dyn Outbox>,
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
            outbox: io.outbox,
            messages: HashMap::new(),
            dispatches: io.dispatches,
            replies,
            replies_rx: Some(replies_rx),
            tasks: io.tasks,
            wake_at: None,
            fence: io.fence,
            to_self: io.to_self,
            gate: io.gate,
        }
    }

    pub(crate) async fn run(&mut self, mut rx: mpsc::Receiver<Input>, shutdown: CancellationToken) {
        if let Some(rx) = self.replies_rx.take() {
            self.tasks
                .spawn(replier(rx, self.outbox.clone()).instrument(tracing::info_span!("acks")));
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
            Input::CloseJob(job, reply) => {
                // The closes are among the effects of the burst this input is part of.
                let _ = reply.send(self.engine.close_job(&job, self.clock.now()));
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
                Effect::Ack(d) => self.reply(d, Answer::Ack),
                Effect::Nak(d) => self.reply(d, Answer::Nak),
                Effect::Progress(d) => {
                    // A taken-back message has no delivery to report on.
                    if let Some(msg) = self.messages.get(&d).filter(|m| !m.is_taken_back()) {
                        let copy = Box::new(msg.as_ref().clone());
                        let _ = self.replies.send(Reply(copy, Answer::Progress));
                    }
                }
                Effect::Reject(r) => {
                    let Some(msg) = self.let_go(r.message.delivery) else {
                        continue;
                    };
                    let outbox = self.outbox.clone();
                    self.tasks
                        .spawn(reject(outbox, msg, r).instrument(tracing::info_span!("reject")));
                }
                Effect::PublishResult { result, encoding } => {
                    let (outbox, fence) = (self.outbox.clone(), self.fence.clone());
                    self.tasks.spawn(
                        publish_for_worker(outbox, fence, *result, encoding)
                            .instrument(tracing::info_span!("result")),
                    );
                }
                Effect::FetchDispatch { worker, id } => {
                    let outbox = self.outbox.clone();
                    let tx = self.to_self.clone();
                    self.tasks.spawn(
                        async move {
                            let event = match outbox.dispatch_to(&worker, &id).await {
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
                Effect::Submit(action) => {
                    let outbox = self.outbox.clone();
                    self.tasks.spawn(
                        async move {
                            // Asked again by the engine when it does not come back.
                            if let Err(e) = outbox.submit(&action).await {
                                tracing::warn!(action = %action.id, error = %e, "publishing a close of the scheduler's own");
                            }
                        }
                        .instrument(tracing::info_span!("submit")),
                    );
                }
                Effect::Fence { worker, instance } => {
                    let (outbox, fence) = (self.outbox.clone(), self.fence.clone());
                    self.tasks.spawn(
                        write_fence(outbox, fence, worker, instance)
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

    fn reply(&mut self, d: Delivery, answer: Answer) {
        if let Some(msg) = self.let_go(d) {
            let _ = self.replies.send(Reply(msg, answer));
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
