//! Barbican: secrets and orders, and bad input refused clearly.

use openstack_client::Error;
use openstack_client::barbican::{CreateSecret, KeyManager};
use zeroize::Zeroizing;

use crate::backend::*;
use crate::common::deadline;

#[tokio::test]
async fn barbican_secrets_and_orders() {
    let b = Backend::new().await;
    if !b.has("barbican", "barbican_secrets_and_orders") {
        return;
    }
    for user in [User::Admin, User::Member] {
        let km = KeyManager::new(b.session(user));
        let name = unique("contract-kek");
        let payload = Zeroizing::new((0u8..32).collect::<Vec<_>>());
        let id = km
            .create_secret(&CreateSecret {
                name: name.clone(),
                payload: Some(payload.clone()),
                algorithm: Some("aes".into()),
                bit_length: Some(256),
                mode: Some("gcm".into()),
                secret_type: "symmetric".into(),
            })
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
        let meta = km.get_secret(&id).await.unwrap();
        assert_eq!(meta.uuid(), id);
        assert_eq!(meta.name.as_deref(), Some(name.as_str()));
        assert_eq!(meta.status.as_deref(), Some("ACTIVE"));
        assert_eq!(meta.algorithm.as_deref(), Some("aes"));
        assert_eq!(meta.bit_length, Some(256));
        assert_eq!(meta.secret_type.as_deref(), Some("symmetric"));
        assert_eq!(
            *km.get_secret_payload(&id).await.unwrap(),
            *payload,
            "{}",
            b.name()
        );
        let listed = km.list_secrets(Some(&name), 10, 0).await.unwrap();
        assert_eq!(listed.len(), 1, "{}", b.name());
        assert_eq!(listed[0].uuid(), id);

        let order = km
            .create_key_order(&unique("contract-order"), "aes", 256, "cbc")
            .await
            .unwrap();
        let generated = km
            .wait_for_order(&order, deadline())
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
        assert_eq!(km.get_secret_payload(&generated).await.unwrap().len(), 32);
        assert_eq!(km.get_order(&order).await.unwrap().status, "ACTIVE");

        km.delete_secret(&id).await.unwrap();
        km.delete_secret(&generated).await.unwrap();
        let err = km.get_secret(&id).await.unwrap_err();
        assert!(err.is_not_found(), "{}: {err}", b.name());
        let err = km.get_secret_payload(&id).await.unwrap_err();
        assert!(err.is_not_found(), "{}: {err}", b.name());
        let err = km.delete_secret(&id).await.unwrap_err();
        assert!(err.is_not_found(), "{}: {err}", b.name());
    }
}

#[tokio::test]
async fn barbican_refuses_bad_input_clearly() {
    let b = Backend::new().await;
    if !b.has("barbican", "barbican_refuses_bad_input_clearly") {
        return;
    }
    let km = KeyManager::new(b.session(User::Admin));
    // an algorithm no plugin can generate: the order is accepted and fails
    let order = km
        .create_key_order("bad", "rot13", 256, "cbc")
        .await
        .unwrap();
    let err = km.wait_for_order(&order, deadline()).await.unwrap_err();
    assert!(
        matches!(&err, Error::ResourceFailed { status, .. } if status == "ERROR"),
        "{}: {err}",
        b.name()
    );
    assert!(
        err.to_string().contains("plugin not found"),
        "{}: {err}",
        b.name()
    );
    // an impossible AES key length is refused at once
    let err = km
        .create_key_order("bad", "aes", 100, "cbc")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::BadRequest(_)), "{}: {err}", b.name());
    // a secret id that is not a UUID, and one that does not exist
    let err = km
        .get_secret("00000000-0000-0000-0000-000000000000")
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{}: {err}", b.name());
    // a secret of another project is invisible
    let member = KeyManager::new(b.session(User::Member));
    let id = km
        .create_secret(&CreateSecret {
            name: unique("private"),
            payload: Some(Zeroizing::new(vec![1; 32])),
            secret_type: "opaque".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let err = member.get_secret_payload(&id).await.unwrap_err();
    assert!(
        err.is_not_found() || matches!(err, Error::Forbidden(_)),
        "{}: {err}",
        b.name()
    );
    km.delete_secret(&id).await.unwrap();
}
