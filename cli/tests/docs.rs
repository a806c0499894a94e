//! The documentation's examples, run as written against `tangram up` with its default
//! security: the Python (nats-py only) and Go (nats.go only) examples of docs/PROTOCOL.md,
//! the tour in README.md (its CLI commands and its Python block) and every Python block of
//! docs/PYTHON.md. A doc that drifts from what the code does fails here.
//!
//! Blocks are taken from the Markdown by language. Only the cluster's address is replaced
//! (the docs say `nats://127.0.0.1:4222`; the test's cluster listens on a free port), and
//! each block runs in a folder whose `.tangram/` is the cluster's state, as the docs assume.
//! A Python block whose first line is `# fragment` is a piece of a larger program and is
//! not run; every other block is.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// One fenced code block: its language, the heading it sits under, and its text.
#[derive(Debug)]
struct Block {
    lang: String,
    heading: String,
    code: String,
}

/// The fenced blocks of a Markdown text, in order.
fn blocks(markdown: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut heading = String::new();
    let mut open: Option<(String, String)> = None;
    for line in markdown.lines() {
        match &mut open {
            Some((lang, code)) => {
                if line.trim_start().starts_with("```") {
                    out.push(Block {
                        lang: std::mem::take(lang),
                        heading: heading.clone(),
                        code: std::mem::take(code),
                    });
                    open = None;
                } else {
                    code.push_str(line);
                    code.push('\n');
                }
            }
            None => {
                if let Some(rest) = line.trim_start().strip_prefix("```") {
                    open = Some((rest.trim().to_string(), String::new()));
                } else if line.starts_with('#') {
                    heading = line.trim_start_matches('#').trim().to_string();
                }
            }
        }
    }
    out
}

mod common;
use common::{free_port, repo};

fn doc(name: &str) -> String {
    std::fs::read_to_string(repo().join(name)).unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A command bounded in time: killed, and the test failed, if it runs past `limit`.
fn run(mut cmd: Command, limit: Duration) -> Output {
    use std::io::Read;
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {cmd:?}: {e}"));
    let (mut so, mut se) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let out_reader = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = so.read_to_end(&mut b);
        b
    });
    let err_reader = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = se.read_to_end(&mut b);
        b
    });
    let deadline = tokio::time::Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if tokio::time::Instant::now() > deadline {
            let _ = child.kill();
            let s = child.wait().unwrap();
            let partial = Output {
                status: s,
                stdout: out_reader.join().unwrap(),
                stderr: err_reader.join().unwrap(),
            };
            panic!(
                "{cmd:?} ran past {limit:?}; it printed:\n{}",
                text(&partial)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Output {
        status,
        stdout: out_reader.join().unwrap(),
        stderr: err_reader.join().unwrap(),
    }
}

/// `tangram up` in `dir` (state in `dir/.tangram`, as the docs assume), torn down on drop.
struct Up {
    dir: tempfile::TempDir,
    url: String,
}

impl Up {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tangram"));
        cmd.current_dir(dir.path())
            .args(["up", "--nats-port", &port.to_string(), "--workers", "1"])
            .args(["--warm-pool", "2", "--gpus", "2", "--services", "judge"])
            .args(["--rollout-jobs", "job1"])
            .arg("--nats-server")
            .arg(repo().join("tools/bin/nats-server"));
        clean_env(&mut cmd);
        let up = Up {
            dir,
            url: format!("nats://127.0.0.1:{port}"),
        };
        let out = run(cmd, Duration::from_secs(240));
        assert!(out.status.success(), "tangram up failed:\n{}", text(&out));
        up
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The block's text with the docs' address replaced by this cluster's.
    fn localise(&self, code: &str) -> String {
        code.replace("nats://127.0.0.1:4222", &self.url)
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tangram"));
        cmd.current_dir(self.dir.path()).arg("down");
        clean_env(&mut cmd);
        let _ = cmd.output();
    }
}

/// The docs' commands find the cluster from `.tangram/`, not from the test's environment.
fn clean_env(cmd: &mut Command) {
    for v in [
        "TANGRAM_STATE_DIR",
        "TANGRAM_NATS_URL",
        "TANGRAM_NKEY_FILE",
        "TANGRAM_TLS_CA",
        "TANGRAM_TLS_CERT",
        "TANGRAM_TLS_KEY",
    ] {
        cmd.env_remove(v);
    }
}

fn python() -> PathBuf {
    let p = repo().join("tools/venv/bin/python");
    assert!(
        p.exists(),
        "{} is missing: run `bash deploy/install-tools.sh`",
        p.display()
    );
    p
}

fn go() -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("go"))
            .find(|p| p.exists())
    });
    found.unwrap_or_else(|| {
        panic!("`go` is not installed: run `bash deploy/install-tools.sh` (Debian's golang-go and golang-github-nats-io-go-nats-dev)")
    })
}

/// Runs one Python block in the cluster's folder; returns what it printed.
fn run_python(up: &Up, name: &str, code: &str) -> String {
    let file = up.path().join(format!("{name}.py"));
    std::fs::write(&file, up.localise(code)).unwrap();
    let mut cmd = Command::new(python());
    cmd.current_dir(up.path()).arg(&file);
    clean_env(&mut cmd);
    let out = run(cmd, Duration::from_secs(300));
    let t = text(&out);
    assert!(out.status.success(), "{name} failed:\n{code}\n---\n{t}");
    t
}

