//! `csi-sanity --endpoint unix:///path/csi.sock`: runs the conformance
//! checks against a running plugin; exits 1 if any check fails.

#![allow(clippy::print_stdout)]

use clap::Parser;
use plugin_runtime::Endpoint;

#[derive(Parser, Debug)]
#[command(version, about = "CSI conformance checks against a plugin socket")]
struct Args {
    /// The plugin's CSI endpoint.
    #[arg(long)]
    endpoint: Endpoint,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    match csi_sanity::check_identity(args.endpoint.path()).await {
        Err(e) => {
            println!("cannot reach {}: {e}", args.endpoint);
            std::process::ExitCode::from(2)
        }
        Ok(v) if v.is_empty() => {
            println!("{}: identity checks passed", args.endpoint);
            std::process::ExitCode::SUCCESS
        }
        Ok(v) => {
            for x in &v {
                println!("FAIL {x}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}
