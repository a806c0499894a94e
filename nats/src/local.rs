//! The processes of a local cluster, as one launcher: `tangram up`, the benches (pipeline,
//! fleet, opens, density) and the test support (its cluster's processes, the fault fleet,
//! the NATS-cluster tests) start their nats-server ([`LocalServer`]), schedulers
//! ([`SchedulerProcess`]) and workers ([`WorkerProcess`]) through here, so a flag is spelt
//! in one place. (The suites that test a binary's own flags, health and metrics addresses
//! among them, spell those out.) Each type renders its process's command line; the caller
//! decides the binary's path, the environment (credentials, log filter) and where output
//! goes. Also the wait until a server listens.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
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

/// A `tangram-scheduler` of a local cluster. Fields left `None` take the binary's own
/// default (or its `TANGRAM_SCHEDULER_*` variable).
#[derive(Debug, Clone, Default)]
pub struct SchedulerProcess {
    /// Its id in the leader lease.
    pub id: Option<String>,
    /// The NATS URL.
    pub nats_url: Option<String>,
    /// The scheduling policy.
    pub policy: Option<String>,
    /// Cores per sandbox under `static`.
    pub static_cores: Option<u32>,
    /// Prometheus listen address.
    pub metrics_addr: Option<String>,
    /// Replicas of the streams it creates (3 on a NATS cluster).
    pub stream_replicas: Option<usize>,
}

impl SchedulerProcess {
    /// Its command-line arguments.
    pub fn args(&self) -> Vec<OsString> {
        self.flags().0
    }

    /// The command that starts it from `bin`.
    pub fn command(&self, bin: &Path) -> Command {
        self.flags().command(bin)
    }

    fn flags(&self) -> Flags {
        let mut args = Flags::default();
        args.opt("--id", self.id.as_ref());
        args.opt("--nats-url", self.nats_url.as_ref());
        args.opt("--policy", self.policy.as_ref());
        args.opt("--static-cores", self.static_cores.map(|v| v.to_string()));
        args.opt("--metrics-addr", self.metrics_addr.as_ref());
        args.opt(
            "--stream-replicas",
            self.stream_replicas.map(|v| v.to_string()),
        );
        args
    }
}

/// A `tangram-worker` of a local cluster: from flags, from a config file, or both (flags
/// win). Fields left `None` take the inherited `TANGRAM_WORKER_*` variable, else the file's
/// value, else the binary's default: a launcher that must not be redirected by its caller's
/// environment names the NATS URL here even when the file has it.
#[derive(Debug, Clone, Default)]
pub struct WorkerProcess {
    /// A TOML config file.
    pub config: Option<PathBuf>,
    /// Its id in the fleet (with `bench_replicas`, the prefix of its replicas' ids).
    pub id: Option<String>,
    /// The NATS URL.
    pub nats_url: Option<String>,
    /// The cores it grants, as a cpuset list.
    pub cores: Option<String>,
    /// Memory for sandboxes, MiB.
    pub mem_mb: Option<u64>,
    /// Heartbeat period, ms.
    pub heartbeat_ms: Option<u64>,
    /// What runs sandboxes (`docker`, `runsc`, `noop`).
    pub sandbox_runtime: Option<String>,
    /// Prometheus listen address.
    pub metrics_addr: Option<String>,
    /// Benchmarks only: this many workers in the one process (the `noop` runtime).
    pub bench_replicas: Option<usize>,
    /// Benchmarks only, with `bench_replicas`: where each replica's worker seed is.
    pub bench_creds_dir: Option<PathBuf>,
}

impl WorkerProcess {
    /// Its command-line arguments.
    pub fn args(&self) -> Vec<OsString> {
        self.flags().0
    }

    /// The command that starts it from `bin`.
    pub fn command(&self, bin: &Path) -> Command {
        self.flags().command(bin)
    }

    fn flags(&self) -> Flags {
        let mut args = Flags::default();
        args.opt("--config", self.config.as_ref());
        args.opt("--id", self.id.as_ref());
        args.opt("--nats-url", self.nats_url.as_ref());
        args.opt("--cores", self.cores.as_ref());
        args.opt("--mem-mb", self.mem_mb.map(|v| v.to_string()));
        args.opt("--heartbeat-ms", self.heartbeat_ms.map(|v| v.to_string()));
        args.opt("--sandbox-runtime", self.sandbox_runtime.as_ref());
        args.opt("--metrics-addr", self.metrics_addr.as_ref());
        args.opt(
            "--bench-replicas",
            self.bench_replicas.map(|v| v.to_string()),
        );
        args.opt("--bench-creds-dir", self.bench_creds_dir.as_ref());
        args
    }
}

