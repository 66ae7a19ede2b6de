//! One async lock per volume, in this process: a volume's driver calls never overlap, so a detach
//! cannot tear down what a concurrent attach of the same volume is setting up. (State changes
//! themselves are conditional updates and need no lock; this only orders driver work.) A flow
//! holds the lock from before it writes its operation until after it ends it, which is what lets
//! the holder recognise an operation of this node as orphaned (`ops.rs`). Across processes, the
//! database allows one operation per volume (`one_operation_per_volume`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

#[derive(Default)]
pub struct VolumeLocks {
    locks: Mutex<HashMap<String, Weak<AsyncMutex<()>>>>,
}

impl VolumeLocks {
    /// Waits for the volume's lock.
    pub async fn lock(&self, volume_id: &str) -> OwnedMutexGuard<()> {
        let lock = {
            let mut map = self.locks.lock().unwrap_or_else(|p| p.into_inner());
            if map.len() > 1024 {
                map.retain(|_, weak| weak.strong_count() > 0);
            }
            match map.get(volume_id).and_then(Weak::upgrade) {
                Some(lock) => lock,
                None => {
                    let lock = Arc::new(AsyncMutex::new(()));
                    map.insert(volume_id.to_string(), Arc::downgrade(&lock));
                    lock
                }
            }
        };
        lock.lock_owned().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn one_volume_at_a_time_but_volumes_independently() {
        let locks = Arc::new(VolumeLocks::default());
        let a = locks.lock("a").await;
        let _b =
            tokio::time::timeout(Duration::from_millis(50), locks.lock("b")).await.expect("b is independent");
        assert!(tokio::time::timeout(Duration::from_millis(50), locks.lock("a")).await.is_err(), "a is held");
        drop(a);
        let _a =
            tokio::time::timeout(Duration::from_millis(50), locks.lock("a")).await.expect("a was released");
    }
}
