//! A container registry on loopback for the image-pull tests: Debian's docker-registry (from
//! `deploy/install-registry.sh`) with basic auth, its storage in a temporary folder, killed
//! when dropped. Images are pushed with a Docker client config of the test's own, so the
//! machine's `docker login` state is never touched.

use crate::{free_port, repo_root, ChildGuard};
use anyhow::Context as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

/// The registry binary, when installed.
pub fn binary() -> Option<PathBuf> {
    let p = repo_root().join("tools/registry/bin/docker-registry");
    p.exists().then_some(p)
}

/// The message a test prints when the registry is not installed.
pub const MISSING: &str =
    "tools/registry is not installed: run `bash deploy/install-registry.sh` to run this test";

/// A running registry.
#[derive(Debug)]
pub struct Registry {
    /// `127.0.0.1:port`: the registry part of image references.
    pub addr: String,
    user: String,
    password: String,
    child: Option<ChildGuard>,
    dir: tempfile::TempDir,
}

impl Registry {
    /// Starts one that lets in `user` with `password` and no one else; waits until it answers.
    pub fn start(user: &str, password: &str) -> anyhow::Result<Self> {
        let bin = binary().context(MISSING)?;
        let dir = tempfile::tempdir()?;
        let hash = Command::new("python3")
            .args(["-W", "ignore", "-c"])
            .arg("import crypt,sys; print(crypt.crypt(sys.argv[1], crypt.mksalt(crypt.METHOD_BLOWFISH)))")
            .arg(password)
            .output()?;
        anyhow::ensure!(hash.status.success(), "bcrypt via python3 failed");
        let hash = String::from_utf8(hash.stdout)?.trim().to_string();
        std::fs::write(dir.path().join("htpasswd"), format!("{user}:{hash}\n"))?;
        let addr = format!("127.0.0.1:{}", free_port());
        let config = format!(
            "version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\nauth:\n  htpasswd:\n    realm: tangram-test\n    path: {}\n",
            dir.path().join("data").display(),
            dir.path().join("htpasswd").display()
        );
        std::fs::write(dir.path().join("config.yml"), config)?;
        let child = Command::new(bin)
            .arg("serve")
            .arg(dir.path().join("config.yml"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("registry.log"))?)
            .spawn()?;
        let r = Self {
            addr,
            user: user.into(),
            password: password.into(),
            child: Some(ChildGuard(child)),
            dir,
        };
        // Up to 20 s for it to listen.
        let up = (0..400).any(|_| {
            let ok = std::net::TcpStream::connect(&r.addr).is_ok();
            if !ok {
                std::thread::sleep(Duration::from_millis(50));
            }
            ok
        });
        anyhow::ensure!(up, "the registry did not start");
        Ok(r)
    }

    fn docker(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new("docker")
            .arg("--config")
            .arg(self.dir.path().join("client"))
            .args(args)
            .output()?;
        let text = crate::output_text(&out);
        anyhow::ensure!(out.status.success(), "docker {args:?}: {text}");
        Ok(text)
    }

    /// Pushes the local image `local` as `repository:tag` and removes that name locally again
    /// (the layers stay, under `local`), so a worker must pull it. Returns the reference.
    pub fn push(&self, local: &str, repository_tag: &str) -> anyhow::Result<String> {
        let reference = format!("{}/{repository_tag}", self.addr);
        self.login()?;
        self.docker(&["tag", local, &reference])?;
        self.docker(&["push", "-q", &reference])?;
        self.docker(&["rmi", &reference])?;
        Ok(reference)
    }

    /// `docker login` into the test's own client config, the password on stdin.
    fn login(&self) -> anyhow::Result<()> {
        use std::io::Write as _;
        let mut child = Command::new("docker")
            .arg("--config")
            .arg(self.dir.path().join("client"))
            .args(["login", &self.addr, "-u", &self.user, "--password-stdin"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        child
            .stdin
            .take()
            .context("docker login's stdin")?
            .write_all(self.password.as_bytes())?;
        let out = child.wait_with_output()?;
        anyhow::ensure!(
            out.status.success(),
            "docker login: {}",
            crate::output_text(&out)
        );
        Ok(())
    }

    /// Stops the registry (a registry outage).
    pub fn stop(&mut self) {
        self.child = None;
    }

    /// A credentials file for a worker: this registry's user and password.
    pub fn auth_file(&self) -> anyhow::Result<PathBuf> {
        let p = self.dir.path().join("auth.json");
        let v =
            serde_json::json!({ &self.addr: { "username": self.user, "password": self.password } });
        std::fs::write(&p, v.to_string())?;
        Ok(p)
    }
}

/// Imports a small image for the pull tests, tagged `tag`: a root holding only a shell
/// (`/bin/sh`), `sleep` and the C runtime they load, plus `pad_mb` MiB of random bytes (so two
/// such images differ, and sizes are known to a disk budget). The default sandbox image is
/// about 1.6 GB: pushing and pulling it would take most of a test's time.
pub fn small_image(tag: &str, pad_mb: usize) -> anyhow::Result<String> {
    let dir = tempfile::tempdir()?;
    let root = dir.path().join("root");
    for sub in ["bin", "work", "tmp"] {
        std::fs::create_dir_all(root.join(sub))?;
    }
    let shell = if std::path::Path::new("/bin/dash").exists() {
        "/bin/dash"
    } else {
        "/bin/sh"
    };
    let copies = [(shell, "bin/sh"), ("/bin/sleep", "bin/sleep")];
    for (from, to) in copies {
        std::fs::copy(from, root.join(to)).with_context(|| format!("copying {from}"))?;
        let ldd = Command::new("ldd").arg(from).output()?;
        for lib in String::from_utf8_lossy(&ldd.stdout)
            .split_whitespace()
            .filter(|w| w.starts_with('/'))
        {
            let dest = root.join(lib.trim_start_matches('/'));
            std::fs::create_dir_all(dest.parent().expect("a library has a folder"))?;
            std::fs::copy(lib, &dest).with_context(|| format!("copying {lib}"))?;
        }
    }
    let mut pad = vec![0u8; pad_mb << 20];
    // Seeded from the whole tag (FNV-1a) and the process: two tags, two paddings.
    let mut x = tag.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    }) ^ std::process::id() as u64;
    x |= 1;
    for b in pad.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    std::fs::write(root.join("pad"), &pad)?;
    let tar = Command::new("tar")
        .arg("-C")
        .arg(&root)
        .args(["-c", "."])
        .stdout(Stdio::piped())
        .spawn()?;
    let out = Command::new("docker")
        .args(["import", "-c", "WORKDIR /work", "-", tag])
        .stdin(tar.stdout.context("tar's stdout")?)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "docker import: {}",
        crate::output_text(&out)
    );
    Ok(tag.to_string())
}
