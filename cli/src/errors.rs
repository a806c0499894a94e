//! How the CLI fails: exit codes, one line per cause (never the same cause twice), and the
//! next step to take when we can tell what it is.
//!
//! Exit codes: 0 success, 1 a runtime failure (the cluster is down, an action failed), 2 a
//! usage error (clap's), 64 a configuration error (a bad config file or value).

use std::time::Duration;

/// Exit status of a runtime failure.
pub const EXIT_RUNTIME: u8 = 1;
/// Exit status of a usage error (clap uses it too).
pub const EXIT_USAGE: u8 = 2;
/// Exit status of a configuration error.
pub const EXIT_CONFIG: u8 = 64;

/// Marks an error as a bad command line that clap could not catch, such as an unknown
/// policy name (exit 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// Fails with a usage error.
#[macro_export]
macro_rules! usage {
    ($($t:tt)*) => {
        return Err(anyhow::Error::new($crate::errors::UsageError(format!($($t)*))))
    };
}

/// Marks an error as the configuration's fault (exit 64).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// The error's causes, outermost first, leaving out any cause whose text an earlier one
/// already shows (libraries often print their source inside their own message).
pub fn causes(e: &anyhow::Error) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !out.iter().any(|earlier| earlier.contains(&text)) {
            out.push(text);
        }
    }
    out
}

/// What to do next, for failures we recognise.
pub fn hint(causes: &[String]) -> Option<&'static str> {
    let all = causes.join(" ").to_ascii_lowercase();
    if all.contains("connection refused") || all.contains("no nats server answered") {
        Some("is the cluster up? `tangram up` starts a local one; `--nats-url` (or TANGRAM_NATS_URL) points at another")
    } else if all.contains("authorization") || all.contains("authentication") {
        Some("pass the cluster's credentials: `--nkey-file <state-dir>/creds/operator.nk` (or TANGRAM_NKEY_FILE)")
    } else if all.contains("permissions violation") {
        Some("these credentials may not do that; the operator role can (`<state-dir>/creds/operator.nk`)")
    } else {
        None
    }
}

/// Prints the error for a person and returns the exit status.
pub fn report(e: &anyhow::Error) -> u8 {
    let causes = causes(e);
    eprintln!("tangram: {}", causes.join(": "));
    if let Some(h) = hint(&causes) {
        eprintln!("hint: {h}");
    }
    if e.chain().any(|c| c.is::<ConfigError>()) {
        EXIT_CONFIG
    } else if e.chain().any(|c| c.is::<UsageError>()) {
        EXIT_USAGE
    } else {
        EXIT_RUNTIME
    }
}

/// Connects to NATS, giving up after 5 s with a readable error.
pub async fn connect(
    url: &str,
    name: &str,
    creds: &tangram_nats::auth::Credentials,
) -> anyhow::Result<async_nats::Client> {
    match tokio::time::timeout(
        Duration::from_secs(5),
        tangram_nats::auth::connect(url, name, creds),
    )
    .await
    {
        Ok(r) => Ok(r?),
        Err(_) => anyhow::bail!("no NATS server answered at {url} within 5 s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("connecting to NATS at x: {0}")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn a_cause_already_in_its_parents_text_is_printed_once() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        let e = anyhow::Error::new(Outer(io)).context("tangram status");
        let c = causes(&e);
        assert_eq!(
            c,
            [
                "tangram status",
                "connecting to NATS at x: Connection refused"
            ]
        );
        assert!(hint(&c).unwrap().contains("tangram up"));
        assert_eq!(report(&e), EXIT_RUNTIME);
    }

    #[test]
    fn a_config_error_exits_64_and_a_usage_error_2() {
        let e = anyhow::Error::new(ConfigError("bad key".into())).context("reading tangram.toml");
        assert_eq!(report(&e), EXIT_CONFIG);
        fn bad() -> anyhow::Result<()> {
            usage!("unknown policy {:?}", "magic")
        }
        assert_eq!(report(&bad().unwrap_err()), EXIT_USAGE);
    }
}
