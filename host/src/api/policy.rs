//! Who may call what: Cinder's secure defaults ("reader" reads, "member" changes what belongs to
//! its project, "admin" does everything), under Cinder's rule names where Cinder has one.
//!
//! Roles imply one another as Keystone's bootstrap makes them imply: `admin` ⇒ `member` ⇒
//! `reader`. A rule passes when one of the caller's (implied) roles is in the rule's list. Which
//! project a resource belongs to is checked by the store (another project's resource is 404, so
//! its existence is not revealed; admins reach every project's resources by id and list them with
//! `all_tenants`).
//!
//! The OSSA-2023-003 rule (an attachment that an instance uses and that is connected may be
//! deleted, terminated or detached only with a service token or by an admin; others get Cinder's
//! 409 `ConflictNovaUsingAttachment`) depends on the attachment, so the attach service checks it
//! (`attach/attachments.rs`, `remove_locked`).
//!
//! Operators override rules with a policy file (`[auth] policy_file`, TOML, rule name to roles):
//!
//! ```toml
//! "volume:create" = ["admin"]          # only admins create volumes
//! "volume:attachment_create" = ["admin", "member"]
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use super::error::ApiError;
use crate::attach::Caller;

/// Every rule the API checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rule {
    VolumeGet,
    VolumeGetAll,
    VolumeCreate,
    VolumeUpdate,
    VolumeDelete,
    VolumeForceDelete,
    VolumeUnmanage,
    Multiattach,
    MetadataGet,
    MetadataCreate,
    MetadataUpdate,
    MetadataDelete,
    TypeGet,
    TypeGetAll,
    AttachmentGet,
    AttachmentGetAll,
    AttachmentCreate,
    AttachmentUpdate,
    AttachmentComplete,
    AttachmentDelete,
    Reserve,
    Unreserve,
    InitializeConnection,
    Attach,
    BeginDetaching,
    RollDetaching,
    TerminateConnection,
    Detach,
    ForceDetach,
    Reimage,
    Retype,
    Extend,
    ExtendAttached,
    ExtendVolumeCompletion,
    ServiceIndex,
    ServiceUpdate,
    GetPools,
    Capabilities,
    DefaultTypeSet,
    DefaultTypeGet,
    DefaultTypeGetAll,
    DefaultTypeUnset,
    ClusterGetAll,
    ClusterGet,
    ClusterUpdate,
    ExtraSpecsGetAll,
    ExtraSpecsGet,
    TypeEncryptionGet,
    EncryptionMetadataGet,
    AttachmentEventGetAll,
    DriverGetAll,
    DriverUpgrade,
    AvailabilityZoneList,
    LimitsGet,
    QuotaShow,
    QuotaUpdate,
    QuotaDelete,
    QuotaClassShow,
    QuotaClassUpdate,
    TransferCreate,
    TransferAccept,
    TransferDelete,
    TransferGet,
    TransferGetAll,
    MessageGet,
    MessageGetAll,
    MessageDelete,
    ImageMetadataShow,
    ImageMetadataSet,
    ImageMetadataRemove,
    QosSpecsGetAll,
    QosSpecsGet,
    TypeQosSpecsId,
    SnapshotGet,
    SnapshotGetAll,
    SnapshotCreate,
    SnapshotDelete,
    BackupGet,
    BackupGetAll,
    BackupCreate,
    BackupDelete,
    GroupGet,
    GroupGetAll,
    GroupCreate,
    GroupUpdate,
    GroupSnapshotGet,
    GroupSnapshotGetAll,
    GroupSnapshotCreate,
    GroupSnapshotDelete,
    GroupTypeCreate,
    GroupTypeDelete,
}

/// The least role a rule needs by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Least {
    Reader,
    Member,
    Admin,
}

