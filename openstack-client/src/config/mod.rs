//! Configuration compatible with the upstream plugins: cloud.conf (gcfg INI)
//! and clouds.yaml (+ secure.yaml).
//!
//! Loading parses and type-checks every section; the credentials of a cloud
//! are resolved (and missing keys reported) when that cloud is asked for,
//! so a node plugin whose cloud.conf has only `[BlockStorage]` and
//! `[Metadata]` loads fine.

mod auth_inputs;
pub mod clouds_yaml;
pub mod gcfg;
pub mod secret_files;
pub mod secrets;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use url::Url;

use crate::secret::SecretString;
use crate::service::{Interface, ServiceType};

pub(crate) use auth_inputs::AuthInputs;
pub use clouds_yaml::CloudsYamlSearch;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is empty", path.display())]
    Empty { path: PathBuf },
    #[error("no cloud configuration file was given")]
    NoFiles,
    #[error("syntax error in {0}")]
    Syntax(#[from] gcfg::ParseError),
    #[error("{}:{line}: [{section}] {key}: {message}", file.display())]
    InvalidValue {
        file: PathBuf,
        line: usize,
        section: String,
        key: String,
        message: String,
    },
    #[error("[{section}] lacks {key}{}", hint.as_ref().map(|h| format!(" ({h})")).unwrap_or_default())]
    MissingKey {
        section: String,
        key: String,
        hint: Option<String>,
    },
    #[error("cloud {name:?} is not defined (defined: {})", if available.is_empty() { "none".to_string() } else { available.join(", ") })]
    UnknownCloud {
        name: String,
        available: Vec<String>,
    },
    #[error("{}: {message}", path.display())]
    CloudsYaml { path: PathBuf, message: String },
    /// A request Secret's key that may not be used as given; the reason
    /// never says what a file holds or whether it exists.
    #[error("{key}: {reason}")]
    SecretRefused { key: String, reason: String },
    #[error("no clouds.yaml found (searched {})", searched.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "))]
    CloudsYamlNotFound { searched: Vec<PathBuf> },
}

/// An unknown key or section: worth a warning, not a failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigWarning {
    pub file: PathBuf,
    pub line: usize,
    pub section: String,
    pub key: Option<String>,
}

