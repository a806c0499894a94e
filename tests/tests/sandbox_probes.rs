//! Sandbox probes (S1-S13 of the security checklist), run as model-generated code would run:
//! through the scheduler and a real worker into a real Docker sandbox. Each probe states what
//! an escape would look like and asserts it did not happen. Every probe runs twice: under
//! Docker's default runtime (runc) and under gVisor (`[sandbox] runtime = "runsc"`, on the
//! Docker daemon `deploy/install-runsc.sh` configured).

use std::time::Duration;
use tangram_shared::{Action, ActionResult, ActionSpec, Outcome};
use tangram_tests::build::{exec, open};
use tangram_tests::gvisor::Runtime;
use tangram_tests::Client;
use tokio::time::Instant;

const T: Duration = Duration::from_secs(60);

/// Runs the probe script and returns its findings as JSON.
const PROBE: &str = r#"
import ctypes, errno, json, os, resource, socket, subprocess
r = {}
def connect(host, port):
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect((host, port))
        return "connected"
    except OSError as e:
        return "refused:" + type(e).__name__
    finally:
        s.close()
r["net_nats"] = connect("127.0.0.1", 4222)
r["net_metadata"] = connect("169.254.169.254", 80)
r["net_public"] = connect("1.1.1.1", 53)
try:
    socket.getaddrinfo("example.com", 80)
    r["dns"] = "resolved"
except OSError:
    r["dns"] = "failed"
# gVisor without a network stack (runtime argument --network=none) has no /sys/class/net.
r["interfaces"] = sorted(os.listdir("/sys/class/net")) if os.path.exists("/sys/class/net") else None
def write(path):
    try:
        with open(path, "w") as f:
            f.write("x")
        return "written"
    except OSError as e:
        return errno.errorcode[e.errno]
r["write_root"] = write("/probe")
r["write_etc"] = write("/etc/probe")
r["write_usr"] = write("/usr/probe")
r["root_ro"] = any(l.split()[1] == "/" and "ro" in l.split()[3].split(",")
                   for l in open("/proc/mounts"))
r["docker_sock"] = any(os.path.exists(p) for p in
                       ("/var/run/docker.sock", "/run/docker.sock",
                        "/run/containerd/containerd.sock"))
status = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
# gVisor's /proc has no CapAmb line: the sets it shows.
r["caps"] = {k: int(status[k].strip(), 16)
             for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb") if k in status}
PR_GET_NO_NEW_PRIVS = 39  # prctl: gVisor's /proc/self/status has no NoNewPrivs line
r["no_new_privs"] = ctypes.CDLL(None).prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)
r["uid"] = os.getuid()
r["core_limit"] = list(resource.getrlimit(resource.RLIMIT_CORE))
def fill(path, mb):
    try:
        with open(path, "wb") as f:
            for _ in range(mb):
                f.write(b"\0" * (1 << 20))
                f.flush()
        return "fit"
    except OSError as e:
        return errno.errorcode[e.errno]
    finally:
        try:
            os.remove(path)
        except OSError:
            pass
r["tmp_fill_64m"] = fill("/tmp/fill", 64)
r["work_fill_128m"] = fill("/work/fill", 128)
def refused(argv):
    try:
        p = subprocess.run(argv, capture_output=True, timeout=10)
        return p.returncode != 0
    except OSError:
        return True
r["unshare_refused"] = refused(["unshare", "-r", "true"])
r["mount_refused"] = refused(["mount", "-t", "tmpfs", "none", "/work"])
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000
r["unshare_syscall"] = libc.unshare(CLONE_NEWUSER | CLONE_NEWNS)
import platform
SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}.get(platform.machine())
KEYCTL_JOIN_SESSION_KEYRING = 1
r["keyctl"] = libc.syscall(SYS_KEYCTL, KEYCTL_JOIN_SESSION_KEYRING, None) if SYS_KEYCTL else -1
# Every process this one can see (and so could ptrace) is of its own sandbox: the keeper,
# its sleep, and this probe with its children.
r["visible_pids"] = len([d for d in os.listdir("/proc") if d.isdigit()])
r["host_marker_visible"] = os.path.exists(os.environ["HOST_MARKER"])
print(json.dumps(r))
"#;

async fn run(c: &Client, a: Action) -> anyhow::Result<ActionResult> {
    c.run(&a, T).await
}

