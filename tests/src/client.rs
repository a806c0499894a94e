//! A minimal submitter: publish an action, wait for its result, read status.

use crate::POLL;
use anyhow::{bail, Context as _};
use async_nats::jetstream;
use futures::StreamExt;
use std::time::Duration;
use tangram_shared::codec::{self, Encoding};
use tangram_shared::status::Status;
use tangram_shared::{subject, Action, ActionId, ActionResult, Heartbeat, JobId};
use tokio::time::Instant;

/// A minimal submitter.
#[derive(Debug, Clone)]
pub struct Client {
    /// The NATS client.
    pub nats: async_nats::Client,
    /// JetStream.
    pub js: jetstream::Context,
    /// The job.
    pub job: JobId,
}

impl Client {
    /// Connects (no credentials) and makes sure the streams exist.
    pub async fn connect(url: &str, job: &str) -> anyhow::Result<Self> {
        Self::connect_with(url, job, &tangram_nats::auth::Credentials::default()).await
    }

    /// Connects with credentials; creates the streams only where they are missing (a
    /// rollout may not administer streams, and need not when the scheduler is up).
    pub async fn connect_with(
        url: &str,
        job: &str,
        creds: &tangram_nats::auth::Credentials,
    ) -> anyhow::Result<Self> {
        let nats = tangram_nats::auth::connect(url, "tangram-test-client", creds).await?;
        let js = jetstream::new(nats.clone());
        if creds.nkey_file.is_none() {
            tangram_nats::ensure_streams_exist(&js).await?;
        } else {
            // Only the scheduler (or an operator) may create streams: wait for them.
            let deadline = Instant::now() + Duration::from_secs(30);
            // By subject (STREAM.NAMES): a job's role may not read the streams' info.
            let exists = |subject: &'static str| {
                let js = js.clone();
                async move { js.stream_by_subject(subject).await.is_ok() }
            };
            while !exists("tangram.v1.result.probe.probe").await
                || !exists("tangram.v1.action.probe.probe").await
            {
                if Instant::now() > deadline {
                    bail!("the streams do not exist (is the scheduler up?)");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(Self {
            nats,
            js,
            job: JobId::new(job)?,
        })
    }

    /// Publishes an action (msgpack, `Nats-Msg-Id` = id) and waits for the JetStream ack.
    pub async fn submit(&self, action: &Action) -> anyhow::Result<()> {
        let bytes = codec::encode(action, Encoding::Msgpack)?;
        self.publish_raw(
            &subject::action(&action.job, action.kind()),
            Some(action.id.as_str()),
            None,
            bytes,
        )
        .await
    }

    /// Publishes raw bytes with optional headers.
    pub async fn publish_raw(
        &self,
        subject: &str,
        msg_id: Option<&str>,
        content_type: Option<&str>,
        payload: Vec<u8>,
    ) -> anyhow::Result<()> {
        let mut headers = async_nats::HeaderMap::new();
        if let Some(id) = msg_id {
            headers.insert(subject::HEADER_MSG_ID, id);
        }
        if let Some(ct) = content_type {
            headers.insert(subject::HEADER_CONTENT_TYPE, ct);
        }
        self.js
            .publish_with_headers(subject.to_string(), headers, payload.into())
            .await?
            .await?;
        Ok(())
    }

    /// Waits for the result of `id` (read from the persisted result stream).
    pub async fn result(&self, id: &ActionId, timeout: Duration) -> anyhow::Result<ActionResult> {
        // Listen first, then look for one already stored (a direct get names the subject, so
        // it works with one job's rollout credentials), then wait.
        let subject = subject::result(&self.job, id);
        let mut sub = self.nats.subscribe(subject.clone()).await?;
        let decode = |headers: Option<&async_nats::HeaderMap>, payload: &[u8]| {
            let enc = Encoding::from_content_type(
                headers
                    .and_then(|h| h.get(subject::HEADER_CONTENT_TYPE))
                    .map(|v| v.as_str()),
            )?;
            anyhow::Ok(codec::decode::<ActionResult>(payload, enc)?)
        };
        let stream =
            tokio::time::timeout(timeout, self.js.get_stream_no_info(subject::RESULTS_STREAM))
                .await
                .with_context(|| format!("no result for {id} within {timeout:?}"))??;
        // A direct get can fail under load (a timeout): ask again every half second while
        // waiting, so a result stored before the subscription took effect is not missed.
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Ok(m) = stream.direct_get_last_for_subject(subject.clone()).await {
                return decode(Some(&m.headers), &m.payload);
            }
            let wait = deadline
                .saturating_duration_since(tokio::time::Instant::now())
                .min(Duration::from_millis(500));
            match tokio::time::timeout(wait, sub.next()).await {
                Ok(Some(m)) => return decode(m.headers.as_ref(), &m.payload),
                Ok(None) => bail!("result subscription closed"),
                Err(_) if tokio::time::Instant::now() < deadline => continue,
                Err(_) => bail!("no result for {id} within {timeout:?}"),
            }
        }
    }

    /// Waits until `n` results for `id` arrived, or `timeout`; returns what arrived.
    pub async fn results(
        &self,
        id: &ActionId,
        n: usize,
        timeout: Duration,
    ) -> anyhow::Result<Vec<ActionResult>> {
        let stream = self.js.get_stream(subject::RESULTS_STREAM).await?;
        let consumer = stream
            .create_consumer(jetstream::consumer::pull::OrderedConfig {
                filter_subject: subject::result(&self.job, id),
                ..Default::default()
            })
            .await?;
        let mut messages = consumer.messages().await?;
        let mut out = Vec::new();
        let deadline = tokio::time::Instant::now() + timeout;
        while out.len() < n {
            match tokio::time::timeout_at(deadline, messages.next()).await {
                Ok(Some(Ok(m))) => {
                    let enc = Encoding::from_content_type(
                        m.headers
                            .as_ref()
                            .and_then(|h| h.get(subject::HEADER_CONTENT_TYPE))
                            .map(|v| v.as_str()),
                    )?;
                    out.push(codec::decode(&m.payload, enc)?);
                }
                Ok(Some(Err(e))) => bail!("reading results: {e}"),
                Ok(None) => break,
                Err(_) if out.is_empty() && n == 1 => {
                    bail!("no result for {id} within {timeout:?}")
                }
                Err(_) => break,
            }
        }
        Ok(out)
    }

    /// Submits and waits.
    pub async fn run(&self, action: &Action, timeout: Duration) -> anyhow::Result<ActionResult> {
        self.submit(action).await?;
        self.result(&action.id, timeout).await
    }

    /// The leader lease as stored now, if any.
    pub async fn leader(&self) -> anyhow::Result<Option<tangram_shared::status::LeaderRecord>> {
        let Ok(store) = self.js.get_key_value(subject::SCHEDULER_BUCKET).await else {
            return Ok(None);
        };
        Ok(match store.entry(subject::LEADER_KEY).await? {
            Some(e) if e.operation == jetstream::kv::Operation::Put => {
                Some(serde_json::from_slice(&e.value)?)
            }
            _ => None,
        })
    }

    /// Waits until the scheduler with this id holds the leader lease with an epoch set.
    pub async fn wait_for_leader(
        &self,
        id: &str,
        timeout: Duration,
    ) -> anyhow::Result<tangram_shared::status::LeaderRecord> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = self.leader().await? {
                if l.id == id && l.epoch > 0 {
                    return Ok(l);
                }
            }
            if Instant::now() > deadline {
                bail!("{id} did not become leader within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until `n` workers are registered with the scheduler, by submitting nothing:
    /// watches heartbeats instead.
    pub async fn wait_for_workers(&self, ids: &[&str], timeout: Duration) -> anyhow::Result<()> {
        let mut sub = self.nats.subscribe(subject::HEARTBEAT_ALL).await?;
        let mut seen = std::collections::BTreeSet::new();
        let deadline = tokio::time::Instant::now() + timeout;
        while seen.len() < ids.len() {
            let msg = tokio::time::timeout_at(deadline, sub.next())
                .await
                .context("workers did not heartbeat")?;
            let Some(msg) = msg else {
                bail!("heartbeat subscription closed")
            };
            let hb: Heartbeat = codec::decode(&msg.payload, Encoding::Msgpack)?;
            if ids.contains(&hb.worker.as_str()) {
                seen.insert(hb.worker.0.clone());
            }
        }
        Ok(())
    }

    /// Waits until the scheduler answers its status and lists every worker in `ids`: until
    /// then, actions already queued may be placed on the workers it knows so far.
    pub async fn wait_for_scheduler_to_know(
        &self,
        ids: &[&str],
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Ok(st) = self.status().await {
                if ids.iter().all(|id| st.workers.iter().any(|w| w.id == *id)) {
                    return Ok(());
                }
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("the scheduler did not list workers {ids:?} within {timeout:?}");
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Dead-letter records in the stream now, as (code header, reason header) pairs.
    pub async fn dead_letters(&self) -> anyhow::Result<Vec<(String, String)>> {
        let mut stream = self.js.get_stream(subject::DEADLETTER_STREAM).await?;
        let held = stream.info().await?.state.messages as usize;
        let mut out = Vec::with_capacity(held);
        if held == 0 {
            return Ok(out);
        }
        let consumer = stream
            .create_consumer(jetstream::consumer::pull::OrderedConfig::default())
            .await?;
        let mut messages = consumer.messages().await?;
        while out.len() < held {
            let m = tokio::time::timeout(Duration::from_secs(10), messages.next())
                .await
                .context("reading the dead-letter stream back")?
                .context("the dead-letter stream ended")?
                .map_err(|e| anyhow::anyhow!("reading dead letters: {e}"))?;
            let h = m.headers.clone().unwrap_or_default();
            let get = |k: &str| h.get(k).map(|v| v.as_str().to_string()).unwrap_or_default();
            out.push((
                get(subject::HEADER_DLQ_CODE),
                get(subject::HEADER_DLQ_REASON),
            ));
        }
        Ok(out)
    }

    /// Dead-letter records once `ready` holds for them (a rejection's record may land just
    /// after its result); fails after `timeout` with what the stream held.
    pub async fn dead_letters_once(
        &self,
        timeout: Duration,
        ready: impl Fn(&[(String, String)]) -> bool,
    ) -> anyhow::Result<Vec<(String, String)>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let dl = self.dead_letters().await?;
            if ready(&dl) {
                return Ok(dl);
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("dead letters still not as expected after {timeout:?}: {dl:?}");
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The scheduler's status report (`tangram.v1.status`).
    pub async fn status(&self) -> anyhow::Result<Status> {
        Ok(
            tangram_nats::status::fetch(&self.nats, Duration::from_secs(5))
                .await?
                .status,
        )
    }

    /// Waits until the scheduler's status satisfies `ready` and returns it; fails after
    /// `timeout`, naming `what` and showing the last status.
    pub async fn wait_for_status(
        &self,
        timeout: Duration,
        what: &str,
        ready: impl Fn(&Status) -> bool,
    ) -> anyhow::Result<Status> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let last = self.status().await;
            match last {
                Ok(st) if ready(&st) => return Ok(st),
                _ => {}
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("{what}: not within {timeout:?}; last status {last:?}");
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits for a heartbeat satisfying `ready` and returns it.
    pub async fn wait_for_heartbeat(
        &self,
        timeout: Duration,
        what: &str,
        ready: impl Fn(&Heartbeat) -> bool,
    ) -> anyhow::Result<Heartbeat> {
        let mut sub = self.nats.subscribe(subject::HEARTBEAT_ALL).await?;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let msg = tokio::time::timeout_at(deadline, sub.next())
                .await
                .with_context(|| format!("{what}: no such heartbeat within {timeout:?}"))?
                .context("heartbeat subscription closed")?;
            let hb: Heartbeat = codec::decode(&msg.payload, Encoding::Msgpack)?;
            if ready(&hb) {
                return Ok(hb);
            }
        }
    }

    /// Waits until `worker` reports action `id` among those it is running.
    pub async fn wait_until_running(
        &self,
        worker: &str,
        id: &ActionId,
        timeout: Duration,
    ) -> anyhow::Result<Heartbeat> {
        self.wait_for_heartbeat(timeout, &format!("{worker} running {id}"), |hb| {
            hb.worker.as_str() == worker && hb.running.contains(id)
        })
        .await
    }
}
