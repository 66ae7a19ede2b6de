//! The runtime: the only room that touches wasmtime. It loads drivers shipped as `.wasm`
//! components (`loader.rs`, the contract versions it accepts in `version.rs`), checks their
//! imports against the operator's grants, caches their compiled form (`cache.rs`), and runs the
//! calls of each operation in a fresh, bounded instance (`driver.rs`, `session.rs`; the limits
//! in `limits.rs`, a call's network in `network.rs`, the capabilities' host functions in
//! `glue/`). It knows nothing of HTTP or SQL.

pub(crate) mod bindings;
mod cache;
mod call;
mod driver;
mod error;
mod footprint;
pub(crate) mod glue;
pub mod inspect;
pub mod json;
mod limits;
mod loader;
pub mod model;
mod network;
mod outcome;
mod session;
mod since_v0_1;
mod since_v0_2;
mod size;
pub mod slot;
pub(crate) mod state;
mod store;
mod version;

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Config, Engine};

pub use cache::Provenance;
pub use call::{BeforeLasting, Call, CallOptions, CallStats, CapabilityCall, Effect, Request, Response};
pub use driver::Driver;
pub(crate) use driver::Kept;
pub use error::{CallError, CallErrorKind, Failure, LoadError};
pub use footprint::Footprint;
pub use limits::Limits;
pub use loader::{DriverSpec, WasmSource};
pub use outcome::Outcome;
pub use session::{DriverCalls, KeptInstance};
pub use version::CONTRACT;

use cache::ArtifactCache;
use state::HostState;

/// The contract's types, as the rest of the host uses them.
pub mod contract {
    pub use super::bindings::latest::berth::driver::types::{
        AccessMode, Attachment, Capabilities, Connection, ConnectionInfo, Connector, DriverError, DriverInfo,
        InvalidConnector, ModelUpdate, Protocol, Termination, Value, Volume, VolumeField,
    };
    pub use super::bindings::latest::exports::berth::driver::driver::Guarantee;
    pub use super::version::ContractVersion;

    impl Guarantee {
        /// The WIT name of the promise.
        pub fn as_str(self) -> &'static str {
            match self {
                Guarantee::TerminateEndsSessions => "terminate-ends-sessions",
            }
        }
    }

    impl AccessMode {
        /// The one reading of a mode's text: `rw` or `ro`, nothing else.
        pub fn parse(text: &str) -> Option<AccessMode> {
            match text {
                "rw" => Some(AccessMode::Rw),
                "ro" => Some(AccessMode::Ro),
                _ => None,
            }
        }

        /// `rw` or `ro`, as Cinder and os-brick spell it.
        pub fn as_str(self) -> &'static str {
            match self {
                AccessMode::Rw => "rw",
                AccessMode::Ro => "ro",
            }
        }
    }
}

/// Instance slots whose memory is returned to the kernel together. Until its batch is flushed a
/// slot's touched memory stays resident, so finished calls hold at most `DECOMMIT_BATCH` times a
/// driver's memory limit (16 x 64 MiB by default, whatever the drivers do).
pub const DECOMMIT_BATCH: u32 = 16;

/// How to build a runtime.
#[derive(Debug, Clone)]
pub struct RuntimeOptions {
    /// Where compiled drivers are cached; `None` compiles on every load.
    pub cache_dir: Option<PathBuf>,
    /// Interval of the epoch ticker, the granularity of CPU-time limits.
    pub tick: Duration,
    /// Meter calls with fuel (deterministic CPU accounting, used by the conformance suite).
    pub fuel: bool,
    /// Driver calls that may run at once; more wait. With the pooling allocator each has a
    /// preallocated instance slot and fiber stacks, which makes a fresh instance per call cheap.
    pub max_concurrent_calls: u32,
    /// What each call slot of the pool holds: the largest footprint of the drivers this runtime
    /// will load (`berth serve` takes at least [`Footprint::BASELINE`]). A driver that needs more
    /// is refused at load.
    pub slot: Footprint,
    /// Bytes of a slot's linear memory kept resident, reset page by page, when its instance is
    /// dropped (`[runtime] keep_resident_mib`); used only where the kernel has `PAGEMAP_SCAN`.
    pub keep_resident: usize,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions {
            cache_dir: None,
            tick: Duration::from_millis(10),
            fuel: false,
            max_concurrent_calls: 64,
            slot: Footprint::BASELINE,
            keep_resident: 32 << 20,
        }
    }
}

