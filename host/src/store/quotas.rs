//! The `quota_limits` table: the limits of projects and of the default quota class
//! (`attach/quotas.rs`), and what a project's volumes use, counted from the volumes themselves.

use std::collections::BTreeMap;

use super::sql::Tx;
use super::{DbKind, StoreError, now_micros};
use crate::domain::quotas::{Limits, Usage};
use crate::domain::state::VolumeStatus;
use crate::params;

/// Who holds limits: a project, or the default quota class (every project's, where it has none
/// of its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder<'a> {
    Project(&'a str),
    DefaultClass,
}

impl Holder<'_> {
    fn key(&self) -> (&str, &str) {
        match self {
            Holder::Project(id) => ("project", id),
            Holder::DefaultClass => ("class", "default"),
        }
    }
}

/// The limits `holder` sets itself, by resource.
pub async fn own(tx: &mut Tx, holder: Holder<'_>) -> Result<BTreeMap<String, i64>, StoreError> {
    let (kind, name) = holder.key();
    let rows = tx
        .query(
            "SELECT resource, hard_limit FROM quota_limits WHERE holder = $1 AND name = $2",
            &params![kind, name],
        )
        .await?;
    rows.iter().map(|r| Ok((r.text(0)?, r.int(1)?))).collect()
}

/// The limits that apply to `project`: the default class's, and its own over them.
pub async fn of_project(tx: &mut Tx, project: &str) -> Result<Limits, StoreError> {
    let rows = tx
        .query(
            "SELECT holder, resource, hard_limit FROM quota_limits \
             WHERE (holder = 'class' AND name = 'default') OR (holder = 'project' AND name = $1)",
            &params![project],
        )
        .await?;
    let (mut class, mut own) = (BTreeMap::new(), BTreeMap::new());
    for r in &rows {
        let into = if r.text(0)? == "project" { &mut own } else { &mut class };
        into.insert(r.text(1)?, r.int(2)?);
    }
    Ok(Limits(class).overlaid(own))
}

/// Sets `holder`'s limit on `resource`.
pub async fn set(tx: &mut Tx, holder: Holder<'_>, resource: &str, limit: i64) -> Result<(), StoreError> {
    let (kind, name) = holder.key();
    tx.execute(
        "INSERT INTO quota_limits (holder, name, resource, hard_limit, updated_at) VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT (holder, name, resource) DO UPDATE SET hard_limit = excluded.hard_limit, \
         updated_at = excluded.updated_at",
        &params![kind, name, resource, limit, now_micros()],
    )
    .await?;
    Ok(())
}

/// Removes every limit `holder` sets itself; how many there were.
pub async fn clear(tx: &mut Tx, holder: Holder<'_>) -> Result<u64, StoreError> {
    let (kind, name) = holder.key();
    tx.execute("DELETE FROM quota_limits WHERE holder = $1 AND name = $2", &params![kind, name]).await
}

/// Orders this transaction after every other that checks or changes `project`'s quotas, until
/// it ends. SQLite's writers are one at a time already; on PostgreSQL it is an advisory lock on
/// the project (two-key form, a space no other lock of Berth's uses; projects whose hashes meet
/// only wait for each other). What the transaction reads after it includes what the
/// transactions it waited for committed: Berth's writes run at PostgreSQL's `READ COMMITTED`,
/// where each statement reads afresh.
pub async fn order(tx: &mut Tx, project: &str) -> Result<(), StoreError> {
    if tx.kind() == DbKind::Postgres {
        tx.execute("SELECT pg_advisory_xact_lock(1651668081, hashtext($1))", &params![project]).await?;
    }
    Ok(())
}

/// What `project`'s live volumes use, by type; a volume being extended holds its growth besides
/// (reserved, by the extend's operation).
pub async fn usage(tx: &mut Tx, project: &str) -> Result<Usage, StoreError> {
    let mut usage = Usage::default();
    for (volume_type, volumes, gigabytes) in
        super::volumes::usage_by_type(tx, crate::domain::list::Scope::Project(project)).await?
    {
        usage.add(&volume_type, volumes, gigabytes);
    }
    let extending = tx
        .query(
            "SELECT v.volume_type, v.size_gib, o.detail FROM operations o JOIN volumes v ON v.id = o.volume_id \
             WHERE o.kind = 'extend-volume' AND v.project_id = $1 AND v.deleted = 0 AND v.status = $2",
            &params![project, VolumeStatus::Extending.to_string()],
        )
        .await?;
    for r in &extending {
        let detail = r.text(2)?;
        let kind: crate::domain::model::OpKind = serde_json::from_str(&detail)
            .map_err(|e| StoreError::Corrupt(format!("operations.detail {detail:?}: {e}")))?;
        if let crate::domain::model::OpKind::ExtendVolume { new_size_gib } = kind {
            usage.reserve(&r.text(0)?, (new_size_gib - r.int(1)?).max(0));
        }
    }
    Ok(usage)
}