/// Runs one Go block with nats.go from Debian's package (GOPATH mode).
fn run_go(up: &Up, name: &str, code: &str) -> String {
    let src = up.path().join("go").join(name);
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("main.go"), up.localise(code)).unwrap();
    let mut cmd = Command::new(go());
    cmd.current_dir(up.path())
        .arg("run")
        .arg(src.join("main.go"))
        .env("GO111MODULE", "off")
        .env("GOPATH", "/usr/share/gocode")
        .env("GOCACHE", up.path().join("go-cache"));
    clean_env(&mut cmd);
    let out = run(cmd, Duration::from_secs(300));
    let t = text(&out);
    assert!(out.status.success(), "{name} failed:\n{code}\n---\n{t}");
    t
}

/// A result the examples print is never a rejection or an infrastructure error.
fn assert_no_failure(name: &str, out: &str) {
    for bad in ["rejected", "infra_error", "Traceback"] {
        assert!(!out.contains(bad), "{name} printed {bad}:\n{out}");
    }
}

#[test]
fn the_docs_examples_run_as_written_against_tangram_up() {
    let up = &Up::start();

    // docs/PROTOCOL.md: every Python and Go example, each under the credentials it names.
    let protocol = blocks(&doc("docs/PROTOCOL.md"));
    let python_blocks: Vec<&Block> = protocol.iter().filter(|b| b.lang == "python").collect();
    let go_blocks: Vec<&Block> = protocol.iter().filter(|b| b.lang == "go").collect();
    assert!(
        python_blocks.len() >= 2 && go_blocks.len() >= 2,
        "PROTOCOL.md should hold a nats-py and a nats.go example for each role: {} and {}",
        python_blocks.len(),
        go_blocks.len()
    );
    for (i, b) in python_blocks.iter().enumerate() {
        let out = run_python(up, &format!("protocol-{i}"), &b.code);
        assert_no_failure(&b.heading, &out);
        assert!(out.contains("completed"), "{}:\n{out}", b.heading);
    }
    for (i, b) in go_blocks.iter().enumerate() {
        let out = run_go(up, &format!("protocol-{i}"), &b.code);
        assert_no_failure(&b.heading, &out);
        assert!(out.contains("completed"), "{}:\n{out}", b.heading);
    }

    // README.md's tour: the CLI commands, then the Python block.
    let readme = doc("README.md");
    let tour: Vec<Block> = blocks(&readme)
        .into_iter()
        .filter(|b| b.heading == "A five-minute tour")
        .collect();
    let cli_blocks: Vec<&Block> = tour
        .iter()
        .filter(|b| b.lang == "sh" && runs_here(&b.code))
        .collect();
    assert!(
        cli_blocks.len() >= 3,
        "the tour's submit, status and cordon blocks: {tour:#?}"
    );
    // `tangram submit file my-action.json` takes an action the reader wrote.
    std::fs::write(
        up.path().join("my-action.json"),
        r#"{"trajectory": "t2", "spec": {"kind": "reward", "service": "judge", "inputs": ["print(1)"]}}"#,
    )
    .unwrap();
    for b in &cli_blocks {
        let script = format!(
            "set -euo pipefail\ntangram() {{ '{}' \"$@\"; }}\n{}",
            env!("CARGO_BIN_EXE_tangram"),
            up.localise(&b.code)
        );
        let mut cmd = Command::new("bash");
        cmd.current_dir(up.path()).arg("-c").arg(&script);
        clean_env(&mut cmd);
        let out = run(cmd, Duration::from_secs(300));
        let t = text(&out);
        assert!(
            out.status.success(),
            "README block failed:\n{}\n---\n{t}",
            b.code
        );
        assert_no_failure("README", &t);
    }
    let tour_python: Vec<&Block> = tour.iter().filter(|b| b.lang == "python").collect();
    assert_eq!(tour_python.len(), 1, "{tour:#?}");
    let out = run_python(up, "readme", &tour_python[0].code);
    assert_no_failure("README python", &out);
    assert!(out.contains("Outcome.COMPLETED 0 1"), "{out}");

    // docs/PYTHON.md: every block that is a whole program.
    let python_doc = blocks(&doc("docs/PYTHON.md"));
    let programs: Vec<&Block> = python_doc
        .iter()
        .filter(|b| b.lang == "python" && !b.code.trim_start().starts_with("# fragment"))
        .collect();
    assert!(!programs.is_empty(), "PYTHON.md has no runnable example");
    for (i, b) in programs.iter().enumerate() {
        let out = run_python(up, &format!("python-doc-{i}"), &b.code);
        assert_no_failure(&b.heading, &out);
    }
}

/// A tour block of CLI commands that run against the cluster (not the ones that start a
/// cluster or a fleet, build, or name placeholders the reader fills in).
fn runs_here(code: &str) -> bool {
    code.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .all(|l| l.starts_with("tangram ") && !l.contains('<') && !l.contains("replay"))
}

#[test]
fn blocks_are_read_with_their_language_and_heading() {
    let md = "# A\n```sh\necho 1\n```\n## B c\ntext\n```python\nprint(1)\nprint(2)\n```\n";
    let b = blocks(md);
    assert_eq!(b.len(), 2);
    assert_eq!((b[0].lang.as_str(), b[0].heading.as_str()), ("sh", "A"));
    assert_eq!(b[1].heading, "B c");
    assert_eq!(b[1].code, "print(1)\nprint(2)\n");
    assert!(runs_here(
        "tangram status\n# a comment\ntangram status --json\n"
    ));
    assert!(!runs_here("tangram inspect <action-id>\n"));
    assert!(!runs_here("bash deploy/local-cluster.sh --keep\n"));
}
