//! The data of one store, i.e. of one instance, which serves the calls of one operation at
//! most: an empty WASI context (no preopens, no network, no environment), bounded stdio capture,
//! the resource accounting, and the current call's scope (which capabilities, which secrets to
//! redact, which capability calls were made), renewed for each call.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use super::call::{Call, CallOptions, CapabilityCall, Effect};
use super::limits::{GuestClock, MemoryLimiter};
use super::network::CallNetwork;
use crate::capabilities::DriverCapabilities;
use crate::capabilities::secret::Redactor;

/// How much of a guest's stdout/stderr is kept (the panic message of a crashed driver is there).
const CAPTURE_BYTES: usize = 16 * 1024;

pub(crate) struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    /// `wasi:http` for drivers granted the network (`network.rs`).
    network: CallNetwork,
    pub(crate) memory: MemoryLimiter,
    pub(crate) clock: GuestClock,
    pub(crate) scope: CallScope,
    pub(crate) stderr: Capture,
}

impl HostState {
    pub(crate) fn new(scope: CallScope, memory_limit: usize, network: CallNetwork) -> Self {
        let stderr = Capture::default();
        let wasi = WasiCtxBuilder::new().stdout(stderr.clone()).stderr(stderr.clone()).build();
        HostState {
            wasi,
            table: ResourceTable::new(),
            network,
            memory: MemoryLimiter::new(memory_limit),
            clock: GuestClock::new(),
            scope,
            stderr,
        }
    }
}

impl HostState {
    /// Readies the state of a kept instance for its next call: that call's scope and network,
    /// its own CPU clock and output capture. The memory accounting stays (the instance's memory
    /// does: the memory limit bounds the instance, whichever calls grew it).
    pub(crate) fn renew(&mut self, scope: CallScope, network: CallNetwork) {
        self.scope = scope;
        self.network = network;
        self.clock = GuestClock::new();
        self.stderr.clear();
    }

    /// The resource table and the call's network, borrowed together (`wasi:http` keeps its
    /// resources in the table WASI's streams use).
    pub(crate) fn table_and_network(&mut self) -> (&mut ResourceTable, &mut CallNetwork) {
        (&mut self.table, &mut self.network)
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

/// Who is calling what, with which capabilities, for one call.
pub(crate) struct CallScope {
    pub(crate) driver: Arc<str>,
    pub(crate) call: Call,
    pub(crate) caps: DriverCapabilities,
    pub(crate) redactor: Redactor,
    pub(crate) log_limit: u32,
    pub(crate) logs: u32,
    pub(crate) dropped_logs: u32,
    pub(crate) options: CallOptions,
    /// Capability calls made so far (recorded only when asked for).
    pub(crate) capability_calls: Vec<CapabilityCall>,
    /// What the capability calls changed.
    pub(crate) effects: Vec<Effect>,
    /// Number of capability calls started so far.
    pub(crate) started: u32,
    /// The capability call under way: interface, operation, when it started (for metrics).
    pub(crate) current: Option<(&'static str, &'static str, std::time::Instant)>,
}

/// The trap raised when the conformance suite injects a fault at a capability call.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("fault injected at capability call {0}")]
pub(crate) struct InjectedFault(pub u32);

impl CallScope {
    pub(crate) fn new(
        driver: Arc<str>,
        call: Call,
        caps: DriverCapabilities,
        redactor: Redactor,
        log_limit: u32,
        options: CallOptions,
    ) -> Self {
        CallScope {
            driver,
            call,
            caps,
            redactor,
            log_limit,
            logs: 0,
            dropped_logs: 0,
            options,
            capability_calls: Vec::new(),
            effects: Vec::new(),
            started: 0,
            current: None,
        }
    }

    /// Notes the start of a capability call; traps if a fault is to be injected here.
    pub(crate) fn enter(
        &mut self,
        interface: &'static str,
        op: &'static str,
        args: &[&str],
    ) -> wasmtime::Result<()> {
        self.started += 1;
        self.current = Some((interface, op, std::time::Instant::now()));
        if self.options.record {
            self.capability_calls.push(CapabilityCall {
                interface,
                op,
                args: args.iter().map(|a| self.redactor.redact(a)).collect(),
                outcome: String::new(),
            });
        }
        if self.options.trap_at_capability_call == Some(self.started) {
            return Err(wasmtime::Error::new(InjectedFault(self.started)));
        }
        Ok(())
    }

    /// Makes `change`, a capability call whose change outlives the machine's power, once what the
    /// call's operation must make durable first is (`CallOptions::before_lasting`); when that
    /// fails, the change is not made and the capability answers `refused` with why.
    pub(crate) async fn lasting<T, E>(
        &self,
        refused: impl FnOnce(String) -> E,
        change: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        if let Some(before) = &self.options.before_lasting {
            before.wait().await.map_err(refused)?;
        }
        change.await
    }

    /// Records how the last capability call ended.
    pub(crate) fn outcome(&mut self, ok: bool, outcome: impl FnOnce() -> String) {
        if let Some((interface, operation, started)) = self.current.take() {
            crate::metrics::capability(interface, operation, ok, started.elapsed());
        }
        if self.options.record
            && let Some(last) = self.capability_calls.last_mut()
        {
            last.outcome = outcome();
        }
    }
}

/// Bounded capture of a guest's stdout and stderr. Output beyond the bound is dropped silently:
/// a chatty driver must not fail because of it.
#[derive(Clone, Default)]
pub(crate) struct Capture(Arc<Mutex<Vec<u8>>>);

impl Capture {
    pub(crate) fn text(&self) -> String {
        let buf = self.0.lock().unwrap_or_else(|p| p.into_inner());
        String::from_utf8_lossy(&buf).into_owned()
    }

    fn clear(&self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    fn push(&self, bytes: &[u8]) {
        let mut buf = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let room = CAPTURE_BYTES.saturating_sub(buf.len());
        buf.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }
}

impl IsTerminal for Capture {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Capture {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }

    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }
}

impl tokio::io::AsyncWrite for Capture {
    fn poll_write(self: Pin<&mut Self>, _cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[async_trait::async_trait]
impl OutputStream for Capture {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }
    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }
    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 * 1024)
    }
}

#[async_trait::async_trait]
impl Pollable for Capture {
    async fn ready(&mut self) {}
}