impl Rule {
    pub const ALL: [Rule; 91] = [
        Rule::VolumeGet,
        Rule::VolumeGetAll,
        Rule::VolumeCreate,
        Rule::VolumeUpdate,
        Rule::VolumeDelete,
        Rule::VolumeForceDelete,
        Rule::VolumeUnmanage,
        Rule::Multiattach,
        Rule::MetadataGet,
        Rule::MetadataCreate,
        Rule::MetadataUpdate,
        Rule::MetadataDelete,
        Rule::TypeGet,
        Rule::TypeGetAll,
        Rule::AttachmentGet,
        Rule::AttachmentGetAll,
        Rule::AttachmentCreate,
        Rule::AttachmentUpdate,
        Rule::AttachmentComplete,
        Rule::AttachmentDelete,
        Rule::Reserve,
        Rule::Unreserve,
        Rule::InitializeConnection,
        Rule::Attach,
        Rule::BeginDetaching,
        Rule::RollDetaching,
        Rule::TerminateConnection,
        Rule::Detach,
        Rule::ForceDetach,
        Rule::Reimage,
        Rule::Retype,
        Rule::Extend,
        Rule::ExtendAttached,
        Rule::ExtendVolumeCompletion,
        Rule::ServiceIndex,
        Rule::ServiceUpdate,
        Rule::GetPools,
        Rule::Capabilities,
        Rule::DefaultTypeSet,
        Rule::DefaultTypeGet,
        Rule::DefaultTypeGetAll,
        Rule::DefaultTypeUnset,
        Rule::ClusterGetAll,
        Rule::ClusterGet,
        Rule::ClusterUpdate,
        Rule::ExtraSpecsGetAll,
        Rule::ExtraSpecsGet,
        Rule::TypeEncryptionGet,
        Rule::EncryptionMetadataGet,
        Rule::AttachmentEventGetAll,
        Rule::DriverGetAll,
        Rule::DriverUpgrade,
        Rule::AvailabilityZoneList,
        Rule::LimitsGet,
        Rule::QuotaShow,
        Rule::QuotaUpdate,
        Rule::QuotaDelete,
        Rule::QuotaClassShow,
        Rule::QuotaClassUpdate,
        Rule::TransferCreate,
        Rule::TransferAccept,
        Rule::TransferDelete,
        Rule::TransferGet,
        Rule::TransferGetAll,
        Rule::MessageGet,
        Rule::MessageGetAll,
        Rule::MessageDelete,
        Rule::ImageMetadataShow,
        Rule::ImageMetadataSet,
        Rule::ImageMetadataRemove,
        Rule::QosSpecsGetAll,
        Rule::QosSpecsGet,
        Rule::TypeQosSpecsId,
        Rule::SnapshotGet,
        Rule::SnapshotGetAll,
        Rule::SnapshotCreate,
        Rule::SnapshotDelete,
        Rule::BackupGet,
        Rule::BackupGetAll,
        Rule::BackupCreate,
        Rule::BackupDelete,
        Rule::GroupGet,
        Rule::GroupGetAll,
        Rule::GroupCreate,
        Rule::GroupUpdate,
        Rule::GroupSnapshotGet,
        Rule::GroupSnapshotGetAll,
        Rule::GroupSnapshotCreate,
        Rule::GroupSnapshotDelete,
        Rule::GroupTypeCreate,
        Rule::GroupTypeDelete,
    ];

