//! Credentials rotated without a restart: the sessions a plugin built from
//! its cloud.conf (one per cloud section) are reconfigured from the files
//! when they change. All or nothing: a file that cannot be read or parsed,
//! or a section that no longer resolves, leaves every session as it was.

use std::path::PathBuf;

use crate::config::{CloudConf, ConfigEnv, ConfigError};
use crate::session::Session;

#[derive(Debug, Clone)]
pub struct SessionReload {
    paths: Vec<PathBuf>,
    /// Cloud section name (`""`: `[Global]`) and the session built from it.
    sessions: Vec<(String, Session)>,
}

/// What a reload did.
#[derive(Debug)]
pub struct Reloaded {
    /// The configuration as read now (for what else the plugin reads from
    /// it, such as the KMS key id).
    pub conf: CloudConf,
    /// Clouds whose session got new credentials or endpoints.
    pub changed: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cloud {cloud:?}: {source}")]
    Session {
        cloud: String,
        source: Box<crate::Error>,
    },
}

impl SessionReload {
    pub fn new(paths: Vec<PathBuf>, sessions: Vec<(String, Session)>) -> Self {
        Self { paths, sessions }
    }

    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }

    /// Reads the files again and gives every session whose section changed
    /// the new credentials; calls under way finish on the old ones.
    pub fn reload(&self) -> Result<Reloaded, ReloadError> {
        self.reload_with(ConfigEnv::from_process())
    }

    pub fn reload_with(&self, env: ConfigEnv) -> Result<Reloaded, ReloadError> {
        let conf = CloudConf::load(&self.paths, env)?;
        // every section resolves before any session changes
        let mut configs = Vec::with_capacity(self.sessions.len());
        for (name, _) in &self.sessions {
            configs.push(conf.cloud(name)?);
        }
        let mut changed = Vec::new();
        for ((name, session), config) in self.sessions.iter().zip(configs) {
            match session.reconfigure(config) {
                Ok(true) => changed.push(name.clone()),
                Ok(false) => {}
                Err(source) => {
                    return Err(ReloadError::Session {
                        cloud: name.clone(),
                        source: Box::new(source),
                    });
                }
            }
        }
        Ok(Reloaded { conf, changed })
    }
}
