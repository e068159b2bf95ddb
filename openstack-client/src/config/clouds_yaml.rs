//! clouds.yaml and secure.yaml, as openstacksdk reads them.

use std::path::{Path, PathBuf};

use serde_yaml::{Mapping, Value};

use super::{AuthInputs, CloudConfig, ConfigEnv, ConfigError, first_existing};
use crate::secret::SecretString;
use crate::service::ServiceType;

/// Where clouds.yaml and secure.yaml are looked for, in order:
/// `OS_CLIENT_CONFIG_FILE`, the current directory, `~/.config/openstack`,
/// `/etc/openstack`.
#[derive(Debug, Clone, Default)]
pub struct CloudsYamlSearch {
    pub explicit_file: Option<PathBuf>,
    pub explicit_secure_file: Option<PathBuf>,
    pub dirs: Vec<PathBuf>,
}

impl CloudsYamlSearch {
    pub fn from_process() -> Self {
        let mut dirs = Vec::new();
        if let Ok(cwd) = std::env::current_dir() {
            dirs.push(cwd);
        }
        if let Some(home) = std::env::var_os("HOME") {
            dirs.push(PathBuf::from(home).join(".config/openstack"));
        }
        dirs.push(PathBuf::from("/etc/openstack"));
        Self {
            explicit_file: std::env::var_os("OS_CLIENT_CONFIG_FILE").map(PathBuf::from),
            explicit_secure_file: std::env::var_os("OS_CLIENT_SECURE_FILE").map(PathBuf::from),
            dirs,
        }
    }

    /// Every place clouds.yaml or secure.yaml is looked for.
    pub fn candidates_all(&self) -> Vec<PathBuf> {
        let mut c = self.candidates("clouds.yaml", self.explicit_file.as_ref());
        c.extend(self.candidates("secure.yaml", self.explicit_secure_file.as_ref()));
        c
    }

    fn candidates(&self, file: &str, explicit: Option<&PathBuf>) -> Vec<PathBuf> {
        let mut c: Vec<PathBuf> = explicit.into_iter().cloned().collect();
        c.extend(self.dirs.iter().map(|d| d.join(file)));
        c
    }
}

/// Resolves cloud `cloud` from clouds.yaml alone (tools that take
/// `OS_CLOUD` rather than a cloud.conf).
pub fn cloud_from_clouds_yaml(
    env: &ConfigEnv,
    cloud: Option<&str>,
) -> Result<CloudConfig, ConfigError> {
    let name = cloud
        .map(str::to_string)
        .or_else(|| env.os_cloud.clone())
        .ok_or_else(|| ConfigError::MissingKey {
            section: "clouds.yaml".into(),
            key: "cloud".into(),
            hint: Some("set OS_CLOUD or name the cloud".into()),
        })?;
    let inputs = load_cloud(&env.clouds_yaml, None, &name)?;
    inputs.resolve(&name, &format!("clouds.yaml cloud {name:?}"))
}

pub(crate) fn load_cloud(
    search: &CloudsYamlSearch,
    file: Option<&Path>,
    cloud: &str,
) -> Result<AuthInputs, ConfigError> {
    let candidates = match file {
        Some(f) => vec![f.to_path_buf()],
        None => search.candidates("clouds.yaml", search.explicit_file.as_ref()),
    };
    let path = first_existing(&candidates)
        .ok_or_else(|| ConfigError::CloudsYamlNotFound {
            searched: candidates.clone(),
        })?
        .to_path_buf();
    let text = read_text(&path)?;
    // secure.yaml sits beside clouds.yaml or in the usual places
    let mut secure_candidates: Vec<PathBuf> = search.explicit_secure_file.iter().cloned().collect();
    if let Some(dir) = path.parent() {
        secure_candidates.push(dir.join("secure.yaml"));
    }
    secure_candidates.extend(search.dirs.iter().map(|d| d.join("secure.yaml")));
    let secure = match first_existing(&secure_candidates) {
        Some(p) => Some((p.to_path_buf(), read_text(p)?)),
        None => None,
    };
    inputs_from_texts(
        &path,
        &text,
        secure.as_ref().map(|(p, t)| (p.as_path(), t.as_str())),
        cloud,
    )
}