    /// The rule's name: Cinder's where Cinder has the rule (`cinder/policies/*.py`).
    pub fn name(self) -> &'static str {
        match self {
            Rule::VolumeGet => "volume:get",
            Rule::VolumeGetAll => "volume:get_all",
            Rule::VolumeCreate => "volume:create",
            Rule::VolumeUpdate => "volume:update",
            Rule::VolumeDelete => "volume:delete",
            Rule::VolumeForceDelete => "volume:force_delete",
            Rule::VolumeUnmanage => "volume_extension:volume_unmanage",
            // A volume of a multiattach type: made, or retyped to.
            Rule::Multiattach => "volume:multiattach",
            Rule::MetadataGet => "volume:get_volume_metadata",
            Rule::MetadataCreate => "volume:create_volume_metadata",
            Rule::MetadataUpdate => "volume:update_volume_metadata",
            Rule::MetadataDelete => "volume:delete_volume_metadata",
            Rule::TypeGet => "volume_extension:type_get",
            Rule::TypeGetAll => "volume_extension:type_get_all",
            // Cinder scopes attachment reads by project without a rule; these are Berth's.
            Rule::AttachmentGet => "volume:attachment_get",
            Rule::AttachmentGetAll => "volume:attachment_get_all",
            Rule::AttachmentCreate => "volume:attachment_create",
            Rule::AttachmentUpdate => "volume:attachment_update",
            Rule::AttachmentComplete => "volume:attachment_complete",
            Rule::AttachmentDelete => "volume:attachment_delete",
            Rule::Reserve => "volume_extension:volume_actions:reserve",
            Rule::Unreserve => "volume_extension:volume_actions:unreserve",
            Rule::InitializeConnection => "volume_extension:volume_actions:initialize_connection",
            Rule::Attach => "volume_extension:volume_actions:attach",
            Rule::BeginDetaching => "volume_extension:volume_actions:begin_detaching",
            Rule::RollDetaching => "volume_extension:volume_actions:roll_detaching",
            Rule::TerminateConnection => "volume_extension:volume_actions:terminate_connection",
            Rule::Detach => "volume_extension:volume_actions:detach",
            Rule::ForceDetach => "volume_extension:volume_admin_actions:force_detach",
            Rule::Reimage => "volume:reimage",
            Rule::Retype => "volume:retype",
            Rule::Extend => "volume:extend",
            Rule::ExtendAttached => "volume:extend_attached_volume",
            Rule::ExtendVolumeCompletion => "volume_extension:volume_admin_actions:extend_volume_completion",
            Rule::ServiceIndex => "volume_extension:services:index",
            // Disabling and enabling a backend for new volumes.
            Rule::ServiceUpdate => "volume_extension:services:update",
            Rule::GetPools => "scheduler_extension:scheduler_stats:get_pools",
            Rule::Capabilities => "volume_extension:capabilities",
            Rule::DefaultTypeSet => "volume_extension:default_set_or_update",
            Rule::DefaultTypeGet => "volume_extension:default_get",
            Rule::DefaultTypeGetAll => "volume_extension:default_get_all",
            Rule::DefaultTypeUnset => "volume_extension:default_unset",
            Rule::ClusterGetAll => "clusters:get_all",
            Rule::ClusterGet => "clusters:get",
            Rule::ClusterUpdate => "clusters:update",
            Rule::ExtraSpecsGetAll => "volume_extension:types_extra_specs:index",
            Rule::ExtraSpecsGet => "volume_extension:types_extra_specs:show",
            Rule::TypeEncryptionGet => "volume_extension:volume_type_encryption:get",
            Rule::EncryptionMetadataGet => "volume_extension:volume_encryption_metadata",
            // Berth's: the attach history (members read their projects' events).
            Rule::AttachmentEventGetAll => "volume:attachment_event_get_all",
            // Berth's: the drivers each backend runs, their upgrades and rollbacks.
            Rule::DriverGetAll => "berth:driver:get_all",
            Rule::DriverUpgrade => "berth:driver:upgrade",
            Rule::AvailabilityZoneList => "volume_extension:availability_zone_list",
            Rule::LimitsGet => "limits_extension:used_limits",
            Rule::QuotaShow => "volume_extension:quotas:show",
            Rule::QuotaUpdate => "volume_extension:quotas:update",
            Rule::QuotaDelete => "volume_extension:quotas:delete",
            Rule::QuotaClassShow => "volume_extension:quota_classes:get",
            Rule::QuotaClassUpdate => "volume_extension:quota_classes:update",
            Rule::TransferCreate => "volume:create_transfer",
            Rule::TransferAccept => "volume:accept_transfer",
            Rule::TransferDelete => "volume:delete_transfer",
            Rule::TransferGet => "volume:get_transfer",
            Rule::TransferGetAll => "volume:get_all_transfers",
            Rule::MessageGet => "message:get",
            Rule::MessageGetAll => "message:get_all",
            Rule::MessageDelete => "message:delete",
            Rule::ImageMetadataShow => "volume_extension:volume_image_metadata:show",
            Rule::ImageMetadataSet => "volume_extension:volume_image_metadata:set",
            Rule::ImageMetadataRemove => "volume_extension:volume_image_metadata:remove",
            // Lists the specs and each one's associations.
            Rule::QosSpecsGetAll => "volume_extension:qos_specs_manage:get_all",
            Rule::QosSpecsGet => "volume_extension:qos_specs_manage:get",
            // Who sees a volume type's `qos_specs_id`.
            Rule::TypeQosSpecsId => "volume_extension:access_types_qos_specs_id",
            Rule::SnapshotGet => "volume:get_snapshot",
            Rule::SnapshotGetAll => "volume:get_all_snapshots",
            Rule::SnapshotCreate => "volume:create_snapshot",
            Rule::SnapshotDelete => "volume:delete_snapshot",
            Rule::BackupGet => "backup:get",
            Rule::BackupGetAll => "backup:get_all",
            Rule::BackupCreate => "backup:create",
            Rule::BackupDelete => "backup:delete",
            Rule::GroupGet => "group:get",
            Rule::GroupGetAll => "group:get_all",
            Rule::GroupCreate => "group:create",
            Rule::GroupUpdate => "group:update",
            Rule::GroupSnapshotGet => "group:get_group_snapshot",
            Rule::GroupSnapshotGetAll => "group:get_all_group_snapshots",
            Rule::GroupSnapshotCreate => "group:create_group_snapshot",
            Rule::GroupSnapshotDelete => "group:delete_group_snapshot",
            Rule::GroupTypeCreate => "group:group_types:create",
            Rule::GroupTypeDelete => "group:group_types:delete",
        }
    }

    fn least(self) -> Least {
        match self {
            Rule::VolumeGet
            | Rule::VolumeGetAll
            | Rule::MetadataGet
            | Rule::TypeGet
            | Rule::TypeGetAll
            | Rule::ExtraSpecsGetAll
            | Rule::ExtraSpecsGet
            | Rule::EncryptionMetadataGet
            | Rule::AttachmentGet
            | Rule::AttachmentGetAll
            | Rule::AttachmentEventGetAll
            | Rule::AvailabilityZoneList
            | Rule::LimitsGet
            | Rule::QuotaShow
            | Rule::TransferGet
            | Rule::TransferGetAll
            | Rule::MessageGet
            | Rule::MessageGetAll
            | Rule::ImageMetadataShow
            | Rule::SnapshotGet
            | Rule::SnapshotGetAll
            | Rule::BackupGet
            | Rule::BackupGetAll
            | Rule::GroupGet
            | Rule::GroupGetAll
            | Rule::GroupSnapshotGet
            | Rule::GroupSnapshotGetAll => Least::Reader,
            Rule::VolumeForceDelete
            | Rule::VolumeUnmanage
            | Rule::ForceDetach
            | Rule::ExtendVolumeCompletion
            | Rule::ServiceIndex
            | Rule::ServiceUpdate
            | Rule::GetPools
            | Rule::Capabilities
            | Rule::TypeEncryptionGet
            | Rule::DefaultTypeSet
            | Rule::DefaultTypeGet
            | Rule::DefaultTypeGetAll
            | Rule::DefaultTypeUnset
            | Rule::ClusterGetAll
            | Rule::ClusterGet
            | Rule::ClusterUpdate
            | Rule::DriverGetAll
            | Rule::DriverUpgrade
            | Rule::QuotaUpdate
            | Rule::QuotaDelete
            | Rule::QuotaClassShow
            | Rule::QuotaClassUpdate
            | Rule::QosSpecsGetAll
            | Rule::QosSpecsGet
            | Rule::TypeQosSpecsId
            | Rule::GroupTypeCreate
            | Rule::GroupTypeDelete => Least::Admin,
            _ => Least::Member,
        }
    }

    fn by_name(name: &str) -> Option<Rule> {
        Rule::ALL.into_iter().find(|r| r.name() == name)
    }
}

