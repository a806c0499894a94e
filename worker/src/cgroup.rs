//! Granting and parking cores by writing the container's cgroup files directly.
//!
//! Docker's update API goes through dockerd and runc; writing `cpuset.cpus` and the CFS quota
//! ourselves skips both (see `benches/grant.rs` for the two measured side by side). Both
//! cgroup v1 (`cpuset/` and `cpu/` hierarchies) and v2 (`cpuset.cpus`, `cpu.max`) are handled;
//! the paths come from `/proc/<pid>/cgroup` of the container's init process, so the cgroup
//! driver (cgroupfs or systemd) does not matter.

use std::io;
use std::path::{Path, PathBuf};

/// CFS period used for every grant, in microseconds.
pub const PERIOD_US: i64 = 100_000;

/// Where one container's CPU controls live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupCpu {
    /// cgroup v1: separate cpuset and cpu hierarchies.
    V1 {
        /// Directory holding `cpuset.cpus`.
        cpuset: PathBuf,
        /// Directory holding `cpu.cfs_quota_us`.
        cpu: PathBuf,
    },
    /// cgroup v2: one directory with `cpuset.cpus` and `cpu.max`.
    V2 {
        /// The container's cgroup directory.
        dir: PathBuf,
    },
}

impl CgroupCpu {
    /// Finds the CPU controls of the process `pid` (the container's init).
    pub fn for_pid(pid: i64) -> io::Result<Self> {
        Self::from_dirs(&ProcCgroups::of_pid(pid)?)
    }

    /// Parses `/proc/<pid>/cgroup` text against a cgroup mount root.
    pub fn from_proc(text: &str, root: &Path) -> io::Result<Self> {
        Self::from_dirs(&ProcCgroups::parse(text, root))
    }

    fn from_dirs(dirs: &ProcCgroups) -> io::Result<Self> {
        match (dirs.v1("cpuset"), dirs.v1("cpu"), &dirs.unified) {
            (Some(cpuset), Some(cpu), _) => Ok(CgroupCpu::V1 { cpuset, cpu }),
            (None, None, Some(dir)) => Ok(CgroupCpu::V2 { dir: dir.clone() }),
            _ => Err(io::Error::new(
                io::ErrorKind::NotFound,
                "no cpu and cpuset cgroup for the process",
            )),
        }
    }

    /// How many CFS periods the container was throttled in (`nr_throttled` of `cpu.stat`).
    pub fn throttled_periods(&self) -> io::Result<u64> {
        let dir = match self {
            CgroupCpu::V1 { cpu, .. } => cpu,
            CgroupCpu::V2 { dir } => dir,
        };
        let text = std::fs::read_to_string(dir.join("cpu.stat"))?;
        text.lines()
            .find_map(|l| l.strip_prefix("nr_throttled ")?.trim().parse().ok())
            .ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidData, "no nr_throttled in cpu.stat")
            })
    }

    /// Grants `cpus` (a cpuset list) with a quota of `quota_us` per [`PERIOD_US`].
    ///
    /// Widening writes the cpuset before the quota and narrowing the quota before the cpuset,
    /// so the container never holds more than the larger of the two states.
    pub fn apply(&self, cpus: &str, quota_us: i64, widening: bool) -> io::Result<()> {
        match self {
            CgroupCpu::V1 { cpuset, cpu } => {
                let quota = quota_us.to_string();
                if widening {
                    write_file(cpuset, "cpuset.cpus", cpus)?;
                    write_file(cpu, "cpu.cfs_quota_us", &quota)
                } else {
                    write_file(cpu, "cpu.cfs_quota_us", &quota)?;
                    write_file(cpuset, "cpuset.cpus", cpus)
                }
            }
            CgroupCpu::V2 { dir } => {
                let max = format!("{quota_us} {PERIOD_US}");
                if widening {
                    write_file(dir, "cpuset.cpus", cpus)?;
                    write_file(dir, "cpu.max", &max)
                } else {
                    write_file(dir, "cpu.max", &max)?;
                    write_file(dir, "cpuset.cpus", cpus)
                }
            }
        }
    }
}

/// The cgroup directories `/proc/<pid>/cgroup` names for a process, under a mount root: each
/// cgroup v1 line's directory by its controllers (`cpu,cpuacct` names both), and the v2
/// (unified) directory. Shared by the CPU controls, the memory limit and the containment.
#[derive(Debug, Default)]
pub(crate) struct ProcCgroups {
    v1: Vec<(String, PathBuf)>,
    /// The unified hierarchy's directory (the line with no controllers).
    pub unified: Option<PathBuf>,
}

impl ProcCgroups {
    /// Reads those of process `pid`, under `/sys/fs/cgroup`.
    pub fn of_pid(pid: i64) -> io::Result<Self> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
        Ok(Self::parse(&text, Path::new("/sys/fs/cgroup")))
    }

    /// Parses `/proc/<pid>/cgroup` text against a cgroup mount root.
    pub fn parse(text: &str, root: &Path) -> Self {
        let mut dirs = Self::default();
        for line in text.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(_), Some(controllers), Some(path)) =
                (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let rel = path.trim_start_matches('/');
            if controllers.is_empty() {
                dirs.unified = Some(root.join(rel));
            } else {
                dirs.v1
                    .push((controllers.to_string(), root.join(controllers).join(rel)));
            }
        }
        dirs
    }

    /// The directory of v1 controller `name`, when mounted.
    pub fn v1(&self, name: &str) -> Option<PathBuf> {
        self.v1
            .iter()
            .find(|(controllers, _)| controllers.split(',').any(|c| c == name))
            .map(|(_, dir)| dir.clone())
    }
}

/// Writes `value` to `dir/file`, naming both in the error.
pub(crate) fn write_file(dir: &Path, file: &str, value: &str) -> io::Result<()> {
    std::fs::write(dir.join(file), value).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("writing {value:?} to {}: {e}", dir.join(file).display()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_v1_v2_and_hybrid_paths() {
        let root = Path::new("/sys/fs/cgroup");
        let v1 = "4:memory:/docker/abc\n3:cpuset:/docker/abc\n1:cpu,cpuacct:/docker/abc\n0::/docker/abc\n";
        assert_eq!(
            CgroupCpu::from_proc(v1, root).unwrap(),
            CgroupCpu::V1 {
                cpuset: "/sys/fs/cgroup/cpuset/docker/abc".into(),
                cpu: "/sys/fs/cgroup/cpu,cpuacct/docker/abc".into()
            }
        );
        let v2 = "0::/system.slice/docker-abc.scope\n";
        assert_eq!(
            CgroupCpu::from_proc(v2, root).unwrap(),
            CgroupCpu::V2 {
                dir: "/sys/fs/cgroup/system.slice/docker-abc.scope".into()
            }
        );
        assert!(CgroupCpu::from_proc("4:memory:/x\n", root).is_err());
    }

    #[test]
    fn writes_cpuset_and_quota_files() {
        let dir = tempfile::tempdir().unwrap();
        let cg = CgroupCpu::V2 {
            dir: dir.path().to_path_buf(),
        };
        cg.apply("0-1", 200_000, true).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("cpuset.cpus")).unwrap(),
            "0-1"
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("cpu.max")).unwrap(),
            "200000 100000"
        );
    }
}
