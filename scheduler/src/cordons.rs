//! Operators' cordons and drains: the `cordon.<worker>` keys of the scheduler's bucket,
//! watched (history first, then every change) and handed to the engine as
//! [`Event::Cordon`]. A record that does not decode still cordons (logged): an operator's
//! intent to stop placements is never dropped over a typo.

use crate::channels::Input;
use async_nats::jetstream::kv;
use futures::StreamExt;
use std::time::Duration;
use tangram_core::Event;
use tangram_shared::status::CordonRecord;
use tangram_shared::{subject, WorkerId};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Until `stop`, feeds every cordon change to the state task; a watch that fails is opened
/// again after a second (its history replays; cordon events are idempotent).
pub(crate) async fn watch(store: kv::Store, tx: mpsc::Sender<Input>, stop: CancellationToken) {
    let keys = format!("{}>", subject::CORDON_PREFIX);
    loop {
        match store.watch_with_history(&keys).await {
            Ok(mut entries) => loop {
                let entry = tokio::select! {
                    _ = stop.cancelled() => return,
                    e = entries.next() => e,
                };
                match entry {
                    Some(Ok(e)) => {
                        if let Some(event) = event_of(&e) {
                            if tx.send(Input::Engine(event)).await.is_err() {
                                return;
                            }
                        }
                    }
                    Some(Err(e)) => {
                        warn!(error = %e, "watching cordons");
                        break;
                    }
                    None => break,
                }
            },
            Err(e) => warn!(error = %e, "watching cordons"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// The engine's event for one entry of the bucket, if it is a worker's cordon.
fn event_of(e: &kv::Entry) -> Option<Event> {
    let name = e.key.strip_prefix(subject::CORDON_PREFIX)?;
    let worker = match WorkerId::new(name) {
        Ok(w) => w,
        Err(err) => {
            warn!(key = %e.key, error = %err, "cordon key names no valid worker; ignored");
            return None;
        }
    };
    let cordon = match e.operation {
        kv::Operation::Put => {
            let record = serde_json::from_slice::<CordonRecord>(&e.value).unwrap_or_else(|err| {
                warn!(%worker, error = %err, "cordon record does not decode; cordoning without a drain");
                CordonRecord::default()
            });
            info!(%worker, drain_by_unix_ms = ?record.drain_by_unix_ms, by = %record.by, "worker cordoned");
            Some(record)
        }
        kv::Operation::Delete | kv::Operation::Purge => {
            info!(%worker, "worker uncordoned");
            None
        }
    };
    Some(Event::Cordon { worker, cordon })
}