impl fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.key {
            Some(k) => write!(
                f,
                "{}:{}: unknown key {k:?} in [{}], ignored",
                self.file.display(),
                self.line,
                self.section
            ),
            None => write!(
                f,
                "{}:{}: unknown section [{}], ignored",
                self.file.display(),
                self.line,
                self.section
            ),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DomainRef {
    Id(String),
    Name(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UserRef {
    Id(String),
    Name { name: String, domain: DomainRef },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProjectRef {
    Id(String),
    Name { name: String, domain: DomainRef },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthMethod {
    Password {
        user: UserRef,
        password: SecretString,
    },
    ApplicationCredentialId {
        id: String,
        secret: SecretString,
    },
    ApplicationCredentialName {
        name: String,
        user: UserRef,
        secret: SecretString,
    },
    Token {
        token: SecretString,
    },
}

impl AuthMethod {
    pub fn kind(&self) -> &'static str {
        match self {
            AuthMethod::Password { .. } => "password",
            AuthMethod::ApplicationCredentialId { .. }
            | AuthMethod::ApplicationCredentialName { .. } => "application credential",
            AuthMethod::Token { .. } => "token",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    Project(ProjectRef),
    Trust(String),
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    pub ca_file: Option<PathBuf>,
    /// CA certificates given as PEM text rather than a file (upstream's
    /// `os-certAuthority` CSI secret key).
    pub ca_pem: Option<String>,
    pub insecure: bool,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// A client certificate and key given as PEM text (read by the
    /// plugin from a Secret's `os-clientCertPath`/`os-clientKeyPath`).
    pub cert_pem: Option<String>,
    pub key_pem: Option<SecretString>,
}

/// Everything needed to open a Keystone session against one cloud.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudConfig {
    /// `""` for `[Global]`, else the subsection or clouds.yaml name.
    pub name: String,
    pub auth_url: Url,
    pub auth: AuthMethod,
    /// None for application credentials (they carry their own scope).
    pub scope: Option<Scope>,
    pub region: Option<String>,
    pub interface: Interface,
    pub tls: TlsOptions,
    pub endpoint_overrides: BTreeMap<ServiceType, Url>,
}

/// `[BlockStorage]`
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockStorageOptions {
    pub node_volume_attach_limit: Option<i64>,
    pub rescan_on_resize: bool,
    pub ignore_volume_az: bool,
    pub ignore_volume_microversion: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetadataSource {
    ConfigDrive,
    MetadataService,
}

/// `[Metadata]`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataOptions {
    pub search_order: Vec<MetadataSource>,
    pub request_timeout: Option<Duration>,
}

impl Default for MetadataOptions {
    fn default() -> Self {
        Self {
            search_order: vec![MetadataSource::ConfigDrive, MetadataSource::MetadataService],
            request_timeout: None,
        }
    }
}

/// `[KeyManager]`
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyManagerOptions {
    pub key_id: Option<String>,
    /// `decrypt-key-ids`: Barbican secrets Decrypt may use besides the
    /// current key (staged before a rotation, kept until migration).
    pub decrypt_key_ids: Vec<String>,
    /// `retired-key-ids`: Barbican secrets Decrypt must no longer use,
    /// forgotten by the plugin's key record.
    pub retired_key_ids: Vec<String>,
}

/// Where clouds.yaml is looked for, and the process environment that
/// selects a cloud. Tests build one by hand; binaries use `from_process`.
#[derive(Debug, Clone, Default)]
pub struct ConfigEnv {
    pub clouds_yaml: CloudsYamlSearch,
    /// `OS_CLOUD`
    pub os_cloud: Option<String>,
    /// Where files a request's Secret names may be read from (see
    /// [`secret_files`]); empty: nowhere.
    pub secret_file_dirs: Vec<PathBuf>,
}

impl ConfigEnv {
    pub fn from_process() -> Self {
        Self {
            clouds_yaml: CloudsYamlSearch::from_process(),
            os_cloud: std::env::var("OS_CLOUD").ok().filter(|s| !s.is_empty()),
            secret_file_dirs: secret_files::default_dirs(),
        }
    }
}

/// A parsed cloud.conf (one or more files merged, later wins).
#[derive(Debug, Clone, Default)]
pub struct CloudConf {
    document: gcfg::Document,
    env: ConfigEnv,
    /// The INI files read, in order.
    files: Vec<PathBuf>,
    pub block_storage: BlockStorageOptions,
    pub metadata: MetadataOptions,
    pub key_manager: KeyManagerOptions,
    pub warnings: Vec<ConfigWarning>,
}

const GLOBAL_KEYS: &[&str] = &[
    "auth-url",
    "username",
    "user-id",
    "password",
    "tenant-id",
    "tenant-name",
    "project-id",
    "project-name",
    "tenant-domain-id",
    "tenant-domain-name",
    "project-domain-id",
    "project-domain-name",
    "user-domain-id",
    "user-domain-name",
    "domain-id",
    "domain-name",
    "region",
    "os-endpoint-type",
    "ca-file",
    "tls-insecure",
    "cert-file",
    "key-file",
    "trust-id",
    "trustee-id",
    "trustee-password",
    "application-credential-id",
    "application-credential-name",
    "application-credential-secret",
    "token",
    "use-clouds",
    "clouds-file",
    "cloud",
];
const BLOCK_STORAGE_KEYS: &[&str] = &[
    "node-volume-attach-limit",
    "rescan-on-resize",
    "ignore-volume-az",
    "ignore-volume-microversion",
];
const METADATA_KEYS: &[&str] = &["search-order", "request-timeout"];
const KEY_MANAGER_KEYS: &[&str] = &["key-id", "decrypt-key-ids", "retired-key-ids"];
/// Every section and key this parser reads (the README's configuration
/// reference is checked against it); `[Global "name"]` sections take the
/// `[Global]` keys.
pub const KNOWN_KEYS: &[(&str, &[&str])] = &[
    ("Global", GLOBAL_KEYS),
    ("BlockStorage", BLOCK_STORAGE_KEYS),
    ("Metadata", METADATA_KEYS),
    ("KeyManager", KEY_MANAGER_KEYS),
];
/// Sections that belong to the cloud controller manager, which commonly
/// shares the file: accepted silently.
const FOREIGN_SECTIONS: &[&str] = &["loadbalancer", "loadbalancerclass", "networking", "route"];

impl CloudConf {
    /// Reads and merges the given files in order.
    pub fn load(paths: &[PathBuf], env: ConfigEnv) -> Result<Self, ConfigError> {
        if paths.is_empty() {
            return Err(ConfigError::NoFiles);
        }
        let mut texts = Vec::with_capacity(paths.len());
        for p in paths {
            let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Io {
                path: p.clone(),
                source,
            })?;
            texts.push((p.clone(), text));
        }
        Self::from_texts(&texts, env)
    }

    /// Parses file contents already read (tests, fuzzing).
    pub fn from_texts(files: &[(PathBuf, String)], env: ConfigEnv) -> Result<Self, ConfigError> {
        let mut document = gcfg::Document::default();
        for (path, text) in files {
            if text.trim().is_empty() {
                return Err(ConfigError::Empty { path: path.clone() });
            }
            document.parse_into(path, text)?;
        }
        let mut conf = CloudConf {
            document,
            env,
            files: files.iter().map(|(p, _)| p.clone()).collect(),
            ..Default::default()
        };
        conf.check_known()?;
        Ok(conf)
    }

    /// Every file the configuration comes from or may come from, for a
    /// watcher: the INI files, and for sections with `use-clouds` the
    /// clouds.yaml and secure.yaml candidates (one that appears later
    /// counts as a change too).
    pub fn watched_files(&self) -> Vec<PathBuf> {
        let mut out = self.files.clone();
        let uses_clouds = self.document.sections.iter().any(|s| {
            s.name == "global"
                && s.get("use-clouds")
                    .is_some_and(|e| e.value.trim().eq_ignore_ascii_case("true"))
        });
        if uses_clouds {
            for s in &self.document.sections {
                if let Some(e) = s.get("clouds-file") {
                    let p = PathBuf::from(e.value.trim());
                    if let Some(dir) = p.parent() {
                        out.push(dir.join("secure.yaml"));
                    }
                    out.push(p);
                }
            }
            out.extend(self.env.clouds_yaml.candidates_all());
        }
        out.sort();
        out.dedup();
        out
    }

    fn check_known(&mut self) -> Result<(), ConfigError> {
        let mut warnings = Vec::new();
        for s in &self.document.sections {
            let known: &[&str] = match s.name.as_str() {
                "global" => GLOBAL_KEYS,
                "blockstorage" => BLOCK_STORAGE_KEYS,
                "metadata" => METADATA_KEYS,
                "keymanager" => KEY_MANAGER_KEYS,
                n if FOREIGN_SECTIONS.contains(&n) => continue,
                _ => {
                    warnings.push(ConfigWarning {
                        file: s.file.clone(),
                        line: s.line,
                        section: display_section(s),
                        key: None,
                    });
                    continue;
                }
            };
            for e in &s.entries {
                if !known.contains(&e.key.as_str()) {
                    warnings.push(ConfigWarning {
                        file: e.file.clone(),
                        line: e.line,
                        section: display_section(s),
                        key: Some(e.key.clone()),
                    });
                }
            }
            // type-check values of every Global section now, so a bad
            // boolean fails at start-up rather than on first use
            if s.name == "global" {
                for key in ["tls-insecure", "use-clouds"] {
                    if let Some(e) = s.get(key) {
                        parse_bool(s, e)?;
                    }
                }
                if let Some(e) = s.get("os-endpoint-type") {
                    e.value.parse::<Interface>().map_err(|m| invalid(s, e, m))?;
                }
                if let Some(e) = s.get("auth-url") {
                    parse_auth_url(&e.value).map_err(|m| invalid(s, e, m))?;
                }
            }
        }
        self.warnings = warnings;
        for w in &self.warnings {
            tracing::warn!("{w}");
        }
        if let Some(s) = self.document.section("blockstorage", None) {
            let mut bs = BlockStorageOptions::default();
            if let Some(e) = s.get("node-volume-attach-limit") {
                bs.node_volume_attach_limit = Some(
                    e.value
                        .trim()
                        .parse::<i64>()
                        .map_err(|_| invalid(s, e, "not an integer".into()))?,
                );
            }
            bs.rescan_on_resize = opt_bool(s, "rescan-on-resize")?;
            bs.ignore_volume_az = opt_bool(s, "ignore-volume-az")?;
            bs.ignore_volume_microversion = opt_bool(s, "ignore-volume-microversion")?;
            self.block_storage = bs;
        }
        if let Some(s) = self.document.section("metadata", None) {
            let mut md = MetadataOptions::default();
            if let Some(e) = s.get("search-order") {
                md.search_order = parse_search_order(&e.value).map_err(|m| invalid(s, e, m))?;
            }
            if let Some(e) = s.get("request-timeout") {
                md.request_timeout =
                    Some(parse_go_duration(&e.value).map_err(|m| invalid(s, e, m))?);
            }
            self.metadata = md;
        }
        if let Some(s) = self.document.section("keymanager", None) {
            self.key_manager.key_id = s
                .get("key-id")
                .map(|e| e.value.trim().to_string())
                .filter(|v| !v.is_empty());
            let list = |key: &str| -> Vec<String> {
                s.get(key)
                    .map(|e| {
                        e.value
                            .split([',', ' ', '\t'])
                            .map(str::trim)
                            .filter(|v| !v.is_empty())
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default()
            };
            self.key_manager.decrypt_key_ids = list("decrypt-key-ids");
            self.key_manager.retired_key_ids = list("retired-key-ids");
        }
        Ok(())
    }

    /// Names of the clouds defined by `[Global]` (`""`) and
    /// `[Global "name"]` sections.
    pub fn cloud_names(&self) -> Vec<String> {
        self.document
            .sections_named("global")
            .map(|s| s.subsection.clone().unwrap_or_default())
            .collect()
    }

    /// The secrets this configuration holds, each as `[Global] key` (never
    /// its value): what a plugin that calls no OpenStack API should not
    /// be given.
    pub fn secret_keys(&self) -> Vec<String> {
        const SECRETS: &[&str] = &[
            "password",
            "application-credential-secret",
            "token",
            "trustee-password",
        ];
        self.document
            .sections_named("global")
            .flat_map(|s| {
                SECRETS
                    .iter()
                    .filter(|k| s.get(k).is_some_and(|e| !e.value.trim().is_empty()))
                    .map(move |k| format!("[{}] {k}", display_section(s)))
            })
            .collect()
    }

    /// Resolves the credentials of one cloud: `""` is `[Global]`.
    pub fn cloud(&self, name: &str) -> Result<CloudConfig, ConfigError> {
        let sub = if name.is_empty() { None } else { Some(name) };
        let section =
            self.document
                .section("global", sub)
                .ok_or_else(|| ConfigError::UnknownCloud {
                    name: name.to_string(),
                    available: self
                        .cloud_names()
                        .into_iter()
                        .map(|n| if n.is_empty() { "[Global]".into() } else { n })
                        .collect(),
                })?;
        let mut inputs = AuthInputs::default();
        if opt_bool(section, "use-clouds")? {
            let clouds_file = section
                .get("clouds-file")
                .map(|e| PathBuf::from(e.value.trim()));
            let cloud = section
                .get("cloud")
                .map(|e| e.value.clone())
                .or_else(|| self.env.os_cloud.clone())
                .ok_or_else(|| ConfigError::MissingKey {
                    section: display_section(section),
                    key: "cloud".into(),
                    hint: Some(
                        "use-clouds = true needs the clouds.yaml entry to use, or OS_CLOUD".into(),
                    ),
                })?;
            inputs =
                clouds_yaml::load_cloud(&self.env.clouds_yaml, clouds_file.as_deref(), &cloud)?;
        }
        // explicit INI values win over clouds.yaml
        inputs.overlay_ini(section);
        inputs.resolve(name, &display_section(section))
    }
}

fn display_section(s: &gcfg::Section) -> String {
    let canonical = match s.name.as_str() {
        "global" => "Global",
        "blockstorage" => "BlockStorage",
        "metadata" => "Metadata",
        "keymanager" => "KeyManager",
        _ => s.written_name.as_str(),
    };
    match &s.subsection {
        Some(sub) => format!("{canonical} \"{sub}\""),
        None => canonical.to_string(),
    }
}

fn invalid(s: &gcfg::Section, e: &gcfg::Entry, message: String) -> ConfigError {
    ConfigError::InvalidValue {
        file: e.file.clone(),
        line: e.line,
        section: display_section(s),
        key: e.key.clone(),
        message,
    }
}

fn parse_bool(s: &gcfg::Section, e: &gcfg::Entry) -> Result<bool, ConfigError> {
    match e.value.trim().to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" | "1" => Ok(true),
        "false" | "no" | "off" | "0" | "" => Ok(false),
        other => Err(invalid(
            s,
            e,
            format!("{other:?} is not a boolean (true/false)"),
        )),
    }
}

fn opt_bool(s: &gcfg::Section, key: &str) -> Result<bool, ConfigError> {
    s.get(key)
        .map(|e| parse_bool(s, e))
        .transpose()
        .map(|b| b.unwrap_or(false))
}

fn parse_auth_url(v: &str) -> Result<Url, String> {
    let url = Url::parse(v.trim()).map_err(|e| format!("{v:?} is not a URL: {e}"))?;
    match url.scheme() {
        "http" | "https" if url.host().is_some() => Ok(url),
        _ => Err(format!("{v:?} is not an http(s) URL")),
    }
}

fn parse_search_order(v: &str) -> Result<Vec<MetadataSource>, String> {
    let mut out = Vec::new();
    for item in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let src = match item {
            "configDrive" => MetadataSource::ConfigDrive,
            "metadataService" => MetadataSource::MetadataService,
            other => return Err(format!("{other:?} is not configDrive or metadataService")),
        };
        if out.contains(&src) {
            return Err(format!("{item} is listed twice"));
        }
        out.push(src);
    }
    if out.is_empty() {
        return Err("the search order is empty".into());
    }
    Ok(out)
}

/// Go's `time.ParseDuration` format (`90s`, `1m30s`, `500ms`).
pub fn parse_go_duration(v: &str) -> Result<Duration, String> {
    let s = v.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total = 0f64;
    let mut rest = s;
    if rest.is_empty() {
        return Err("empty duration".into());
    }
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("{s:?} lacks a unit"))?;
        let n: f64 = rest[..num_end]
            .parse()
            .map_err(|_| format!("{s:?} is not a duration"))?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let mult = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            u => return Err(format!("{s:?}: unknown unit {u:?}")),
        };
        total += n * mult;
        rest = &rest[unit_end..];
    }
    Ok(Duration::from_secs_f64(total))
}

/// Writes an upstream-style cloud.conf for the given password credentials
/// (used by the emulator and the test cloud to describe themselves).
pub fn render_cloud_conf(
    auth_url: &str,
    username: &str,
    password: &str,
    project: &str,
    domain: &str,
    region: &str,
) -> String {
    format!(
        "[Global]\nauth-url = {}\nusername = {}\npassword = {}\ntenant-name = {}\nuser-domain-name = {}\ntenant-domain-name = {}\nregion = {}\n",
        quote(auth_url),
        quote(username),
        quote(password),
        quote(project),
        quote(domain),
        quote(domain),
        quote(region)
    )
}

fn quote(v: &str) -> String {
    format!("\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\""))
}

/// Finds the first existing file among candidates.
pub(crate) fn first_existing(candidates: &[PathBuf]) -> Option<&Path> {
    candidates
        .iter()
        .map(PathBuf::as_path)
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests;
