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