/// After a command that ended its sandbox: the trajectory's next command is told
/// `sandbox_lost` (an infrastructure fact the worker saw), and a new open succeeds.
async fn reopened(
    c: &Client,
    worker: &str,
    job: &str,
    traj: &str,
    after: &str,
) -> anyhow::Result<()> {
    reopened_with(c, worker, job, traj, after, 512).await
}

async fn reopened_with(
    c: &Client,
    worker: &str,
    job: &str,
    traj: &str,
    after: &str,
    memory_mb: u64,
) -> anyhow::Result<()> {
    let r = run(
        c,
        exec(&format!("{after}-lost"), job, traj, &["true"], 1, 1),
    )
    .await?;
    assert!(
        matches!(
            r.outcome,
            Outcome::InfraError {
                code: tangram_shared::InfraCode::SandboxLost,
                ..
            }
        ),
        "{after}: the sandbox should be lost: {r:?}"
    );
    // Forgotten on both sides (the scheduler reads the result beside us): its memory free.
    c.wait_for_status(T, "the lost sandbox's memory freed", |s| {
        s.workers
            .iter()
            .any(|w| w.id == worker && w.mem_used_mb == 0)
    })
    .await?;
    let mut o = open(&format!("{after}-reopen"), job, traj);
    if let ActionSpec::SandboxOpen(s) = &mut o.spec {
        s.memory_mb = memory_mb;
    }
    completed(&run(c, o).await?);
    Ok(())
}

fn completed(r: &ActionResult) -> i32 {
    match r.outcome {
        Outcome::Completed { exit_code } => exit_code,
        ref other => panic!("expected completed, got {other:?}: {r:?}"),
    }
}

async fn sandbox_probes_find_no_network_no_privilege_no_host_and_bounded_disk(
    rt: Runtime,
) -> anyhow::Result<()> {
    let cluster = rt.cluster("probe-a").await?;
    let c = cluster.client("probes").await?;
    c.wait_for_workers(&["probe-a"], T).await?;
    completed(&run(&c, open("o1", "probes", "t1")).await?);

    // A file on the host, at a path the sandbox would see if it shared the host's files.
    let marker = tempfile::Builder::new()
        .prefix("tangram-host-marker")
        .tempfile_in("/tmp")?;
    let mut a = exec("probe", "probes", "t1", &["python3", "-c", PROBE], 1, 1);
    if let ActionSpec::SandboxExec(e) = &mut a.spec {
        e.env.insert(
            "HOST_MARKER".into(),
            marker.path().to_string_lossy().into_owned(),
        );
    }
    let r = run(&c, a).await?;
    assert_eq!(completed(&r), 0, "{r:?}");
    let p: serde_json::Value = serde_json::from_str(r.stdout.trim())?;
    let s = |k: &str| p[k].as_str().unwrap_or_default().to_string();

    // S1: no network at all, the metadata address included.
    for k in ["net_nats", "net_metadata", "net_public"] {
        assert!(s(k).starts_with("refused"), "{k}: {p}");
    }
    assert_eq!(s("dns"), "failed", "{p}");
    // runc: a network namespace with loopback only; gVisor: no network stack at all.
    let interfaces = match rt {
        Runtime::Runc => serde_json::json!(["lo"]),
        Runtime::Gvisor => serde_json::Value::Null,
    };
    assert_eq!(p["interfaces"], interfaces, "{p}");
    // S2: a read-only root, seen in /proc/mounts and by writing; no runtime socket; no host.
    assert_eq!(p["root_ro"], true, "{p}");
    for k in ["write_root", "write_etc", "write_usr"] {
        assert!(
            matches!(s(k).as_str(), "EROFS" | "EACCES"),
            "{k} should fail: {p}"
        );
    }
    assert_eq!(p["docker_sock"], false, "{p}");
    assert_eq!(p["host_marker_visible"], false, "{p}");
    // S8: no capabilities in any set, no new privileges, not root, no unshare, mount or
    // keyctl; ptrace reaches nothing but the sandbox's own processes, the only ones it sees.
    let caps = p["caps"].as_object().expect("caps");
    for k in ["CapInh", "CapPrm", "CapEff", "CapBnd"] {
        assert!(caps.contains_key(k), "{k} is not in /proc/self/status: {p}");
    }
    for (k, v) in caps {
        assert_eq!(v, 0, "{k} is not zero: {p}");
    }
    assert_eq!(p["no_new_privs"], 1, "{p}");
    assert_ne!(p["uid"], 0, "{p}");
    match rt {
        // Docker's seccomp profile refuses them.
        Runtime::Runc => {
            assert_eq!(p["unshare_refused"], true, "{p}");
            assert_eq!(p["unshare_syscall"], -1, "{p}");
            assert_eq!(p["keyctl"], -1, "{p}");
        }
        // gVisor's kernel implements user namespaces and keyrings itself, so these calls
        // never reach the host's; and it applies the seccomp profile (`--oci-seccomp`) to
        // the sandbox's init only, not to processes started by `docker exec`, so they
        // succeed there (measured; SECURITY.md says so).
        Runtime::Gvisor => {
            assert_eq!(p["unshare_refused"], false, "{p}");
            assert_eq!(p["unshare_syscall"], 0, "{p}");
            assert!(p["keyctl"].as_i64().unwrap_or(-1) > 0, "{p}");
        }
    }
    assert_eq!(p["mount_refused"], true, "{p}");
    assert!(p["visible_pids"].as_u64().unwrap_or(99) <= 6, "{p}");
    // Core dumps off.
    assert_eq!(p["core_limit"], serde_json::json!([0, 0]), "{p}");
    // S9: /tmp (16 MiB) and /work (workdir_mb, 64 MiB by default) are bounded.
    assert_eq!(s("tmp_fill_64m"), "ENOSPC", "{p}");
    assert_eq!(s("work_fill_128m"), "ENOSPC", "{p}");
    cluster.shutdown().await
}

