//! A TCP proxy between one worker and NATS that a fault can break in two ways until it
//! heals:
//! - **cut**: every open connection is dropped and new ones are refused, a partition that
//!   both ends see at once (connections reset);
//! - **black hole**: connections stay open and new ones are taken, but nothing crosses in
//!   either direction, neither bytes nor the end of a stream, as when a network drops
//!   packets. Neither end is told; each finds out only by its own timeouts (pings), and
//!   what was sent meanwhile arrives after the heal, as TCP's retransmissions would bring it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A running proxy.
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    cut: Arc<AtomicBool>,
    generation: watch::Sender<u64>,
    /// Whether bytes cross (false in a black hole).
    crossing: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream` (host:port).
    pub async fn start(upstream: String) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let cut = Arc::new(AtomicBool::new(false));
        let (generation, _) = watch::channel(0u64);
        let gen_rx = generation.subscribe();
        let (crossing, crossing_rx) = watch::channel(true);
        let task = tokio::spawn(accept(listener, upstream, cut.clone(), gen_rx, crossing_rx));
        Ok(Self {
            port,
            cut,
            generation,
            crossing,
            task,
        })
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL a client connects to.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Drops every connection and refuses new ones.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    /// Lets nothing cross, connections kept: a network dropping packets.
    pub fn black_hole(&self) {
        self.crossing.send_replace(false);
    }

    /// Accepts connections again and lets bytes cross.
    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
        self.crossing.send_replace(true);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.generation.send_modify(|g| *g += 1);
    }
}

async fn accept(
    listener: TcpListener,
    upstream: String,
    cut: Arc<AtomicBool>,
    generation: watch::Receiver<u64>,
    crossing: watch::Receiver<bool>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        if cut.load(Ordering::SeqCst) {
            drop(client);
            continue;
        }
        let upstream = upstream.clone();
        let mut generation = generation.clone();
        generation.mark_unchanged();
        let crossing = crossing.clone();
        tokio::spawn(async move {
            let Ok(server) = TcpStream::connect(&upstream).await else {
                return;
            };
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            // Either direction ending ends the other too, after its end has crossed.
            tokio::select! {
                _ = forward(client_read, server_write, crossing.clone()) => {}
                _ = forward(server_read, client_write, crossing) => {}
                _ = generation.changed() => {}
            }
        });
    }
}

/// Copies `from` to `to`; each chunk, and the end of the stream, waits until bytes cross.
async fn forward(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut crossing: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf).await.unwrap_or(0);
        if crossing.wait_for(|c| *c).await.is_err() {
            return;
        }
        if n == 0 || to.write_all(&buf[..n]).await.is_err() {
            let _ = to.shutdown().await;
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// An upstream that echoes what it reads.
    async fn echo() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.into_split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn a_black_hole_holds_bytes_on_open_connections_and_delivers_them_after_the_heal() {
        let proxy = Proxy::start(echo().await).await.unwrap();
        let mut conn = TcpStream::connect(("127.0.0.1", proxy.port()))
            .await
            .unwrap();
        let mut got = [0u8; 5];
        conn.write_all(b"hello").await.unwrap();
        conn.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello");

        proxy.black_hole();
        conn.write_all(b"again").await.unwrap();
        let mut late = TcpStream::connect(("127.0.0.1", proxy.port()))
            .await
            .unwrap();
        late.write_all(b"fresh").await.unwrap();
        let held = tokio::time::timeout(Duration::from_millis(300), conn.read(&mut got)).await;
        assert!(held.is_err(), "bytes crossed a black hole: {held:?}");
        let held = tokio::time::timeout(Duration::from_millis(50), late.read(&mut got)).await;
        assert!(
            held.is_err(),
            "a new connection crossed a black hole: {held:?}"
        );

        proxy.heal();
        conn.read_exact(&mut got).await.unwrap();
        assert_eq!(
            &got, b"again",
            "the held bytes arrive after the heal, connection kept"
        );
        late.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"fresh");
    }

    #[tokio::test]
    async fn a_cut_resets_open_connections() {
        let proxy = Proxy::start(echo().await).await.unwrap();
        let mut conn = TcpStream::connect(("127.0.0.1", proxy.port()))
            .await
            .unwrap();
        conn.write_all(b"x").await.unwrap();
        let mut got = [0u8; 1];
        conn.read_exact(&mut got).await.unwrap();
        proxy.cut();
        let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut got))
            .await
            .expect("a cut connection ends at once");
        assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    }
}

#[cfg(test)]
mod nats_tests {
    use super::*;
    use futures::StreamExt as _;
    use std::time::Duration;

    #[tokio::test]
    async fn a_nats_client_talks_through_the_proxy() {
        let nats = crate::NatsServer::start();
        let proxy = Proxy::start(format!("127.0.0.1:{}", nats.port()))
            .await
            .unwrap();
        let client = tokio::time::timeout(Duration::from_secs(5), async_nats::connect(proxy.url()))
            .await
            .expect("connected within 5 s")
            .unwrap();
        let mut sub = client.subscribe("x").await.unwrap();
        client.publish("x", "hi".into()).await.unwrap();
        let m = tokio::time::timeout(Duration::from_secs(5), sub.next())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&m.payload[..], b"hi");
    }
}
