//! Credentials given as key/value pairs, as upstream's Manila CSI driver
//! reads them from a Kubernetes Secret (`os-authURL`, `os-userName`,
//! `os-password`, ...): the same keys, mapped onto the same auth methods
//! a cloud.conf `[Global]` section resolves to.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::{AuthInputs, CloudConfig, ConfigEnv, ConfigError, clouds_yaml};
use crate::SecretString;

/// Every key this mapping reads. Other `os-*` keys are reported back as
/// unknown so that a typo does not go unnoticed.
pub const SECRET_KEYS: &[&str] = &[
    "os-authURL",
    "os-region",
    "os-userID",
    "os-userName",
    "os-password",
    "os-projectID",
    "os-projectName",
    "os-domainID",
    "os-domainName",
    "os-projectDomainID",
    "os-projectDomainName",
    "os-userDomainID",
    "os-userDomainName",
    "os-applicationCredentialID",
    "os-applicationCredentialName",
    "os-applicationCredentialSecret",
    "os-trustID",
    "os-trusteeID",
    "os-trusteePassword",
    "os-certAuthorityPath",
    "os-certAuthority",
    "os-TLSInsecure",
    "os-clientCertPath",
    "os-clientKeyPath",
    "os-endpointType",
    "os-useClouds",
    "os-cloudsFile",
    "os-cloud",
];

/// Whether a map holds credentials in this form (any `os-` key).
pub fn has_credentials(secrets: &BTreeMap<String, String>) -> bool {
    secrets.keys().any(|k| k.starts_with("os-"))
}

/// `os-*` keys this mapping does not know.
pub fn unknown_keys(secrets: &BTreeMap<String, String>) -> Vec<String> {
    secrets
        .keys()
        .filter(|k| k.starts_with("os-") && !SECRET_KEYS.contains(&k.as_str()))
        .cloned()
        .collect()
}

fn parse_bool(key: &str, v: &str) -> Result<bool, ConfigError> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" | "1" => Ok(true),
        "false" | "no" | "off" | "0" | "" => Ok(false),
        other => Err(ConfigError::InvalidValue {
            file: PathBuf::new(),
            line: 0,
            section: "CSI secrets".into(),
            key: key.into(),
            message: format!("{other:?} is not a boolean (true/false)"),
        }),
    }
}

/// Keys that choose where credentials are sent or how the server is
/// trusted: a Secret may not set them next to credentials it loads from a
/// plugin-side clouds.yaml, or it could send those to a server of its
/// choosing.
pub const ENDPOINT_KEYS: &[&str] = &[
    "os-authURL",
    "os-certAuthority",
    "os-certAuthorityPath",
    "os-TLSInsecure",
    "os-endpointType",
];

/// Keys naming a file the plugin reads.
pub const FILE_KEYS: &[&str] = &[
    "os-cloudsFile",
    "os-certAuthorityPath",
    "os-clientCertPath",
    "os-clientKeyPath",
];

fn refused(key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::SecretRefused {
        key: key.into(),
        reason: reason.into(),
    }
}

