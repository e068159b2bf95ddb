//! The suite's main job, shown end to end: the three plugins started as
//! Kubernetes runs them and driven over their sockets the way kubelet, the
//! CSI sidecars and the kube-apiserver drive them.
//!
//! - On the embedded OpenStack emulator (the default, [`local`]): a Cinder
//!   volume ([`volume`]) staged on a real loop device, a Manila share
//!   ([`share`]) published to two pods, and KMS v2 envelope encryption
//!   ([`secrets`]) under a Barbican key, with its rotation. Without root,
//!   the node steps that need mounts say so and are skipped.
//! - Against a real cloud (`--cloud`, `--cloud-config`, [`preflight`]):
//!   what the plugins will need of it, checked with tagged resources that
//!   are always deleted again.

pub mod local;
pub mod options;
pub mod preflight;
pub mod report;
pub mod secrets;
pub mod share;
pub mod volume;

use std::path::{Path, PathBuf};

pub use options::Options;
pub use report::Report;

use report::say;

/// Why a step failed.
#[derive(Debug, thiserror::Error)]
pub enum StepFailure {
    #[error("{rpc} answered {code:?}: {message}")]
    Rpc {
        rpc: &'static str,
        code: tonic::Code,
        message: String,
    },
    #[error("{0}")]
    Check(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    OpenStack(#[from] openstack_client::Error),
    #[error("{0}")]
    Harness(#[from] csi_sanity::harness::HarnessError),
    #[error("cannot reach the plugin: {0}")]
    Connect(#[from] tonic::transport::Error),
}

impl StepFailure {
    /// What the user should look at.
    pub fn hints(&self) -> Vec<String> {
        match self {
            StepFailure::OpenStack(e) => {
                let mut v = Vec::new();
                if let Some(id) = e.request_id() {
                    v.push(format!(
                        "the service's log for request {id} (grep it in the API and worker logs)"
                    ));
                }
                v.push(
                    match e {
                        openstack_client::Error::Unauthorized(_) => {
                            "the credentials ([Global] / clouds.yaml auth), and that the user is enabled"
                        }
                        openstack_client::Error::Forbidden(_) => {
                            "the user's roles in the project (member is enough for everything here)"
                        }
                        openstack_client::Error::OverQuota(_) => {
                            "the project's quotas (volumes, gigabytes, shares, share_gigabytes)"
                        }
                        openstack_client::Error::EndpointNotFound { .. } => {
                            "the service catalog (`openstack catalog list`) and the region"
                        }
                        openstack_client::Error::ResourceFailed { .. } => {
                            "the service's scheduler and volume/share logs: the backend refused the request"
                        }
                        openstack_client::Error::Timeout { .. } => {
                            "that the service's workers are up (`openstack volume service list`, `openstack share service list`)"
                        }
                        _ => "the service's API log",
                    }
                    .to_string(),
                );
                v
            }
            StepFailure::Rpc { .. } => {
                vec!["the plugin's log (its path is printed at the end)".into()]
            }
            _ => Vec::new(),
        }
    }
}

/// A Keystone session for the `[Global]` cloud of a cloud.conf's text (the
/// emulator's, in the walk and its tests).
pub fn session_of(cloud_conf: &str) -> Result<openstack_client::Session, openstack_client::Error> {
    let conf = openstack_client::config::CloudConf::from_texts(
        &[(PathBuf::from("cloud.conf"), cloud_conf.to_string())],
        openstack_client::config::ConfigEnv::default(),
    )?;
    openstack_client::Session::new(conf.cloud("")?, openstack_client::SessionOptions::default())
}

/// A gRPC answer, or the failure naming the call.
pub fn answer<T>(
    rpc: &'static str,
    r: Result<tonic::Response<T>, tonic::Status>,
) -> Result<T, StepFailure> {
    r.map(tonic::Response::into_inner)
        .map_err(|s| StepFailure::Rpc {
            rpc,
            code: s.code(),
            message: s.message().to_string(),
        })
}

/// Fails a step with `problem` unless `cond`.
pub fn ensure(cond: bool, problem: impl FnOnce() -> String) -> Result<(), StepFailure> {
    if cond {
        Ok(())
    } else {
        Err(StepFailure::Check(problem()))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WalkError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("cannot start: {0}")]
    Harness(#[from] csi_sanity::harness::HarnessError),
    #[error("the emulator: {0}")]
    Emulator(String),
    #[error("{0}")]
    Config(String),
}

/// Where the plugins' logs go: a directory kept when asked for or when a
/// step failed (and something was logged), else removed.
#[derive(Debug)]
pub struct Logs {
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
}

impl Logs {
    fn new(asked: Option<&Path>) -> Result<Self, WalkError> {
        Ok(match asked {
            Some(p) => {
                std::fs::create_dir_all(p)?;
                Self {
                    dir: None,
                    path: p.to_path_buf(),
                }
            }
            None => {
                let dir = tempfile::Builder::new()
                    .prefix("suite-walk-logs-")
                    .tempdir()?;
                let path = dir.path().to_path_buf();
                Self {
                    dir: Some(dir),
                    path,
                }
            }
        })
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Keeps the logs (a failed run) and says where they are.
    fn keep(mut self) {
        let empty = std::fs::read_dir(&self.path).map_or(true, |mut d| d.next().is_none());
        if empty && self.dir.is_some() {
            // nothing was logged (a preflight runs no plugin): removed on drop
            return;
        }
        if let Some(d) = self.dir.take() {
            let _ = d.keep();
        }
        say(&format!("plugin logs: {}", self.path.display()));
    }
}

/// Runs the walk (or the preflight) and prints its summary; the number of
/// failed steps.
pub async fn run(options: Options) -> Result<usize, WalkError> {
    let logs = Logs::new(options.log_dir.as_deref())?;
    let mut report = Report::new();
    let mut created = preflight::Created::default();
    let interrupted = {
        let walk = async {
            if options.preflight() {
                preflight::run(&options, &mut report, &mut created).await
            } else {
                local::run(&options, &mut report, &logs).await
            }
        };
        tokio::select! {
            r = walk => { r?; false }
            _ = tokio::signal::ctrl_c() => true,
        }
    };
    // the walk's future is gone: every harness has stopped its plugin and
    // taken down its mounts; what a preflight created on a cloud is
    // deleted here, also after Ctrl-C or a failed step
    if interrupted {
        say("\ninterrupted: cleaning up");
    }
    created.delete_all(&mut report).await;
    report.summary();
    let failed = report.failed() + usize::from(interrupted);
    if failed > 0 || options.log_dir.is_some() {
        logs.keep();
    }
    Ok(failed)
}
