//! The HTTP client's TLS: the system's roots, a CA file, a client
//! certificate, or (`tls-insecure`) any certificate with valid signatures.

use std::sync::Arc;

use crate::config::TlsOptions;
use crate::error::{Error, Result};

/// A rustls configuration with the ring provider and the system roots
/// (reqwest is built without a default provider, so every client must be
/// given one).
pub(crate) fn default_tls() -> Result<rustls::ClientConfig> {
    build_tls(&TlsOptions::default())
}

pub(super) fn build_tls(tls: &TlsOptions) -> Result<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string()))?;
    let builder = if tls.insecure {
        tracing::warn!("tls-insecure is set: server certificates are NOT verified");
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(insecure::AcceptAnyCertificate(provider)))
    } else {
        let mut roots = rustls::RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        roots.add_parsable_certificates(native.certs);
        let mut sources = Vec::new();
        if let Some(ca) = &tls.ca_file {
            let pem = std::fs::read(ca)
                .map_err(|e| Error::Tls(format!("cannot read ca-file {}: {e}", ca.display())))?;
            sources.push((format!("ca-file {}", ca.display()), pem));
        }
        if let Some(pem) = &tls.ca_pem {
            sources.push((
                "the CA certificate text".to_string(),
                pem.as_bytes().to_vec(),
            ));
        }
        for (what, pem) in sources {
            let certs: Vec<_> = rustls_pemfile::certs(&mut pem.as_slice())
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| Error::Tls(format!("{what}: {e}")))?;
            if certs.is_empty() {
                return Err(Error::Tls(format!("{what} holds no PEM certificate")));
            }
            for c in certs {
                roots
                    .add(c)
                    .map_err(|e| Error::Tls(format!("{what}: {e}")))?;
            }
        }
        builder.with_root_certificates(roots)
    };
    let client_pem = match (&tls.cert_pem, &tls.key_pem) {
        (Some(cert), Some(key)) => Some((
            "the client certificate".to_string(),
            cert.as_bytes().to_vec(),
            "the client key".to_string(),
            key.expose().as_bytes().to_vec(),
        )),
        _ => match (&tls.cert_file, &tls.key_file) {
            (Some(cert), Some(key)) => Some((
                format!("cert-file {}", cert.display()),
                std::fs::read(cert).map_err(|e| {
                    Error::Tls(format!("cannot read cert-file {}: {e}", cert.display()))
                })?,
                format!("key-file {}", key.display()),
                std::fs::read(key).map_err(|e| {
                    Error::Tls(format!("cannot read key-file {}: {e}", key.display()))
                })?,
            )),
            _ => None,
        },
    };
    match client_pem {
        Some((cert_what, cert_pem, key_what, key_pem)) => {
            let key_pem = zeroize::Zeroizing::new(key_pem);
            let chain: Vec<_> = rustls_pemfile::certs(&mut cert_pem.as_slice())
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| Error::Tls(format!("{cert_what}: {e}")))?;
            let key_der = rustls_pemfile::private_key(&mut key_pem.as_slice())
                .map_err(|e| Error::Tls(format!("{key_what}: {e}")))?
                .ok_or_else(|| Error::Tls(format!("{key_what} holds no private key")))?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|e| Error::Tls(format!("client certificate: {e}")))
        }
        None => Ok(builder.with_no_client_auth()),
    }
}

mod insecure {
    use std::sync::Arc;

    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::crypto::CryptoProvider;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{DigitallySignedStruct, SignatureScheme};

    /// `tls-insecure = true`: accepts any certificate but still checks that
    /// the handshake signatures are valid.
    #[derive(Debug)]
    pub struct AcceptAnyCertificate(pub Arc<CryptoProvider>);

    impl ServerCertVerifier for AcceptAnyCertificate {
        fn verify_server_cert(
            &self,
            _end_entity: &CertificateDer<'_>,
            _intermediates: &[CertificateDer<'_>],
            _server_name: &ServerName<'_>,
            _ocsp_response: &[u8],
            _now: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }
}
