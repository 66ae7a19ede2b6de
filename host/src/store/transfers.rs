//! The `volume_transfers` table: offers of a volume to another project (`attach/transfers.rs`).
//! One per volume at most (`one_transfer_per_volume`); a row goes when its offer is accepted or
//! withdrawn.

use super::sql::{Row, Tx};
use super::{StoreError, now_micros};
use crate::domain::list::Scope;
use crate::params;

/// An offer, with its key's salted hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    pub id: String,
    pub volume_id: String,
    pub name: Option<String>,
    pub source_project_id: String,
    pub salt: String,
    pub key_hash: String,
    pub created_at: i64,
}

const COLUMNS: &str = "id, volume_id, name, source_project_id, salt, key_hash, created_at";

fn from_row(r: &Row) -> Result<Transfer, StoreError> {
    Ok(Transfer {
        id: r.text(0)?,
        volume_id: r.text(1)?,
        name: r.opt_text(2)?,
        source_project_id: r.text(3)?,
        salt: r.text(4)?,
        key_hash: r.text(5)?,
        created_at: r.int(6)?,
    })
}

/// Records an offer (its `created_at` is now). A volume offered already refuses it
/// ([`StoreError::Constraint`]`("one_transfer_per_volume")`).
pub async fn insert(tx: &mut Tx, t: &Transfer) -> Result<(), StoreError> {
    tx.execute(
        &format!("INSERT INTO volume_transfers ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7)"),
        &params![&t.id, &t.volume_id, &t.name, &t.source_project_id, &t.salt, &t.key_hash, now_micros()],
    )
    .await?;
    Ok(())
}

/// An offer by id, among those of `scope`'s projects.
pub async fn get(tx: &mut Tx, id: &str, scope: Scope<'_>) -> Result<Option<Transfer>, StoreError> {
    let rows = match scope {
        Scope::All => {
            tx.query(&format!("SELECT {COLUMNS} FROM volume_transfers WHERE id = $1"), &params![id]).await?
        }
        Scope::Project(p) => {
            let q =
                format!("SELECT {COLUMNS} FROM volume_transfers WHERE id = $1 AND source_project_id = $2");
            tx.query(&q, &params![id, p]).await?
        }
    };
    rows.iter().map(from_row).next().transpose()
}

/// The offers of `scope`'s projects, oldest first.
pub async fn list(tx: &mut Tx, scope: Scope<'_>) -> Result<Vec<Transfer>, StoreError> {
    let rows = match scope {
        Scope::All => {
            tx.query(&format!("SELECT {COLUMNS} FROM volume_transfers ORDER BY created_at, id"), &params![])
                .await?
        }
        Scope::Project(p) => {
            let q = format!(
                "SELECT {COLUMNS} FROM volume_transfers WHERE source_project_id = $1 ORDER BY created_at, id"
            );
            tx.query(&q, &params![p]).await?
        }
    };
    rows.iter().map(from_row).collect()
}

/// Ends an offer; false when it was gone already.
pub async fn delete(tx: &mut Tx, id: &str) -> Result<bool, StoreError> {
    Ok(tx.execute("DELETE FROM volume_transfers WHERE id = $1", &params![id]).await? == 1)
}
