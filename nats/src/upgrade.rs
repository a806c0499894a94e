//! Upgrading the stream layout in place. Releases before the backlog/history split created
//! `TANGRAM_ACTIONS` and `TANGRAM_DISPATCH` with limits retention: they kept every message
//! until its age or the byte limit ran out, so processed history filled them and they then
//! refused new work. JetStream cannot change a stream's retention, so the upgrade:
//!
//! 1. checks that nothing pulls from the two streams (schedulers and workers stopped);
//! 2. finds the unprocessed work: actions past the scheduler consumer's ack floor with no
//!    stored dispatch and no stored result, and dispatches with no stored result;
//! 3. copies every message of both streams into `TANGRAM_HISTORY` (JetStream sources, so
//!    subjects and payloads are unchanged) and waits until the copy has caught up;
//! 4. deletes the two streams, creates them as work queues, and publishes the unprocessed
//!    work into them again (same subjects, headers and payloads);
//! 5. points the history at the new streams.
//!
//! The schedulers and workers then start as usual and find their work where it was.

pub use crate::streams::old_layout;
use crate::streams::{self, not_found, StreamSettings};
use async_nats::jetstream::{self, stream};
use futures::StreamExt as _;
use std::collections::HashSet;
use std::time::Duration;
use tangram_shared::codec::{decode, Encoding};
use tangram_shared::{subject, Dispatch};

/// The upgrade could not be done; the message says what to do.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UpgradeError(String);

fn err(what: impl std::fmt::Display) -> UpgradeError {
    UpgradeError(what.to_string())
}

/// What an upgrade did.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Upgraded {
    /// True when the layout was current already (nothing was changed but a missing history).
    pub already_current: bool,
    /// Messages copied into the history.
    pub history_messages: u64,
    /// Unprocessed actions carried into the new backlog.
    pub actions_carried: u64,
    /// In-flight dispatches carried into the new backlog.
    pub dispatches_carried: u64,
    /// Actions past the ack floor found processed (a dispatch or a result is stored).
    pub actions_processed: u64,
}

/// One message to publish again.
struct Carried {
    subject: String,
    headers: async_nats::HeaderMap,
    payload: bytes::Bytes,
}

/// Upgrades the layout (see the module). `idle_within`: how long to wait for pull requests
/// of stopped processes to expire before refusing.
pub async fn upgrade(
    js: &jetstream::Context,
    settings: &StreamSettings,
    idle_within: Duration,
) -> Result<Upgraded, UpgradeError> {
    let desired = streams::desired(settings).map_err(err)?;
    let find = |name: &str| {
        desired
            .iter()
            .find(|c| c.name == name)
            .cloned()
            .expect("bundled")
    };
    let mut out = Upgraded::default();
    if old_layout(js).await.map_err(err)?.is_none() {
        out.already_current = true;
        streams::ensure(js, settings).await.map_err(err)?;
        return Ok(out);
    }
    let mut actions = js
        .get_stream(subject::ACTIONS_STREAM)
        .await
        .map_err(|e| err(format!("looking up {}: {e}", subject::ACTIONS_STREAM)))?;
    let dispatch = js
        .get_stream(subject::DISPATCH_STREAM)
        .await
        .map_err(|e| err(format!("looking up {}: {e}", subject::DISPATCH_STREAM)))?;
    let results = js
        .get_stream(subject::RESULTS_STREAM)
        .await
        .map_err(|e| err(format!("looking up {}: {e}", subject::RESULTS_STREAM)))?;
    wait_idle(&actions, idle_within).await?;
    wait_idle(&dispatch, idle_within).await?;

    // 2. The unprocessed work.
    let result_stored = |job: String, id: String| {
        let results = &results;
        async move {
            let subj = format!("{}.result.{job}.{id}", subject::PREFIX);
            match results.get_last_raw_message_by_subject(&subj).await {
                Ok(_) => Ok(true),
                Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => Ok(false),
                Err(e) => Err(err(format!("looking up {subj}: {e}"))),
            }
        }
    };
    let mut dispatched = HashSet::new();
    let mut carried_dispatches = Vec::new();
    for subj in subjects(&dispatch, subject::DISPATCH_ALL).await? {
        if subj.ends_with(".regrant") {
            continue; // a re-size; the dispatch it amends carries the grant
        }
        let m = dispatch
            .get_last_raw_message_by_subject(&subj)
            .await
            .map_err(|e| err(format!("reading {subj}: {e}")))?;
        let Ok(d) = decode::<Dispatch>(&m.payload, Encoding::Msgpack) else {
            continue; // never a dispatch; nothing would run it
        };
        dispatched.insert(d.action.id.to_string());
        if !result_stored(d.action.job.to_string(), d.action.id.to_string()).await? {
            carried_dispatches.push(Carried {
                subject: subj,
                headers: m.headers,
                payload: m.payload,
            });
        }
    }
    let floor = match actions
        .consumer_info(subject::SCHEDULER_ACTIONS_CONSUMER)
        .await
    {
        Ok(c) => c.ack_floor.stream_sequence,
        Err(_) => 0, // never consumed: everything is unprocessed
    };
    let state = actions
        .info()
        .await
        .map_err(|e| err(format!("reading {}: {e}", subject::ACTIONS_STREAM)))?
        .state
        .clone();
    let mut carried_actions = Vec::new();
    if state.messages > 0 {
        for seq in (floor + 1).max(state.first_sequence)..=state.last_sequence {
            let m = match actions.get_raw_message(seq).await {
                Ok(m) => m,
                Err(e) if e.kind() == stream::RawMessageErrorKind::NoMessageFound => continue,
                Err(e) => return Err(err(format!("reading action {seq}: {e}"))),
            };
            let id = m
                .headers
                .get(subject::HEADER_MSG_ID)
                .map(|v| v.as_str().to_string());
            let job = subject::parse_action(&m.subject).map(|(j, _)| j.to_string());
            let processed = match (id, job) {
                (Some(id), Some(job)) => dispatched.contains(&id) || result_stored(job, id).await?,
                // The scheduler rejects it (with a result the submitter reads) when it comes.
                _ => false,
            };
            if processed {
                out.actions_processed += 1;
            } else {
                carried_actions.push(Carried {
                    subject: m.subject.to_string(),
                    headers: m.headers,
                    payload: m.payload,
                });
            }
        }
    }

    // 3. Copy the history. The copying sources filter by subject, so that JetStream tracks
    // them apart from the steady sources set in step 5 (which then start at the new streams'
    // first message).
    let history = find(subject::HISTORY_STREAM);
    let copying = stream::Config {
        sources: Some(vec![
            source(subject::ACTIONS_STREAM, Some(subject::ACTION_ALL)),
            source(subject::DISPATCH_STREAM, Some(subject::DISPATCH_ALL)),
        ]),
        ..history.clone()
    };
    match js.get_stream(subject::HISTORY_STREAM).await {
        Ok(_) => js.update_stream(copying).await.map(drop).map_err(err)?,
        Err(e) if not_found(&e) => js.create_stream(copying).await.map(drop).map_err(err)?,
        Err(e) => return Err(err(e)),
    }
    out.history_messages = caught_up(js).await?;

    // 4. New backlog streams, the unprocessed work back in.
    let still = stream::Config {
        sources: None,
        ..history.clone()
    };
    js.update_stream(still).await.map_err(err)?;
    for name in [subject::ACTIONS_STREAM, subject::DISPATCH_STREAM] {
        js.delete_stream(name)
            .await
            .map_err(|e| err(format!("deleting {name}: {e}")))?;
        js.create_stream(find(name))
            .await
            .map_err(|e| err(format!("creating {name}: {e}")))?;
    }
    for c in &carried_actions {
        republish(js, c).await?;
    }
    out.actions_carried = carried_actions.len() as u64;
    for c in &carried_dispatches {
        republish(js, c).await?;
    }
    out.dispatches_carried = carried_dispatches.len() as u64;

    // 5. The history follows the new streams.
    js.update_stream(history).await.map_err(err)?;
    streams::ensure(js, settings).await.map_err(err)?;
    Ok(out)
}