/// The roles each rule accepts.
#[derive(Debug, Clone)]
pub struct Policy {
    rules: BTreeMap<Rule, Vec<String>>,
}

impl Default for Policy {
    fn default() -> Self {
        let rules = Rule::ALL
            .into_iter()
            .map(|rule| {
                let roles: &[&str] = match rule.least() {
                    Least::Reader => &["admin", "member", "reader"],
                    Least::Member => &["admin", "member"],
                    Least::Admin => &["admin"],
                };
                (rule, roles.iter().map(|r| r.to_string()).collect())
            })
            .collect();
        Policy { rules }
    }
}

impl Policy {
    /// The defaults with the overrides of a policy file. An unknown rule name is an error (a typo
    /// would otherwise leave the default in force).
    pub fn from_file(path: &Path) -> Result<Policy, String> {
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Policy::from_toml(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn from_toml(text: &str) -> Result<Policy, String> {
        let overrides: BTreeMap<String, Vec<String>> = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut policy = Policy::default();
        for (name, roles) in overrides {
            let rule = Rule::by_name(&name).ok_or_else(|| {
                let known: Vec<&str> = Rule::ALL.iter().map(|r| r.name()).collect();
                format!("unknown policy rule {name:?}; the rules are: {}", known.join(", "))
            })?;
            policy.rules.insert(rule, roles);
        }
        Ok(policy)
    }

    /// Whether `caller` passes `rule`.
    pub fn allows(&self, caller: &Caller, rule: Rule) -> bool {
        let accepted = &self.rules[&rule];
        implied_roles(&caller.roles).any(|role| accepted.iter().any(|a| a == role))
    }

    /// `Ok` when `caller` passes `rule`, else Cinder's 403 "Policy doesn't allow ... to be
    /// performed."
    pub fn authorize(&self, caller: &Caller, rule: Rule) -> Result<(), ApiError> {
        if self.allows(caller, rule) {
            Ok(())
        } else {
            tracing::info!(user = %caller.user_id, project = %caller.project_id, rule = rule.name(), "refused by policy");
            Err(ApiError::forbidden(rule.name()))
        }
    }
}

/// A caller's roles with those they imply (admin ⇒ member ⇒ reader).
fn implied_roles(roles: &[String]) -> impl Iterator<Item = &str> {
    let has = |r: &str| roles.iter().any(|x| x == r);
    let admin = has("admin");
    let member = admin || has("member");
    let reader = member || has("reader");
    roles
        .iter()
        .map(String::as_str)
        .chain(admin.then_some("admin"))
        .chain(member.then_some("member"))
        .chain(reader.then_some("reader"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(roles: &[&str]) -> Caller {
        Caller {
            user_id: "u".into(),
            project_id: "p".into(),
            roles: roles.iter().map(|r| r.to_string()).collect(),
            is_service: false,
            request: Default::default(),
        }
    }

    #[test]
    fn defaults_follow_cinders_secure_roles() {
        let p = Policy::default();
        for (roles, rule, allowed) in [
            (&["reader"][..], Rule::VolumeGet, true),
            (&["reader"], Rule::AttachmentGetAll, true),
            (&["reader"], Rule::VolumeCreate, false),
            (&["reader"], Rule::AttachmentCreate, false),
            (&["reader"], Rule::TerminateConnection, false),
            (&["member"], Rule::VolumeGet, true),
            (&["member"], Rule::AttachmentCreate, true),
            (&["member"], Rule::VolumeForceDelete, false),
            (&["member"], Rule::ForceDetach, false),
            (&["admin"], Rule::ForceDetach, true),
            (&["admin"], Rule::VolumeGet, true),
            (&[], Rule::VolumeGet, false),
            (&["service"], Rule::AttachmentDelete, false),
        ] {
            assert_eq!(p.allows(&caller(roles), rule), allowed, "{roles:?} {}", rule.name());
        }
    }

    #[test]
    fn a_policy_file_overrides_by_cinders_rule_names() {
        let p = Policy::from_toml(
            "\"volume:create\" = [\"admin\"]\n\"volume:get\" = [\"auditor\", \"member\"]\n",
        )
        .unwrap();
        assert!(!p.allows(&caller(&["member"]), Rule::VolumeCreate));
        assert!(p.allows(&caller(&["admin"]), Rule::VolumeCreate));
        assert!(p.allows(&caller(&["auditor"]), Rule::VolumeGet));
        assert!(!p.allows(&caller(&["reader"]), Rule::VolumeGet));
        assert!(p.allows(&caller(&["admin"]), Rule::VolumeGet), "admin implies member");
        // Untouched rules keep their defaults.
        assert!(p.allows(&caller(&["member"]), Rule::AttachmentCreate));
        let error = Policy::from_toml("\"volume:craete\" = [\"admin\"]").unwrap_err();
        assert!(error.contains("unknown policy rule \"volume:craete\""), "{error}");
    }

    #[test]
    fn refusals_are_cinders_403() {
        let e = Policy::default().authorize(&caller(&["reader"]), Rule::AttachmentDelete).unwrap_err();
        assert_eq!(e.status, axum::http::StatusCode::FORBIDDEN);
        assert_eq!(e.message, "Policy doesn't allow volume:attachment_delete to be performed.");
    }
}
