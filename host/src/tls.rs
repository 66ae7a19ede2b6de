//! TLS files as every part of Berth reads them: PEM certificates and private keys (a key others
//! can read is refused: it is a credential, kept as a secret file is), the roots a client
//! trusts (the system's and an operator's CA file), and the API's server configuration
//! (`[http] tls_cert_file`, `tls_key_file`).

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The certificates of a PEM file (at least one).
pub fn pem_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{} holds no PEM certificate", path.display()));
    }
    Ok(certs)
}

/// The private key of a PEM file readable by its owner only.
pub fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?.permissions().mode();
    if mode & 0o077 != 0 {
        return Err(format!(
            "{} is readable by others (mode {:o}); chmod 600 it",
            path.display(),
            mode & 0o777
        ));
    }
    PrivateKeyDer::from_pem_file(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// A client's roots: the system's, and those of `ca_file`.
pub fn roots(ca_file: Option<&Path>) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    if let Some(ca) = ca_file {
        for cert in pem_certs(ca)? {
            roots.add(cert).map_err(|e| format!("{}: {e}", ca.display()))?;
        }
    }
    Ok(roots)
}

/// An HTTP client's extra roots (`ca_file`'s certificates, besides the system's).
pub fn with_ca_file(
    builder: reqwest::ClientBuilder,
    ca_file: Option<&Path>,
) -> Result<reqwest::ClientBuilder, String> {
    let Some(ca) = ca_file else { return Ok(builder) };
    let mut builder = builder;
    for cert in pem_certs(ca)? {
        let cert =
            reqwest::Certificate::from_der(cert.as_ref()).map_err(|e| format!("{}: {e}", ca.display()))?;
        builder = builder.add_root_certificate(cert);
    }
    Ok(builder)
}

/// A server's TLS configuration: its certificate chain (the server's own first) and key.
pub fn server_config(cert_file: &Path, key_file: &Path) -> Result<Arc<rustls::ServerConfig>, String> {
    let chain = pem_certs(cert_file)?;
    let key = private_key(key_file)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("{} and {}: {e}", cert_file.display(), key_file.display()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
