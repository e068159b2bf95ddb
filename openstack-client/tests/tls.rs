//! TLS with rustls against a real TLS endpoint: a TLS-terminating proxy in
//! front of the emulator's Keystone, with certificates made for the test.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use openstack_client::config::{CloudConf, ConfigEnv};
use openstack_client::{Error, RetryPolicy, Session, SessionOptions};
use openstack_emulator::{Emulator, EmulatorConfig};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::{TcpListener, TcpStream};

struct Pki {
    dir: tempfile::TempDir,
    ca_pem: PathBuf,
    other_ca_pem: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    server_chain: Vec<CertificateDer<'static>>,
    server_key: PrivateKeyDer<'static>,
    ca_der: CertificateDer<'static>,
}

fn ca(name: &str) -> (rcgen::Certificate, KeyPair, CertificateParams) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let key = KeyPair::generate().unwrap();
    let cert = params.clone().self_signed(&key).unwrap();
    (cert, key, params)
}

fn pki() -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let (ca_cert, ca_key, ca_params) = ca("test CA");
    let issuer = Issuer::new(ca_params, ca_key);
    let server_key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&server_key, &issuer)
        .unwrap();
    let client_key = KeyPair::generate().unwrap();
    let mut cp = CertificateParams::new(Vec::<String>::new()).unwrap();
    cp.distinguished_name
        .push(rcgen::DnType::CommonName, "csi-client");
    let client = cp.signed_by(&client_key, &issuer).unwrap();
    let (other, _, _) = ca("someone else's CA");
    let write = |name: &str, text: String| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    Pki {
        ca_pem: write("ca.pem", ca_cert.pem()),
        other_ca_pem: write("other-ca.pem", other.pem()),
        client_cert: write("client.pem", client.pem()),
        client_key: write("client-key.pem", client_key.serialize_pem()),
        server_chain: vec![server.der().clone()],
        server_key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der())),
        ca_der: ca_cert.der().clone(),
        dir,
    }
}

/// Terminates TLS on a free port and forwards the bytes to `backend`.
async fn tls_proxy(pki: &Pki, backend: std::net::SocketAddr, require_client_cert: bool) -> u16 {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = if require_client_cert {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(pki.ca_der.clone()).unwrap();
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .unwrap();
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let config = builder
        .with_single_cert(pki.server_chain.clone(), pki.server_key.clone_key())
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let Ok(mut up) = TcpStream::connect(backend).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
            });
        }
    });
    port
}

fn session(emu: &Emulator, port: u16, extra: &str) -> Session {
    let text = emu.cloud_conf().replace(
        &emu.url().to_string(),
        &format!("https://localhost:{port}/"),
    ) + "";
    // extra keys go into [Global]
    let text = text.replacen("[Global]\n", &format!("[Global]\n{extra}"), 1);
    let conf =
        CloudConf::from_texts(&[(PathBuf::from("tls.conf"), text)], ConfigEnv::default()).unwrap();
    Session::new(
        conf.cloud("").unwrap(),
        SessionOptions {
            retry: RetryPolicy {
                min_delay: Duration::from_millis(5),
                max_delay: Duration::from_millis(10),
                max_attempts: 1,
            },
            default_timeout: Duration::from_secs(10),
            ..Default::default()
        },
    )
    .unwrap()
}

fn key(name: &str, p: &Path) -> String {
    format!("{name} = \"{}\"\n", p.display())
}

async fn backend() -> (Emulator, std::net::SocketAddr) {
    let emu = Emulator::start(EmulatorConfig::default()).await.unwrap();
    let addr = format!(
        "{}:{}",
        emu.url().host_str().unwrap(),
        emu.url().port().unwrap()
    )
    .parse()
    .unwrap();
    (emu, addr)
}

#[tokio::test]
async fn verifies_the_server_against_the_configured_ca() {
    let pki = pki();
    let (emu, addr) = backend().await;
    let port = tls_proxy(&pki, addr, false).await;

    session(&emu, port, &key("ca-file", &pki.ca_pem))
        .authenticate()
        .await
        .unwrap();

    // a CA that did not sign the server: refused, with the reason
    let err = session(&emu, port, &key("ca-file", &pki.other_ca_pem))
        .authenticate()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unavailable(_)), "{err}");
    assert!(
        err.to_string().to_lowercase().contains("certificate"),
        "{err}"
    );

    // no ca-file: the system roots do not know the test CA
    let err = session(&emu, port, "").authenticate().await.unwrap_err();
    assert!(
        err.to_string().to_lowercase().contains("certificate"),
        "{err}"
    );

    // tls-insecure accepts it (and says so in the log)
    session(&emu, port, "tls-insecure = true\n")
        .authenticate()
        .await
        .unwrap();
    drop(pki.dir);
}

#[tokio::test]
async fn presents_a_client_certificate_when_configured() {
    let pki = pki();
    let (emu, addr) = backend().await;
    let port = tls_proxy(&pki, addr, true).await;
    let with_cert = format!(
        "{}{}{}",
        key("ca-file", &pki.ca_pem),
        key("cert-file", &pki.client_cert),
        key("key-file", &pki.client_key)
    );
    session(&emu, port, &with_cert)
        .authenticate()
        .await
        .unwrap();
    let err = session(&emu, port, &key("ca-file", &pki.ca_pem))
        .authenticate()
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Unavailable(_)),
        "without a client certificate: {err}"
    );
}

#[tokio::test]
async fn unusable_tls_files_are_clear_errors() {
    let pki = pki();
    let (emu, _) = backend().await;
    let build = |extra: &str| {
        let text = emu
            .cloud_conf()
            .replacen("[Global]\n", &format!("[Global]\n{extra}"), 1);
        let conf =
            CloudConf::from_texts(&[(PathBuf::from("c"), text)], ConfigEnv::default()).unwrap();
        Session::new(conf.cloud("").unwrap(), SessionOptions::default()).map(|_| ())
    };
    let err = build("ca-file = /nonexistent/ca.pem\n").unwrap_err();
    assert!(
        matches!(err, Error::Tls(_)) && err.to_string().contains("/nonexistent/ca.pem"),
        "{err}"
    );
    let not_pem = pki.dir.path().join("garbage.pem");
    std::fs::write(&not_pem, "not a certificate").unwrap();
    let err = build(&key("ca-file", &not_pem)).unwrap_err();
    assert!(
        err.to_string().contains("holds no PEM certificate"),
        "{err}"
    );
    let err = build(&format!(
        "{}{}",
        key("cert-file", &pki.client_cert),
        key("key-file", &not_pem)
    ))
    .unwrap_err();
    assert!(err.to_string().contains("holds no private key"), "{err}");
}
