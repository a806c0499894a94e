//! Running in a sandbox: files written under `/work` (a tar archive piped into `tar -x`, or
//! unpacked by the command's own wrapper), a command run through `docker exec` with its
//! limits, and the processes of a sandbox killed.

use super::*;
use bollard::query_parameters::WaitContainerOptions;

/// How long a kill from inside may take.
const KILL_WAIT: Duration = Duration::from_secs(10);

/// `runsc exec`'s exit code when it could not run or wait for the process.
const RUNSC_EXEC_FAILED: i64 = 128;

/// True when host process `pid` exists and is not a zombie.
fn process_alive(pid: i64) -> bool {
    if pid <= 0 {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command's closing parenthesis.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Exit code of [`FILES_WRAPPER`] when the files could not be written.
pub const FILES_FAILED_EXIT: i64 = 125;
/// What [`FILES_WRAPPER`] prints on stderr when the files could not be written, before the
/// exec's token (see [`files_failed`]).
pub const FILES_FAILED_MARK: &str = "tangram: writing files into /work failed";

/// Runs a command after unpacking the tar archive on its stdin into `/work`, in the same
/// `docker exec` (one round trip to the daemon instead of two). Used when the action has files
/// but no stdin of its own; the command then gets an empty stdin. The stdin starts with a line
/// holding a token the worker made for this exec (see [`files_stdin`]), which a failure
/// names: the command, which could print the mark and exit 125 itself, never sees the token
/// (it is read from stdin into an unexported shell variable, in no argument or environment,
/// and the shell is replaced by the command), so only the wrapper's own failure is taken for
/// an infrastructure error.
pub const FILES_WRAPPER: &str = "read -r t; tar -x -m --no-same-owner -C /work -f - || { echo \"tangram: writing files into /work failed [$t]\" >&2; exit 125; }; exec \"$@\" </dev/null";

/// `argv` wrapped by [`FILES_WRAPPER`].
pub fn with_files_wrapper(argv: &[String]) -> Vec<String> {
    let mut out = vec![
        "/bin/sh".to_string(),
        "-c".to_string(),
        FILES_WRAPPER.to_string(),
        "tangram-exec".to_string(),
    ];
    out.extend(argv.iter().cloned());
    out
}

/// A fresh token for one exec's [`FILES_WRAPPER`]: 128 bits from the kernel's generator.
pub fn exec_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// What [`FILES_WRAPPER`] reads on its stdin: the token's line, then the archive.
pub fn files_stdin(token: &str, archive: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(token.len() + 1 + archive.len());
    out.extend_from_slice(token.as_bytes());
    out.push(b'\n');
    out.extend_from_slice(archive);
    out
}

/// Whether an exec's output says its [`FILES_WRAPPER`] (with `token`) failed to write the
/// files: its exit code and the mark naming the token.
pub fn files_failed(exit_code: Option<i64>, stderr: &[u8], token: &str) -> bool {
    exit_code == Some(FILES_FAILED_EXIT)
        && String::from_utf8_lossy(stderr).contains(&format!("{FILES_FAILED_MARK} [{token}]"))
}

/// A tar archive of text files, by relative path.
pub fn files_archive(files: &BTreeMap<String, String>) -> Result<Vec<u8>, std::io::Error> {
    let mut archive = tar::Builder::new(Vec::new());
    for (path, text) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(text.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(0);
        header.set_cksum();
        archive.append_data(&mut header, path, text.as_bytes())?;
    }
    archive.into_inner()
}

impl DockerSandboxes {
    /// Writes text files under `/work` by piping a tar archive into `tar -x`.
    pub async fn write_files(
        &self,
        id: &str,
        files: &BTreeMap<String, String>,
    ) -> Result<(), DockerError> {
        if files.is_empty() {
            return Ok(());
        }
        let bytes = files_archive(files)?;
        let argv = [
            "tar",
            "-x",
            "-m",
            "--no-same-owner",
            "-C",
            "/work",
            "-f",
            "-",
        ]
        .map(String::from);
        let out = self
            .run(
                id,
                &argv,
                &[],
                Some(&bytes),
                RunLimits {
                    timeout: Duration::from_secs(30),
                    cap: 64 * 1024,
                    containment: None,
                },
            )
            .await?;
        if out.sandbox_lost {
            // Under gVisor the sandbox ended while the files were written.
            return Err(DockerError::Gone(id.to_string()));
        }
        match out.exit_code {
            Some(0) => Ok(()),
            code => Err(DockerError::Io(std::io::Error::other(format!(
                "writing files failed (exit {code:?}): {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )))),
        }
    }

    /// Runs a command, feeding `stdin`, capturing output up to `limits.cap` bytes per stream,
    /// and killing every process in the sandbox if `limits.timeout` passes.
    pub async fn run(
        &self,
        id: &str,
        argv: &[String],
        env: &[String],
        stdin: Option<&[u8]>,
        limits: RunLimits<'_>,
    ) -> Result<ExecOutput, DockerError> {
        let RunLimits {
            timeout,
            cap,
            containment,
        } = limits;
        let exec = self
            .docker
            .create_exec(
                id,
                CreateExecOptions {
                    attach_stdin: Some(stdin.is_some()),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    cmd: Some(argv.to_vec()),
                    env: Some(env.to_vec()),
                    working_dir: Some("/work".to_string()),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| DockerError::from_api(e, id))?;
        let deadline = Instant::now() + timeout;
        let started = self
            .docker
            .start_exec(&exec.id, None::<StartExecOptions>)
            .await?;
        let StartExecResults::Attached { mut output, input } = started else {
            return Err(DockerError::Io(std::io::Error::other(
                "exec started detached",
            )));
        };
        let mut out = ExecOutput::default();
        // Stdin is fed alongside reading output, so a command that prints before it reads
        // cannot deadlock us; the feed ends with the exec.
        let mut fed = stdin.is_none();
        let input = match stdin {
            Some(_) => Some(input),
            None => {
                drop(input);
                None
            }
        };
        let feed = async move {
            if let (Some(data), Some(mut input)) = (stdin, input) {
                let _ = input.write_all(data).await;
                let _ = input.shutdown().await;
            }
        };
        let mut feed = std::pin::pin!(feed);
        // Under gVisor a command that runs the sandbox out of memory takes the whole sandbox
        // with it (the host's out-of-memory killer ends gVisor's kernel), and the exec's
        // stream can then stay open for minutes: the container's end is watched beside it.
        let mut stopped = std::pin::pin!(self.stopped(id, self.config.gvisor()));
        loop {
            let next = tokio::select! {
                _ = &mut feed, if !fed => {
                    fed = true;
                    continue;
                }
                oom = &mut stopped => {
                    if !oom {
                        return Err(DockerError::Gone(id.to_string()));
                    }
                    out.oom_killed = true;
                    out.sandbox_lost = true;
                    out.exit_code = Some(137);
                    return Ok(out);
                }
                n = tokio::time::timeout_at(deadline, output.next()) => n,
            };
            match next {
                Ok(Some(Ok(chunk))) => {
                    let (buf, bytes) = match chunk {
                        LogOutput::StdOut { message } | LogOutput::Console { message } => {
                            (&mut out.stdout, message)
                        }
                        LogOutput::StdErr { message } => (&mut out.stderr, message),
                        LogOutput::StdIn { .. } => continue,
                    };
                    let room = cap.saturating_sub(buf.len());
                    if bytes.len() > room {
                        out.truncated = true;
                    }
                    buf.extend_from_slice(&bytes[..bytes.len().min(room)]);
                }
                Ok(Some(Err(e))) => return Err(e.into()),
                Ok(None) => break,
                Err(_) => {
                    out.timed_out = true;
                    self.kill_tree(id, containment).await;
                    // Drain what is left, briefly: the streams close once the tree is dead.
                    let _ = tokio::time::timeout(Duration::from_secs(2), async {
                        while output.next().await.is_some() {}
                    })
                    .await;
                    break;
                }
            }
        }
        if !out.timed_out {
            // The stream can close a moment before Docker records the exit code.
            for _ in 0..50 {
                let info = self.docker.inspect_exec(&exec.id).await?;
                if info.running != Some(true) {
                    out.exit_code = info.exit_code;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        // Under gVisor an exec whose sandbox died under it ends with runsc's own failure
        // (exit 128, "waiting on pid ...: EOF"), often before Docker records the container's
        // end: a dead sandbox process tells it apart from a command that exited 128.
        if self.config.gvisor() && out.exit_code == Some(RUNSC_EXEC_FAILED) {
            if let Some(oom) = self.ended(id).await {
                if !oom {
                    return Err(DockerError::Gone(id.to_string()));
                }
                out.oom_killed = true;
                out.sandbox_lost = true;
                out.exit_code = Some(137);
            }
        }
        Ok(out)
    }

    /// Whether the sandbox has ended (`Some`, with whether out of memory ended it) or still
    /// runs (`None`): its host process (under gVisor, gVisor's kernel) gone or a zombie
    /// means ended, and then Docker's record is waited for, at most [`KILL_WAIT`].
    async fn ended(&self, id: &str) -> Option<bool> {
        let info = self
            .docker
            .inspect_container(id, None::<InspectContainerOptions>)
            .await;
        let state = match info {
            Ok(info) => info.state.unwrap_or_default(),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => return Some(false),
            Err(_) => return None,
        };
        // runsc's exec can fail a moment before the kernel has ended the sandbox process:
        // looked at a few times over 100 ms before the exit code is believed.
        let pid = state.pid.unwrap_or(0);
        if state.running == Some(true) {
            let mut alive = process_alive(pid);
            for _ in 0..5 {
                if !alive {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                alive = process_alive(pid);
            }
            if alive {
                return None;
            }
        }
        match tokio::time::timeout(KILL_WAIT, self.stopped(id, true)).await {
            Ok(oom) => Some(oom),
            Err(_) => Some(false),
        }
    }

    /// Resolves once the container has stopped, with whether the out-of-memory killer ended
    /// it; never, unless `watch`.
    async fn stopped(&self, id: &str, watch: bool) -> bool {
        if !watch {
            return std::future::pending().await;
        }
        loop {
            // Docker answers when the container is no longer running (or the request times
            // out: the container is looked at either way).
            let _ = self
                .docker
                .wait_container(id, None::<WaitContainerOptions>)
                .next()
                .await;
            match self
                .docker
                .inspect_container(id, None::<InspectContainerOptions>)
                .await
            {
                Ok(info) => {
                    let state = info.state.unwrap_or_default();
                    if state.running != Some(true) {
                        return state.oom_killed == Some(true);
                    }
                }
                Err(bollard::errors::Error::DockerResponseServerError {
                    status_code: 404, ..
                }) => return false,
                Err(_) => {}
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Kills every process in the sandbox except its init: from the host through its cgroups
    /// when they are known (this needs no new process in the sandbox, so it works when a fork
    /// bomb has used up the pids limit), else, or if that fails, from inside.
    pub async fn kill_tree(&self, id: &str, containment: Option<&Containment>) {
        if let Some(c) = containment.cloned() {
            match tokio::task::spawn_blocking(move || c.kill_all_but_init()).await {
                Ok(Ok(_)) => return,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, sandbox = id, "killing through the cgroup failed; killing from inside")
                }
                Err(e) => {
                    tracing::warn!(error = %e, sandbox = id, "cgroup kill task failed; killing from inside")
                }
            }
        }
        // Bounded: under gVisor an exec into a sandbox that is dying can wait for minutes.
        if tokio::time::timeout(KILL_WAIT, self.kill_all(id))
            .await
            .is_err()
        {
            tracing::warn!(
                sandbox = id,
                "killing from inside did not finish within {KILL_WAIT:?}"
            );
        }
    }

    /// Kills every process in the sandbox except its init: `kill -9 -1` run as the sandbox
    /// user reaches all of the user's processes in the container's PID namespace, so children
    /// that forked or moved to their own process group die too.
    pub async fn kill_all(&self, id: &str) {
        let argv = vec![
            "/bin/sh".to_string(),
            "-c".to_string(),
            "kill -9 -1".to_string(),
        ];
        let exec = self
            .docker
            .create_exec(
                id,
                CreateExecOptions {
                    cmd: Some(argv),
                    attach_stdout: Some(false),
                    ..Default::default()
                },
            )
            .await;
        if let Ok(exec) = exec {
            let _ = self
                .docker
                .start_exec(
                    &exec.id,
                    Some(StartExecOptions {
                        detach: true,
                        ..Default::default()
                    }),
                )
                .await;
            for _ in 0..100 {
                match self.docker.inspect_exec(&exec.id).await {
                    Ok(i) if i.running == Some(true) => {
                        tokio::time::sleep(Duration::from_millis(5)).await
                    }
                    _ => break,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_wrappers_failure_naming_the_execs_token_is_a_files_failure() {
        let token = exec_token().unwrap();
        assert_eq!(token.len(), 32);
        assert_ne!(token, exec_token().unwrap(), "a token per exec");
        let theirs = format!("tar: short write\n{FILES_FAILED_MARK} [{token}]\n");
        assert!(files_failed(
            Some(FILES_FAILED_EXIT),
            theirs.as_bytes(),
            &token
        ));
        // What a command can print: the mark alone, or with a token it guessed.
        let forged = format!("{FILES_FAILED_MARK}\n{FILES_FAILED_MARK} [00]\n");
        assert!(!files_failed(
            Some(FILES_FAILED_EXIT),
            forged.as_bytes(),
            &token
        ));
        assert!(!files_failed(Some(1), theirs.as_bytes(), &token));
        assert!(FILES_WRAPPER.contains(&format!("{FILES_FAILED_MARK} [$t]")));
        assert_eq!(files_stdin("ab", b"TAR"), b"ab\nTAR");
    }
}
