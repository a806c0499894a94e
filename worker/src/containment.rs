//! Acting on a sandbox's processes from outside it, through the cgroup of its init process:
//! killing every process but init, and reading the out-of-memory kill counter.
//!
//! Killing from inside (`kill -9 -1` through `docker exec`) needs a new process in the
//! sandbox, and a fork bomb that used up the pids limit leaves no room for one. From the host
//! the kill needs no process in the sandbox: the cgroup is frozen, so nothing forks while the
//! list is read, every process but init gets SIGKILL, and the cgroup is thawed (frozen
//! processes die as they thaw). cgroup v1 (`freezer`, `memory` hierarchies) and v2 (one
//! directory with `cgroup.freeze` and `memory.events`) are both handled.

use crate::cgroup::ProcCgroups;
use rustix::process::{kill_process, Pid, Signal};
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often, and how many times, a freeze is checked before the kill goes ahead anyway
/// (about half a second in all).
const FREEZE_POLL: Duration = Duration::from_millis(2);
const FREEZE_POLLS: u32 = 250;

/// The cgroup directories of one sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Containment {
    /// Host PID of the sandbox's init, which the kill spares.
    init: i64,
    /// Where `cgroup.procs` lists the sandbox's processes.
    procs: PathBuf,
    /// How to freeze it.
    freezer: Freezer,
    /// Where the out-of-memory kill counter is, and in which file.
    oom: Option<(PathBuf, &'static str)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Freezer {
    /// v1: `freezer.state` takes `FROZEN` and `THAWED`.
    V1(PathBuf),
    /// v2: `cgroup.freeze` takes `1` and `0`.
    V2(PathBuf),
    /// No freezer: the kill is a single pass.
    None,
}

impl Containment {
    /// Finds the cgroups of the process `pid` (a sandbox's init).
    pub fn for_pid(pid: i64) -> io::Result<Self> {
        Self::from_dirs(ProcCgroups::of_pid(pid)?, pid)
    }

    /// Parses `/proc/<pid>/cgroup` text against a cgroup mount root.
    pub fn from_proc(text: &str, root: &Path, pid: i64) -> io::Result<Self> {
        Self::from_dirs(ProcCgroups::parse(text, root), pid)
    }

    fn from_dirs(dirs: ProcCgroups, pid: i64) -> io::Result<Self> {
        let (freezer, memory, pids) = (dirs.v1("freezer"), dirs.v1("memory"), dirs.v1("pids"));
        let unified = dirs.unified;
        // v1 when any v1 controller we use is mounted; the unified line of a hybrid host
        // holds no controllers.
        if freezer.is_some() || memory.is_some() || pids.is_some() {
            let procs = pids
                .clone()
                .or_else(|| freezer.clone())
                .or_else(|| memory.clone())
                .unwrap_or_default();
            return Ok(Containment {
                init: pid,
                procs,
                freezer: freezer.map_or(Freezer::None, Freezer::V1),
                oom: memory.map(|m| (m, "memory.oom_control")),
            });
        }
        match unified {
            Some(dir) => Ok(Containment {
                init: pid,
                procs: dir.clone(),
                freezer: Freezer::V2(dir.clone()),
                oom: Some((dir, "memory.events")),
            }),
            None => Err(io::Error::new(
                io::ErrorKind::NotFound,
                "no cgroup found for the sandbox's init process",
            )),
        }
    }

    /// Host PIDs of every process in the sandbox, init included.
    pub fn processes(&self) -> io::Result<Vec<i64>> {
        let text = std::fs::read_to_string(self.procs.join("cgroup.procs"))?;
        Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
    }

    /// How many processes of the sandbox the kernel's out-of-memory killer has killed since
    /// it started; `None` when the counter cannot be read.
    pub fn oom_kills(&self) -> Option<u64> {
        let (dir, file) = self.oom.as_ref()?;
        let text = std::fs::read_to_string(dir.join(file)).ok()?;
        oom_kill_count(&text)
    }

    /// Kills every process in the sandbox but its init. Returns how many were signalled.
    pub fn kill_all_but_init(&self) -> io::Result<usize> {
        self.freeze(true);
        let killed = self.kill_pass();
        // Thawing lets the killed processes die; it is done whatever the kill pass did.
        self.freeze(false);
        killed
    }

