//! The `operations` table: the durable intents of the service's operations (see
//! `attach/ops.rs`). One row per volume at most (`one_operation_per_volume`).

use super::sql::{Row, Tx};
use super::{StoreError, now_micros};
use crate::domain::model::{Connector, OpKind, Operation};
use crate::params;

const COLUMNS: &str = "id, kind, volume_id, attachment_id, connector, detail, step, node, incarnation, \
     lease_until, created_at, generation";

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
        generation: r.int(11)?,
        id,
    })
}

fn operations(rows: Vec<Row>) -> Result<Vec<Operation>, StoreError> {
    rows.iter().map(from_row).collect()
}

/// Records an operation. A volume that has one already refuses it
/// ([`StoreError::Constraint`]`("one_operation_per_volume")`). With `read_at`, only while the
/// volume's row is as the flow read it (`updated_at`, which every change of the volume and of its
/// attachments moves on), in the same statement: false when it changed since (another node's
/// operation ran meanwhile, on a backend the nodes share), and nothing was recorded.
pub async fn insert(tx: &mut Tx, op: &Operation, read_at: Option<i64>) -> Result<bool, StoreError> {
    let detail = serde_json::to_string(&op.kind).expect("an operation kind serialises");
    let connector = op.connector.as_ref().map(|c| serde_json::Value::Object(c.json().clone()).to_string());
    let mut params = Vec::from(params![
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
        op.generation,
    ]);
    let values = "$1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $11";
    let sql = match read_at {
        None => format!("INSERT INTO operations ({COLUMNS}, updated_at) VALUES ({values})"),
        Some(at) => {
            params.push(at.into());
            format!(
                "INSERT INTO operations ({COLUMNS}, updated_at) SELECT {values} \
                 WHERE EXISTS (SELECT 1 FROM volumes WHERE id = $3 AND updated_at = $13)"
            )
        }
    };
    Ok(tx.execute(&sql, &params).await? == 1)
}

/// Deletes a finished operation held at `generation`; false when it is not there at that
/// generation (another node took it over, or finished it): the caller is fenced off.
pub async fn finish(tx: &mut Tx, id: &str, generation: i64) -> Result<bool, StoreError> {
    Ok(tx
        .execute("DELETE FROM operations WHERE id = $1 AND generation = $2", &params![id, generation])
        .await?
        == 1)
}

/// Whether an operation is still held at `generation`, locking its row for the rest of the
/// transaction (so a take-over waits for this transaction, and then finds the generation it
/// expects gone or not). False: the caller was fenced off.
pub async fn fence(tx: &mut Tx, id: &str, generation: i64) -> Result<bool, StoreError> {
    Ok(tx
        .execute(
            "UPDATE operations SET generation = generation WHERE id = $1 AND generation = $2",
            &params![id, generation],
        )
        .await?
        == 1)
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

/// What a lease renewal found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Renewed {
    /// Extended.
    pub renewed: Vec<String>,
    /// At another generation now: taken over.
    pub taken_over: Vec<String>,
}

/// Extends the lease of operations this process runs, each only at the generation it holds. (One
/// that is not there at all has not begun yet, or has ended.)
pub async fn renew(tx: &mut Tx, held: &[(String, i64)], until: i64) -> Result<Renewed, StoreError> {
    let mut out = Renewed::default();
    for (id, generation) in held {
        let changed = tx
            .execute(
                "UPDATE operations SET lease_until = $1, updated_at = $2 WHERE id = $3 AND generation = $4",
                &params![until, now_micros(), id, *generation],
            )
            .await?;
        if changed == 1 {
            out.renewed.push(id.clone());
            continue;
        }
        let now = tx.query("SELECT generation FROM operations WHERE id = $1", &params![id]).await?;
        if now.first().map(|r| r.int(0)).transpose()?.is_some_and(|g| g != *generation) {
            out.taken_over.push(id.clone());
        }
    }
    Ok(out)
}

/// Makes an operation another owner's only if it is still at `generation` (the one it had when
/// it was read), and moves it to the next generation; returns the new generation, or `None`
/// when someone else changed it first.
pub async fn take_over(
    tx: &mut Tx,
    id: &str,
    generation: i64,
    node: &str,
    incarnation: &str,
    until: i64,
) -> Result<Option<i64>, StoreError> {
    let changed = tx
        .execute(
            "UPDATE operations SET node = $3, incarnation = $4, lease_until = $5, updated_at = $6, \
             generation = generation + 1 WHERE id = $1 AND generation = $2",
            &params![id, generation, node, incarnation, until, now_micros()],
        )
        .await?;
    Ok((changed == 1).then_some(generation + 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::model::OpKind;
    use crate::store::Store;
    use crate::store::events::testing::{postgres_store, temp_store, volume_row};

    fn operation(volume_id: &str) -> Operation {
        Operation {
            id: uuid::Uuid::new_v4().to_string(),
            kind: OpKind::Revoke,
            volume_id: volume_id.to_string(),
            attachment_id: None,
            connector: None,
            step: "intent".into(),
            node: "n".into(),
            incarnation: "i".into(),
            lease_until: 0,
            created_at: 0,
            generation: 1,
        }
    }

    async fn updated_at(store: &Store, v: &str) -> i64 {
        store
            .read(async |tx| {
                tx.query("SELECT updated_at FROM volumes WHERE id = $1", &crate::params![v]).await?[0].int(0)
            })
            .await
            .unwrap()
    }

    /// What a flow read of the volume (`updated_at`) decides whether its operation begins: after
    /// another change of the volume, nothing is recorded.
    async fn begins_only_on_the_volume_as_read(store: &Store) {
        let v = uuid::Uuid::new_v4().to_string();
        store.write(async |tx| volume_row(tx, &v).await).await.unwrap();
        let seen = updated_at(store, &v).await;
        // Another node's change of the volume, between the read and the operation.
        store
            .write(async |tx| {
                tx.execute(
                    "UPDATE volumes SET updated_at = updated_at + 1 WHERE id = $1",
                    &crate::params![&v],
                )
                .await
            })
            .await
            .unwrap();
        let stale = store.write(async |tx| insert(tx, &operation(&v), Some(seen)).await).await.unwrap();
        assert!(!stale, "begun on a volume that changed since it was read");
        assert_eq!(store.read(async |tx| of_volume(tx, &v).await).await.unwrap(), None);
        let seen = updated_at(store, &v).await;
        let op = operation(&v);
        assert!(store.write(async |tx| insert(tx, &op, Some(seen)).await).await.unwrap());
        assert_eq!(store.read(async |tx| of_volume(tx, &v).await).await.unwrap().map(|o| o.id), Some(op.id));
    }

    #[tokio::test]
    async fn an_operation_begins_only_on_the_volume_as_its_flow_read_it() {
        let (_dir, store) = temp_store().await;
        begins_only_on_the_volume_as_read(&store).await;
    }

    #[tokio::test]
    async fn an_operation_begins_only_on_the_volume_as_read_on_postgresql() {
        let Some(store) = postgres_store().await else { return };
        begins_only_on_the_volume_as_read(&store).await;
    }
}