/// What a slot of the instance pool keeps of its memory when its instance is dropped.
#[derive(Debug, PartialEq, Eq)]
enum KeptResident {
    /// Up to this many bytes of the pages the instance wrote, put back as the image has them.
    Pages(usize),
    /// Nothing: every page goes back to the kernel.
    Nothing,
    /// Nothing, although `[runtime] keep_resident_mib` asks for some: the kernel swaps.
    NotWhileSwapping,
}

/// What a slot keeps (`wanted`: `[runtime] keep_resident_mib` in bytes; `pagemap_scan`: whether
/// the kernel can list the pages an instance wrote; `may_swap`: whether the kernel may swap this
/// process's pages out, [`Swap::may_swap_out`]).
///
/// wasmtime 48's scan lists the pages an instance wrote *and that are present*: a page written
/// and then swapped out before its instance was dropped is neither put back nor returned to the
/// kernel, and the next instance in the slot, of any driver (a slot switching drivers maps the
/// new image over the old image's pages only), would read what the last one wrote there, a CHAP
/// secret say. wasmtime 50 lists swapped pages too, but needs a newer toolchain than Berth's.
/// Returning every page to the kernel (`madvise(MADV_DONTNEED)`) drops swapped ones as well.
fn kept_resident(wanted: usize, pagemap_scan: bool, may_swap: bool) -> KeptResident {
    match (wanted, pagemap_scan) {
        (0, _) | (_, false) => KeptResident::Nothing,
        _ if may_swap => KeptResident::NotWhileSwapping,
        (bytes, true) => KeptResident::Pages(bytes),
    }
}

/// Whether the kernel may swap this process's pages out: it has a swap area, and no cgroup the
/// process is in bars the process's memory from swap.
#[derive(Debug, PartialEq, Eq)]
enum Swap {
    /// `/proc/swaps` lists no swap area.
    None,
    /// A swap area is in use, but this cgroup (v2) has `memory.swap.max` 0 (systemd's
    /// `MemorySwapMax=0`, as `packaging/berth.service` sets): the kernel swaps none of the
    /// process's pages out, in its own reclaim or the machine's.
    Barred(PathBuf),
    /// The kernel may swap the process's pages out.
    Possible,
}

impl Swap {
    /// As this machine has it now.
    fn now() -> Swap {
        let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
        let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        Swap::of(&swaps, &cgroup, std::path::Path::new("/sys/fs/cgroup"))
    }

    /// From `/proc/swaps` (`swaps`: a header line and a line per swap area in use),
    /// `/proc/self/cgroup` (`cgroup`; the unified hierarchy's line is `0::<path>`) and the
    /// hierarchy mounted at `root`. A limit of 0 in any cgroup from the process's own up to the
    /// root's children bars it (the kernel takes the lowest of them).
    fn of(swaps: &str, cgroup: &str, root: &std::path::Path) -> Swap {
        if !swaps.lines().skip(1).any(|area| !area.trim().is_empty()) {
            return Swap::None;
        }
        // A path with `..` is outside this cgroup namespace's view: it cannot be read from here.
        let Some(path) = cgroup.lines().find_map(|l| l.strip_prefix("0::")).filter(|p| !p.contains(".."))
        else {
            return Swap::Possible;
        };
        let mut dir = root.join(path.trim().trim_start_matches('/'));
        while dir.starts_with(root) && dir != root {
            let max = std::fs::read_to_string(dir.join("memory.swap.max")).unwrap_or_default();
            if max.trim() == "0" {
                return Swap::Barred(dir);
            }
            dir.pop();
        }
        Swap::Possible
    }

    fn may_swap_out(&self) -> bool {
        *self == Swap::Possible
    }
}

/// How often a runtime that keeps driver memory resident looks whether the kernel began to swap.
const SWAP_WATCH: Duration = Duration::from_secs(60);

/// Says, once, that the kernel may now swap this process's pages out, after this runtime chose to
/// keep driver memory resident between instances ([`kept_resident`]): the choice holds until the
/// process restarts. Stops with the engine.
fn watch_swap(engine: &Engine) {
    every(engine, "berth-swap-watch", SWAP_WATCH, |_| {
        if !Swap::now().may_swap_out() {
            return ControlFlow::Continue(());
        }
        tracing::error!(
            "the kernel may now swap berth's pages out (a swap area is in use, and no cgroup of \
             berth bars it from swap), and driver memory is still kept resident between \
             instances: a page an instance wrote and the kernel swapped out could outlive it; \
             restart berth to stop keeping it, or bar its memory from swap (systemd: \
             MemorySwapMax=0; docs/security.md)"
        );
        ControlFlow::Break(())
    });
}

