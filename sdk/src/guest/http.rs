//! Requests to the array, over the standard `wasi:http` (feature `network`). One small blocking
//! client: a [`Request`] is sent whole and its [`Response`] read whole, which is what a driver's
//! calls to a management API need. The host decides whether a request goes out (the backend's
//! `allowed_hosts`), keeps the connections, adds the array's credentials where the request names
//! them (`{{secret:<name>}}`, see [`secret`]), and bounds time and sizes; a refused request is
//! [`HttpError::Denied`].
//!
//! A redirect is not followed: it is the driver's to follow, as a new request the host checks like
//! any other.
//!
//! ```ignore
//! use berth_driver_sdk::http::{self, Request};
//! let answer = Request::post("https://array.example:8443/api/login")
//!     .json(&format!(r#"{{"user": "admin", "password": "{}"}}"#, http::secret("array-password")))
//!     .send()?;
//! ```

use crate::__bindings::wasi::http::outgoing_handler;
use crate::__bindings::wasi::http::types::{
    ErrorCode, Fields, IncomingBody, Method, OutgoingBody, OutgoingRequest, Scheme,
};
use crate::__bindings::wasi::io::streams::StreamError;
use crate::DriverError;

/// Where the host puts the operator's secret `name` (in a header value or a body).
pub fn secret(name: &str) -> String {
    format!("{{{{secret:{name}}}}}")
}

/// Why a request got no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpError {
    /// The host refused it (not an allowed host, a secret for another host, an address of the
    /// host's own): nothing was sent.
    Denied(String),
    /// No answer in time.
    Timeout(String),
    /// The array could not be reached, or the connection ended.
    Unreachable(String),
    /// Anything else (TLS, sizes, protocol).
    Failed(String),
    /// The URL is not `scheme://host[:port]/path`.
    BadUrl(String),
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HttpError::Denied(m) => write!(f, "refused by the host: {m}"),
            HttpError::Timeout(m) => write!(f, "timed out: {m}"),
            HttpError::Unreachable(m) => write!(f, "unreachable: {m}"),
            HttpError::Failed(m) => write!(f, "failed: {m}"),
            HttpError::BadUrl(m) => write!(f, "bad URL: {m}"),
        }
    }
}

/// A request that got no answer may have been applied or not: time-outs and lost connections are
/// `retryable` (the host retries the call, which is idempotent), the rest is a backend failure.
impl From<HttpError> for DriverError {
    fn from(e: HttpError) -> DriverError {
        match e {
            HttpError::Timeout(_) | HttpError::Unreachable(_) => DriverError::Retryable(e.to_string()),
            _ => DriverError::Backend(e.to_string()),
        }
    }
}

fn classify(code: &ErrorCode) -> HttpError {
    let text = format!("{code:?}");
    match code {
        ErrorCode::HttpRequestDenied | ErrorCode::DestinationIpProhibited => HttpError::Denied(text),
        ErrorCode::ConnectionTimeout
        | ErrorCode::ConnectionReadTimeout
        | ErrorCode::ConnectionWriteTimeout
        | ErrorCode::HttpResponseTimeout
        | ErrorCode::DnsTimeout => HttpError::Timeout(text),
        ErrorCode::ConnectionRefused
        | ErrorCode::ConnectionTerminated
        | ErrorCode::DestinationNotFound
        | ErrorCode::DestinationUnavailable
        | ErrorCode::DnsError(_)
        | ErrorCode::HttpResponseIncomplete => HttpError::Unreachable(text),
        _ => HttpError::Failed(text),
    }
}

/// A request.
#[derive(Debug, Clone)]
pub struct Request {
    method: String,
    url: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

/// An answer, whole.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// A header's value (the first, by case-insensitive name).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

impl Request {
    pub fn new(method: &str, url: &str) -> Request {
        Request { method: method.to_string(), url: url.to_string(), headers: Vec::new(), body: Vec::new() }
    }
    pub fn get(url: &str) -> Request {
        Request::new("GET", url)
    }
    pub fn post(url: &str) -> Request {
        Request::new("POST", url)
    }
    pub fn put(url: &str) -> Request {
        Request::new("PUT", url)
    }
    pub fn delete(url: &str) -> Request {
        Request::new("DELETE", url)
    }

