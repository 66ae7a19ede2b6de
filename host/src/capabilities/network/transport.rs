//! The host's side of a backend's connections: a pool (hyper's) of connections made by a
//! connector that resolves names itself, refuses addresses of this machine or the cloud's that
//! are not listed, and connects to the address it checked; TLS by rustls; the exchange bounded in
//! time and size.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as Pooled;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

use super::allow::{AllowList, is_internal};
use super::{Bounds, NetError, NetworkConfig};

pub(super) type Https = hyper_rustls::HttpsConnector<Connector>;

/// A backend's pooled HTTP client.
#[derive(Clone)]
pub(super) struct Client {
    pool: Pooled<Watching, Full<Bytes>>,
    endings: Endings,
}

/// How each host's last connection ended, when it ended with an error. hyper tells a request
/// whose connection died before the request could be written only that it was canceled; the
/// reason (in TLS 1.3 a refused client certificate arrives as an alert just after the handshake)
/// is the connection's, and is found here.
#[derive(Clone, Default)]
struct Endings(Arc<std::sync::Mutex<std::collections::HashMap<String, (Instant, NetError)>>>);

impl Endings {
    fn record(&self, authority: &str, error: NetError) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(authority.to_string(), (Instant::now(), error));
    }

    /// Why a connection to `authority` ended in the last few seconds, if one did.
    fn recent(&self, authority: &str) -> Option<NetError> {
        let endings = self.0.lock().unwrap_or_else(|p| p.into_inner());
        endings
            .get(authority)
            .filter(|(at, _)| at.elapsed() < Duration::from_secs(5))
            .map(|(_, error)| error.clone())
    }
}

/// The TLS connector, with each connection's read and write errors noted in [`Endings`].
#[derive(Clone)]
pub(super) struct Watching {
    https: Https,
    endings: Endings,
}

impl tower::Service<http::Uri> for Watching {
    type Response = Watched;
    type Error = <Https as tower::Service<http::Uri>>::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Watched, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.https.poll_ready(cx)
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let authority = uri.authority().map(|a| a.to_string()).unwrap_or_default();
        let endings = self.endings.clone();
        let connecting = self.https.call(uri);
        Box::pin(async move { Ok(Watched { inner: connecting.await?, authority, endings }) })
    }
}

/// A connection whose errors are noted for the requests it could not carry.
pub(super) struct Watched {
    inner: hyper_rustls::MaybeHttpsStream<TokioIo<TcpStream>>,
    authority: String,
    endings: Endings,
}

impl Watched {
    fn note<T>(&self, polled: Poll<std::io::Result<T>>) -> Poll<std::io::Result<T>> {
        if let Poll::Ready(Err(e)) = &polled {
            self.endings.record(&self.authority, classify(e));
        }
        polled
    }
}

impl hyper::rt::Read for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        self.note(polled)
    }
}

impl hyper::rt::Write for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.note(polled)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.note(polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.note(polled)
    }
}

impl hyper_util::client::legacy::connect::Connection for Watched {
    fn connected(&self) -> hyper_util::client::legacy::connect::Connected {
        self.inner.connected()
    }
}

/// Why the connector could not connect (found again in hyper's error chain).
#[derive(Debug, thiserror::Error)]
pub(super) enum ConnectError {
    #[error("{0}")]
    Prohibited(String),
    #[error("{0}")]
    Dns(String),
    #[error("{0}")]
    Refused(String),
    #[error("connect timeout")]
    Timeout,
}

/// Resolves and connects, refusing internal addresses that are not listed.
#[derive(Clone)]
pub(super) struct Connector {
    allow: Arc<AllowList>,
    resolve: Arc<std::collections::BTreeMap<String, IpAddr>>,
    timeout: Duration,
}

impl tower::Service<http::Uri> for Connector {
    type Response = TokioIo<TcpStream>;
    type Error = ConnectError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, ConnectError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let host =
                uri.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']').to_string();
            let port = uri.port_u16().unwrap_or(if uri.scheme_str() == Some("https") { 443 } else { 80 });
            let addrs: Vec<SocketAddr> = if let Ok(ip) = host.parse::<IpAddr>() {
                vec![SocketAddr::new(ip, port)]
            } else if let Some(ip) = this.resolve.get(&host.to_ascii_lowercase()) {
                vec![SocketAddr::new(*ip, port)]
            } else {
                tokio::time::timeout(this.timeout, tokio::net::lookup_host((host.as_str(), port)))
                    .await
                    .map_err(|_| ConnectError::Dns(format!("resolving {host} timed out")))?
                    .map_err(|e| ConnectError::Dns(format!("cannot resolve {host}: {e}")))?
                    .collect()
            };
            if addrs.is_empty() {
                return Err(ConnectError::Dns(format!("{host} has no address")));
            }
            // Every address must be acceptable: a name that also resolves inside is refused.
            if let Some(inside) =
                addrs.iter().find(|a| is_internal(a.ip()) && !this.allow.lists_address(a.ip()))
            {
                return Err(ConnectError::Prohibited(format!(
                    "{host} resolves to {}, an address of this machine or of the cloud's services, which is not \
                     itself in the backend's allowed_hosts",
                    inside.ip()
                )));
            }
            let deadline = tokio::time::Instant::now() + this.timeout;
            let mut last = None;
            for addr in addrs {
                match tokio::time::timeout_at(deadline, TcpStream::connect(addr)).await {
                    Ok(Ok(stream)) => {
                        let _ = stream.set_nodelay(true);
                        return Ok(TokioIo::new(stream));
                    }
                    Ok(Err(e)) => last = Some(format!("{addr}: {e}")),
                    Err(_) => return Err(ConnectError::Timeout),
                }
            }
            Err(ConnectError::Refused(last.unwrap_or_default()))
        })
    }
}