    fn kill_pass(&self) -> io::Result<usize> {
        let mut killed = 0;
        for pid in self.processes()? {
            if pid == self.init {
                continue;
            }
            let Some(p) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
                continue;
            };
            // A process that exited since the list was read is not an error.
            if kill_process(p, Signal::KILL).is_ok() {
                killed += 1;
            }
        }
        Ok(killed)
    }

    fn freeze(&self, frozen: bool) {
        let (file, value) = match &self.freezer {
            Freezer::V1(dir) => (
                dir.join("freezer.state"),
                if frozen { "FROZEN" } else { "THAWED" },
            ),
            Freezer::V2(dir) => (dir.join("cgroup.freeze"), if frozen { "1" } else { "0" }),
            Freezer::None => return,
        };
        if std::fs::write(&file, value).is_err() || !frozen {
            return;
        }
        // v1 passes through FREEZING; v2 reports `frozen 1` in cgroup.events. Wait a bounded
        // while for it to settle: a kill pass in a half-frozen cgroup is still correct, only
        // less sure to catch a process forked during it.
        let events = match &self.freezer {
            Freezer::V2(dir) => Some(dir.join("cgroup.events")),
            _ => None,
        };
        for _ in 0..FREEZE_POLLS {
            let settled = match &events {
                Some(ev) => std::fs::read_to_string(ev)
                    .map(|t| t.lines().any(|l| l.trim() == "frozen 1"))
                    .unwrap_or(true),
                None => std::fs::read_to_string(&file)
                    .map(|t| t.trim() == value)
                    .unwrap_or(true),
            };
            if settled {
                return;
            }
            std::thread::sleep(FREEZE_POLL);
        }
    }
}

/// The `oom_kill` count in `memory.oom_control` (v1) or `memory.events` (v2).
pub fn oom_kill_count(text: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (key, value) = l.trim().split_once(' ')?;
        (key == "oom_kill").then(|| value.trim().parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_v1_and_v2_directories() {
        let root = Path::new("/sys/fs/cgroup");
        let v1 = "12:pids:/docker/abc\n8:freezer:/docker/abc\n4:memory:/docker/abc\n0::/\n";
        let c = Containment::from_proc(v1, root, 7).unwrap();
        assert_eq!(c.procs, PathBuf::from("/sys/fs/cgroup/pids/docker/abc"));
        assert_eq!(
            c.freezer,
            Freezer::V1("/sys/fs/cgroup/freezer/docker/abc".into())
        );
        assert_eq!(
            c.oom,
            Some((
                "/sys/fs/cgroup/memory/docker/abc".into(),
                "memory.oom_control"
            ))
        );
        let v2 = "0::/system.slice/docker-abc.scope\n";
        let c = Containment::from_proc(v2, root, 7).unwrap();
        let dir = PathBuf::from("/sys/fs/cgroup/system.slice/docker-abc.scope");
        assert_eq!(c.freezer, Freezer::V2(dir.clone()));
        assert_eq!(c.oom, Some((dir, "memory.events")));
        assert!(Containment::from_proc("", root, 7).is_err());
    }

    #[test]
    fn reads_the_oom_kill_counter_of_either_version() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        let v2 = "low 0\nhigh 0\nmax 9\noom 2\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(oom_kill_count(v1), Some(3));
        assert_eq!(oom_kill_count(v2), Some(2));
        assert_eq!(oom_kill_count("oom_kill_disable 0\n"), None);
    }

    #[test]
    fn the_kill_spares_init_and_thaws_what_it_froze() {
        let dir = tempfile::tempdir().unwrap();
        // A fake v2 cgroup listing only init and a pid that cannot exist.
        std::fs::write(dir.path().join("cgroup.procs"), "7\n2147483000\n").unwrap();
        std::fs::write(dir.path().join("cgroup.events"), "frozen 1\n").unwrap();
        let c = Containment {
            init: 7,
            procs: dir.path().into(),
            freezer: Freezer::V2(dir.path().into()),
            oom: None,
        };
        assert_eq!(c.kill_all_but_init().unwrap(), 0);
        assert_eq!(
            std::fs::read_to_string(dir.path().join("cgroup.freeze")).unwrap(),
            "0"
        );
    }
}
