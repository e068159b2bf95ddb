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

/// Resolves credentials from CSI secrets. With `os-useClouds: "true"` the
/// clouds.yaml entry `os-cloud` (in `os-cloudsFile`, else the usual
/// places) is read first and the explicit keys win over it, as upstream
/// does.
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
        let cloud = get("os-cloud")
            .or_else(|| env.os_cloud.clone())
            .ok_or_else(|| ConfigError::MissingKey {
                section: "CSI secrets".into(),
                key: "os-cloud".into(),
                hint: Some("os-useClouds needs the clouds.yaml entry to use".into()),
            })?;
        let file = get("os-cloudsFile").map(PathBuf::from);
        inputs = clouds_yaml::load_cloud(&env.clouds_yaml, file.as_deref(), &cloud)?;
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
    set(&mut inputs.ca_file, "os-certAuthorityPath");
    set(&mut inputs.ca_pem, "os-certAuthority");
    set(&mut inputs.cert_file, "os-clientCertPath");
    set(&mut inputs.key_file, "os-clientKeyPath");
    set(&mut inputs.interface, "os-endpointType");
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