    pub fn header(mut self, name: &str, value: &str) -> Request {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    /// A JSON body (with its content type).
    pub fn json(self, body: &str) -> Request {
        let mut r = self.header("content-type", "application/json");
        r.body = body.as_bytes().to_vec();
        r
    }

    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Request {
        self.body = body.into();
        self
    }

    /// Sends the request and reads the whole answer.
    pub fn send(self) -> Result<Response, HttpError> {
        let (https, authority, path) = split_url(&self.url)?;
        let headers = Fields::new();
        for (k, v) in &self.headers {
            headers.append(k, v.as_bytes()).map_err(|e| HttpError::Failed(format!("header {k}: {e:?}")))?;
        }
        let request = OutgoingRequest::new(headers);
        let method = match self.method.as_str() {
            "GET" => Method::Get,
            "POST" => Method::Post,
            "PUT" => Method::Put,
            "DELETE" => Method::Delete,
            "PATCH" => Method::Patch,
            "HEAD" => Method::Head,
            other => Method::Other(other.to_string()),
        };
        let bad = |what: &str| HttpError::Failed(format!("cannot set the request's {what}"));
        request.set_method(&method).map_err(|()| bad("method"))?;
        request
            .set_scheme(Some(&if https { Scheme::Https } else { Scheme::Http }))
            .map_err(|()| bad("scheme"))?;
        request.set_authority(Some(&authority)).map_err(|()| bad("host"))?;
        request.set_path_with_query(Some(&path)).map_err(|()| bad("path"))?;
        let outgoing = request.body().map_err(|()| bad("body"))?;
        // The request goes first, then its body: the host reads the body as it is written (a
        // body written before would fill the stream's buffer and wait for ever).
        let future = outgoing_handler::handle(request, None).map_err(|e| classify(&e))?;
        {
            let stream = outgoing.write().map_err(|()| bad("body"))?;
            for chunk in self.body.chunks(4096) {
                if let Err(e) = stream.blocking_write_and_flush(chunk) {
                    // The host stopped reading (a refusal, a bound): its answer says why.
                    drop(stream);
                    future.subscribe().block();
                    return match future.get() {
                        Some(Ok(Err(code))) => Err(classify(&code)),
                        _ => Err(HttpError::Failed(format!("writing the body: {e:?}"))),
                    };
                }
            }
        }
        OutgoingBody::finish(outgoing, None).map_err(|e| classify(&e))?;
        future.subscribe().block();
        let incoming = match future.get() {
            Some(Ok(Ok(response))) => response,
            Some(Ok(Err(code))) => return Err(classify(&code)),
            _ => return Err(HttpError::Failed("the answer was lost".into())),
        };
        let status = incoming.status();
        let headers = incoming
            .headers()
            .entries()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
            .collect();
        let body_handle = incoming.consume().map_err(|()| HttpError::Failed("no body".into()))?;
        let mut body = Vec::new();
        {
            let stream = body_handle.stream().map_err(|()| HttpError::Failed("no body stream".into()))?;
            loop {
                match stream.blocking_read(64 * 1024) {
                    Ok(chunk) => body.extend_from_slice(&chunk),
                    Err(StreamError::Closed) => break,
                    Err(StreamError::LastOperationFailed(e)) => {
                        return Err(HttpError::Unreachable(format!(
                            "reading the answer: {}",
                            e.to_debug_string()
                        )));
                    }
                }
            }
        }
        let _ = IncomingBody::finish(body_handle);
        Ok(Response { status, headers, body })
    }
}

/// `scheme://authority/path?query` into (https?, authority, path and query).
fn split_url(url: &str) -> Result<(bool, String, String), HttpError> {
    let (scheme, rest) = url.split_once("://").ok_or_else(|| HttpError::BadUrl(url.to_string()))?;
    let https = match scheme {
        "https" => true,
        "http" => false,
        _ => return Err(HttpError::BadUrl(url.to_string())),
    };
    let (authority, path) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, "/"),
    };
    if authority.is_empty() {
        return Err(HttpError::BadUrl(url.to_string()));
    }
    Ok((https, authority.to_string(), path.to_string()))
}