async fn a_fork_bomb_is_killed_at_the_timeout_and_the_sandbox_runs_commands_after(
    rt: Runtime,
) -> anyhow::Result<()> {
    let cluster = rt.cluster("bomb-a").await?;
    let c = cluster.client("bombs").await?;
    c.wait_for_workers(&["bomb-a"], T).await?;
    completed(&run(&c, open("o1", "bombs", "t1")).await?);

    // Python forks until the pids limit, and keeps trying; the shell's bomb runs beside it.
    let bomb =
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n";
    for (id, argv) in [
        ("py-bomb", vec!["python3", "-c", bomb]),
        (
            "sh-bomb",
            vec!["bash", "-c", "b(){ b | b & }; b; sleep 600"],
        ),
    ] {
        let mut a = exec(id, "bombs", "t1", &argv, 1, 1);
        let t = Instant::now();
        match rt {
            Runtime::Runc => {
                a.timeout_ms = 3_000;
                let r = run(&c, a).await?;
                assert_eq!(r.outcome, Outcome::TimedOut, "{id}: {r:?}");
                // Killed at the timeout: the result is back within a few seconds of it.
                assert!(
                    t.elapsed() < Duration::from_secs(15),
                    "{id}: took {:?}",
                    t.elapsed()
                );
            }
            Runtime::Gvisor => {
                // gVisor's processes are not host processes, so no pids limit holds them
                // (the host's would count gVisor's own threads and end its kernel: seen,
                // exit 2 in 5 s); the sandbox's memory does. The bomb fills it, the sandbox
                // ends, the command is out of memory (the code's doing, not the
                // infrastructure's), and the trajectory opens a new sandbox. The timeout is
                // long so that what ends the bomb is its memory (3 s and 15 s measured).
                a.timeout_ms = 120_000;
                let r = c.run(&a, Duration::from_secs(150)).await?;
                assert_eq!(
                    r.outcome,
                    Outcome::OutOfMemory { exit_code: 137 },
                    "{id}: {r:?}"
                );
                reopened(&c, "bomb-a", "bombs", "t1", id).await?;
            }
        }
        // The sandbox is usable after it, with nothing of the bomb left.
        let r = run(
            &c,
            exec(
                &format!("{id}-after"),
                "bombs",
                "t1",
                &["sh", "-c", "echo alive; ps -e -o comm= | wc -l"],
                1,
                1,
            ),
        )
        .await?;
        assert_eq!(completed(&r), 0, "{id}: {r:?}");
        let mut lines = r.stdout.lines();
        assert_eq!(lines.next(), Some("alive"), "{r:?}");
        let procs: usize = lines.next().unwrap_or("0").trim().parse()?;
        // The keeper, its sleep, and this command's sh, ps and wc.
        assert!(procs <= 6, "{id}: {procs} processes left: {r:?}");
    }
    cluster.shutdown().await
}

