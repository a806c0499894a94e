//! Setting a sandbox's memory limit by writing its cgroup files, for runtimes whose containers
//! Docker cannot update (gVisor: runsc has no `update` command).
//!
//! Swap is held at zero, as Docker's `memory_swap = memory` holds it: on cgroup v1 the
//! memory-and-swap limit equals the memory limit (raised first when growing, lowered last
//! when shrinking, since the kernel refuses a memory limit above it); on v2 `memory.max` and
//! `memory.swap.max = 0`.

use crate::cgroup::{write_file, ProcCgroups};
use std::io;
use std::path::{Path, PathBuf};

/// Where one container's memory limit lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemoryCgroup {
    /// cgroup v1: the `memory` hierarchy's directory.
    V1(PathBuf),
    /// cgroup v2: the container's directory.
    V2(PathBuf),
}

impl MemoryCgroup {
    /// Finds the memory cgroup of the process `pid` (the container's init).
    pub fn for_pid(pid: i64) -> io::Result<Self> {
        Self::from_dirs(ProcCgroups::of_pid(pid)?)
    }

    /// Parses `/proc/<pid>/cgroup` text against a cgroup mount root.
    pub fn from_proc(text: &str, root: &Path) -> io::Result<Self> {
        Self::from_dirs(ProcCgroups::parse(text, root))
    }

    fn from_dirs(dirs: ProcCgroups) -> io::Result<Self> {
        match (dirs.v1("memory"), dirs.unified) {
            (Some(dir), _) => Ok(Self::V1(dir)),
            (None, Some(dir)) => Ok(Self::V2(dir)),
            (None, None) => Err(io::Error::new(
                io::ErrorKind::NotFound,
                "no memory cgroup for the process",
            )),
        }
    }

    /// Sets the limit to `bytes`, with no swap.
    pub fn set(&self, bytes: u64) -> io::Result<()> {
        let value = bytes.to_string();
        match self {
            Self::V1(dir) => {
                let current: u64 = std::fs::read_to_string(dir.join("memory.limit_in_bytes"))?
                    .trim()
                    .parse()
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                // The kernel keeps memory <= memory+swap at every step.
                let swap = dir.join("memory.memsw.limit_in_bytes").exists();
                if bytes >= current {
                    if swap {
                        write_file(dir, "memory.memsw.limit_in_bytes", &value)?;
                    }
                    write_file(dir, "memory.limit_in_bytes", &value)
                } else {
                    write_file(dir, "memory.limit_in_bytes", &value)?;
                    if swap {
                        write_file(dir, "memory.memsw.limit_in_bytes", &value)?;
                    }
                    Ok(())
                }
            }
            Self::V2(dir) => {
                write_file(dir, "memory.max", &value)?;
                if dir.join("memory.swap.max").exists() {
                    write_file(dir, "memory.swap.max", "0")?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_memory_cgroup_of_either_version() {
        let root = Path::new("/sys/fs/cgroup");
        let v1 = "4:memory:/docker/abc\n3:cpuset:/docker/abc\n0::/docker/abc\n";
        assert_eq!(
            MemoryCgroup::from_proc(v1, root).unwrap(),
            MemoryCgroup::V1("/sys/fs/cgroup/memory/docker/abc".into())
        );
        let v2 = "0::/system.slice/docker-abc.scope\n";
        assert_eq!(
            MemoryCgroup::from_proc(v2, root).unwrap(),
            MemoryCgroup::V2("/sys/fs/cgroup/system.slice/docker-abc.scope".into())
        );
        assert!(MemoryCgroup::from_proc("3:cpuset:/x\n", root).is_err());
    }

    fn read(dir: &Path, file: &str) -> String {
        std::fs::read_to_string(dir.join(file)).unwrap()
    }

    #[test]
    fn v1_keeps_memory_and_swap_equal_growing_and_shrinking() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("memory.limit_in_bytes"), "536870912").unwrap();
        std::fs::write(d.join("memory.memsw.limit_in_bytes"), "536870912").unwrap();
        let cg = MemoryCgroup::V1(d.to_path_buf());
        cg.set(1 << 30).unwrap();
        assert_eq!(read(d, "memory.limit_in_bytes"), "1073741824");
        assert_eq!(read(d, "memory.memsw.limit_in_bytes"), "1073741824");
        cg.set(128 << 20).unwrap();
        assert_eq!(read(d, "memory.limit_in_bytes"), "134217728");
        assert_eq!(read(d, "memory.memsw.limit_in_bytes"), "134217728");
    }

    #[test]
    fn v2_sets_the_limit_and_no_swap() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("memory.swap.max"), "max").unwrap();
        MemoryCgroup::V2(d.to_path_buf()).set(256 << 20).unwrap();
        assert_eq!(read(d, "memory.max"), "268435456");
        assert_eq!(read(d, "memory.swap.max"), "0");
    }
}
