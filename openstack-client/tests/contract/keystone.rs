//! Keystone: scoped tokens and the catalog, application credentials
//! rotated, a wrong password refused.

use openstack_client::{Error, ServiceType, Session, SessionOptions};

use crate::backend::*;

#[tokio::test]
async fn keystone_scoped_tokens_and_catalog() {
    let b = Backend::new().await;
    for user in [User::Admin, User::Member] {
        let s = b.session(user);
        s.authenticate()
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
        assert!(s.project_id().await.unwrap().is_some());
        assert!(s.user_id().await.unwrap().is_some());
    }
    let admin = b.session(User::Admin);
    assert_ne!(
        admin.project_id().await.unwrap(),
        b.session(User::Member).project_id().await.unwrap()
    );
    for (service, ty) in [
        ("barbican", ServiceType::KeyManager),
        ("cinder", ServiceType::BlockStorage),
        ("nova", ServiceType::Compute),
        ("manila", ServiceType::SharedFileSystem),
    ] {
        if b.has(service, "catalog lookup") {
            let url = admin
                .endpoint(ty)
                .await
                .unwrap_or_else(|e| panic!("{service}: {e}"));
            assert!(url.host_str().is_some());
        }
    }
}

#[tokio::test]
async fn keystone_application_credentials_rotate() {
    let b = Backend::new().await;
    let admin = b.session(User::Admin);
    let identity = openstack_client::identity::Identity::new(admin.clone());
    let cred = identity
        .create_application_credential(&unique("contract-ac"))
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    // a session on it works, in the same project
    let mut cfg = admin.config();
    cfg.auth = openstack_client::config::AuthMethod::ApplicationCredentialId {
        id: cred.id.clone(),
        secret: cred.secret.clone(),
    };
    // an application credential is scoped already
    cfg.scope = None;
    let s = Session::new(cfg.clone(), SessionOptions::default()).unwrap();
    s.authenticate()
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
    assert_eq!(
        s.project_id().await.unwrap(),
        admin.project_id().await.unwrap()
    );
    // a restricted credential may not make more
    let err = openstack_client::identity::Identity::new(s.clone())
        .create_application_credential(&unique("contract-ac-2"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Forbidden(_)), "{}: {err}", b.name());
    identity
        .delete_application_credential(&cred.id)
        .await
        .unwrap();
    // gone: it authenticates no more
    let err = Session::new(cfg, SessionOptions::default())
        .unwrap()
        .authenticate()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unauthorized(_)), "{}: {err}", b.name());
    let err = identity
        .delete_application_credential(&cred.id)
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{}: {err}", b.name());
}

#[tokio::test]
async fn keystone_rejects_a_wrong_password() {
    let b = Backend::new().await;
    let mut cfg = b.session(User::Member).config();
    if let openstack_client::config::AuthMethod::Password { password, .. } = &mut cfg.auth {
        *password = openstack_client::SecretString::new("not-the-password");
    }
    let err = Session::new(cfg, SessionOptions::default())
        .unwrap()
        .authenticate()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unauthorized(_)), "{}: {err}", b.name());
    assert!(
        err.request_id().is_some() || matches!(b, Backend::Real { .. }),
        "{err}"
    );
}
