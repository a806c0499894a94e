//! What a process has used so far: CPU time and resident memory, from `/proc`.

/// One process's CPU time so far (user and system), and its resident memory.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    /// CPU seconds.
    pub cpu_s: f64,
    /// Resident set, MiB.
    pub rss_mib: f64,
}

/// Reads `/proc/<pid>/stat` and `/proc/<pid>/status`; zero where the process is gone.
pub fn usage(pid: u32) -> Usage {
    // Clock ticks per second: 100 on every Linux this runs on (USER_HZ).
    const TICKS: f64 = 100.0;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    Usage {
        cpu_s: (ticks(11) + ticks(12)) / TICKS,
        rss_mib: rss_kib / 1024.0,
    }
}

/// The summed usage of several processes.
pub fn usage_of(pids: &[u32]) -> Usage {
    pids.iter()
        .map(|&p| usage(p))
        .fold(Usage::default(), |a, u| Usage {
            cpu_s: a.cpu_s + u.cpu_s,
            rss_mib: a.rss_mib + u.rss_mib,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::{Duration, Instant};

    #[test]
    fn this_process_has_cpu_time_and_memory() {
        let u = usage(std::process::id());
        assert!(u.rss_mib > 1.0, "{u:?}");
        // Spin a little so that at least one tick is counted.
        let t = Instant::now();
        let mut x = 0u64;
        while t.elapsed() < Duration::from_millis(50) {
            x = x.wrapping_add(1);
        }
        assert!(x > 0);
        assert!(usage(std::process::id()).cpu_s > 0.0);
        assert_eq!(
            usage(u32::MAX).cpu_s,
            0.0,
            "a process that is not there reads as zero"
        );
    }
}
