//! `berth:driver/log`, as the runtime links it (the latest contract; older ones are adapted in
//! `runtime/since_*.rs`): a driver's line goes to [`crate::capabilities::log::emit`], bounded per call and redacted.

use crate::capabilities::log as caplog;
use crate::runtime::bindings::latest::berth::driver::log;
use crate::runtime::state::HostState;

impl log::Host for HostState {
    async fn log(&mut self, level: log::Level, message: String) -> wasmtime::Result<()> {
        let scope = &mut self.scope;
        if scope.logs >= scope.log_limit {
            scope.dropped_logs += 1;
            return Ok(());
        }
        scope.logs += 1;
        let level = match level {
            log::Level::Trace => caplog::Level::Trace,
            log::Level::Debug => caplog::Level::Debug,
            log::Level::Info => caplog::Level::Info,
            log::Level::Warn => caplog::Level::Warn,
            log::Level::Error => caplog::Level::Error,
        };
        caplog::emit(&scope.driver, scope.call.as_str(), level, &message, &scope.redactor);
        Ok(())
    }
}
