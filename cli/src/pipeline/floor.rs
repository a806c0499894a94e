//! The NATS floors the action path is measured against.

use super::ACTION_WAIT;
use anyhow::Context as _;
use async_nats::jetstream::{self, consumer, stream};
use futures::stream::FuturesUnordered;
use futures::StreamExt as _;
use std::time::Duration;
use tokio::time::Instant;

/// JetStream on its own, on the same server, laid out like Tangram: one stream per hop (as
/// actions, dispatches and results each have theirs), file storage, limits retention.
#[derive(Debug)]
pub(super) struct Floor {
    js: jetstream::Context,
    payload: bytes::Bytes,
}

/// Floor streams: `BENCH_S<k>` holds `bench.s<k>.>`. As many as Tangram has streams.
const FLOOR_STREAMS: usize = 4;

fn floor_subject(stream: usize, what: &str) -> String {
    format!("bench.s{stream}.{what}")
}

impl Floor {
    pub(super) async fn create(
        js: &jetstream::Context,
        payload_bytes: usize,
    ) -> anyhow::Result<Self> {
        for k in 1..=FLOOR_STREAMS {
            js.create_stream(stream::Config {
                name: format!("BENCH_S{k}"),
                subjects: vec![format!("bench.s{k}.>")],
                storage: stream::StorageType::File,
                retention: stream::RetentionPolicy::Limits,
                ..Default::default()
            })
            .await?;
        }
        Ok(Self {
            js: js.clone(),
            payload: vec![0x5a; payload_bytes].into(),
        })
    }

    /// One publish at a time, each waiting for its PubAck; microseconds each.
    pub(super) async fn publish_ack(&self, n: usize, within: Duration) -> anyhow::Result<Vec<f64>> {
        sample_us(n, within, || async {
            self.js
                .publish(floor_subject(1, "ack"), self.payload.clone())
                .await?
                .await?;
            Ok(())
        })
        .await
    }

    /// Publish on hop 1; a consumer republishes to hop 2 (waiting for its PubAck, then acking,
    /// as the scheduler does with a dispatch); another to hop 3; a reader gets hop 3. One
    /// message at a time; microseconds from publishing to the reader having it.
    pub(super) async fn three_hop(
        &self,
        js: &jetstream::Context,
        client: &async_nats::Client,
        n: usize,
        within: Duration,
    ) -> anyhow::Result<Vec<f64>> {
        let mut relays = tokio::task::JoinSet::new();
        for hop in 1..=2 {
            let js = js.clone();
            let consumer = relay_consumer(&js, hop, "hop").await?;
            relays.spawn(relay_loop(js, consumer, hop, "hop"));
        }
        let out = self.chain(client, "hop", n, within).await;
        relays.abort_all();
        out
    }

    /// The same chain with each relay in its own process (as the scheduler and the worker
    /// are), on a multi-threaded runtime like theirs: what crossing processes adds to the
    /// floor.
    pub(super) async fn three_hop_processes(
        &self,
        url: &str,
        client: &async_nats::Client,
        n: usize,
        within: Duration,
    ) -> anyhow::Result<Vec<f64>> {
        let exe = std::env::current_exe().context("finding the tangram binary")?;
        let mut relays = Vec::new();
        for hop in 1..=2u8 {
            let mut child = tokio::process::Command::new(&exe)
                .args([
                    "bench",
                    "relay",
                    "--nats-url",
                    url,
                    "--hop",
                    &hop.to_string(),
                ])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .context("starting a relay process")?;
            let stdout = child.stdout.take().context("the relay's stdout")?;
            let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
            let ready = tokio::time::timeout(ACTION_WAIT, lines.next_line())
                .await
                .context("the relay process did not get ready")??;
            anyhow::ensure!(
                ready.as_deref() == Some("ready"),
                "relay process: {ready:?}"
            );
            relays.push(child);
        }
        self.chain(client, "xhop", n, within).await
    }

