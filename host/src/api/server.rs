//! The HTTP server around the API (and the metrics endpoint): TLS when configured, header-read
//! (and idle) timeouts, a bound on requests in flight with 503 and `Retry-After` beyond it, and a
//! graceful stop.
//!
//! `axum::serve` sets no timer, so a client could hold a connection open forever without sending
//! a request; here hyper's header-read timeout runs from the moment a connection is ready for a
//! request (after accept, and after each response on a kept-alive connection) until the request's
//! headers are in, and the connection is closed when it expires.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt;

use super::error::ApiError;

/// How the server protects itself.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    pub header_read_timeout: Duration,
    /// How long a stop waits for requests in flight.
    pub shutdown_wait: Duration,
}

/// Serves `app` on `listener` (over TLS with `tls`: a handshake must end within the header-read
/// timeout) until `stop` resolves, then lets requests in flight finish (for at most
/// `shutdown_wait`).
pub async fn serve<S>(
    listener: TcpListener,
    app: S,
    limits: ServerLimits,
    tls: Option<Arc<rustls::ServerConfig>>,
    stop: impl Future<Output = ()>,
) -> std::io::Result<()>
where
    S: tower::Service<Request, Response = Response, Error = std::convert::Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let graceful = GracefulShutdown::new();
    let tls = tls.map(tokio_rustls::TlsAcceptor::from);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    tokio::pin!(stop);
    loop {
        let (stream, _peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Out of file descriptors and the like: wait a little rather than spin.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let _ = stream.set_nodelay(true);
        let service =
            app.clone().map_request(|r: Request<hyper::body::Incoming>| r.map(axum::body::Body::new));
        let service = TowerToHyperService::new(service);
        let Some(tls) = tls.clone() else {
            let watched = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
            tokio::spawn(async move {
                if let Err(e) = watched.await {
                    tracing::debug!("connection ended: {e}");
                }
            });
            continue;
        };
        let (builder, watcher) = (builder.clone(), graceful.watcher());
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(limits.header_read_timeout, tls.accept(stream)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => return tracing::debug!("TLS handshake failed: {e}"),
                Err(_) => return tracing::debug!("TLS handshake not finished in the header-read timeout"),
            };
            if let Err(e) = watcher.watch(builder.serve_connection(TokioIo::new(stream), service)).await {
                tracing::debug!("connection ended: {e}");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(limits.shutdown_wait, graceful.shutdown()).await.is_err() {
        tracing::warn!("stopping with requests still in flight");
    }
    Ok(())
}

/// Requests in flight, shared by the load-shedding middleware.
#[derive(Clone)]
pub struct InFlight(Arc<Semaphore>);

impl InFlight {
    pub fn new(max: usize) -> InFlight {
        InFlight(Arc::new(Semaphore::new(max.max(1))))
    }
}

/// Middleware: answers 503 with `Retry-After` when the bound on requests in flight is reached,
/// before any work is done for the request.
pub async fn shed(State(in_flight): State<InFlight>, request: Request, next: Next) -> Response {
    let Ok(_permit) = in_flight.0.clone().try_acquire_owned() else {
        let mut response =
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "The service is busy; retry later.")
                .into_response();
        response.headers_mut().insert(axum::http::header::RETRY_AFTER, HeaderValue::from_static("1"));
        return response;
    };
    next.run(request).await
}
