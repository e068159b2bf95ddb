//! `csi-sanity --endpoint unix:///path/csi.sock [--mount-dir DIR]`: runs the
//! conformance checks against a running plugin; exits 1 if any fails.
//! Without `--mount-dir` only the Identity checks run; with it, the whole
//! suite (controller, node, snapshots, expansion, lifecycles on real
//! mounts below DIR, which must be inside the node plugin's path roots).
//! `--no-block`, `--shared` and `--quota-on-node` say what kind of storage
//! the driver serves (block volumes, or shared file systems).

#![allow(clippy::print_stdout)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use plugin_runtime::Endpoint;

#[derive(Parser, Debug)]
#[command(version, about = "CSI conformance checks against a plugin socket")]
struct Args {
    /// The plugin's CSI endpoint.
    #[arg(long)]
    endpoint: Endpoint,
    /// Run the whole suite, staging and publishing below this directory.
    #[arg(long)]
    mount_dir: Option<PathBuf>,
    /// YAML map of CreateVolume parameters (as upstream csi-sanity's
    /// --csi.testvolumeparameters).
    #[arg(long)]
    parameters: Option<PathBuf>,
    /// YAML map of secrets passed to every call that takes them.
    #[arg(long)]
    secrets: Option<PathBuf>,
    /// YAML map of VolumeAttributesClass parameters the driver can change
    /// (as upstream csi-sanity's --csi.testvolumemutableparameters).
    #[arg(long)]
    mutable_parameters: Option<PathBuf>,
    #[arg(long, default_value = "ext4")]
    fs_type: String,
    /// Filesystem of the online-expansion lifecycle.
    #[arg(long, default_value = "ext4")]
    expansion_fs_type: String,
    /// Per-call timeout, seconds.
    #[arg(long, default_value_t = 60)]
    timeout_secs: u64,
    /// The driver serves no raw block volumes (asking for one must be
    /// InvalidArgument).
    #[arg(long)]
    no_block: bool,
    /// The driver serves one volume to several publishers (RWX).
    #[arg(long)]
    shared: bool,
    /// A grown volume shows its new size on the node without node
    /// expansion (a share's quota).
    #[arg(long)]
    quota_on_node: bool,
    /// The backend refuses attachments past the node's max_volumes_per_node:
    /// check that one more is ResourceExhausted.
    #[arg(long)]
    attach_limit_enforced: bool,
}

fn read_map(p: &Option<PathBuf>) -> Result<HashMap<String, String>, String> {
    let Some(p) = p else {
        return Ok(HashMap::new());
    };
    let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
    let m: Option<HashMap<String, String>> =
        serde_yaml::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))?;
    Ok(m.unwrap_or_default())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let identity = match csi_sanity::check_identity(args.endpoint.path()).await {
        Err(e) => {
            println!("cannot reach {}: {e}", args.endpoint);
            return std::process::ExitCode::from(2);
        }
        Ok(v) => v,
    };
    for x in &identity {
        println!("FAIL {x}");
    }
    if identity.is_empty() {
        println!("PASS identity checks");
    }
    let Some(mount_dir) = args.mount_dir.clone() else {
        return if identity.is_empty() {
            std::process::ExitCode::SUCCESS
        } else {
            std::process::ExitCode::FAILURE
        };
    };
    let (parameters, secrets, mutable_parameters) = match (
        read_map(&args.parameters),
        read_map(&args.secrets),
        read_map(&args.mutable_parameters),
    ) {
        (Ok(p), Ok(s), Ok(m)) => (p, s, m),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
            println!("{e}");
            return std::process::ExitCode::from(2);
        }
    };
    let mut cfg = csi_sanity::SuiteConfig::new(args.endpoint.path(), mount_dir);
    cfg.parameters = parameters;
    cfg.secrets = secrets;
    cfg.mutable_parameters = mutable_parameters;
    cfg.fs_type = args.fs_type;
    cfg.expansion_fs_type = args.expansion_fs_type;
    cfg.timeout = Duration::from_secs(args.timeout_secs);
    cfg.block = !args.no_block;
    cfg.shared = args.shared;
    cfg.quota_on_node = args.quota_on_node;
    cfg.attach_limit_enforced = args.attach_limit_enforced;
    let suite = match csi_sanity::Suite::connect(cfg).await {
        Ok(s) => s,
        Err(e) => {
            println!("cannot reach {}: {e}", args.endpoint);
            return std::process::ExitCode::from(2);
        }
    };
    let report = suite.run().await;
    println!("{report}");
    if identity.is_empty() && report.failures().is_empty() {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}
