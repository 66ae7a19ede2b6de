//! The `project_default_types` table: a project's own default volume type, by the type's id
//! (`attach/default_types.rs`). A row per project that has one.

use super::sql::Tx;
use super::{StoreError, now_micros};
use crate::params;

/// `project`'s default type's id, if it has one.
pub async fn get(tx: &mut Tx, project: &str) -> Result<Option<String>, StoreError> {
    let rows = tx
        .query("SELECT volume_type_id FROM project_default_types WHERE project_id = $1", &params![project])
        .await?;
    rows.first().map(|r| r.text(0)).transpose()
}

/// Every project's default type: (project, type id), by project.
pub async fn list(tx: &mut Tx) -> Result<Vec<(String, String)>, StoreError> {
    let rows = tx
        .query("SELECT project_id, volume_type_id FROM project_default_types ORDER BY project_id", &params![])
        .await?;
    rows.iter().map(|r| Ok((r.text(0)?, r.text(1)?))).collect()
}

/// Sets `project`'s default type (again: the new one replaces the old).
pub async fn set(tx: &mut Tx, project: &str, type_id: &str) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO project_default_types (project_id, volume_type_id, updated_at) VALUES ($1, $2, $3) \
         ON CONFLICT (project_id) DO UPDATE SET volume_type_id = excluded.volume_type_id, \
         updated_at = excluded.updated_at",
        &params![project, type_id, now_micros()],
    )
    .await?;
    Ok(())
}

/// Unsets `project`'s default type; false when it had none.
pub async fn unset(tx: &mut Tx, project: &str) -> Result<bool, StoreError> {
    Ok(tx.execute("DELETE FROM project_default_types WHERE project_id = $1", &params![project]).await? > 0)
}
