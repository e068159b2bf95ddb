//! The `openstack-emulator` binary: ready line, written configuration,
//! the HTTP admin API (faults, delays, failures), SIGTERM.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn http(
    base: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
    token: Option<&str>,
) -> (u16, String, String) {
    http_with(base, method, path, body, token, "").await
}

async fn http_with(
    base: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
    token: Option<&str>,
    extra_headers: &str,
) -> (u16, String, String) {
    let host = base.trim_start_matches("http://").trim_end_matches('/');
    let mut s = tokio::net::TcpStream::connect(host).await.unwrap();
    let body = body.unwrap_or("");
    let auth = token
        .map(|t| format!("X-Auth-Token: {t}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Type: application/json\r\n{auth}{extra_headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.unwrap();
    let status = buf.split_whitespace().nth(1).unwrap().parse().unwrap();
    let (head, rest) = buf.split_once("\r\n\r\n").unwrap();
    (status, head.to_string(), rest.to_string())
}

#[tokio::test]
async fn binary_serves_writes_config_and_obeys_the_admin_api() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("cloud.conf");
    let yaml = dir.path().join("clouds.yaml");
    let mut child = Proc(
        Command::new(env!("CARGO_BIN_EXE_openstack-emulator"))
            .args([
                "--listen",
                "127.0.0.1:0",
                "--availability-zones",
                "az1,az2",
                "--transition-delay-ms",
                "10",
            ])
            .arg("--write-cloud-conf")
            .arg(&conf)
            .arg("--write-clouds-yaml")
            .arg(&yaml)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .trim()
        .strip_prefix("openstack-emulator listening on ")
        .unwrap()
        .to_string();
    let conf_text = std::fs::read_to_string(&conf).unwrap();
    assert!(
        conf_text.contains(&format!("auth-url = \"{url}identity/v3\"")),
        "{conf_text}"
    );
    assert!(
        std::fs::read_to_string(&yaml)
            .unwrap()
            .contains("emulator-member")
    );

    // authenticate by hand
    let auth = r#"{"auth":{"identity":{"methods":["password"],"password":{"user":{"name":"admin","domain":{"name":"Default"},"password":"admin-secret"}}},"scope":{"project":{"name":"admin","domain":{"name":"Default"}}}}}"#;
    let (status, head, body) =
        http(&url, "POST", "/identity/v3/auth/tokens", Some(auth), None).await;
    assert_eq!(status, 201, "{body}");
    let token = head
        .lines()
        .find_map(|l| l.strip_prefix("x-subject-token: "))
        .unwrap()
        .trim()
        .to_string();
    assert!(body.contains("volumev3") && body.contains("sharev2") && body.contains("key-manager"));
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    let project = doc["token"]["project"]["id"].as_str().unwrap().to_string();

    // a fault injected over HTTP
    let fault = r#"{"method":"GET","path_contains":"/types","action":{"kind":"status","status":503,"message":"maintenance"},"remaining":1}"#;
    assert_eq!(
        http(&url, "POST", "/_admin/faults", Some(fault), None)
            .await
            .0,
        201
    );
    let path = format!("/volume/v3/{project}/types");
    let (status, head, body) = http(&url, "GET", &path, None, Some(&token)).await;
    assert_eq!(status, 503);
    assert!(
        body.contains("maintenance") && body.contains("serviceUnavailable"),
        "{body}"
    );
    assert!(head.contains("x-openstack-request-id: req-"));
    assert_eq!(
        http(&url, "GET", &path, None, Some(&token)).await.0,
        200,
        "the fault fired once"
    );

    // no token, bad token
    assert_eq!(http(&url, "GET", &path, None, None).await.0, 401);
    assert_eq!(http(&url, "GET", &path, None, Some("garbage")).await.0, 401);
    // microversions: reported back, and refused beyond the maximum
    let (status, head, _) = http_with(
        &url,
        "GET",
        &path,
        None,
        Some(&token),
        "OpenStack-API-Version: volume 3.42\r\n",
    )
    .await;
    assert_eq!(status, 200);
    assert!(
        head.to_ascii_lowercase()
            .contains("openstack-api-version: volume 3.42"),
        "{head}"
    );
    let (status, _, body) = http_with(
        &url,
        "GET",
        &path,
        None,
        Some(&token),
        "OpenStack-API-Version: volume 3.99\r\n",
    )
    .await;
    assert_eq!(status, 406, "{body}");
    assert!(body.contains("maximum is 3.70"), "{body}");

    // availability zones from the flag
    let create = r#"{"volume":{"size":1,"name":"v","availability_zone":"az2"}}"#;
    let (status, _, body) = http(
        &url,
        "POST",
        &format!("/volume/v3/{project}/volumes"),
        Some(create),
        Some(&token),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let create = r#"{"volume":{"size":1,"name":"v","availability_zone":"az9"}}"#;
    let (status, _, body) = http(
        &url,
        "POST",
        &format!("/volume/v3/{project}/volumes"),
        Some(create),
        Some(&token),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("az9"));

    // calls are recorded
    let (_, _, calls) = http(&url, "GET", "/_admin/calls", None, None).await;
    assert!(calls.contains("/types") && calls.contains("503"), "{calls}");

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.0.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(child.0.wait().unwrap().success());
}

#[test]
fn bad_flags_fail_clearly() {
    let out = Command::new(env!("CARGO_BIN_EXE_openstack-emulator"))
        .args(["--listen", "not-an-address"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid value 'not-an-address'"));
    let out = Command::new(env!("CARGO_BIN_EXE_openstack-emulator"))
        .args(["--hypervisor-by-id-dir", "/tmp/x"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "the by-id dir needs an image dir");
}
