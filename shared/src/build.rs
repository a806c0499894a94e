//! What this build is: the workspace version and the git revision it was built from (see
//! `build.rs`), for every binary's `--version` and for `tangram_build_info`.

/// The git revision the build came from (12 hex digits, or what `TANGRAM_GIT_SHA` said at
/// build time); `None` for a source tree without git.
pub const GIT_SHA: Option<&str> = option_env!("TANGRAM_GIT_SHA");

/// The version line after a binary's name: `0.1.0 (git 0123456789ab)`, or
/// `0.1.0 (git unknown)`.
pub const VERSION: &str = env!("TANGRAM_VERSION");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_names_the_crate_version_and_the_revision() {
        let sha = GIT_SHA.unwrap_or("unknown");
        assert_eq!(
            VERSION,
            format!("{} (git {sha})", env!("CARGO_PKG_VERSION"))
        );
    }
}