/// Cloud `cloud` of a clouds.yaml already read, with its secure.yaml
/// overlay.
pub(crate) fn inputs_from_texts(
    path: &Path,
    text: &str,
    secure: Option<(&Path, &str)>,
    cloud: &str,
) -> Result<AuthInputs, ConfigError> {
    let mut root = parse_yaml(path, text)?;
    if let Some((secure_path, secure_text)) = secure {
        let overlay = parse_yaml(secure_path, secure_text)?;
        merge(&mut root, overlay);
    }
    let yaml_err = |message: String| ConfigError::CloudsYaml {
        path: path.to_path_buf(),
        message,
    };
    let clouds = root
        .get("clouds")
        .and_then(Value::as_mapping)
        .ok_or_else(|| yaml_err("no `clouds:` mapping".into()))?;
    let entry = clouds
        .get(cloud)
        .and_then(Value::as_mapping)
        .ok_or_else(|| ConfigError::UnknownCloud {
            name: cloud.to_string(),
            available: clouds
                .keys()
                .filter_map(|k| k.as_str().map(str::to_string))
                .collect(),
        })?;
    inputs_from_entry(entry).map_err(yaml_err)
}

fn read_text(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn parse_yaml(path: &Path, text: &str) -> Result<Value, ConfigError> {
    if text.trim().is_empty() {
        return Err(ConfigError::Empty {
            path: path.to_path_buf(),
        });
    }
    serde_yaml::from_str(text).map_err(|e| ConfigError::CloudsYaml {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

fn merge(base: &mut Value, overlay: Value) {
    match (base, overlay) {
        (Value::Mapping(b), Value::Mapping(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(existing) => merge(existing, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, o) => *b = o,
    }
}

fn scalar(m: &Mapping, key: &str) -> Result<Option<String>, String> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Number(n)) => Ok(Some(n.to_string())),
        Some(Value::Bool(b)) => Ok(Some(b.to_string())),
        Some(_) => Err(format!("{key} must be a string")),
    }
}

fn inputs_from_entry(entry: &Mapping) -> Result<AuthInputs, String> {
    let empty = Mapping::new();
    let auth = match entry.get("auth") {
        Some(Value::Mapping(m)) => m,
        None => &empty,
        Some(_) => return Err("`auth` must be a mapping".into()),
    };
    let auth_type = scalar(entry, "auth_type")?.unwrap_or_else(|| "password".into());
    let mut i = AuthInputs {
        auth_url: scalar(auth, "auth_url")?,
        username: scalar(auth, "username")?,
        user_id: scalar(auth, "user_id")?,
        password: scalar(auth, "password")?.map(SecretString::new),
        project_id: scalar(auth, "project_id")?.or(scalar(auth, "tenant_id")?),
        project_name: scalar(auth, "project_name")?.or(scalar(auth, "tenant_name")?),
        project_domain_id: scalar(auth, "project_domain_id")?,
        project_domain_name: scalar(auth, "project_domain_name")?,
        user_domain_id: scalar(auth, "user_domain_id")?,
        user_domain_name: scalar(auth, "user_domain_name")?,
        domain_id: scalar(auth, "domain_id")?,
        domain_name: scalar(auth, "domain_name")?,
        region: scalar(entry, "region_name")?,
        interface: scalar(entry, "interface")?.or(scalar(entry, "endpoint_type")?),
        ca_file: scalar(entry, "cacert")?,
        cert_file: scalar(entry, "cert")?,
        key_file: scalar(entry, "key")?,
        trust_id: scalar(auth, "trust_id")?,
        app_cred_id: scalar(auth, "application_credential_id")?,
        app_cred_name: scalar(auth, "application_credential_name")?,
        app_cred_secret: scalar(auth, "application_credential_secret")?.map(SecretString::new),
        token: scalar(auth, "token")?.map(SecretString::new),
        ..Default::default()
    };
    match entry.get("verify") {
        None | Some(Value::Null) => {}
        Some(Value::Bool(b)) => i.insecure = Some(!b),
        Some(_) => return Err("verify must be true or false".into()),
    }
    match auth_type.as_str() {
        "password" | "v3password" => {}
        "v3applicationcredential" | "applicationcredential" | "v3token" | "token" => {}
        other => {
            return Err(format!(
                "auth_type {other:?} is not supported (password, v3applicationcredential, token)"
            ));
        }
    }
    for (k, v) in entry {
        let Some(k) = k.as_str() else { continue };
        if let Some(svc) = k.strip_suffix("_endpoint_override") {
            let svc: ServiceType = svc.parse()?;
            let url = v.as_str().ok_or_else(|| format!("{k} must be a string"))?;
            i.endpoint_overrides.insert(svc, url.to_string());
        }
    }
    Ok(i)
}
