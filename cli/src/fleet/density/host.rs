//! What the host spends on a worker's sandboxes, read from `/proc`, the containers' memory
//! cgroups (v1 or v2) and `docker`: available memory, each container's charge, the runtime
//! shim beside each container, and the Docker daemons' resident memory.

use super::super::docker;
use anyhow::Context as _;
use serde_json::{json, Value};

/// The host at one moment.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// `MemAvailable`, KiB.
    pub available_kib: u64,
    /// The worker's running containers.
    pub containers: usize,
    /// Their memory cgroups' charge, summed, KiB.
    pub cgroup_kib: u64,
    /// The shims (each container's parent process), proportional set size summed, KiB.
    pub shim_kib: u64,
    /// dockerd and containerd, resident, KiB.
    pub daemons_kib: u64,
}

impl Snapshot {
    /// Reads the host and the containers labelled with `worker`.
    pub fn take(worker: &str) -> anyhow::Result<Self> {
        let ids = docker(&[
            "ps",
            "-q",
            "--no-trunc",
            "--filter",
            &format!("label=tangram.worker={worker}"),
        ])?;
        let ids: Vec<&str> = ids.split_whitespace().collect();
        let mut s = Snapshot {
            available_kib: meminfo("MemAvailable")?,
            containers: ids.len(),
            daemons_kib: ["dockerd", "containerd"]
                .iter()
                .flat_map(|n| pids_named(n))
                .map(|p| status_kib(p, "VmRSS"))
                .sum(),
            ..Default::default()
        };
        if ids.is_empty() {
            return Ok(s);
        }
        let mut args = vec!["inspect", "-f", "{{.State.Pid}}"];
        args.extend(&ids);
        let mut shims = std::collections::BTreeSet::new();
        for pid in docker(&args)?.split_whitespace() {
            let pid: u32 = pid.parse().context("a container's pid")?;
            s.cgroup_kib += cgroup_kib(pid).unwrap_or(0);
            if let Some(ppid) = ppid(pid) {
                shims.insert(ppid);
            }
        }
        s.shim_kib = shims.iter().map(|&p| pss_kib(p)).sum();
        Ok(s)
    }
}

/// What one parked sandbox costs, from the host before and after they were opened.
pub fn per_sandbox(before: &Snapshot, after: &Snapshot) -> Value {
    let n = after.containers.max(1) as u64;
    let host = before.available_kib.saturating_sub(after.available_kib) / n;
    json!({
        "host_kib": host,
        "cgroup_kib": after.cgroup_kib / n,
        "shim_kib": after.shim_kib / n,
        "daemons_kib": after.daemons_kib.saturating_sub(before.daemons_kib) / n,
        "available_after_mib": after.available_kib / 1024,
        "fit_in_available": n + after.available_kib / host.max(1),
    })
}

fn meminfo(key: &str) -> anyhow::Result<u64> {
    let text = std::fs::read_to_string("/proc/meminfo")?;
    field_kib(&text, key).with_context(|| format!("{key} in /proc/meminfo"))
}

/// `key:   N kB` in a `/proc` file's text.
fn field_kib(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

fn status_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|t| field_kib(&t, key))
        .unwrap_or(0)
}

/// Proportional set size (shared pages split among their users), else resident size.
fn pss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|t| field_kib(&t, "Pss"))
        .unwrap_or_else(|| status_kib(pid, "VmRSS"))
}

fn ppid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // pid (comm) state ppid ...: comm may hold spaces, so count from its closing paren.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn pids_named(name: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == name)
        })
        .collect()
}

/// The charge of `pid`'s memory cgroup, KiB: cgroup v1's `memory.usage_in_bytes` or v2's
/// `memory.current`.
fn cgroup_kib(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let file = cgroup_file(&text)?;
    let bytes: u64 = std::fs::read_to_string(file).ok()?.trim().parse().ok()?;
    Some(bytes / 1024)
}

/// Where the memory charge of the cgroup described by a `/proc/<pid>/cgroup` text is read.
fn cgroup_file(text: &str) -> Option<String> {
    let v1 = text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then(|| format!("/sys/fs/cgroup/memory{path}/memory.usage_in_bytes"))
    });
    v1.or_else(|| {
        let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
        Some(format!("/sys/fs/cgroup{path}/memory.current"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_charge_is_read_from_the_v1_memory_controller_or_the_v2_unified_tree() {
        let v1 = "12:pids:/docker/abc\n4:memory:/docker/abc\n1:name=systemd:/docker/abc\n";
        assert_eq!(
            cgroup_file(v1).as_deref(),
            Some("/sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes")
        );
        let v2 = "0::/system.slice/docker-abc.scope\n";
        assert_eq!(
            cgroup_file(v2).as_deref(),
            Some("/sys/fs/cgroup/system.slice/docker-abc.scope/memory.current")
        );
        assert_eq!(cgroup_file("3:cpu,cpuacct:/x\n"), None);
    }

    #[test]
    fn a_proc_field_is_read_in_kib_and_a_prefix_of_another_key_does_not_match() {
        let t = "MemTotal:       24000000 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(field_kib(t, "MemAvailable"), Some(20_000_000));
        assert_eq!(field_kib(t, "Mem"), None);
    }

    #[test]
    fn a_parked_sandbox_costs_the_drop_in_available_memory_shared_out() {
        let before = Snapshot {
            available_kib: 1_000_000,
            daemons_kib: 100_000,
            ..Default::default()
        };
        let after = Snapshot {
            available_kib: 800_000,
            containers: 100,
            cgroup_kib: 50_000,
            shim_kib: 80_000,
            daemons_kib: 120_000,
        };
        let m = per_sandbox(&before, &after);
        assert_eq!(m["host_kib"], 2_000);
        assert_eq!(m["cgroup_kib"], 500);
        assert_eq!(m["shim_kib"], 800);
        assert_eq!(m["daemons_kib"], 200);
        assert_eq!(m["fit_in_available"], 100 + 400);
    }
}