/// Accepts any server certificate (`insecure_skip_verify`).
#[derive(Debug)]
struct AcceptAny(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The TLS configuration of a backend.
fn tls(backend: &str, config: &NetworkConfig) -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("backend {backend}: TLS: {e}"))?;
    let builder = if config.insecure_skip_verify {
        builder.dangerous().with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
    } else {
        let roots = crate::tls::roots(config.ca_file.as_deref())
            .map_err(|e| format!("backend {backend}: ca_file: {e}"))?;
        builder.with_root_certificates(roots)
    };
    match (&config.client_cert_file, &config.client_key_file) {
        (Some(cert), Some(key)) => {
            let chain = crate::tls::pem_certs(cert)
                .map_err(|e| format!("backend {backend}: client_cert_file: {e}"))?;
            let key = crate::tls::private_key(key)
                .map_err(|e| format!("backend {backend}: client_key_file: {e}"))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("backend {backend}: client certificate: {e}"))
        }
        (None, None) => Ok(builder.with_no_client_auth()),
        _ => Err(format!("backend {backend}: give both client_cert_file and client_key_file, or neither")),
    }
}

/// A backend's client.
pub(super) fn client(
    backend: &str,
    config: &NetworkConfig,
    allow: Arc<AllowList>,
    bounds: Bounds,
) -> Result<Client, String> {
    let connector = Connector {
        allow,
        resolve: Arc::new(config.resolve.iter().map(|(k, v)| (k.to_ascii_lowercase(), *v)).collect()),
        timeout: bounds.connect,
    };
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls(backend, config)?)
        .https_or_http()
        .enable_http1()
        .wrap_connector(connector);
    let endings = Endings::default();
    let https = Watching { https, endings: endings.clone() };
    let pool = Pooled::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(32)
        .build(https);
    Ok(Client { pool, endings })
}

/// Whether hyper gave up on a request because its connection closed before it was sent.
fn canceled(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if s.downcast_ref::<hyper::Error>().is_some_and(hyper::Error::is_canceled) {
            return true;
        }
        source = s.source();
    }
    false
}

/// What a hyper error is, as the driver should see it.
fn classify(e: &(dyn std::error::Error + 'static)) -> NetError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(c) = s.downcast_ref::<ConnectError>() {
            return match c {
                ConnectError::Prohibited(m) => NetError::Prohibited(m.clone()),
                ConnectError::Dns(m) => NetError::Dns(m.clone()),
                ConnectError::Refused(m) => NetError::Refused(m.clone()),
                ConnectError::Timeout => NetError::ConnectTimeout,
            };
        }
        // An I/O error wraps a TLS alert received after the handshake (TLS 1.3 reports a refused
        // client certificate so), and its `source` skips the wrapped error itself.
        let wrapped = s.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()).and_then(|inner| {
            let inner: &(dyn std::error::Error + 'static) = inner;
            inner.downcast_ref::<rustls::Error>()
        });
        if let Some(tls) = s.downcast_ref::<rustls::Error>().or(wrapped) {
            return match tls {
                rustls::Error::InvalidCertificate(c) => NetError::Certificate(format!("{c:?}")),
                other => NetError::Tls(other.to_string()),
            };
        }
        source = s.source();
    }
    let text = e.to_string();
    let mut chain = text.clone();
    let mut s = e.source();
    while let Some(inner) = s {
        chain.push_str(": ");
        chain.push_str(&inner.to_string());
        s = inner.source();
    }
    if chain.contains("certificate") || chain.contains("UnknownIssuer") {
        NetError::Certificate(chain)
    } else if chain.contains("tls") || chain.contains("TLS") || chain.contains("handshake") {
        NetError::Tls(chain)
    } else if chain.contains("connection closed")
        || chain.contains("reset")
        || chain.contains("IncompleteMessage")
    {
        NetError::ConnectionLost
    } else {
        NetError::Protocol(chain)
    }
}

impl Client {
    /// Sends `request` and reads its whole answer, within the bounds and by `deadline`.
    pub(super) async fn exchange(
        &self,
        request: http::Request<Bytes>,
        deadline: Instant,
        bounds: &Bounds,
    ) -> Result<http::Response<Bytes>, NetError> {
        let left = || deadline.saturating_duration_since(Instant::now());
        let first_byte = bounds.first_byte.min(left());
        let authority = request.uri().authority().map(|a| a.to_string()).unwrap_or_default();
        let request = request.map(Full::new);
        let response = match tokio::time::timeout(first_byte, self.pool.request(request)).await {
            Err(_) => return Err(NetError::FirstByteTimeout(first_byte)),
            // The connection ended before the request was written: say why it ended.
            Ok(Err(e)) if canceled(&e) => {
                return Err(self.endings.recent(&authority).unwrap_or(NetError::ConnectionLost));
            }
            Ok(Err(e)) => return Err(classify(&e)),
            Ok(Ok(r)) => r,
        };
        let (parts, mut body) = response.into_parts();
        let mut collected = Vec::new();
        loop {
            let idle = bounds.idle.min(left());
            match tokio::time::timeout(idle, body.frame()).await {
                Err(_) => return Err(NetError::IdleTimeout(idle)),
                Ok(None) => break,
                Ok(Some(Err(e))) => return Err(classify(&e)),
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        if collected.len() + data.len() > bounds.max_response {
                            return Err(NetError::ResponseTooLarge(bounds.max_response));
                        }
                        collected.extend_from_slice(&data);
                    }
                }
            }
        }
        Ok(http::Response::from_parts(parts, Bytes::from(collected)))
    }
}