fn source(name: &str, filter: Option<&str>) -> stream::Source {
    stream::Source {
        name: name.to_string(),
        filter_subject: filter.map(str::to_string),
        ..Default::default()
    }
}

async fn subjects(s: &stream::Stream, filter: &str) -> Result<Vec<String>, UpgradeError> {
    crate::stored_subjects(s, filter).await.map_err(err)
}

/// Refuses while a process pulls from `s` (a running scheduler or worker would lose its
/// consumer mid-flight); waits up to `within` for the requests of stopped ones to expire.
async fn wait_idle(s: &stream::Stream, within: Duration) -> Result<(), UpgradeError> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let mut busy = None;
        let mut names = s.consumer_names();
        while let Some(name) = names.next().await {
            let name = name.map_err(err)?;
            let info = s.consumer_info(&name).await.map_err(err)?;
            if info.num_waiting > 0 {
                busy = Some(name);
                break;
            }
        }
        let Some(name) = busy else { return Ok(()) };
        if tokio::time::Instant::now() >= deadline {
            return Err(err(format!(
                "consumer {name} of {} is still pulling: stop the schedulers and workers first",
                s.cached_info().config.name
            )));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Waits until the history's copying sources have caught up; returns its message count.
async fn caught_up(js: &jetstream::Context) -> Result<u64, UpgradeError> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    let mut last = None;
    loop {
        let info = js
            .get_stream(subject::HISTORY_STREAM)
            .await
            .map_err(err)?
            .cached_info()
            .clone();
        let sources_done = info.sources.len() == 2
            && info
                .sources
                .iter()
                .all(|s| s.lag == 0 && s.active.is_some());
        let count = info.state.messages;
        // Caught up: no lag, and nothing arrived since the last look.
        if sources_done && last == Some(count) {
            return Ok(count);
        }
        last = Some(count);
        if tokio::time::Instant::now() >= deadline {
            return Err(err(
                "the history did not catch up within 10 minutes; nothing was deleted, run the upgrade again",
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn republish(js: &jetstream::Context, c: &Carried) -> Result<(), UpgradeError> {
    let ack = js
        .publish_with_headers(c.subject.clone(), c.headers.clone(), c.payload.clone())
        .await
        .map_err(|e| err(format!("publishing {} again: {e}", c.subject)))?;
    ack.await
        .map_err(|e| err(format!("publishing {} again: {e}", c.subject)))?;
    Ok(())
}
