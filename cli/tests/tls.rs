//! Every CLI command that talks to NATS reaches a fleet whose servers require TLS and verify
//! clients, given `--tls-ca`, `--tls-cert` and `--tls-key` like the other binaries; without
//! them it fails at once with an error that says which flag to pass.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, SanType,
};
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;
use tokio::time::Instant;

mod common;
use common::{free_port, repo, wait_listening, Procs};

/// A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files in `dir`.
fn certificates(dir: &Path) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "tangram test CA");
    let ca = CertifiedIssuer::self_signed(ca, ca_key).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    for (name, eku) in [
        ("server", ExtendedKeyUsagePurpose::ServerAuth),
        ("client", ExtendedKeyUsagePurpose::ClientAuth),
    ] {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        // A client dialling an IP checks an IP SAN, not a name (DEPLOY.md says so).
        p.subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        p.extended_key_usages.push(eku);
        p.distinguished_name.push(DnType::CommonName, name);
        let cert = p.signed_by(&key, &ca).unwrap();
        std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
    }
}

fn tangram(args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tangram"))
        .args(args)
        .env("TANGRAM_STATE_DIR", dir.join("no-state"))
        .env_remove("TANGRAM_NATS_URL")
        .env_remove("TANGRAM_NKEY_FILE")
        .env_remove("TANGRAM_TLS_CA")
        .env_remove("TANGRAM_TLS_CERT")
        .env_remove("TANGRAM_TLS_KEY")
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn every_nats_command_of_the_cli_reaches_a_tls_fleet_that_verifies_clients() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    certificates(d);
    let port = free_port();
    std::fs::write(
        d.join("nats.conf"),
        format!(
            "listen: 127.0.0.1:{port}\njetstream {{ store_dir: \"{}\", max_file_store: 20GB }}\n\
             tls {{ cert_file: \"{}\", key_file: \"{}\", ca_file: \"{}\", verify: true, timeout: 2 }}\n",
            d.join("js").display(),
            d.join("server.pem").display(),
            d.join("server.key").display(),
            d.join("ca.pem").display(),
        ),
    )
    .unwrap();
    let mut procs = Procs(vec![]);
    procs.0.push(
        Command::new(repo().join("tools/bin/nats-server"))
            .args(["-c"])
            .arg(d.join("nats.conf"))
            .stderr(std::fs::File::create(d.join("nats.log")).unwrap())
            .spawn()
            .expect("tools/bin/nats-server: run `bash deploy/install-tools.sh`"),
    );
    // The server listens before the scheduler dials it.
    wait_listening(port, &d.join("nats.log"));
    let url = format!("tls://127.0.0.1:{port}");
    let ca = d.join("ca.pem");
    let cert = d.join("client.pem");
    let key = d.join("client.key");
    let (ca, cert, key) = (
        ca.to_str().unwrap(),
        cert.to_str().unwrap(),
        key.to_str().unwrap(),
    );
    let tls = [
        "--nats-url",
        &url,
        "--tls-ca",
        ca,
        "--tls-cert",
        cert,
        "--tls-key",
        key,
    ];
    // The scheduler, a binary of the same build, connects with the same flags.
    let scheduler = Path::new(env!("CARGO_BIN_EXE_tangram")).with_file_name("tangram-scheduler");
    procs.0.push(
        Command::new(&scheduler)
            .args(tls)
            .stdout(std::fs::File::create(d.join("scheduler.log")).unwrap())
            .stderr(std::fs::File::create(d.join("scheduler.err")).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e} (cargo build --bins)", scheduler.display())),
    );
    let with_tls = |args: &[&str]| -> Output {
        let mut all: Vec<&str> = args.to_vec();
        all.extend_from_slice(&tls);
        tangram(&all, d)
    };

    // status answers once the scheduler leads (bounded).
    let began = Instant::now();
    let status = loop {
        let o = with_tls(&["status", "--json"]);
        if o.status.success() {
            break o;
        }
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "status over TLS never answered: {}\nscheduler log: {}{}",
            text(&o),
            std::fs::read_to_string(d.join("scheduler.log")).unwrap_or_default(),
            std::fs::read_to_string(d.join("scheduler.err")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let st: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert!(st["epoch"].as_u64().unwrap() >= 1, "{st}");

    // cordon, uncordon and drain write the operator's record over TLS.
    for args in [
        &["cordon", "w-1"][..],
        &["uncordon", "w-1"][..],
        &["drain", "w-1", "--no-wait"][..],
        &["uncordon", "w-1"][..],
    ] {
        let o = with_tls(args);
        assert!(o.status.success(), "{args:?}: {}", text(&o));
    }
    // submit gets its result (a rejection from the scheduler: no service is served).
    let o = with_tls(&[
        "submit",
        "reward",
        "--service",
        "nope",
        "--input",
        "x",
        "--json",
    ]);
    let r: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("submit over TLS: {e}: {}", text(&o)));
    assert_eq!(r["outcome"]["code"], "unknown_service", "{r}");
    // images prepull reads the fleet from the scheduler, and says that no worker takes work.
    let o = with_tls(&["images", "prepull", "python:3.11", "--workers", "1"]);
    assert!(
        text(&o).contains("no CPU worker taking new work"),
        "prepull over TLS: {}",
        text(&o)
    );
    // replay reads the streams.
    let o = with_tls(&["replay", "jobs"]);
    assert!(o.status.success(), "replay jobs over TLS: {}", text(&o));

    // Without a client certificate, or without the CA, it fails at once and names the flag.
    for (args, flag) in [
        (
            vec!["status", "--nats-url", &url, "--tls-ca", ca],
            "--tls-cert",
        ),
        (vec!["status", "--nats-url", &url], "--tls-ca"),
    ] {
        let began = Instant::now();
        let o = tangram(&args, d);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(flag), "{args:?}: {}", text(&o));
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "{args:?} took {:?}",
            began.elapsed()
        );
    }
    // A certificate without its key is a usage error before anything connects.
    let o = tangram(&["status", "--nats-url", &url, "--tls-cert", cert], d);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}