    /// Publishes on hop 1 one message at a time and waits for the reader of hop 3.
    async fn chain(
        &self,
        client: &async_nats::Client,
        what: &str,
        n: usize,
        within: Duration,
    ) -> anyhow::Result<Vec<f64>> {
        let reader = tokio::sync::Mutex::new(client.subscribe(floor_subject(3, what)).await?);
        sample_us(n, within, || async {
            self.js
                .publish(floor_subject(1, what), self.payload.clone())
                .await?
                .await?;
            tokio::time::timeout(ACTION_WAIT, reader.lock().await.next())
                .await
                .context("the three-hop chain stalled")?
                .context("the reader's subscription closed")?;
            Ok(())
        })
        .await
    }

    /// Pipelined publishing, `window` PubAcks outstanding, spread round-robin over `streams`
    /// streams: persisted writes per second.
    pub(super) async fn persisted_writes(
        &self,
        n: usize,
        window: usize,
        streams: usize,
        within: Duration,
    ) -> anyhow::Result<f64> {
        let subjects: Vec<String> = (1..=streams.clamp(1, FLOOR_STREAMS))
            .map(|k| floor_subject(k, "writes"))
            .collect();
        let deadline = Instant::now() + within;
        let mut acks = FuturesUnordered::new();
        let mut sent = 0;
        let mut acked = 0usize;
        let t = Instant::now();
        while acked < n {
            while sent < n && acks.len() < window {
                let ack = self
                    .js
                    .publish(
                        subjects[sent % subjects.len()].clone(),
                        self.payload.clone(),
                    )
                    .await?;
                acks.push(std::future::IntoFuture::into_future(ack));
                sent += 1;
            }
            match tokio::time::timeout_at(deadline, acks.next()).await {
                Ok(Some(r)) => {
                    r?;
                    acked += 1;
                }
                Ok(None) | Err(_) => break,
            }
        }
        Ok(acked as f64 / t.elapsed().as_secs_f64())
    }
}

/// Runs `one` up to `n` times, one after another, until `within` has passed; the
/// microseconds each took, sorted.
async fn sample_us<F, Fut>(n: usize, within: Duration, mut one: F) -> anyhow::Result<Vec<f64>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let deadline = Instant::now() + within;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        if Instant::now() > deadline {
            break;
        }
        let t = Instant::now();
        one().await?;
        out.push(t.elapsed().as_secs_f64() * 1e6);
    }
    out.sort_by(f64::total_cmp);
    Ok(out)
}

async fn relay_consumer(
    js: &jetstream::Context,
    hop: u8,
    what: &str,
) -> anyhow::Result<consumer::PullConsumer> {
    let stream = js.get_stream(format!("BENCH_S{hop}")).await?;
    Ok(stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some(format!("relay-{what}-{hop}")),
            filter_subject: floor_subject(hop.into(), what),
            ack_policy: consumer::AckPolicy::Explicit,
            deliver_policy: consumer::DeliverPolicy::New,
            ..Default::default()
        })
        .await?)
}

/// Republishes each message of hop `hop` to the next, waiting for the PubAck, then acks it
/// (as the scheduler does with a dispatch).
async fn relay_loop(
    js: jetstream::Context,
    consumer: consumer::PullConsumer,
    hop: u8,
    what: &'static str,
) -> anyhow::Result<()> {
    let to = floor_subject(usize::from(hop) + 1, what);
    let mut messages = consumer.messages().await?;
    while let Some(m) = messages.next().await {
        let m = m.map_err(|e| anyhow::anyhow!("{e}"))?;
        js.publish(to.clone(), m.payload.clone()).await?.await?;
        m.ack().await.map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    Ok(())
}

/// How long a relay process lives at most (the bench kills it when done).
const RELAY_LIFETIME: Duration = Duration::from_secs(600);

/// `tangram bench relay`: one hop of the cross-process floor chain, for the pipeline bench's
/// own use. Prints `ready` once its consumer exists.
pub fn relay(nats_url: &str, hop: u8) -> anyhow::Result<()> {
    anyhow::ensure!((1..=2).contains(&hop), "hop must be 1 or 2");
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let client = async_nats::connect(nats_url).await?;
        let js = jetstream::new(client);
        let consumer = relay_consumer(&js, hop, "xhop").await?;
        println!("ready");
        use std::io::Write as _;
        std::io::stdout().flush()?;
        match tokio::time::timeout(RELAY_LIFETIME, relay_loop(js, consumer, hop, "xhop")).await {
            Ok(r) => r,
            Err(_) => Ok(()),
        }
    })
}