async fn a_memory_bomb_is_reported_as_out_of_memory(rt: Runtime) -> anyhow::Result<()> {
    let cluster = rt.cluster("oom-a").await?;
    let c = cluster.client("ooms").await?;
    c.wait_for_workers(&["oom-a"], T).await?;
    let mut o = open("o1", "ooms", "t1");
    if let ActionSpec::SandboxOpen(s) = &mut o.spec {
        s.memory_mb = 128;
    }
    completed(&run(&c, o).await?);
    // Touches 512 MiB, four times the limit.
    let r = run(
        &c,
        exec(
            "bomb",
            "ooms",
            "t1",
            &["python3", "-c", "x = b'a' * (512 << 20); print(len(x))"],
            1,
            1,
        ),
    )
    .await?;
    assert_eq!(r.outcome, Outcome::OutOfMemory { exit_code: 137 }, "{r:?}");
    if rt == Runtime::Gvisor {
        // Under gVisor the host's out-of-memory killer ends the whole sandbox (gVisor's
        // kernel holds every process's memory): the command stays out of memory, and the
        // trajectory opens a new sandbox, with the open's memory.
        reopened_with(&c, "oom-a", "ooms", "t1", "bomb", 128).await?;
    }
    // A command that stays within the limit still completes in the (runc: same) sandbox.
    let r = run(
        &c,
        exec(
            "small",
            "ooms",
            "t1",
            &["python3", "-c", "x = b'a' * (16 << 20); print(len(x))"],
            1,
            1,
        ),
    )
    .await?;
    assert_eq!(completed(&r), 0, "{r:?}");
    assert_eq!(r.stdout.trim(), (16 << 20).to_string());
    cluster.shutdown().await
}

async fn another_sandboxs_processes_and_files_are_invisible(rt: Runtime) -> anyhow::Result<()> {
    let cluster = rt.cluster("iso-a").await?;
    let c = cluster.client("iso").await?;
    c.wait_for_workers(&["iso-a"], T).await?;
    completed(&run(&c, open("o1", "iso", "t1")).await?);
    completed(&run(&c, open("o2", "iso", "t2")).await?);
    // t1 leaves a process and a file behind.
    let r = run(
        &c,
        exec(
            "leave",
            "iso",
            "t1",
            &[
                "sh",
                "-c",
                "echo secret > /work/secret; nohup sleep 4242 >/dev/null 2>&1 & echo started",
            ],
            1,
            1,
        ),
    )
    .await?;
    assert_eq!(completed(&r), 0, "{r:?}");
    // t1 sees its own; t2, on the same worker, sees neither.
    let look = "ps -e -o args= | grep -c '^sleep 4242' || true; ls /work";
    let r1 = run(&c, exec("look1", "iso", "t1", &["sh", "-c", look], 1, 1)).await?;
    let r2 = run(&c, exec("look2", "iso", "t2", &["sh", "-c", look], 1, 1)).await?;
    assert_eq!(
        r1.placement.as_ref().map(|p| &p.worker),
        r2.placement.as_ref().map(|p| &p.worker)
    );
    assert_eq!(r1.stdout, "1\nsecret\n", "{r1:?}");
    assert_eq!(r2.stdout, "0\n", "{r2:?}");
    cluster.shutdown().await
}

/// Each probe above as two tests: under runc and under gVisor.
macro_rules! under_both_runtimes {
    ($($probe:ident),* $(,)?) => {
        mod runc {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $probe() -> anyhow::Result<()> {
                super::$probe(super::Runtime::Runc).await
            })*
        }
        mod gvisor {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $probe() -> anyhow::Result<()> {
                super::$probe(super::Runtime::Gvisor).await
            })*
        }
    };
}

under_both_runtimes!(
    sandbox_probes_find_no_network_no_privilege_no_host_and_bounded_disk,
    a_fork_bomb_is_killed_at_the_timeout_and_the_sandbox_runs_commands_after,
    a_memory_bomb_is_reported_as_out_of_memory,
    another_sandboxs_processes_and_files_are_invisible,
);