/// A wasmtime engine configured for drivers, with its linker and artifact cache.
#[derive(Clone)]
pub struct Runtime {
    engine: Engine,
    linker: Arc<Linker<HostState>>,
    cache: Option<ArtifactCache>,
    fuel: bool,
    tick: Duration,
    /// One permit per concurrent call.
    slots: Arc<tokio::sync::Semaphore>,
    /// One permit per instance kept between the calls of an operation.
    keeping: Arc<tokio::sync::Semaphore>,
    /// What each call slot of the instance pool holds.
    slot: Footprint,
    /// What a slot keeps of its memory between instances, in bytes ([`kept_resident`]).
    kept_resident: usize,
    /// Components already loaded, by source (see `loader.rs`).
    loaded: Arc<std::sync::Mutex<std::collections::HashMap<String, LoadedComponent>>>,
}

/// A component with its digest and where it came from.
type LoadedComponent = (String, wasmtime::component::Component, Provenance, Footprint);

impl Runtime {
    pub fn new(options: RuntimeOptions) -> Result<Self, LoadError> {
        let slots = options.max_concurrent_calls.max(1);
        let mut config = Config::new();
        config.wasm_component_model(true);
        config.epoch_interruption(true);
        config.consume_fuel(options.fuel);
        config.max_wasm_stack(512 * 1024);
        config.cranelift_opt_level(wasmtime::OptLevel::Speed);
        // Every operation gets a fresh instance. A linear memory starts as the component's image mapped
        // copy-on-write (only the pages a call writes are copied), and a table's entries are
        // filled when first used. Copying every data segment at each instantiation cost a Python
        // driver (18 MB, its interpreter's heap in the image) 5.4 ms per call and a JavaScript one
        // 2.4 ms; mapped, 0.6 ms and 0.2 ms; and lazy tables took a Rust driver's instantiation
        // from 15 to 9 us (BENCHMARKS.md, "Drivers by language").
        config.memory_init_cow(true);
        config.table_lazy_init(true);
        // Every slot can hold an instance of the largest driver, so a call that has a slot never
        // finds the pool exhausted: beyond `max_concurrent_calls`, calls wait for a slot. As many
        // again hold the instances operations keep between their calls (`driver::Kept`): an
        // instance is kept only while one of those is free, so running and kept instances
        // together never exceed the pool.
        let slot = options.slot;
        let instances = slots * 2;
        let mut pool = wasmtime::PoolingAllocationConfig::new();
        pool.total_component_instances(instances)
            .total_core_instances(instances * slot.core_instances)
            .total_memories(instances * slot.memories)
            .total_tables(instances * slot.tables)
            .total_stacks(slots * 2)
            .max_core_instances_per_component(slot.core_instances)
            .max_memories_per_component(slot.memories)
            .max_tables_per_component(slot.tables)
            .max_tables_per_module(slot.tables)
            .max_memory_size(Limits::MAX_MEMORY_MIB as usize * (1 << 20))
            // Returning a slot's memory to the kernel (madvise) makes every core flush its TLB;
            // on a small VM those interrupts cost more than the call itself. Batch them.
            .decommit_batch_size(DECOMMIT_BATCH as usize);
        // A dropped instance's memory goes back to the kernel (madvise), and the next instance
        // in the slot takes a page fault, and a copy of the image's page, for every page it
        // writes: some 200 for a Python or JavaScript driver's first call. Where the kernel
        // can list the pages an instance wrote (PAGEMAP_SCAN), those are put back as the image
        // has them instead and stay resident; without it, keeping memory resident would mean
        // resetting all of it, which costs more than the faults. Not while the kernel swaps
        // (`kept_resident`).
        let pagemap_scan = wasmtime::PoolingAllocationConfig::is_pagemap_scan_available();
        let swap = Swap::now();
        let kept = kept_resident(options.keep_resident, pagemap_scan, swap.may_swap_out());
        let keeps = matches!(kept, KeptResident::Pages(_));
        let kept_resident = if let KeptResident::Pages(bytes) = kept { bytes } else { 0 };
        match kept {
            KeptResident::Pages(bytes) => {
                if let Swap::Barred(cgroup) = &swap {
                    tracing::info!(
                        cgroup = %cgroup.display(),
                        "the kernel swaps, but this process's cgroup bars its memory from swap \
                         (memory.swap.max 0): driver memory is kept resident between instances"
                    );
                }
                pool.linear_memory_keep_resident(bytes)
                    .table_keep_resident(1 << 20)
                    .pagemap_scan(wasmtime::Enabled::Yes);
            }
            KeptResident::NotWhileSwapping => tracing::warn!(
                "the kernel swaps (/proc/swaps): no driver memory is kept resident between \
                 instances ([runtime] keep_resident_mib ignored), since a page an instance wrote \
                 and the kernel swapped out would outlive it; calls of the interpreted drivers \
                 cost more. A cgroup that bars berth's memory from swap (systemd: \
                 MemorySwapMax=0, as packaging/berth.service sets) keeps them fast (docs/security.md)"
            ),
            KeptResident::Nothing => {}
        }
        let mut pooled = config.clone();
        pooled.allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(pool));
        // Reserving the pool's address space can fail (a small virtual address space, or
        // `ulimit -v`): then instances are allocated on demand, which costs a few microseconds
        // per call more.
        let engine = match Engine::new(&pooled) {
            Ok(engine) => {
                if keeps {
                    watch_swap(&engine);
                }
                engine
            }
            Err(e) => {
                tracing::warn!("pooling allocator unavailable ({e:#}); allocating instances on demand");
                Engine::new(&config).map_err(|e| LoadError::Engine(format!("{e:#}")))?
            }
        };

