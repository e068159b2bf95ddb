//! What the tests against a stand-in apiserver share.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use axum::Router;
use kube_api::{Client, Token};

/// Serves `app` on a loopback port; a client of it with a fixed token.
pub async fn client_of(app: Router) -> Client {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    Client::new(
        format!("http://{a}/").parse().unwrap(),
        None,
        Token::Fixed("t".into()),
    )
    .unwrap()
}
