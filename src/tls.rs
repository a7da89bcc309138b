//! TLS: to HTTPS upstreams (system or webpki roots, a private CA, a client certificate for
//! mTLS to the provider) and, optionally, on the listener.
//!
//! Everything here runs at start-up, from the configuration, so a missing or broken
//! certificate stops the proxy with the key named instead of failing the first request.

use std::path::Path;
use std::sync::Arc;

use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Where trust in upstream certificates comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Roots {
    /// Mozilla's roots, compiled in: the same everywhere, no files needed.
    Webpki,
    /// The operating system's certificate store.
    System,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{} is not a PEM certificate file: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{} holds no certificate", path.display()));
    }
    Ok(certs)
}

fn key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_file(path)
        .map_err(|e| format!("cannot read a PEM private key from {}: {e}", path.display()))
}

/// The TLS client configuration for upstream connections.
pub fn client_config(
    roots: Roots,
    ca_file: Option<&Path>,
    client_auth: Option<(&Path, &Path)>,
) -> Result<Arc<ClientConfig>, String> {
    let mut store = RootCertStore::empty();
    match roots {
        Roots::Webpki => store.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        Roots::System => {
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                let _ = store.add(cert);
            }
            if store.is_empty() {
                return Err("no usable certificate in the system store".into());
            }
        }
    }
    if let Some(ca) = ca_file {
        for cert in certs(ca)? {
            store
                .add(cert)
                .map_err(|e| format!("{}: {e}", ca.display()))?;
        }
    }
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(store);
    // No ALPN here: the connector sets it from the protocols it enables (HTTP/1.1).
    let config = match client_auth {
        Some((cert, key_file)) => builder
            .with_client_auth_cert(certs(cert)?, key(key_file)?)
            .map_err(|e| format!("client certificate: {e}"))?,
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// The TLS server configuration for the listener; offers HTTP/2 and HTTP/1.1 by ALPN.
pub fn server_config(cert: &Path, key_file: &Path) -> Result<Arc<ServerConfig>, String> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs(cert)?, key(key_file)?)
        .map_err(|e| format!("certificate and key: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// How a PostgreSQL server's certificate is checked (libpq's `sslmode` decides which).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PgCheck {
    /// Not at all: the connection is encrypted, but anyone in between can answer.
    Nothing,
    /// The chain to a trusted root, not the host name (`verify-ca`).
    Chain,
    /// The chain and the host name (`verify-full`).
    Full,
}

/// Where trust in a PostgreSQL server's certificate comes from.
#[derive(Debug, Clone, Copy)]
pub enum PgRoots<'a> {
    /// A PEM file of trust anchors (`sslrootcert=FILE`).
    File(&'a Path),
    /// The operating system's store (`sslrootcert=system`).
    System,
}

/// The TLS client configuration for PostgreSQL connections.
pub fn postgres_client_config(
    check: PgCheck,
    roots: Option<PgRoots<'_>>,
    client_auth: Option<(&Path, &Path)>,
) -> Result<Arc<ClientConfig>, String> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match (check, roots) {
        (PgCheck::Nothing, _) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider()))),
        (_, None) => return Err("verifying the server needs trusted roots (sslrootcert)".into()),
        (check, Some(roots)) => {
            let mut store = RootCertStore::empty();
            match roots {
                PgRoots::File(file) => {
                    for cert in certs(file)? {
                        store
                            .add(cert)
                            .map_err(|e| format!("{}: {e}", file.display()))?;
                    }
                }
                PgRoots::System => {
                    for cert in rustls_native_certs::load_native_certs().certs {
                        let _ = store.add(cert);
                    }
                    if store.is_empty() {
                        return Err("no usable certificate in the system store".into());
                    }
                }
            }
            let webpki = rustls::client::WebPkiServerVerifier::builder_with_provider(
                Arc::new(store),
                provider(),
            )
            .build()
            .map_err(|e| e.to_string())?;
            let verifier: Arc<dyn ServerCertVerifier> = match check {
                PgCheck::Chain => Arc::new(ChainOnly(webpki)),
                PgCheck::Full | PgCheck::Nothing => webpki,
            };
            builder
                .dangerous()
                .with_custom_certificate_verifier(verifier)
        }
    };
    let config = match client_auth {
        Some((cert, key_file)) => builder
            .with_client_auth_cert(certs(cert)?, key(key_file)?)
            .map_err(|e| format!("client certificate: {e}"))?,
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls_pki_types::{ServerName, UnixTime};

/// `verify-ca`: the chain must lead to a trusted root; the name in it is not checked (the
/// certificate may name another host of the cluster, as libpq allows in this mode).
#[derive(Debug)]
struct ChainOnly(Arc<rustls::client::WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        use rustls::{CertificateError, Error};
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `require` (without `sslrootcert`) and `prefer`: any certificate is accepted, as libpq
/// does in these modes; the handshake's signatures are still checked.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
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
        signed_by_key_of(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
            false,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        signed_by_key_of(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
            true,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Checks a handshake signature against the public key of `cert`, read from the
/// certificate here rather than by webpki, which refuses X.509 v1 certificates (older
/// hand-made setups and Citus generate them) that libpq accepts under `require`.
fn signed_by_key_of(
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &DigitallySignedStruct,
    algorithms: &rustls::crypto::WebPkiSupportedAlgorithms,
    tls13: bool,
) -> Result<HandshakeSignatureValid, rustls::Error> {
    let unadvertised = || rustls::PeerMisbehaved::SignedHandshakeWithUnadvertisedSigScheme.into();
    // TLS 1.3 forbids PKCS#1 v1.5 and SHA-1 signatures in the handshake (RFC 8446 §4.2.3).
    use rustls::SignatureScheme as S;
    let legacy = matches!(
        dss.scheme,
        S::RSA_PKCS1_SHA1
            | S::ECDSA_SHA1_Legacy
            | S::RSA_PKCS1_SHA256
            | S::RSA_PKCS1_SHA384
            | S::RSA_PKCS1_SHA512
    );
    if tls13 && legacy {
        return Err(unadvertised());
    }
    let (key_algorithm, key) = public_key(cert).ok_or(rustls::Error::InvalidCertificate(
        rustls::CertificateError::BadEncoding,
    ))?;
    let candidates = algorithms
        .mapping
        .iter()
        .find(|(scheme, _)| *scheme == dss.scheme)
        .map(|(_, algs)| *algs)
        .ok_or_else(unadvertised)?;
    let matching = candidates
        .iter()
        .filter(|alg| alg.public_key_alg_id().as_ref() == key_algorithm);
    // TLS 1.3 names one algorithm per scheme: the first; TLS 1.2 may mean several.
    for alg in matching.take(if tls13 { 1 } else { usize::MAX }) {
        if alg.verify_signature(key, message, dss.signature()).is_ok() {
            return Ok(HandshakeSignatureValid::assertion());
        }
    }
    Err(rustls::Error::InvalidCertificate(
        rustls::CertificateError::BadSignature,
    ))
}

/// The subject public key of an X.509 certificate of any version (RFC 5280 §4.1; a v1
/// certificate has no version field): its algorithm identifier's contents and the key.
fn public_key(cert: &[u8]) -> Option<(&[u8], &[u8])> {
    let (0x30, certificate, _) = der(cert)? else {
        return None;
    };
    let (0x30, mut tbs, _) = der(certificate)? else {
        return None;
    };
    if let (0xa0, _, after) = der(tbs)? {
        tbs = after;
    }
    // serialNumber, signature, issuer, validity, subject.
    for _ in 0..5 {
        tbs = der(tbs)?.2;
    }
    let (0x30, spki, _) = der(tbs)? else {
        return None;
    };
    let (0x30, algorithm, rest) = der(spki)? else {
        return None;
    };
    let (0x03, [0, key @ ..], _) = der(rest)? else {
        return None;
    };
    Some((algorithm, key))
}

/// One DER element at the start of `input`: its tag, its contents, and what follows.
fn der(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |len, b| len << 8 | usize::from(*b));
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}
