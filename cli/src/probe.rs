//! `tangram probe`: one HTTP GET to a local health endpoint, for container health checks in
//! images that have no curl. Exits 0 on a 200 answer, 1 otherwise; prints the body.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Probes `http://<addr><path>` within `timeout`; true on a 200.
pub(crate) fn probe(addr: &str, path: &str, timeout: Duration) -> anyhow::Result<bool> {
    let target = addr
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| anyhow::anyhow!("{addr} resolves to no address"))?;
    let mut s = TcpStream::connect_timeout(&target, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut out = Vec::new();
    s.take(64 * 1024).read_to_end(&mut out)?;
    let text = String::from_utf8_lossy(&out);
    let status: u16 = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("{addr}{path} did not answer HTTP"))?;
    if let Some(body) = text.split("\r\n\r\n").nth(1) {
        println!("{}", body.trim());
    }
    Ok(status == 200)
}
