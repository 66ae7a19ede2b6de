//! The `operations` table: the durable intents of the service's operations (see
//! `attach/ops.rs`). One row per volume at most (`one_operation_per_volume`).

use super::sql::{Param, Row, Tx};
use super::{StoreError, now_micros, placeholders};
use crate::attach::model::{Connector, OpKind, Operation};
use crate::params;

const COLUMNS: &str = "id, kind, volume_id, attachment_id, connector, detail, step, node, incarnation, \
     lease_until, created_at";

fn from_row(r: &Row) -> Result<Operation, StoreError> {
    let id = r.text(0)?;
    let corrupt = |what: &str, e: String| StoreError::Corrupt(format!("operation {id}: {what}: {e}"));
    let connector = match r.opt_text(4)? {
        Some(text) => {
            let json = serde_json::from_str(&text).map_err(|e| corrupt("connector", e.to_string()))?;
            Some(Connector::parse(json).map_err(|e| corrupt("connector", e))?)
        }
        None => None,
    };
    let kind: OpKind = serde_json::from_str(&r.text(5)?).map_err(|e| corrupt("detail", e.to_string()))?;
    Ok(Operation {
        kind,
        volume_id: r.text(2)?,
        attachment_id: r.opt_text(3)?,
        connector,
        step: r.text(6)?,
        node: r.text(7)?,
        incarnation: r.text(8)?,
        lease_until: r.int(9)?,
        created_at: r.int(10)?,
        id,
    })
}

fn operations(rows: Vec<Row>) -> Result<Vec<Operation>, StoreError> {
    rows.iter().map(from_row).collect()
}

/// Records an operation. A volume that has one already refuses it
/// ([`StoreError::Constraint`]`("one_operation_per_volume")`).
pub async fn insert(tx: &mut Tx, op: &Operation) -> Result<(), StoreError> {
    let detail = serde_json::to_string(&op.kind).expect("an operation kind serialises");
    let connector = op.connector.as_ref().map(|c| serde_json::Value::Object(c.json().clone()).to_string());
    tx.execute(
        &format!(
            "INSERT INTO operations ({COLUMNS}, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $11)"
        ),
        &params![
            &op.id,
            op.kind.name(),
            &op.volume_id,
            &op.attachment_id,
            connector,
            detail,
            &op.step,
            &op.node,
            &op.incarnation,
            op.lease_until,
            op.created_at,
        ],
    )
    .await?;
    Ok(())
}

/// Deletes a finished operation; false when it was not there (someone else finished it).
pub async fn finish(tx: &mut Tx, id: &str) -> Result<bool, StoreError> {
    Ok(tx.execute("DELETE FROM operations WHERE id = $1", &params![id]).await? == 1)
}

/// Records the step an operation reached.
pub async fn set_step(tx: &mut Tx, id: &str, step: &str) -> Result<(), StoreError> {
    tx.execute(
        "UPDATE operations SET step = $2, updated_at = $3 WHERE id = $1",
        &params![id, step, now_micros()],
    )
    .await?;
    Ok(())
}

/// The operation on a volume, if there is one.
pub async fn of_volume(tx: &mut Tx, volume_id: &str) -> Result<Option<Operation>, StoreError> {
    let rows = tx
        .query(&format!("SELECT {COLUMNS} FROM operations WHERE volume_id = $1"), &params![volume_id])
        .await?;
    Ok(operations(rows)?.pop())
}

/// Every unfinished operation, oldest first.
pub async fn all(tx: &mut Tx) -> Result<Vec<Operation>, StoreError> {
    operations(tx.query(&format!("SELECT {COLUMNS} FROM operations ORDER BY created_at, id"), &[]).await?)
}

/// Extends the lease of operations this process runs; returns how many it extended.
pub async fn renew(tx: &mut Tx, ids: &[String], incarnation: &str, until: i64) -> Result<u64, StoreError> {
    let mut renewed = 0;
    for chunk in ids.chunks(500) {
        let q = format!(
            "UPDATE operations SET lease_until = $1, updated_at = $2 WHERE incarnation = $3 AND id IN ({})",
            placeholders(4, chunk.len())
        );
        let mut params: Vec<Param> = Vec::from(params![until, now_micros(), incarnation]);
        params.extend(chunk.iter().map(Param::from));
        renewed += tx.execute(&q, &params).await?;
    }
    Ok(renewed)
}

/// Makes an operation another owner's only if its row still names `previous` (the incarnation
/// that owned it when it was read); returns whether it did.
pub async fn take_over(
    tx: &mut Tx,
    id: &str,
    previous: &str,
    node: &str,
    incarnation: &str,
    until: i64,
) -> Result<bool, StoreError> {
    let changed = tx
        .execute(
            "UPDATE operations SET node = $3, incarnation = $4, lease_until = $5, updated_at = $6 \
             WHERE id = $1 AND incarnation = $2",
            &params![id, previous, node, incarnation, until, now_micros()],
        )
        .await?;
    Ok(changed == 1)
}
