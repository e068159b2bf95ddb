use std::path::PathBuf;

use proptest::prelude::*;

use super::*;

fn conf(text: &str) -> Result<CloudConf, ConfigError> {
    CloudConf::from_texts(
        &[(
            PathBuf::from("/etc/kubernetes/cloud.conf"),
            text.to_string(),
        )],
        ConfigEnv::default(),
    )
}

const PASSWORD_CONF: &str = r#"
[Global]
auth-url = "https://keystone.example.com:5000/v3"
username = csi
password = "p@ss;word#1"   ; the quoted ';' belongs to the password
user-domain-name = Default
tenant-name = k8s
tenant-domain-id = default
region = RegionOne
os-endpoint-type = internalURL
ca-file = /etc/ssl/ca.pem

[Global "region-two"]
auth-url = https://keystone.two:5000
application-credential-id = abc123
application-credential-secret = s3cret
region = RegionTwo

[BlockStorage]
node-volume-attach-limit = 25
rescan-on-resize = yes
ignore-volume-az = false

[Metadata]
search-order = metadataService,configDrive
request-timeout = 1m30s

[LoadBalancer]
use-octavia = true
"#;

#[test]
fn full_password_and_app_cred_config() {
    let c = conf(PASSWORD_CONF).unwrap();
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    let g = c.cloud("").unwrap();
    assert_eq!(g.auth_url.as_str(), "https://keystone.example.com:5000/v3");
    match &g.auth {
        AuthMethod::Password { user, password } => {
            assert_eq!(
                user,
                &UserRef::Name {
                    name: "csi".into(),
                    domain: DomainRef::Name("Default".into())
                }
            );
            assert_eq!(password.expose(), "p@ss;word#1");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        g.scope,
        Some(Scope::Project(ProjectRef::Name {
            name: "k8s".into(),
            domain: DomainRef::Id("default".into())
        }))
    );
    assert_eq!(g.interface, Interface::Internal);
    assert_eq!(g.region.as_deref(), Some("RegionOne"));
    assert_eq!(g.tls.ca_file, Some(PathBuf::from("/etc/ssl/ca.pem")));

    let two = c.cloud("region-two").unwrap();
    assert!(
        matches!(two.auth, AuthMethod::ApplicationCredentialId { ref id, .. } if id == "abc123")
    );
    assert_eq!(two.scope, None);
    assert_eq!(
        c.cloud_names(),
        vec!["".to_string(), "region-two".to_string()]
    );

    assert_eq!(c.block_storage.node_volume_attach_limit, Some(25));
    assert!(c.block_storage.rescan_on_resize);
    assert_eq!(
        c.metadata.search_order,
        vec![MetadataSource::MetadataService, MetadataSource::ConfigDrive]
    );
    assert_eq!(c.metadata.request_timeout, Some(Duration::from_secs(90)));
}

#[test]
fn secrets_never_in_debug_output() {
    let c = conf(PASSWORD_CONF).unwrap();
    let printed = format!(
        "{:?} {:?}",
        c.cloud("").unwrap(),
        c.cloud("region-two").unwrap()
    );
    assert!(!printed.contains("p@ss"), "{printed}");
    assert!(!printed.contains("s3cret"), "{printed}");
}

#[test]
fn error_table() {
    struct Case {
        name: &'static str,
        text: &'static str,
        cloud: &'static str,
        want: &'static str,
    }
    let cases = [
        Case {
            name: "missing auth-url",
            text: "[Global]\nusername=u\npassword=p\n",
            cloud: "",
            want: "[Global] lacks auth-url",
        },
        Case {
            name: "malformed url",
            text: "[Global]\nauth-url = not a url\nusername=u\n",
            cloud: "",
            want: "cloud.conf:2: [Global] auth-url: \"not a url\" is not a URL",
        },
        Case {
            name: "ftp url",
            text: "[Global]\nauth-url = ftp://x/\n",
            cloud: "",
            want: "is not an http(s) URL",
        },
        Case {
            name: "missing password",
            text: "[Global]\nauth-url=http://k/v3\nusername=u\nuser-domain-name=d\ntenant-id=p\n",
            cloud: "",
            want: "[Global] lacks password",
        },
        Case {
            name: "user without domain",
            text: "[Global]\nauth-url=http://k/v3\nusername=u\npassword=p\ntenant-id=p\n",
            cloud: "",
            want: "lacks user-domain-name",
        },
        Case {
            name: "no project",
            text: "[Global]\nauth-url=http://k/v3\nuser-id=u\npassword=p\n",
            cloud: "",
            want: "lacks tenant-id",
        },
        Case {
            name: "app cred without secret",
            text: "[Global]\nauth-url=http://k/v3\napplication-credential-id=x\n",
            cloud: "",
            want: "lacks application-credential-secret",
        },
        Case {
            name: "bad boolean",
            text: "[Global]\nauth-url=http://k/v3\ntls-insecure = maybe\n",
            cloud: "",
            want: "[Global] tls-insecure: \"maybe\" is not a boolean",
        },
        Case {
            name: "bad endpoint type",
            text: "[Global]\nauth-url=http://k/v3\nos-endpoint-type = private\n",
            cloud: "",
            want: "os-endpoint-type",
        },
        Case {
            name: "bad attach limit",
            text: "[BlockStorage]\nnode-volume-attach-limit = many\n",
            cloud: "",
            want: "[BlockStorage] node-volume-attach-limit: not an integer",
        },
        Case {
            name: "bad search order",
            text: "[Metadata]\nsearch-order = configDrive,cloudInit\n",
            cloud: "",
            want: "\"cloudInit\" is not configDrive or metadataService",
        },
        Case {
            name: "bad timeout",
            text: "[Metadata]\nrequest-timeout = 5 parsecs\n",
            cloud: "",
            want: "request-timeout",
        },
        Case {
            name: "unknown cloud",
            text: "[Global]\nauth-url=http://k/v3\n",
            cloud: "other",
            want: "cloud \"other\" is not defined (defined: [Global])",
        },
        Case {
            name: "syntax",
            text: "[Global]\npassword = \"unterminated\n",
            cloud: "",
            want: "cloud.conf:2: unterminated",
        },
        Case {
            name: "cert without key",
            text: "[Global]\nauth-url=http://k/v3\nuser-id=u\npassword=p\ntenant-id=t\ncert-file=/c.pem\n",
            cloud: "",
            want: "lacks key-file",
        },
    ];
    for c in cases {
        let err = conf(c.text)
            .and_then(|cc| cc.cloud(c.cloud))
            .expect_err(c.name);
        assert!(err.to_string().contains(c.want), "{}: got {err}", c.name);
    }
}

#[test]
fn empty_and_missing_files() {
    let err = CloudConf::from_texts(
        &[(PathBuf::from("/x/cloud.conf"), "  \n".into())],
        ConfigEnv::default(),
    )
    .unwrap_err();
    assert_eq!(err.to_string(), "/x/cloud.conf is empty");
    let err = CloudConf::load(
        &[PathBuf::from("/nonexistent/cloud.conf")],
        ConfigEnv::default(),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("cannot read /nonexistent/cloud.conf:"),
        "{err}"
    );
    assert!(matches!(
        CloudConf::load(&[], ConfigEnv::default()),
        Err(ConfigError::NoFiles)
    ));
}

#[test]
fn unknown_keys_and_sections_warn_with_location() {
    let c = conf("[Global]\nauth-url=http://k/v3\nbogus-key = 1\n[Mystery]\nx=1\n").unwrap();
    let w: Vec<String> = c.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(
        w,
        vec![
            "/etc/kubernetes/cloud.conf:3: unknown key \"bogus-key\" in [Global], ignored"
                .to_string(),
            "/etc/kubernetes/cloud.conf:4: unknown section [Mystery], ignored".to_string(),
        ]
    );
}

#[test]
fn later_files_win() {
    let c = CloudConf::from_texts(
        &[
            (
                PathBuf::from("a"),
                "[Global]\nauth-url=http://a/v3\nuser-id=u\npassword=old\ntenant-id=t\n".into(),
            ),
            (PathBuf::from("b"), "[Global]\npassword=new\n".into()),
        ],
        ConfigEnv::default(),
    )
    .unwrap();
    match c.cloud("").unwrap().auth {
        AuthMethod::Password { password, .. } => assert_eq!(password.expose(), "new"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn trust_and_token_auth() {
    let c =
        conf("[Global]\nauth-url=http://k/v3\ntrust-id=T1\ntrustee-id=U9\ntrustee-password=tp\n")
            .unwrap();
    let t = c.cloud("").unwrap();
    assert_eq!(t.scope, Some(Scope::Trust("T1".into())));
    assert!(matches!(t.auth, AuthMethod::Password { user: UserRef::Id(ref u), .. } if u == "U9"));

    let c = conf("[Global]\nauth-url=http://k/v3\ntoken=abc\ntenant-id=p1\n").unwrap();
    let t = c.cloud("").unwrap();
    assert_eq!(t.auth.kind(), "token");
    assert_eq!(t.scope, Some(Scope::Project(ProjectRef::Id("p1".into()))));
}

fn write(dir: &std::path::Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

const CLOUDS_YAML: &str = r#"
clouds:
  mycloud:
    auth:
      auth_url: http://yaml-keystone:5000/v3
      username: yamluser
      project_name: yamlproject
      user_domain_name: Default
      project_domain_name: Default
    region_name: YamlRegion
    interface: internal
    verify: false
    block_storage_endpoint_override: http://cinder.override:8776/v3/p
  other:
    auth:
      auth_url: http://other/v3
      application_credential_id: ac
      application_credential_secret: acs
    auth_type: v3applicationcredential
"#;

#[test]
fn clouds_yaml_with_secure_yaml_and_ini_precedence() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "clouds.yaml", CLOUDS_YAML);
    write(
        dir.path(),
        "secure.yaml",
        "clouds:\n  mycloud:\n    auth:\n      password: from-secure\n",
    );
    let env = ConfigEnv {
        clouds_yaml: CloudsYamlSearch {
            dirs: vec![dir.path().to_path_buf()],
            ..Default::default()
        },
        os_cloud: None,
        ..Default::default()
    };
    let c = CloudConf::from_texts(
        &[(
            PathBuf::from("cloud.conf"),
            "[Global]\nuse-clouds = true\ncloud = mycloud\nregion = IniRegion\n".into(),
        )],
        env.clone(),
    )
    .unwrap();
    let cfg = c.cloud("").unwrap();
    assert_eq!(cfg.auth_url.as_str(), "http://yaml-keystone:5000/v3");
    assert_eq!(
        cfg.region.as_deref(),
        Some("IniRegion"),
        "INI wins over clouds.yaml"
    );
    assert_eq!(cfg.interface, Interface::Internal);
    assert!(cfg.tls.insecure);
    match &cfg.auth {
        AuthMethod::Password { password, .. } => assert_eq!(password.expose(), "from-secure"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        cfg.endpoint_overrides
            .get(&ServiceType::BlockStorage)
            .map(Url::as_str),
        Some("http://cinder.override:8776/v3/p")
    );

    // OS_CLOUD selects when `cloud` is absent
    let env2 = ConfigEnv {
        os_cloud: Some("other".into()),
        ..env.clone()
    };
    let c = CloudConf::from_texts(
        &[(
            PathBuf::from("cloud.conf"),
            "[Global]\nuse-clouds = true\n".into(),
        )],
        env2,
    )
    .unwrap();
    assert!(matches!(
        c.cloud("").unwrap().auth,
        AuthMethod::ApplicationCredentialId { .. }
    ));

    // unknown cloud lists what exists
    let err = clouds_yaml::cloud_from_clouds_yaml(&env, Some("nope")).unwrap_err();
    assert!(
        err.to_string().contains("mycloud") && err.to_string().contains("other"),
        "{err}"
    );
}

#[test]
fn clouds_yaml_search_order_explicit_file_first() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    write(
        a.path(),
        "clouds.yaml",
        "clouds:\n  c:\n    auth: {auth_url: 'http://from-dir/v3', user_id: u, password: p, project_id: x}\n",
    );
    let explicit = write(
        b.path(),
        "mine.yaml",
        "clouds:\n  c:\n    auth: {auth_url: 'http://explicit/v3', user_id: u, password: p, project_id: x}\n",
    );
    let search = CloudsYamlSearch {
        explicit_file: Some(explicit),
        dirs: vec![a.path().to_path_buf()],
        ..Default::default()
    };
    let env = ConfigEnv {
        clouds_yaml: search,
        os_cloud: None,
        ..Default::default()
    };
    assert_eq!(
        clouds_yaml::cloud_from_clouds_yaml(&env, Some("c"))
            .unwrap()
            .auth_url
            .host_str(),
        Some("explicit")
    );

    let env = ConfigEnv {
        clouds_yaml: CloudsYamlSearch {
            dirs: vec![b.path().join("none")],
            ..Default::default()
        },
        os_cloud: None,
        ..Default::default()
    };
    let err = clouds_yaml::cloud_from_clouds_yaml(&env, Some("c")).unwrap_err();
    assert!(err.to_string().starts_with("no clouds.yaml found"), "{err}");
}

#[test]
fn malformed_clouds_yaml() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "clouds.yaml", "clouds: [not, a, map]\n");
    let env = ConfigEnv {
        clouds_yaml: CloudsYamlSearch {
            dirs: vec![dir.path().to_path_buf()],
            ..Default::default()
        },
        os_cloud: None,
        ..Default::default()
    };
    let err = clouds_yaml::cloud_from_clouds_yaml(&env, Some("x")).unwrap_err();
    assert!(err.to_string().contains("no `clouds:` mapping"), "{err}");
}

#[test]
fn go_durations() {
    assert_eq!(
        parse_go_duration("500ms").unwrap(),
        Duration::from_millis(500)
    );
    assert_eq!(
        parse_go_duration("1h2m3s").unwrap(),
        Duration::from_secs(3723)
    );
    assert!(parse_go_duration("10").is_err());
    assert!(parse_go_duration("").is_err());
}

#[test]
fn rendered_cloud_conf_round_trips() {
    let text = render_cloud_conf(
        "http://127.0.0.1:1/identity/v3",
        "admin",
        "pa\"ss;#",
        "admin",
        "Default",
        "RegionOne",
    );
    let c = conf(&text).unwrap();
    match c.cloud("").unwrap().auth {
        AuthMethod::Password { password, .. } => assert_eq!(password.expose(), "pa\"ss;#"),
        other => panic!("{other:?}"),
    }
}

proptest! {
    /// Any password survives quoting, including `;`, `#`, quotes and
    /// backslashes; the parser never panics on it.
    #[test]
    fn any_password_round_trips(pw in "[ -~]{0,40}") {
        let text = render_cloud_conf("http://k/v3", "u", &pw, "p", "d", "r");
        let c = conf(&text).unwrap();
        let cfg = c.cloud("");
        if pw.is_empty() {
            prop_assert!(cfg.is_err());
        } else {
            match cfg.unwrap().auth {
                AuthMethod::Password { password, .. } => prop_assert_eq!(password.expose(), pw.as_str()),
                other => prop_assert!(false, "{:?}", other),
            }
        }
    }

    /// Arbitrary bytes never panic the parser.
    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
        let _ = conf(&text).map(|c| c.cloud(""));
    }
}

#[test]
fn key_manager_lists_keys_decrypt_may_use_and_keys_retired() {
    let c = conf(
        "[KeyManager]\nkey-id = 11111111-1111-4111-8111-111111111111\n\
         decrypt-key-ids = 22222222-2222-4222-8222-222222222222, 33333333-3333-4333-8333-333333333333\n\
         retired-key-ids = 44444444-4444-4444-8444-444444444444\n",
    )
    .unwrap();
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    assert_eq!(
        c.key_manager.decrypt_key_ids,
        [
            "22222222-2222-4222-8222-222222222222",
            "33333333-3333-4333-8333-333333333333"
        ]
    );
    assert_eq!(
        c.key_manager.retired_key_ids,
        ["44444444-4444-4444-8444-444444444444"]
    );
    let none = conf("[KeyManager]\nkey-id = x\ndecrypt-key-ids =\n").unwrap();
    assert!(none.key_manager.decrypt_key_ids.is_empty());
    assert!(none.key_manager.retired_key_ids.is_empty());
}