        let mut linker = Linker::<HostState>::new(&engine);
        // All of WASI p2 is linked, but the context is empty and the loader refuses any driver
        // that imports more than the baseline (see `loader::judge_import`).
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .map_err(|e| LoadError::Engine(format!("{e:#}")))?;
        // Every contract version the host speaks, side by side: a driver is bound to the one it
        // was built for (see `loader.rs`).
        bindings::latest::StorageDriver::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)
            .map_err(|e| LoadError::Engine(format!("{e:#}")))?;
        bindings::v0_2::StorageDriver::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)
            .map_err(|e| LoadError::Engine(format!("{e:#}")))?;
        bindings::v0_1::StorageDriver::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)
            .map_err(|e| LoadError::Engine(format!("{e:#}")))?;
        // `berth:cephx/identities`, the cephx capability's own package (admitted with the grant).
        glue::cephx::bindings::berth::cephx::identities::add_to_linker::<HostState, HasSelf<HostState>>(
            &mut linker,
            |s| s,
        )
        .map_err(|e| LoadError::Engine(format!("{e:#}")))?;
        // `berth:iscsi-chap/initiator-accounts`, per-initiator CHAP accounts (admitted with the
        // `iscsi-target` grant).
        glue::iscsi_chap::bindings::berth::iscsi_chap::initiator_accounts::add_to_linker::<
            HostState,
            HasSelf<HostState>,
        >(&mut linker, |s| s)
        .map_err(|e| LoadError::Engine(format!("{e:#}")))?;
        // `wasi:http` for the network capability (the loader admits it only with the grant, for
        // 0.3.0 drivers; the host sends every request itself: `network.rs`).
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)
            .map_err(|e| LoadError::Engine(format!("{e:#}")))?;

        let cache = match options.cache_dir {
            Some(dir) => Some(ArtifactCache::new(&dir).map_err(|e| {
                LoadError::Engine(format!("cannot use cache directory {}: {e}", dir.display()))
            })?),
            None => None,
        };
        start_ticker(&engine, options.tick);
        Ok(Runtime {
            engine,
            linker: Arc::new(linker),
            cache,
            fuel: options.fuel,
            tick: options.tick,
            slots: Arc::new(tokio::sync::Semaphore::new(slots as usize)),
            keeping: Arc::new(tokio::sync::Semaphore::new(slots as usize)),
            slot,
            kept_resident,
            loaded: Default::default(),
        })
    }

    /// Bytes of a slot's memory kept resident between instances: `[runtime] keep_resident_mib`,
    /// or 0 where it is not honoured (no `PAGEMAP_SCAN`, or swap that may take the pages).
    pub fn kept_resident(&self) -> usize {
        self.kept_resident
    }

    /// The epoch tick: CPU-time limits are enforced to within one tick.
    pub fn tick(&self) -> Duration {
        self.tick
    }

    pub fn fuel_enabled(&self) -> bool {
        self.fuel
    }

    /// What each call slot of the instance pool holds: a driver loaded later must fit in it.
    pub fn slot(&self) -> Footprint {
        self.slot
    }
}

/// Advances the engine's epoch every `tick` until the engine is dropped.
fn start_ticker(engine: &Engine, tick: Duration) {
    every(engine, "berth-epoch", tick, |engine| {
        engine.increment_epoch();
        ControlFlow::Continue(())
    });
}

