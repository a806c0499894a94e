//! A TCP proxy between one worker and NATS that a fault can cut: every open connection is
//! dropped and new ones are refused until it heals. To the worker this is a network
//! partition; NATS sees the connection vanish.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A running proxy.
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    cut: Arc<AtomicBool>,
    generation: watch::Sender<u64>,
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
        let task = tokio::spawn(accept(listener, upstream, cut.clone(), gen_rx));
        Ok(Self {
            port,
            cut,
            generation,
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

    /// Accepts connections again.
    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
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
        tokio::spawn(async move {
            let Ok(server) = TcpStream::connect(&upstream).await else {
                return;
            };
            let (mut client, mut server) = (client, server);
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                _ = generation.changed() => {}
            }
        });
    }
}
