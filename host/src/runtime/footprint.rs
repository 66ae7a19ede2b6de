//! What one instance of a component takes from the instance pool: its core instances, memories
//! and tables. Read from the component's bytes at load, so that the pool is sized by the drivers
//! it will hold (a Python component built by componentize-py has 38 core instances; a Rust one
//! has a handful) and a component that cannot fit is refused with a message that says so.

use wasmtime::wasmparser::{Parser, Payload};

/// Pool resources one instance of a component needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Footprint {
    pub core_instances: u32,
    pub memories: u32,
    pub tables: u32,
}

impl Footprint {
    /// What the pool gives each call slot when no component asks for more.
    pub const BASELINE: Footprint = Footprint { core_instances: 8, memories: 2, tables: 4 };

    /// Reads a component's footprint: core instances instantiated (at every nesting level), and
    /// the memories and tables its core modules define (imported ones belong to another module).
    pub fn of(wasm: &[u8]) -> Result<Footprint, String> {
        let mut f = Footprint::default();
        for payload in Parser::new(0).parse_all(wasm) {
            match payload.map_err(|e| super::inspect::malformed(e, wasm))? {
                Payload::InstanceSection(s) => {
                    for instance in s {
                        if let wasmtime::wasmparser::Instance::Instantiate { .. } =
                            instance.map_err(|e| e.to_string())?
                        {
                            f.core_instances += 1;
                        }
                    }
                }
                Payload::MemorySection(s) => f.memories += s.count(),
                Payload::TableSection(s) => f.tables += s.count(),
                _ => {}
            }
        }
        Ok(f)
    }

    /// The larger of two footprints, field by field.
    pub fn max(self, other: Footprint) -> Footprint {
        Footprint {
            core_instances: self.core_instances.max(other.core_instances),
            memories: self.memories.max(other.memories),
            tables: self.tables.max(other.tables),
        }
    }

    /// Whether an instance of `self` fits in a slot of `slot`.
    pub fn fits(self, slot: Footprint) -> bool {
        self.core_instances <= slot.core_instances
            && self.memories <= slot.memories
            && self.tables <= slot.tables
    }
}

impl std::fmt::Display for Footprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} core instances, {} memories, {} tables",
            self.core_instances, self.memories, self.tables
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shipped_driver_is_counted() {
        let wasm = std::fs::read(concat!(env!("BERTH_DRIVER_DIR"), "/tgt-iscsi.wasm")).unwrap();
        let f = Footprint::of(&wasm).unwrap();
        assert!(f.core_instances >= 1 && f.memories >= 1, "{f}");
        assert!(f.fits(Footprint::BASELINE), "{f}");
        assert!(!f.fits(Footprint { core_instances: 0, memories: 0, tables: 0 }));
        assert!(Footprint::of(b"not wasm").is_err());
    }
}
