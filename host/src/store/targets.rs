//! The `targets` table: the iSCSI targets this service created, with the backend and the volume
//! whose driver call created them. Kept from the effects the capability reports for each call
//! (`runtime::Effect`), in the transaction that records the call's operation.

use super::sql::Tx;
use super::{StoreError, now_micros};
use crate::params;
use crate::runtime::Effect;

/// A recorded target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub iqn: String,
    pub backend: String,
    pub volume_id: String,
}

/// Records what driver calls for `volume_id` of `backend` did: targets created are recorded,
/// targets deleted forgotten.
pub async fn record(
    tx: &mut Tx,
    backend: &str,
    volume_id: &str,
    effects: &[Effect],
) -> Result<(), StoreError> {
    for effect in effects {
        match effect {
            Effect::TargetCreated { iqn } => {
                // An upsert both databases understand.
                tx.execute("DELETE FROM targets WHERE iqn = $1", &params![iqn]).await?;
                tx.execute(
                    "INSERT INTO targets (iqn, backend, volume_id, created_at) VALUES ($1, $2, $3, $4)",
                    &params![iqn, backend, volume_id, now_micros()],
                )
                .await?;
            }
            Effect::TargetDeleted { iqn } => {
                tx.execute("DELETE FROM targets WHERE iqn = $1", &params![iqn]).await?;
            }
        }
    }
    Ok(())
}

/// Every recorded target.
pub async fn all(tx: &mut Tx) -> Result<Vec<Target>, StoreError> {
    tx.query("SELECT iqn, backend, volume_id FROM targets ORDER BY iqn", &[])
        .await?
        .iter()
        .map(|r| Ok(Target { iqn: r.text(0)?, backend: r.text(1)?, volume_id: r.text(2)? }))
        .collect()
}

/// The targets recorded for a volume.
pub async fn of_volume(tx: &mut Tx, volume_id: &str) -> Result<Vec<Target>, StoreError> {
    tx.query(
        "SELECT iqn, backend, volume_id FROM targets WHERE volume_id = $1 ORDER BY iqn",
        &params![volume_id],
    )
    .await?
    .iter()
    .map(|r| Ok(Target { iqn: r.text(0)?, backend: r.text(1)?, volume_id: r.text(2)? }))
    .collect()
}

/// Forgets a target (it is gone from the target service).
pub async fn forget(tx: &mut Tx, iqn: &str) -> Result<(), StoreError> {
    tx.execute("DELETE FROM targets WHERE iqn = $1", &params![iqn]).await?;
    Ok(())
}
