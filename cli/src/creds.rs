//! The credentials `tangram up` gives each role: one nkey seed per role in
//! `<state-dir>/creds/<role>.nk` (mode 0600, the directory 0700), kept across restarts of
//! the cluster so that processes and rollouts holding them keep working.

use anyhow::Context;
use std::path::Path;
use tangram_nats::auth::{Role, User};

/// Reads or creates the seeds of every role this cluster has: the operator, the scheduler,
/// each worker, rollouts of every job and of each named job. Returns the users for the
/// server's configuration.
pub fn ensure(dir: &Path, workers: &[String], jobs: &[&str]) -> anyhow::Result<Vec<User>> {
    std::fs::create_dir_all(dir)?;
    set_mode(dir, 0o700)?;
    let mut roles = vec![Role::Operator, Role::Scheduler, Role::Rollout];
    roles.extend(workers.iter().map(|w| Role::Worker(w.clone())));
    for job in jobs {
        anyhow::ensure!(
            !job.is_empty()
                && job
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_".contains(c)),
            "rollout job {job:?} must be letters, digits, - and _"
        );
        roles.push(Role::RolloutOf(job.to_string()));
    }
    let mut users = Vec::new();
    for role in roles {
        let path = dir.join(format!("{}.nk", role.name()));
        let user = match std::fs::read_to_string(&path) {
            Ok(text) => User::from_seed(role, &text).map_err(|e| {
                anyhow::anyhow!("{}: {e}; delete it to get a new one", path.display())
            })?,
            Err(_) => {
                let user = User::generate(role);
                std::fs::write(&path, format!("{}\n", user.seed))
                    .with_context(|| format!("writing {}", path.display()))?;
                set_mode(&path, 0o600)?;
                user
            }
        };
        users.push(user);
    }
    Ok(users)
}

/// `tangram creds`: the seeds of a fleet's roles in `dir` (kept when present) and, beside
/// them, `authorization.conf`, the block every nats-server of the fleet includes.
pub fn fleet(dir: &Path, workers: &str, jobs: &str) -> anyhow::Result<()> {
    let list = |s: &str| -> Vec<String> {
        s.split(',')
            .map(str::trim)
            .filter(|x| !x.is_empty())
            .map(str::to_string)
            .collect()
    };
    let workers = list(workers);
    for w in &workers {
        tangram_shared::WorkerId::new(w.clone())
            .map_err(|e| anyhow::anyhow!("worker {w:?}: {e}"))?;
    }
    let jobs = list(jobs);
    let job_refs: Vec<&str> = jobs.iter().map(String::as_str).collect();
    let users = ensure(dir, &workers, &job_refs)?;
    let conf = dir.join("authorization.conf");
    std::fs::write(&conf, tangram_nats::auth::server_authorization(&users))
        .with_context(|| format!("writing {}", conf.display()))?;
    // Public keys and permissions only: readable by the server's user.
    set_mode(&conf, 0o644)?;
    println!(
        "{} seeds in {} (one file per role, 0600); give each process only its own",
        users.len(),
        dir.display()
    );
    println!(
        "{}: include it in every nats-server's configuration (deploy/systemd/nats.conf does)",
        conf.display()
    );
    Ok(())
}

fn set_mode(path: &Path, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_are_written_private_and_reused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let creds = dir.path().join("creds");
        let first = ensure(&creds, &["cpu-0".into()], &["job1"]).unwrap();
        let names: Vec<String> = first.iter().map(|u| u.role.name()).collect();
        assert_eq!(
            names,
            [
                "operator",
                "scheduler",
                "rollout",
                "worker-cpu-0",
                "rollout-job1"
            ]
        );
        let mode = std::fs::metadata(creds.join("operator.nk"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let again = ensure(&creds, &["cpu-0".into()], &["job1"]).unwrap();
        for (a, b) in first.iter().zip(&again) {
            assert_eq!(a.public, b.public, "{} was not reused", a.role.name());
        }
        assert!(ensure(&creds, &[], &["bad.job"]).is_err());
    }
}
