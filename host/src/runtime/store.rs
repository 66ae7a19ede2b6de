//! A store set up for a driver's calls, with every limit of `limits.rs` in place: linear memory, the
//! bound on what one crossing may copy into the host, guest CPU time checked at every epoch tick
//! (which also yields to the executor), and fuel when the engine meters it.

use wasmtime::{Engine, Store, UpdateDeadline};

use super::limits::{CpuTimeExceeded, Limits};
use super::state::HostState;

/// A fresh store for one call. `fuel` meters the call when the engine was built with fuel.
pub(crate) fn call_store(
    engine: &Engine,
    state: HostState,
    limits: &Limits,
    fuel_enabled: bool,
    fuel: Option<u64>,
) -> Store<HostState> {
    let mut store = Store::new(engine, state);
    store.limiter(|s| &mut s.memory);
    store.call_hook(|mut ctx, hook| {
        ctx.data_mut().clock.hook(hook);
        Ok(())
    });
    let cpu = limits.cpu();
    store.epoch_deadline_callback(move |ctx| {
        let clock = ctx.data().clock.clone();
        if clock.guest_time() > cpu {
            return Err(wasmtime::Error::new(CpuTimeExceeded));
        }
        // Yield to the executor at every tick; the guest may resume on another thread. From the
        // first tick on, the guest's time is its thread's CPU time (`limits.rs`, `GuestClock`).
        clock.leave();
        clock.measure_cpu();
        Ok(UpdateDeadline::YieldCustom(
            1,
            Box::pin(async move {
                tokio::task::yield_now().await;
                clock.enter();
            }),
        ))
    });
    renew(&mut store, limits, fuel_enabled, fuel);
    store
}

/// Gives a store the budgets of one call: at its creation, and again before each further call of
/// an instance kept for its operation (`driver.rs`). The call's CPU clock is the state's
/// (`HostState::renew`).
pub(crate) fn renew(store: &mut Store<HostState>, limits: &Limits, fuel_enabled: bool, fuel: Option<u64>) {
    // What the guest may make the host allocate in one crossing (its result, or the arguments
    // of one capability call), counted by wasmtime as it copies, before it allocates: a
    // result that would be too large is refused while being copied, not after.
    store.set_hostcall_fuel(limits.copy_bytes());
    store.set_epoch_deadline(1);
    if fuel_enabled {
        // A metered engine needs fuel even for unmetered calls.
        let _ = store.set_fuel(fuel.unwrap_or(u64::MAX / 2));
    }
}
