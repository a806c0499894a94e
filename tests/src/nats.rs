//! A real `nats-server` per test.

use crate::{free_port, nats_server_bin, repo_root};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::Duration;

/// A real nats-server with JetStream, for one test.
#[derive(Debug)]
pub struct NatsServer {
    child: Option<Child>,
    port: u16,
    store: tempfile::TempDir,
    conf: PathBuf,
}

impl NatsServer {
    /// Starts a server and waits until it accepts connections.
    pub fn start() -> Self {
        Self::start_with("")
    }

    /// Starts a server whose configuration is the bundled one plus `extra` (for example
    /// an `authorization` block from [`tangram_nats::auth::server_authorization`]).
    pub fn start_with(extra: &str) -> Self {
        let store = tempfile::tempdir().expect("temp store dir");
        let conf = store.path().join("server.conf");
        let base = std::fs::read_to_string(repo_root().join("nats/server.conf"))
            .expect("the bundled server.conf");
        std::fs::write(&conf, format!("{base}\n{extra}\n")).expect("writing server.conf");
        let mut s = Self {
            child: None,
            port: free_port(),
            store,
            conf,
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let bin = nats_server_bin();
        let store = self.store.path().join("js");
        let server = tangram_nats::local::LocalServer {
            bin: &bin,
            conf: &self.conf,
            store: &store,
            port: self.port,
            monitor_port: free_port(),
        };
        let child = server
            .command()
            .stdout(Stdio::null())
            // TANGRAM_TEST_NATS_LOG=1 shows the server's log (permission violations...).
            .stderr(if std::env::var_os("TANGRAM_TEST_NATS_LOG").is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .spawn()
            .expect("spawning nats-server");
        self.child = Some(child);
        assert!(
            tangram_nats::local::wait_listening(
                self.port,
                Duration::from_secs(10),
                Duration::from_millis(20)
            ),
            "nats-server did not start on port {}",
            self.port
        );
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The client URL.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Stops and starts the server on the same port and store.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Kills the server (SIGKILL).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}
