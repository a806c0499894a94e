//! A real Prometheus for a test (from `tools/prometheus/`, `deploy/install-prometheus.sh`):
//! a generated config on a dynamic port, a temporary store, killed on drop; plain-HTTP reads
//! of its API; and the series selectors that the dashboard and the alert rules query.

use crate::{free_port, repo_root, ChildGuard};
use anyhow::{bail, Context};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// `tools/prometheus/bin/<name>` when installed.
/// Under CI (`CI` set, where `deploy/test.sh` installs it first) a missing tool fails the
/// test instead of skipping it, so a broken install cannot pass as a green run.
pub fn tool(name: &str) -> Option<PathBuf> {
    let p = repo_root().join("tools/prometheus/bin").join(name);
    if !p.exists() && std::env::var("CI").is_ok_and(|v| !v.is_empty()) {
        panic!("{name} is missing under CI: {MISSING}");
    }
    p.exists().then_some(p)
}

/// The message a test prints when it cannot run for want of Prometheus.
pub const MISSING: &str =
    "tools/prometheus is not installed: run `bash deploy/install-prometheus.sh` to run this test";

/// A Prometheus server scraping the given jobs every second.
#[derive(Debug)]
pub struct Prometheus {
    /// Its API address, `127.0.0.1:port`.
    pub addr: String,
    _child: ChildGuard,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts one scraping `jobs` (job name, targets), every target labelled
    /// `deployment="test"`, with the alert rules of `deploy/alerts.yml` loaded.
    pub fn start(jobs: &[(&str, Vec<String>)]) -> anyhow::Result<Self> {
        let bin = tool("prometheus").context(MISSING)?;
        let dir = tempfile::tempdir()?;
        let mut config = String::from(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n",
        );
        config += &format!("  - {}\n", repo_root().join("deploy/alerts.yml").display());
        config += "scrape_configs:\n";
        for (job, targets) in jobs {
            let list: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
            config += &format!(
                "  - job_name: {job}\n    static_configs:\n      - targets: [{}]\n        labels: {{deployment: test}}\n",
                list.join(", ")
            );
        }
        let file = dir.path().join("prometheus.yml");
        std::fs::write(&file, config)?;
        let addr = format!("127.0.0.1:{}", free_port());
        let child = Command::new(&bin)
            .arg(format!("--config.file={}", file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("spawning {}", bin.display()))?;
        Ok(Self {
            addr,
            _child: ChildGuard(child),
            _dir: dir,
        })
    }

    /// `GET path` of the API, its JSON `data` (an error when Prometheus says so).
    pub fn api(&self, path: &str) -> anyhow::Result<serde_json::Value> {
        let body = http_get(&self.addr, path)?;
        let v: serde_json::Value =
            serde_json::from_str(&body).with_context(|| format!("{path}: {body}"))?;
        if v["status"] != "success" {
            bail!("{path}: {body}");
        }
        Ok(v["data"].clone())
    }

    /// How many series match `selector`.
    pub fn series(&self, selector: &str) -> anyhow::Result<usize> {
        let data = self.api(&format!("/api/v1/series?match[]={}", encode(selector)))?;
        Ok(data.as_array().map_or(0, Vec::len))
    }

    /// Evaluates `expr` now (an error for a query Prometheus rejects).
    pub fn query(&self, expr: &str) -> anyhow::Result<serde_json::Value> {
        self.api(&format!("/api/v1/query?query={}", encode(expr)))
    }
}

/// One HTTP/1.0 GET on loopback; the body of a 2xx or 4xx answer (the API explains its
/// errors in JSON).
pub fn http_get(addr: &str, path: &str) -> anyhow::Result<String> {
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let (head, body) = text.split_once("\r\n\r\n").context("no HTTP header")?;
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if !(status.starts_with('2') || status.starts_with('4')) {
        bail!("GET {path}: {head}");
    }
    Ok(body.to_string())
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The PromQL expressions of the dashboard's panels, with its variables given values that
/// match everything (`$deployment` any, `$__rate_interval` one minute).
pub fn dashboard_exprs() -> anyhow::Result<Vec<String>> {
    dashboard_exprs_of("tangram.json")
}

/// The expressions of one dashboard in `deploy/grafana/`.
pub fn dashboard_exprs_of(file: &str) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(repo_root().join("deploy/grafana").join(file))?;
    let dash: serde_json::Value = serde_json::from_str(&text)?;
    let mut out = Vec::new();
    for p in dash["panels"].as_array().context("panels")? {
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(e) = t["expr"].as_str() {
                out.push(
                    e.replace("$deployment", ".*")
                        .replace("$__rate_interval", "1m"),
                );
            }
        }
    }
    Ok(out)
}

/// The expressions of `deploy/alerts.yml` (each `expr:`, block scalars included).
pub fn alert_exprs() -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(repo_root().join("deploy/alerts.yml"))?;
    let mut out = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let Some(rest) = line.trim_start().strip_prefix("expr:") else {
            continue;
        };
        let rest = rest.trim();
        if rest == "|" {
            let indent = line.len() - line.trim_start().len();
            let mut block = String::new();
            while let Some(next) = lines.peek() {
                let deeper = next.len() - next.trim_start().len() > indent;
                if !deeper && !next.trim().is_empty() {
                    break;
                }
                block += next.trim();
                block.push(' ');
                lines.next();
            }
            out.push(block.trim().to_string());
        } else {
            out.push(rest.to_string());
        }
    }
    Ok(out)
}

/// Every `tangram_*` series selector in `expr`: the name with its label matchers when it has
/// any (`tangram_x{code!="none"}`).
pub fn selectors(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("tangram_") {
        let tail = &rest[at..];
        let name_len = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let mut sel = tail[..name_len].to_string();
        if tail[name_len..].starts_with('{') {
            if let Some(close) = tail[name_len..].find('}') {
                sel += &tail[name_len..name_len + close + 1];
            }
        }
        rest = &tail[sel.len()..];
        out.push(sel);
    }
    out
}
