//! Container image references and the allow-list a worker pulls against.
//!
//! A reference is read as Docker reads one: the first path component names a registry when
//! it has a `.` or a `:` or is `localhost`, else the image is on Docker Hub (`docker.io`,
//! with `library/` before a one-component name); a tag follows the last `:` of the last
//! component (`latest` when none), a digest follows `@`.
//!
//! An allow rule is `registry/repository`, where the repository may end in `/*` (every
//! repository below it) or be `*` (every repository of the registry). Matching is on the
//! parsed parts, never on the raw string, so `127.0.0.1:5000/team/../other` or a registry
//! spelled as a repository cannot pass a rule meant for another.

/// A parsed image reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    /// `host[:port]`, `docker.io` when the reference names none.
    pub registry: String,
    /// Path components joined by `/` (`library/python` for `python`).
    pub repository: String,
    /// The tag (`latest` when none is given) or the digest (`sha256:...`).
    pub reference: String,
}

impl ImageRef {
    /// The reference spelled in full, `registry/repository:tag` (or `@digest`): two spellings
    /// of one image (`python:3.11`, `docker.io/library/python:3.11`) give the same string.
    pub fn canonical(&self) -> String {
        let sep = if self.reference.contains(':') {
            '@'
        } else {
            ':'
        };
        format!(
            "{}/{}{sep}{}",
            self.registry, self.repository, self.reference
        )
    }

    /// [`ImageRef::canonical`] of a reference, `None` when it does not parse.
    pub fn canonical_of(s: &str) -> Option<String> {
        Self::parse(s).ok().map(|r| r.canonical())
    }

    /// Parses a reference; the error says what is wrong with it.
    pub fn parse(s: &str) -> Result<Self, String> {
        if s.is_empty() || s.len() > 512 {
            return Err("an image reference is 1 to 512 characters".into());
        }
        let (name, digest) = match s.split_once('@') {
            Some((n, d)) => (n, Some(d)),
            None => (s, None),
        };
        let (name, tag) = match name.rsplit_once(':') {
            Some((n, t)) if !t.contains('/') => (n, Some(t)),
            _ => (name, None),
        };
        let mut parts: Vec<&str> = name.split('/').collect();
        let registry = if parts.len() > 1
            && (parts[0].contains('.') || parts[0].contains(':') || parts[0] == "localhost")
        {
            parts.remove(0).to_string()
        } else {
            "docker.io".to_string()
        };
        if !valid_registry(&registry) {
            return Err(format!("{s:?}: registry {registry:?} is not host[:port]"));
        }
        if registry == "docker.io" && parts.len() == 1 {
            parts.insert(0, "library");
        }
        for p in &parts {
            let ok = !p.is_empty()
                && p.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c))
                && p.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
                && *p != "."
                && *p != "..";
            if !ok {
                return Err(format!(
                    "{s:?}: repository component {p:?} must be lowercase letters, digits, '.', '_' or '-', starting with a letter or digit"
                ));
            }
        }
        let reference = match (tag, digest) {
            (_, Some(d)) => {
                let ok = d.split_once(':').is_some_and(|(algo, hex)| {
                    !algo.is_empty()
                        && hex.len() >= 32
                        && hex.chars().all(|c| c.is_ascii_hexdigit())
                });
                if !ok {
                    return Err(format!("{s:?}: a digest is <algorithm>:<hex>"));
                }
                d.to_string()
            }
            (Some(t), None) => {
                let ok = !t.is_empty()
                    && t.len() <= 128
                    && t.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
                if !ok {
                    return Err(format!(
                        "{s:?}: a tag is up to 128 letters, digits, '.', '_' or '-'"
                    ));
                }
                t.to_string()
            }
            (None, None) => "latest".to_string(),
        };
        Ok(Self {
            registry,
            repository: parts.join("/"),
            reference,
        })
    }
}

/// `host[:port]`: letters, digits, '.' and '-' in the host, digits in the port.
fn valid_registry(r: &str) -> bool {
    let (host, port) = match r.split_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (r, None),
    };
    !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
        && port
            .is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.chars().all(|c| c.is_ascii_digit()))
}

/// One allow rule: a registry and a repository pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRule {
    registry: String,
    /// The repository, or its prefix when `prefix` is set (empty with `prefix`: any).
    repository: String,
    prefix: bool,
}

impl ImageRule {
    /// Parses `registry/repository`, `registry/prefix/*` or `registry/*`.
    pub fn parse(rule: &str) -> Result<Self, String> {
        let (registry, repo) = rule
            .split_once('/')
            .ok_or_else(|| format!("{rule:?}: an image rule is registry/repository"))?;
        if !valid_registry(registry) {
            return Err(format!(
                "{rule:?}: the registry must be named (host[:port])"
            ));
        }
        let (repository, prefix) = if repo == "*" {
            (String::new(), true)
        } else if let Some(p) = repo.strip_suffix("/*") {
            (p.to_string(), true)
        } else {
            (repo.to_string(), false)
        };
        if repository.contains('*') || (!prefix && repository.is_empty()) {
            return Err(format!(
                "{rule:?}: '*' may only end a rule (registry/* or registry/prefix/*)"
            ));
        }
        if !repository.is_empty() {
            // The same component rules as a reference (checked through a stand-in tag).
            ImageRef::parse(&format!("{registry}/{repository}"))
                .map_err(|e| format!("rule {rule:?}: {e}"))?;
        }
        Ok(Self {
            registry: registry.to_string(),
            repository,
            prefix,
        })
    }

