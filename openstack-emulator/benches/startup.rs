//! Start time of the emulator binary: from spawn to its ready line, and to
//! the first token it issues. Prints figures; asserts nothing.
//! `BENCH_QUICK=1`: 3 runs instead of 20 (as the test command runs it).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn first_token(url: &str) -> Duration {
    let started = Instant::now();
    let host = url.trim_start_matches("http://").trim_end_matches('/');
    let body = r#"{"auth":{"identity":{"methods":["password"],"password":{"user":{"name":"admin","domain":{"name":"Default"},"password":"admin-secret"}}}}}"#;
    let mut s = std::net::TcpStream::connect(host).unwrap();
    write!(s, "POST /identity/v3/auth/tokens HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 201"), "{out}");
    started.elapsed()
}

fn main() {
    let runs = if std::env::var_os("BENCH_QUICK").is_some() {
        3
    } else {
        20
    };
    let mut ready = Vec::new();
    let mut token = Vec::new();
    for _ in 0..runs {
        let started = Instant::now();
        let mut child = Command::new(env!("CARGO_BIN_EXE_openstack-emulator"))
            .args(["--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        ready.push(started.elapsed());
        let url = line.trim().rsplit(' ').next().unwrap().to_string();
        token.push(first_token(&url));
        child.kill().unwrap();
        child.wait().unwrap();
    }
    for (name, v) in [
        ("spawn → ready line", &mut ready),
        ("first token issue", &mut token),
    ] {
        v.sort();
        println!(
            "emulator {name}: min {:.1} ms, median {:.1} ms, max {:.1} ms ({runs} runs)",
            v[0].as_secs_f64() * 1e3,
            v[runs / 2].as_secs_f64() * 1e3,
            v[runs - 1].as_secs_f64() * 1e3
        );
    }
}
