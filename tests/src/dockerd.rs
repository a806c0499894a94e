//! A second Docker daemon on this machine, for tests where workers must not share one image
//! store (as workers on different hosts do not): its own data root, exec root, socket,
//! containerd and default bridge (an interface this module makes: a daemon told to use no
//! bridge deletes the host's `docker0`), no iptables rules. Stopped, and its folders and
//! bridge removed, when dropped.

use crate::ChildGuard;
use anyhow::Context as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

/// A running second daemon.
#[derive(Debug)]
pub struct SecondDaemon {
    /// Its socket, `unix:///...`, for a worker's `[sandbox] docker_host`.
    pub socket: String,
    child: Option<ChildGuard>,
    dir: PathBuf,
    bridge: String,
}

/// Whether this machine can start one: `dockerd` on PATH and root.
pub fn available() -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    root && Command::new("dockerd")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

impl SecondDaemon {
    /// Starts one with the main daemon's storage driver; waits (at most 60 s) until it answers.
    pub fn start() -> anyhow::Result<Self> {
        let driver = Command::new("docker")
            .args(["info", "--format", "{{.Driver}}"])
            .output()
            .context("docker info")?;
        let driver = String::from_utf8_lossy(&driver.stdout).trim().to_string();
        sweep_leftovers();
        // Short: the containerd socket under the exec root must fit a socket path.
        let pid = std::process::id();
        let dir = PathBuf::from(format!("/tmp/tgd-{pid}"));
        std::fs::create_dir_all(&dir)?;
        let socket = dir.join("docker.sock");
        // Its own bridge, on a private /24 of its own (the pid picks it). The guard exists
        // before the bridge does, so a failure below still removes it.
        let bridge = format!("tgd{}", pid % 100_000);
        let mut d = Self {
            socket: format!("unix://{}", socket.display()),
            child: None,
            dir: dir.clone(),
            bridge: bridge.clone(),
        };
        let cidr = format!("10.231.{}.1/24", pid % 250);
        for args in [
            vec!["link", "add", &bridge, "type", "bridge"],
            vec!["addr", "add", &cidr, "dev", &bridge],
            vec!["link", "set", &bridge, "up"],
        ] {
            let out = Command::new("ip").args(&args).output().context("ip")?;
            anyhow::ensure!(
                out.status.success(),
                "ip {args:?}: {}",
                crate::output_text(&out)
            );
        }
        let config = serde_json::json!({
            "data-root": dir.join("root"),
            "exec-root": dir.join("exec"),
            "pidfile": dir.join("docker.pid"),
            "hosts": [format!("unix://{}", socket.display())],
            "storage-driver": driver,
            "bridge": bridge,
            "iptables": false,
            "ip6tables": false,
            "ip-masq": false,
            // Namespaces of its own, should it share a system containerd with the main
            // daemon: its containers and images stay apart.
            "containerd-namespace": format!("tgd{pid}"),
            "containerd-plugins-namespace": format!("tgd{pid}-plugins"),
        });
        std::fs::write(dir.join("daemon.json"), config.to_string())?;
        let log = std::fs::File::create(dir.join("dockerd.log"))?;
        let child = Command::new("dockerd")
            .arg("--config-file")
            .arg(dir.join("daemon.json"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting a second dockerd")?;
        d.child = Some(ChildGuard(child));
        // At most 60 s: 300 tries, 200 ms apart.
        for _ in 0..300 {
            if d.docker(&["info", "--format", "{{.ServerVersion}}"])
                .is_ok()
            {
                return Ok(d);
            }
            if let Some(c) = d.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    let log =
                        std::fs::read_to_string(d.dir.join("dockerd.log")).unwrap_or_default();
                    anyhow::bail!("the second dockerd exited ({status}):\n{log}");
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        anyhow::bail!("the second dockerd did not answer within 60 s")
    }

    /// Runs the docker CLI against this daemon; its stdout, or the error with its output.
    pub fn docker(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new("docker")
            .args(["-H", &self.socket])
            .args(args)
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "docker {args:?}: {}",
            crate::output_text(&out)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Copies `image` from the main daemon into this one.
    pub fn load(&self, image: &str) -> anyhow::Result<()> {
        let save = Command::new("docker")
            .args(["save", image])
            .stdout(Stdio::piped())
            .spawn()?;
        let out = Command::new("docker")
            .args(["-H", &self.socket, "load", "-q"])
            .stdin(save.stdout.context("docker save's stdout")?)
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "docker load: {}",
            crate::output_text(&out)
        );
        Ok(())
    }
}

/// What second daemons of test processes that are gone left behind (a test killed at its
/// timeout runs no `Drop`): their daemons, bridges and folders.
fn sweep_leftovers() {
    let Ok(entries) = std::fs::read_dir("/tmp") else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("tgd-")
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue; // its test is still running
        }
        if let Ok(daemon) = std::fs::read_to_string(e.path().join("docker.pid")) {
            let daemon = daemon.trim();
            // Only a dockerd running on this folder's config (a pid may have been reused).
            let cmdline = std::fs::read(format!("/proc/{daemon}/cmdline")).unwrap_or_default();
            let ours = String::from_utf8_lossy(&cmdline).contains(&format!("/tmp/tgd-{pid}/"));
            if ours {
                if let Ok(daemon) = daemon.parse() {
                    let _ = crate::signal(daemon, crate::Signal::TERM);
                }
                std::thread::sleep(Duration::from_secs(2));
            }
        }
        let _ = Command::new("ip")
            .args(["link", "del", &format!("tgd{}", pid % 100_000)])
            .output();
        let _ = std::fs::remove_dir_all(e.path());
    }
}

impl Drop for SecondDaemon {
    fn drop(&mut self) {
        // Whatever sandboxes are left, then the daemon (SIGTERM: it stops its containerd).
        if let Ok(ids) = self.docker(&["ps", "-aq"]) {
            let ids: Vec<&str> = ids.split_whitespace().collect();
            if !ids.is_empty() {
                let mut args = vec!["rm", "-f"];
                args.extend(ids);
                let _ = self.docker(&args);
            }
        }
        if let Some(mut c) = self.child.take() {
            let _ = crate::signal(c.id(), crate::Signal::TERM);
            // At most 20 s for it to stop.
            for _ in 0..200 {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .output();
    }
}
