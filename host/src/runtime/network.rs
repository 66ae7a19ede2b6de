//! The network of one call: `wasi:http` as `wasmtime-wasi-http` implements it, with the host's
//! own `send_request` (the hooks below): every request of a driver's call goes to
//! [`NetworkCapability::send`], which decides whether and how it goes out. What the driver sees
//! is `wasi:http`'s: an answer, or an error code (`HTTP-request-denied` for a refused request).
//! The guest reaches it through the glue (`glue/network.rs`).
//!
//! Per call: a bound on requests under way (more wait, within the call's time), the call's
//! deadline, the fault the conformance suite injects at the n-th request, and what the call's log
//! and record see.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpHooks};

use crate::capabilities::network::{NetError, NetFault, NetworkCapability};
use crate::capabilities::secret::Redactor;
use crate::runtime::{BeforeLasting, CapabilityCall};

/// The network of one call.
pub(crate) struct CallNetwork {
    pub(crate) ctx: WasiHttpCtx,
    pub(crate) hooks: Hooks,
}

/// Allocates nothing for a driver without the network (most calls).
pub(crate) struct Hooks {
    /// The backend's network, with what its requests share during the call.
    network: Option<Granted>,
    deadline: Instant,
    sent: u32,
    fault: Option<(u32, NetFault)>,
    /// Awaited before every request: what it changes on the other side outlives the power.
    before_lasting: Option<BeforeLasting>,
}

struct Granted {
    capability: Arc<NetworkCapability>,
    permits: Arc<tokio::sync::Semaphore>,
    redactor: Redactor,
    /// The requests, when the call records its capability calls.
    record: Option<Record>,
}

/// Where a call records its capability calls.
pub(crate) type Record = Arc<std::sync::Mutex<Vec<CapabilityCall>>>;

impl CallNetwork {
    /// The network of a call; `granted` is the backend's capability, with the call's redactor and
    /// where to record its requests.
    pub(crate) fn new(
        granted: Option<(Arc<NetworkCapability>, Redactor, Option<Record>)>,
        deadline: Instant,
        fault: Option<(u32, NetFault)>,
        before_lasting: Option<BeforeLasting>,
    ) -> CallNetwork {
        let network = granted.map(|(capability, redactor, record)| Granted {
            permits: Arc::new(tokio::sync::Semaphore::new(capability.bounds.max_concurrent as usize)),
            capability,
            redactor,
            record,
        });
        CallNetwork {
            ctx: WasiHttpCtx::new(),
            hooks: Hooks { network, deadline, sent: 0, fault, before_lasting },
        }
    }
}

/// `wasi:http`'s error code for a request that got no answer.
fn code(e: &NetError) -> wasmtime_wasi_http::Error {
    use wasmtime_wasi_http::Error as E;
    match e {
        NetError::Denied(_) => E::HttpRequestDenied,
        NetError::Prohibited(_) => E::DestinationIpProhibited,
        NetError::Dns(m) => E::DnsError { rcode: Some(m.clone()), info_code: None },
        NetError::Refused(_) => E::ConnectionRefused,
        NetError::ConnectTimeout => E::ConnectionTimeout,
        NetError::Tls(_) => E::TlsProtocolError,
        NetError::Certificate(_) => E::TlsCertificateError,
        NetError::FirstByteTimeout(_) => E::ConnectionReadTimeout,
        NetError::IdleTimeout(_) => E::HttpResponseTimeout,
        NetError::RequestTooLarge(n) => E::HttpRequestBodySize(Some(*n as u64)),
        NetError::ResponseTooLarge(n) => E::HttpResponseBodySize(Some(*n as u64)),
        NetError::ConnectionLost => E::ConnectionTerminated,
        NetError::Protocol(_) => E::HttpProtocolError,
    }
}

type Sending = Box<
    dyn Future<
            Output = wasmtime_wasi_http::Result<(
                http::Response<wasmtime_wasi_http::WasiBody>,
                Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
            )>,
        > + Send,
>;

impl WasiHttpHooks for Hooks {
    /// Only `https`, and `http` where listed (the allow-list decides).
    fn default_scheme(&mut self) -> Option<http::uri::Scheme> {
        Some(http::uri::Scheme::HTTPS)
    }

    fn send_request(
        &mut self,
        request: http::Request<wasmtime_wasi_http::WasiBody>,
        options: Option<wasmtime_wasi_http::RequestOptions>,
        _: Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
    ) -> Sending {
        let Some(granted) = &self.network else {
            // Not granted: the loader refuses such a driver, so this is only a last guard.
            return Box::new(async { Err(wasmtime_wasi_http::Error::HttpRequestDenied) });
        };
        self.sent += 1;
        let fault = self.fault.filter(|(at, _)| *at == self.sent).map(|(_, f)| f);
        let network = granted.capability.clone();
        let (permits, redactor, record) =
            (granted.permits.clone(), granted.redactor.clone(), granted.record.clone());
        let before_lasting = self.before_lasting.clone();
        // The guest's own timeouts may shorten the call's, never lengthen it.
        let mut deadline = self.deadline;
        if let Some(first) = options.as_ref().and_then(|o| o.first_byte_timeout) {
            deadline = deadline.min(Instant::now() + first);
        }
        Box::new(async move {
            if let Some(before) = &before_lasting {
                before.wait().await.map_err(|why| wasmtime_wasi_http::Error::InternalError(Some(why)))?;
            }
            let _permit = tokio::time::timeout_at(deadline.into(), permits.acquire_owned())
                .await
                .map_err(|_| wasmtime_wasi_http::Error::ConnectionTimeout)?
                .expect("never closed");
            let (parts, body) = request.into_parts();
            let limit = network.bounds.max_request;
            let body = http_body_util::Limited::new(body, limit).collect().await.map_err(|e| {
                if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() {
                    wasmtime_wasi_http::Error::HttpRequestBodySize(Some(limit as u64))
                } else {
                    wasmtime_wasi_http::Error::InternalError(Some(
                        "the request body could not be read".into(),
                    ))
                }
            })?;
            let request = http::Request::from_parts(parts, body.to_bytes());
            let (method, target) = (request.method().to_string(), request.uri().to_string());
            let answered = network.send(request, deadline, fault).await;
            if let Some(record) = &record {
                let outcome = match &answered {
                    Ok(a) => a.response.status().as_u16().to_string(),
                    Err(e) => redactor.redact(&e.to_string()),
                };
                let target = target.split('?').next().unwrap_or_default().to_string();
                record.lock().unwrap_or_else(|p| p.into_inner()).push(CapabilityCall {
                    interface: "network",
                    op: method_name(&method),
                    args: vec![target],
                    outcome,
                });
            }
            let answer = answered.map_err(|e| code(&e))?;
            for secret in &answer.secrets {
                redactor.add_network(secret);
            }
            let response =
                answer.response.map(|b: Bytes| Full::new(b).map_err(|never| match never {}).boxed_unsync());
            let io: Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send> =
                Box::new(async { Ok(()) });
            Ok((response, io))
        })
    }
}

fn method_name(method: &str) -> &'static str {
    crate::metrics::http_method(method)
}