/// Runs `each` every `period` on a thread of its own, for as long as the engine lives and `each`
/// goes on.
fn every(
    engine: &Engine,
    name: &str,
    period: Duration,
    mut each: impl FnMut(&Engine) -> ControlFlow<()> + Send + 'static,
) {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            loop {
                std::thread::sleep(period);
                let Some(engine) = weak.upgrade() else { return };
                if each(&engine).is_break() {
                    return;
                }
            }
        })
        .unwrap_or_else(|e| panic!("cannot start the {name} thread: {e}"));
}

#[cfg(test)]
mod tests {
    use super::{KeptResident, Swap, kept_resident};

    const NO_SWAP: &str = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n";
    const SWAP: &str = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n\
                        /swapfile                               file\t\t2097148\t\t0\t\t-2\n";

    #[test]
    fn a_slot_keeps_what_it_wrote_only_where_the_kernel_lists_it_and_swaps_nothing() {
        assert_eq!(kept_resident(32 << 20, true, false), KeptResident::Pages(32 << 20));
        assert_eq!(kept_resident(32 << 20, false, false), KeptResident::Nothing, "no PAGEMAP_SCAN");
        assert_eq!(kept_resident(0, true, false), KeptResident::Nothing, "keep_resident_mib = 0");
    }

    #[test]
    fn while_the_kernel_may_swap_every_page_an_instance_wrote_goes_back_to_the_kernel() {
        assert_eq!(kept_resident(32 << 20, true, true), KeptResident::NotWhileSwapping);
        assert_eq!(kept_resident(0, true, true), KeptResident::Nothing);
        assert_eq!(kept_resident(32 << 20, false, true), KeptResident::Nothing);
    }

    /// A cgroup hierarchy in a directory: `berth.service` under `system.slice`, each with the
    /// `memory.swap.max` given (none: the file is absent, as where the memory controller is off).
    fn hierarchy(slice: Option<&str>, service: Option<&str>) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("system.slice/berth.service");
        std::fs::create_dir_all(&dir).unwrap();
        for (dir, max) in [(dir.parent().unwrap(), slice), (dir.as_path(), service)] {
            if let Some(max) = max {
                std::fs::write(dir.join("memory.swap.max"), format!("{max}\n")).unwrap();
            }
        }
        root
    }

    const IN_SERVICE: &str = "0::/system.slice/berth.service\n";

    #[test]
    fn the_kernel_may_swap_a_process_out_where_it_has_swap_and_no_cgroup_bars_it() {
        let unlimited = hierarchy(Some("max"), Some("max"));
        assert_eq!(Swap::of(NO_SWAP, IN_SERVICE, unlimited.path()), Swap::None);
        assert_eq!(Swap::of("", IN_SERVICE, unlimited.path()), Swap::None, "no /proc/swaps: no swap");
        assert_eq!(Swap::of(SWAP, IN_SERVICE, unlimited.path()), Swap::Possible);
        let some = hierarchy(None, Some("1048576"));
        assert_eq!(Swap::of(SWAP, IN_SERVICE, some.path()), Swap::Possible, "a limit that is not 0");
        let off = hierarchy(None, None);
        assert_eq!(Swap::of(SWAP, IN_SERVICE, off.path()), Swap::Possible, "no memory controller");
        let v1 = "4:memory:/system.slice/berth.service\n1:name=systemd:/system.slice/berth.service\n";
        assert_eq!(
            Swap::of(SWAP, v1, hierarchy(Some("0"), Some("0")).path()),
            Swap::Possible,
            "cgroup v1 only"
        );
        let barred = hierarchy(Some("0"), Some("0"));
        assert_eq!(Swap::of(SWAP, "0::/\n", barred.path()), Swap::Possible, "the root cgroup");
        let outside = "0::/../system.slice/berth.service\n";
        assert_eq!(Swap::of(SWAP, outside, barred.path()), Swap::Possible, "outside this cgroup namespace");
    }

    #[test]
    fn a_cgroup_with_no_swap_allowed_bars_the_process_and_those_under_it() {
        let own = hierarchy(Some("max"), Some("0"));
        let service = own.path().join("system.slice/berth.service");
        assert_eq!(Swap::of(SWAP, IN_SERVICE, own.path()), Swap::Barred(service));
        let slice = hierarchy(Some("0"), Some("max"));
        assert_eq!(Swap::of(SWAP, IN_SERVICE, slice.path()), Swap::Barred(slice.path().join("system.slice")));
        assert!(!Swap::of(SWAP, IN_SERVICE, slice.path()).may_swap_out());
        assert!(!Swap::of(NO_SWAP, IN_SERVICE, slice.path()).may_swap_out());
        assert!(Swap::of(SWAP, IN_SERVICE, hierarchy(None, None).path()).may_swap_out());
    }
}
