//! Volume quotas (Cinder's `os-quota-sets` and `os-quota-class-sets`: `cinder quota-update`,
//! `quota-class-update default`): limits an admin sets on a project, or on the default quota
//! class for every project without a limit of its own, on the number and GiB of its volumes (of
//! each type too) and on the size of one volume. None is set unless an admin sets it: out of
//! the box everything is unlimited, as it was before quotas were enforced.
//!
//! A change is checked in the transaction that makes it (a create, an extend, a retype, a
//! transfer accepted), against the project's live volumes counted in that transaction (a volume
//! being extended at its new size), so two changes can never both pass a limit only one of them
//! fits in: SQLite's writers are one at a time, and on PostgreSQL each such transaction first
//! takes its project's quota lock (`store::quotas::order`), on every node alike. Nothing is
//! reserved ahead and nothing is kept to drift from the volumes: a delete frees its share as it
//! commits. A limit set below what a project uses already is refused, as Cinder does.

use std::collections::BTreeMap;

use super::{AttachError, Caller, Service};
use crate::domain::quotas::{self, Change, Limits, MAX_LIMIT, PER_VOLUME, UNLIMITED, Usage};
use crate::store::quotas::{self as stored, Holder};
use crate::store::sql::Tx;

impl Service {
    /// Refuses `change` to `project`'s volumes when it would pass one of the project's limits.
    /// Runs inside the write transaction that makes the change.
    pub(super) async fn within_quota(
        &self,
        tx: &mut Tx,
        project: &str,
        change: &Change<'_>,
    ) -> Result<(), AttachError> {
        stored::order(tx, project).await?;
        let limits = stored::of_project(tx, project).await?;
        if !limits.any() {
            return Ok(());
        }
        let usage = stored::usage(tx, project).await?;
        Ok(quotas::check(&limits, &usage, change)?)
    }

    /// The resources a limit may be set on: the project's volumes and GiB, each volume type's of
    /// this deployment, and the size of one volume.
    pub fn quota_resources(&self) -> Vec<String> {
        let mut names = vec!["volumes".to_string(), "gigabytes".to_string(), PER_VOLUME.to_string()];
        for t in &self.catalog.types {
            names.push(quotas::volumes_of(&t.name));
            names.push(quotas::gigabytes_of(&t.name));
        }
        names
    }

    /// The limits that apply to `project` (the default class's, its own over them).
    pub async fn project_quotas(&self, project: &str) -> Result<Limits, AttachError> {
        Ok(self.store.read(async |tx| stored::of_project(tx, project).await).await?)
    }

    /// The default class's limits: every project's where it has none of its own.
    pub async fn default_quotas(&self) -> Result<Limits, AttachError> {
        Ok(Limits(self.store.read(async |tx| stored::own(tx, Holder::DefaultClass).await).await?))
    }

    /// What `project`'s volumes use.
    pub async fn quota_usage(&self, project: &str) -> Result<Usage, AttachError> {
        Ok(self.store.read(async |tx| stored::usage(tx, project).await).await?)
    }

    /// Sets limits of `holder` (all of them or none): each must be a resource of
    /// [`Self::quota_resources`] and `-1` (unlimited) or a number of volumes or GiB; a project's
    /// may not be below what it uses (but for `per_volume_gigabytes`, which bounds the next
    /// volumes only).
    pub async fn set_quotas(
        &self,
        caller: &Caller,
        holder: Holder<'_>,
        limits: &BTreeMap<String, i64>,
    ) -> Result<(), AttachError> {
        let resources = self.quota_resources();
        for (resource, &limit) in limits {
            if !resources.contains(resource) {
                return Err(AttachError::InvalidInput(format!("Bad key(s) in quota set: {resource}")));
            }
            if !(UNLIMITED..=MAX_LIMIT).contains(&limit) {
                return Err(AttachError::InvalidInput(format!(
                    "Quota limit {limit} for {resource} must be -1 (unlimited) or from 0 to {MAX_LIMIT}."
                )));
            }
        }
        self.store
            .write(async |tx| {
                if let Holder::Project(project) = holder {
                    stored::order(tx, project).await?;
                    let usage = stored::usage(tx, project).await?;
                    for (resource, &limit) in limits {
                        let used = usage.of(resource);
                        if resource != PER_VOLUME && limit != UNLIMITED && limit < used {
                            return Err(AttachError::InvalidInput(format!(
                                "Quota {resource} limit must be equal or greater than existing resources. \
                                 Current usage is {used} and the requested limit is {limit}."
                            )));
                        }
                    }
                }
                for (resource, &limit) in limits {
                    stored::set(tx, holder, resource, limit).await?;
                }
                Ok::<_, AttachError>(())
            })
            .await?;
        if !limits.is_empty() {
            tracing::info!(holder = ?holder, ?limits, admin = %caller.user_id, "quotas set");
        }
        Ok(())
    }

    /// Takes `project`'s own limits away: the default class's apply again.
    pub async fn reset_quotas(&self, caller: &Caller, project: &str) -> Result<(), AttachError> {
        let cleared = self.store.write(async |tx| stored::clear(tx, Holder::Project(project)).await).await?;
        if cleared > 0 {
            tracing::info!(project, admin = %caller.user_id, "quotas reset to the defaults");
        }
        Ok(())
    }
}
