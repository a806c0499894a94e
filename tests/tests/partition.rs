//! A partition that drops packets rather than closing connections: the worker must notice
//! the heal within seconds, not after TCP's retransmission backoff on a dead connection.
//! The drop is made with iptables on the port of a proxy that only the worker uses, so the
//! scheduler and the test's client keep their own connections.

use futures::StreamExt;
use std::process::Command;
use std::time::Duration;
use tangram_shared::codec::{self, Encoding};
use tangram_shared::{subject, Heartbeat};
use tangram_tests::faults::Proxy;
use tangram_tests::Cluster;
use tokio::time::Instant;

/// Packets to and from one loopback port dropped while it lives.
struct Blackhole {
    port: u16,
}

impl Blackhole {
    fn rules(&self) -> [[String; 2]; 2] {
        [
            ["--dport".to_string(), self.port.to_string()],
            ["--sport".to_string(), self.port.to_string()],
        ]
    }

    fn start(port: u16) -> anyhow::Result<Self> {
        let b = Self { port };
        for [dir, p] in b.rules() {
            let out = Command::new("iptables")
                .args(["-I", "INPUT", "-p", "tcp", &dir, &p, "-j", "DROP"])
                .output()?;
            anyhow::ensure!(
                out.status.success(),
                "iptables: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(b)
    }
}

impl Drop for Blackhole {
    fn drop(&mut self) {
        for [dir, p] in self.rules() {
            let _ = Command::new("iptables")
                .args(["-D", "INPUT", "-p", "tcp", &dir, &p, "-j", "DROP"])
                .output();
        }
    }
}

/// When the next heartbeat of `drop-a` arrives, within `within`.
async fn next_heartbeat(hb: &mut async_nats::Subscriber, within: Duration) -> Option<Instant> {
    let deadline = Instant::now() + within;
    loop {
        let m = tokio::time::timeout_at(deadline, hb.next()).await.ok()??;
        let h: Heartbeat = codec::decode(&m.payload, Encoding::Msgpack).ok()?;
        if h.worker.as_str() == "drop-a" {
            return Some(Instant::now());
        }
    }
}

/// Regression: a worker cut off by dropped packets rejoined 12.7 to 13.6 s after the heal
/// (its connection waited out TCP's retransmission backoff; the client pinged once a
/// minute). Clients now ping every 2 s and reconnect with short attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_cut_off_by_dropped_packets_heartbeats_again_within_seconds_of_the_heal(
) -> anyhow::Result<()> {
    let mut cluster = Cluster::start_without_scheduler(&[]).await?;
    cluster.start_scheduler();
    let proxy = Proxy::start(format!("127.0.0.1:{}", cluster.nats.port())).await?;
    let client = async_nats::connect(cluster.nats.url()).await?;
    let mut heartbeats = client.subscribe(subject::HEARTBEAT_ALL).await?;
    let raw = tangram_worker::config::RawConfig {
        id: Some("drop-a".into()),
        nats_url: Some(proxy.url()),
        cores: Some("0-1".into()),
        mem_mb: Some(1024),
        sandbox_runtime: Some(tangram_worker::sandbox::RuntimeKind::Noop),
        heartbeat_ms: Some(200),
        shutdown_grace_ms: Some(2000),
        ..Default::default()
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let worker = tokio::spawn(tangram_worker::run(raw.validate()?, stop.clone()));
    next_heartbeat(&mut heartbeats, Duration::from_secs(30))
        .await
        .ok_or_else(|| anyhow::anyhow!("the worker never heartbeat"))?;

    // Fifteen seconds of dropped packets: long enough for TCP's backoff to reach seconds.
    let hole = Blackhole::start(proxy.port())?;
    tokio::time::sleep(Duration::from_secs(15)).await;
    // Whatever was in flight before the drop has been seen by now; drain it.
    while tokio::time::timeout(Duration::from_millis(10), heartbeats.next())
        .await
        .is_ok()
    {}
    drop(hole);
    let healed = Instant::now();
    let back = next_heartbeat(&mut heartbeats, Duration::from_secs(60))
        .await
        .ok_or_else(|| anyhow::anyhow!("the worker did not come back within 60 s"))?;
    let took = back - healed;
    eprintln!("heartbeats resumed {took:?} after the heal");
    assert!(
        took < Duration::from_secs(5),
        "heartbeats resumed {took:?} after the heal"
    );
    stop.cancel();
    worker.await??;
    cluster.shutdown().await
}
