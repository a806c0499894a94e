//! A nats-server on loopback for a local cluster. `tangram up`, the pipeline bench and the
//! integration tests all start theirs through here: the command line (config, loopback
//! address, client and monitoring ports, JetStream store), and the wait until it listens.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Where a local server runs and with what.
#[derive(Debug, Clone, Copy)]
pub struct LocalServer<'a> {
    /// The `nats-server` binary.
    pub bin: &'a Path,
    /// Its configuration file (the bundled `nats/server.conf`, perhaps with an
    /// `authorization` block).
    pub conf: &'a Path,
    /// The JetStream store directory.
    pub store: &'a Path,
    /// The client port on 127.0.0.1.
    pub port: u16,
    /// The monitoring port on 127.0.0.1.
    pub monitor_port: u16,
}

impl LocalServer<'_> {
    /// The command that starts it (the caller decides where its output goes).
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(self.bin);
        cmd.arg("-c")
            .arg(self.conf)
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-m", &self.monitor_port.to_string()])
            .arg("-sd")
            .arg(self.store);
        cmd
    }

    /// The client URL.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

/// Waits until something accepts connections on 127.0.0.1:`port`, trying every `poll`;
/// false if `within` passes first. Blocking, on the real clock: a paused test clock would
/// never let it give up.
#[allow(clippy::disallowed_types, clippy::disallowed_methods)]
pub fn wait_listening(port: u16, within: Duration, poll: Duration) -> bool {
    use std::time::Instant;
    let deadline = Instant::now() + within;
    loop {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(poll);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_names_the_config_ports_and_store_on_loopback() {
        let s = LocalServer {
            bin: Path::new("nats-server"),
            conf: Path::new("/c/server.conf"),
            store: Path::new("/c/js"),
            port: 4300,
            monitor_port: 8300,
        };
        let cmd = s.command();
        let args: Vec<String> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            args,
            [
                "-c",
                "/c/server.conf",
                "-a",
                "127.0.0.1",
                "-p",
                "4300",
                "-m",
                "8300",
                "-sd",
                "/c/js"
            ]
        );
        assert_eq!(s.url(), "nats://127.0.0.1:4300");
    }

    #[test]
    fn waiting_on_a_port_nobody_listens_on_gives_up() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert!(wait_listening(
            port,
            Duration::ZERO,
            Duration::from_millis(1)
        ));
        drop(l);
        assert!(!wait_listening(
            port,
            Duration::from_millis(30),
            Duration::from_millis(10)
        ));
    }
}