/// The text of a file a Secret names, read beneath the allowed
/// directories; one answer for every way it can fail.
fn secret_file(key: &str, value: &str, env: &ConfigEnv) -> Result<String, ConfigError> {
    super::secret_files::read(std::path::Path::new(value), &env.secret_file_dirs).ok_or_else(
        || {
            refused(
                key,
                format!(
                    "not a file the plugin reads for a Secret: it must be a regular file beneath {} (the plugin's --secret-file-dir)",
                    if env.secret_file_dirs.is_empty() {
                        "a directory the operator allows".to_string()
                    } else {
                        env.secret_file_dirs
                            .iter()
                            .map(|d| d.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                ),
            )
        },
    )
}

/// The clouds.yaml entry `cloud` for a Secret with `os-useClouds`: from
/// `os-cloudsFile` (read beneath the allowed directories) or from the
/// operator's usual places. Any failure is one sentence naming the key:
/// it never echoes the file, its parse errors or the clouds it defines.
fn secret_clouds_entry(
    cloud: &str,
    file: Option<&str>,
    env: &ConfigEnv,
) -> Result<AuthInputs, ConfigError> {
    let unusable = |_| refused("os-cloud", "not a usable cloud of the clouds.yaml");
    match file {
        Some(file) => {
            let text = secret_file("os-cloudsFile", file, env)?;
            let path = std::path::Path::new(file);
            let secure = path
                .parent()
                .map(|d| d.join("secure.yaml"))
                .and_then(|p| super::secret_files::read(&p, &env.secret_file_dirs).map(|t| (p, t)));
            clouds_yaml::inputs_from_texts(
                path,
                &text,
                secure.as_ref().map(|(p, t)| (p.as_path(), t.as_str())),
                cloud,
            )
            .map_err(unusable)
        }
        None => clouds_yaml::load_cloud(&env.clouds_yaml, None, cloud).map_err(unusable),
    }
}

/// Resolves credentials from CSI secrets. With `os-useClouds: "true"` the
/// clouds.yaml entry `os-cloud` (in `os-cloudsFile`, else the usual
/// places) is read first and the explicit keys win over it, as upstream
/// does, except the keys that say where credentials go
/// ([`ENDPOINT_KEYS`]): those are refused next to a plugin-side entry.
pub fn cloud_from_secrets(
    secrets: &BTreeMap<String, String>,
    env: &ConfigEnv,
) -> Result<CloudConfig, ConfigError> {
    let get = |k: &str| {
        secrets
            .get(k)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    let mut inputs = AuthInputs::default();
    if let Some(v) = get("os-useClouds")
        && parse_bool("os-useClouds", &v)?
    {
        let conflicting: Vec<&str> = ENDPOINT_KEYS
            .iter()
            .copied()
            .filter(|k| get(k).is_some())
            .collect();
        if !conflicting.is_empty() {
            return Err(refused(
                &conflicting.join(", "),
                "not allowed with os-useClouds: credentials from the plugin's clouds.yaml are used only with that file's own endpoint and CA",
            ));
        }
        let cloud = get("os-cloud")
            .or_else(|| env.os_cloud.clone())
            .ok_or_else(|| ConfigError::MissingKey {
                section: "CSI secrets".into(),
                key: "os-cloud".into(),
                hint: Some("os-useClouds needs the clouds.yaml entry to use".into()),
            })?;
        inputs = secret_clouds_entry(&cloud, get("os-cloudsFile").as_deref(), env)?;
    }
    let set = |slot: &mut Option<String>, key: &str| {
        if let Some(v) = get(key) {
            *slot = Some(v);
        }
    };
    set(&mut inputs.auth_url, "os-authURL");
    set(&mut inputs.region, "os-region");
    set(&mut inputs.user_id, "os-userID");
    set(&mut inputs.username, "os-userName");
    set(&mut inputs.project_id, "os-projectID");
    set(&mut inputs.project_name, "os-projectName");
    set(&mut inputs.domain_id, "os-domainID");
    set(&mut inputs.domain_name, "os-domainName");
    set(&mut inputs.project_domain_id, "os-projectDomainID");
    set(&mut inputs.project_domain_name, "os-projectDomainName");
    set(&mut inputs.user_domain_id, "os-userDomainID");
    set(&mut inputs.user_domain_name, "os-userDomainName");
    set(&mut inputs.app_cred_id, "os-applicationCredentialID");
    set(&mut inputs.app_cred_name, "os-applicationCredentialName");
    set(&mut inputs.trust_id, "os-trustID");
    set(&mut inputs.ca_pem, "os-certAuthority");
    set(&mut inputs.interface, "os-endpointType");
    // files a Secret names are read here, beneath the allowed
    // directories; the session gets their text, never the path
    if let Some(path) = get("os-certAuthorityPath") {
        let pem = secret_file("os-certAuthorityPath", &path, env)?;
        inputs.ca_pem = Some(match inputs.ca_pem.take() {
            Some(inline) => format!("{inline}\n{pem}"),
            None => pem,
        });
    }
    if let Some(path) = get("os-clientCertPath") {
        inputs.cert_pem = Some(secret_file("os-clientCertPath", &path, env)?);
    }
    if let Some(path) = get("os-clientKeyPath") {
        inputs.key_pem = Some(SecretString::new(secret_file(
            "os-clientKeyPath",
            &path,
            env,
        )?));
    }
    if let Some(v) = get("os-password") {
        inputs.password = Some(SecretString::new(v));
    }
    if let Some(v) = get("os-applicationCredentialSecret") {
        inputs.app_cred_secret = Some(SecretString::new(v));
    }
    if let Some(v) = get("os-TLSInsecure") {
        inputs.insecure = Some(parse_bool("os-TLSInsecure", &v)?);
    }
    // a trust is used by the trustee: its id and password stand in for
    // the user
    if inputs.trust_id.is_some() {
        if let Some(v) = get("os-trusteeID") {
            inputs.user_id = Some(v);
        }
        if let Some(v) = get("os-trusteePassword") {
            inputs.password = Some(SecretString::new(v));
        }
    }
    inputs
        .resolve("csi-secrets", "CSI secrets")
        .map_err(name_keys_as_secrets)
}

/// The shared resolution names cloud.conf keys; say the secret's key.
fn name_keys_as_secrets(e: ConfigError) -> ConfigError {
    let rename = |k: &str| -> String {
        match k {
            "auth-url" => "os-authURL",
            "username" => "os-userName",
            "password" => "os-password",
            "user-domain-name" => "os-userDomainName",
            "tenant-id" => "os-projectID",
            "tenant-domain-name" => "os-projectDomainName",
            "application-credential-id" => "os-applicationCredentialID",
            "application-credential-secret" => "os-applicationCredentialSecret",
            "os-endpoint-type" => "os-endpointType",
            "cert-file" => "os-clientCertPath",
            "key-file" => "os-clientKeyPath",
            other => other,
        }
        .to_string()
    };
    let hint_for = |k: &str| -> Option<String> {
        match k {
            "username" => Some("or os-userID".into()),
            "user-domain-name" => Some(
                "a user given by name needs os-userDomainName, os-userDomainID or os-domainName"
                    .into(),
            ),
            "tenant-id" => Some("or os-projectName: the project to scope the token to".into()),
            "tenant-domain-name" => {
                Some("a project given by name needs os-projectDomainName or os-domainName".into())
            }
            "application-credential-id" => Some("or os-applicationCredentialName".into()),
            _ => None,
        }
    };
    match e {
        ConfigError::MissingKey { section, key, hint } => ConfigError::MissingKey {
            section,
            hint: hint_for(&key).or(hint),
            key: rename(&key),
        },
        ConfigError::InvalidValue {
            file,
            line,
            section,
            key,
            message,
        } => ConfigError::InvalidValue {
            file,
            line,
            section,
            key: rename(&key),
            message,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{AuthMethod, DomainRef, ProjectRef, Scope, UserRef};

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn password_credentials_map_like_upstream() {
        let c = cloud_from_secrets(
            &map(&[
                ("os-authURL", "https://keystone.example/v3"),
                ("os-region", "RegionOne"),
                ("os-userName", "demo"),
                ("os-password", "pw"),
                ("os-projectName", "demo"),
                ("os-domainName", "Default"),
            ]),
            &ConfigEnv::default(),
        )
        .unwrap();
        assert_eq!(c.region.as_deref(), Some("RegionOne"));
        match &c.auth {
            AuthMethod::Password { user, password } => {
                assert_eq!(
                    user,
                    &UserRef::Name {
                        name: "demo".into(),
                        domain: DomainRef::Name("Default".into())
                    }
                );
                assert_eq!(password.expose(), "pw");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            c.scope,
            Some(Scope::Project(ProjectRef::Name {
                name: "demo".into(),
                domain: DomainRef::Name("Default".into())
            }))
        );
    }

    #[test]
    fn application_credentials_trusts_and_tls() {
        let c = cloud_from_secrets(
            &map(&[
                ("os-authURL", "https://keystone.example/v3"),
                ("os-applicationCredentialID", "ac"),
                ("os-applicationCredentialSecret", "s"),
                ("os-TLSInsecure", "true"),
                ("os-certAuthority", "-----BEGIN CERTIFICATE-----"),
            ]),
            &ConfigEnv::default(),
        )
        .unwrap();
        assert!(matches!(c.auth, AuthMethod::ApplicationCredentialId { .. }));
        assert!(c.tls.insecure);
        assert!(c.tls.ca_pem.is_some());
        let t = cloud_from_secrets(
            &map(&[
                ("os-authURL", "https://keystone.example/v3"),
                ("os-trustID", "t"),
                ("os-trusteeID", "trustee"),
                ("os-trusteePassword", "tp"),
            ]),
            &ConfigEnv::default(),
        )
        .unwrap();
        assert_eq!(t.scope, Some(Scope::Trust("t".into())));
        assert!(
            matches!(t.auth, AuthMethod::Password { user: UserRef::Id(ref u), .. } if u == "trustee")
        );
    }

    #[test]
    fn missing_and_bad_values_say_which_key() {
        let e = cloud_from_secrets(&map(&[("os-userName", "x")]), &ConfigEnv::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("os-authURL"), "{e}");
        let e = cloud_from_secrets(
            &map(&[("os-authURL", "https://k/v3"), ("os-TLSInsecure", "maybe")]),
            &ConfigEnv::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("os-TLSInsecure"), "{e}");
        assert_eq!(
            unknown_keys(&map(&[
                ("os-passwrod", "x"),
                ("os-password", "y"),
                ("cloud", "c")
            ])),
            vec!["os-passwrod".to_string()]
        );
    }
}