    /// True when the rule allows `image`.
    pub fn allows(&self, image: &ImageRef) -> bool {
        if image.registry != self.registry {
            return false;
        }
        if !self.prefix {
            return image.repository == self.repository;
        }
        self.repository.is_empty()
            || image
                .repository
                .strip_prefix(&self.repository)
                .is_some_and(|rest| rest.starts_with('/'))
    }
}

/// A request to pre-pull a sandbox image on one worker (`tangram images prepull`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrepullRequest {
    /// The image reference, as a `sandbox_open` would name it.
    pub image: String,
}

/// What a pre-pull came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrepullOutcome {
    /// The worker held it already.
    Present,
    /// The worker pulled it.
    Pulled,
    /// Not allowed, unknown to the registry, or the request was malformed: asking again
    /// will not help.
    Refused,
    /// The pull failed (registry unreachable, credentials refused, too slow): it may work later.
    Failed,
}

/// A worker's answer to a [`PrepullRequest`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PrepullReply {
    /// The worker.
    pub worker: String,
    /// The image asked for.
    pub image: String,
    /// What happened.
    pub outcome: PrepullOutcome,
    /// How long the pull took, ms (when it pulled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_ms: Option<u64>,
    /// Why, when refused or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl PrepullReply {
    /// An answer that did not make the image present: `outcome` (refused or failed), and why.
    pub fn not_done(
        worker: impl Into<String>,
        image: impl Into<String>,
        outcome: PrepullOutcome,
        why: impl Into<String>,
    ) -> Self {
        Self {
            worker: worker.into(),
            image: image.into(),
            outcome,
            pull_ms: None,
            error: Some(why.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(s: &str) -> ImageRef {
        ImageRef::parse(s).unwrap()
    }

    #[test]
    fn two_spellings_of_one_image_have_one_canonical_form() {
        let c = ImageRef::canonical_of;
        assert_eq!(c("python:3.11"), c("docker.io/library/python:3.11"));
        assert_eq!(
            c("python").as_deref(),
            Some("docker.io/library/python:latest")
        );
        assert_eq!(
            c("127.0.0.1:5000/team/app:1").as_deref(),
            Some("127.0.0.1:5000/team/app:1")
        );
        let digest = format!("app@sha256:{}", "a".repeat(64));
        assert_eq!(
            c(&digest),
            Some(format!("docker.io/library/app@sha256:{}", "a".repeat(64)))
        );
        assert_ne!(c("team/app:1"), c("localhost:5000/team/app:1"));
        assert_eq!(c("Not An Image"), None);
    }

    #[test]
    fn references_parse_as_docker_reads_them() {
        assert_eq!(
            r("python"),
            ImageRef {
                registry: "docker.io".into(),
                repository: "library/python".into(),
                reference: "latest".into()
            }
        );
        assert_eq!(r("team/app:1.2").repository, "team/app");
        assert_eq!(r("team/app:1.2").registry, "docker.io");
        let local = r("127.0.0.1:5000/tangram/sandbox:py3-v1");
        assert_eq!(local.registry, "127.0.0.1:5000");
        assert_eq!(local.repository, "tangram/sandbox");
        assert_eq!(local.reference, "py3-v1");
        assert_eq!(r("localhost/x").registry, "localhost");
        assert_eq!(r("reg.example/a/b/c").repository, "a/b/c");
        let d = format!("reg.example/a@sha256:{}", "ab".repeat(32));
        assert!(r(&d).reference.starts_with("sha256:"));
        // A port is not a tag.
        assert_eq!(r("reg.example:5000/a").reference, "latest");
    }

    #[test]
    fn bad_references_are_refused_with_the_reason() {
        for bad in [
            "",
            "Team/app",
            "reg.example/../x",
            "reg.example//x",
            "a:b:c/d",
            "x@sha256:zz",
        ] {
            assert!(ImageRef::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn rules_match_parsed_parts_not_strings() {
        let team = ImageRule::parse("127.0.0.1:5000/team/*").unwrap();
        assert!(team.allows(&r("127.0.0.1:5000/team/app:1")));
        assert!(team.allows(&r("127.0.0.1:5000/team/a/b")));
        assert!(!team.allows(&r("127.0.0.1:5000/teamx/app")));
        assert!(!team.allows(&r("127.0.0.1:5000/team")));
        assert!(!team.allows(&r("127.0.0.1:5001/team/app")));
        // A registry spelled as a repository is another image.
        assert!(!team.allows(&r("127.0.0.1.evil.example:5000/team/app")));
        let exact = ImageRule::parse("reg.example/polyglot").unwrap();
        assert!(exact.allows(&r("reg.example/polyglot:v2")));
        assert!(!exact.allows(&r("reg.example/polyglot/sub")));
        let any = ImageRule::parse("reg.example/*").unwrap();
        assert!(any.allows(&r("reg.example/whatever/x")));
        assert!(!any.allows(&r("python")));
        let hub = ImageRule::parse("docker.io/library/*").unwrap();
        assert!(hub.allows(&r("python:3.12")));
    }

    #[test]
    fn bad_rules_are_refused() {
        for bad in [
            "noslash",
            "*/x",
            "reg.example/a*",
            "reg.example/",
            "reg.example/*/x",
        ] {
            assert!(ImageRule::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