/// A command line being rendered: each flag given a value is written `--flag value`.
#[derive(Default)]
struct Flags(Vec<OsString>);

impl Flags {
    fn opt(&mut self, flag: &str, value: Option<impl AsRef<std::ffi::OsStr>>) {
        if let Some(v) = value {
            self.0.push(flag.into());
            self.0.push(v.as_ref().to_owned());
        }
    }

    /// The command that runs `bin` with these flags.
    fn command(self, bin: &Path) -> Command {
        let mut cmd = Command::new(bin);
        cmd.args(self.0);
        cmd
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

/// A port on loopback that is free now, for a process about to listen on it. Taken below the
/// kernel's ephemeral range (or above it, if that leaves more room) and at random there: a
/// port the kernel hands out itself (`bind(0)`) comes from the same range as the local end of
/// every outgoing connection, and one of those (any NATS client on the machine) could take it
/// before the process listens (seen: a test's `tangram up` failed, its nats-server's port
/// "already in use").
pub fn free_port() -> std::io::Result<u16> {
    use std::net::TcpListener;
    let (lo, hi) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| {
            let mut v = t.split_whitespace().map(|x| x.parse::<u32>().ok());
            Some((v.next()??, v.next()??))
        })
        .unwrap_or((32_768, 60_999));
    let below = lo.saturating_sub(10_000);
    let above = 65_535u32.saturating_sub(hi);
    let (first, span) = if below >= above {
        (10_000, below)
    } else {
        (hi + 1, above)
    };
    if span >= 100 {
        for _ in 0..64 {
            let port = (first + fastrand::u32(0..span)) as u16;
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return Ok(port);
            }
        }
    }
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_port_is_outside_the_ephemeral_range_and_bindable() {
        let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap();
        let v: Vec<u32> = range
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        // Where the range leaves under 100 ports on both sides, the kernel's pick is all
        // there is.
        let room = v[0].saturating_sub(10_000).max(65_535 - v[1]) >= 100;
        for _ in 0..20 {
            let p = free_port().unwrap();
            let q = p as u32;
            assert!(!room || q < v[0] || q > v[1], "{p} is in {range}");
            std::net::TcpListener::bind(("127.0.0.1", p)).unwrap();
        }
    }

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

    fn strings(args: Vec<OsString>) -> Vec<String> {
        args.into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn a_scheduler_names_only_what_it_was_given() {
        assert!(SchedulerProcess::default().args().is_empty());
        let s = SchedulerProcess {
            id: Some("scheduler-1".into()),
            nats_url: Some("nats://127.0.0.1:4300".into()),
            policy: Some("static".into()),
            static_cores: Some(2),
            metrics_addr: None,
            stream_replicas: Some(3),
        };
        assert_eq!(
            strings(s.args()),
            [
                "--id",
                "scheduler-1",
                "--nats-url",
                "nats://127.0.0.1:4300",
                "--policy",
                "static",
                "--static-cores",
                "2",
                "--stream-replicas",
                "3"
            ]
        );
    }

    #[test]
    fn a_worker_from_a_file_with_flags_on_top() {
        let w = WorkerProcess {
            config: Some("/c/gpu-0.toml".into()),
            cores: Some("0-3".into()),
            mem_mb: Some(4096),
            heartbeat_ms: Some(200),
            sandbox_runtime: Some("noop".into()),
            bench_replicas: Some(50),
            bench_creds_dir: Some("/c/creds".into()),
            ..Default::default()
        };
        assert_eq!(
            strings(w.args()),
            [
                "--config",
                "/c/gpu-0.toml",
                "--cores",
                "0-3",
                "--mem-mb",
                "4096",
                "--heartbeat-ms",
                "200",
                "--sandbox-runtime",
                "noop",
                "--bench-replicas",
                "50",
                "--bench-creds-dir",
                "/c/creds"
            ]
        );
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
