//! `barbican-kms-plugin`'s command line as a process: what it says, and
//! the command lines written for upstream's image that it takes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_barbican-kms-plugin");

#[test]
fn help_says_what_is_not_served() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        help.contains("Not served: the KMS v1 API"),
        "--help does not say KMS v1 is not served: {help}"
    );
}

/// Upstream's DaemonSet manifest runs `args: [/bin/barbican-kms-plugin,
/// --socketpath=$(KMS_ENDPOINT), --cloud-config=$(CLOUD_CONFIG)]`: the
/// program's path first (its image has no entrypoint). Ours takes that
/// line as it is; any other stray first argument is still refused.
#[test]
fn upstreams_command_line_naming_the_program_first_is_taken() {
    let out = Command::new(BIN)
        .args([
            "/bin/barbican-kms-plugin",
            "--socketpath=/kms/kms.sock",
            "--cloud-config=/etc/config/cloud.conf",
            "--help",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("--socketpath"));
    let out = Command::new(BIN)
        .args(["/bin/manila-csi-plugin", "--help"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unexpected argument"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
