//! What a list shows: who may see which rows, the filters, and keyset paging as Cinder pages
//! (`limit`, `marker`, `offset`, `sort`). The API fills these in; the store turns them into SQL.

use std::collections::BTreeMap;

/// Who may see a row.
#[derive(Debug, Clone, Copy)]
pub enum Scope<'a> {
    Project(&'a str),
    All,
}

/// Paging of a list: `limit`, `offset`, and the id of the last row of the previous page.
#[derive(Debug, Clone, Default)]
pub struct Page {
    pub limit: Option<i64>,
    pub offset: Option<i64>,
    pub marker: Option<String>,
    /// (column, ascending) pairs, already validated against the resource's sort keys.
    pub sort: Vec<(String, bool)>,
}

/// The most rows one page returns (Cinder's `osapi_max_limit`).
pub const MAX_PAGE: i64 = 1000;

/// Filters of a volume list.
#[derive(Debug, Clone, Default)]
pub struct VolumeFilter {
    pub name: Option<String>,
    pub status: Option<String>,
    pub volume_type: Option<String>,
    pub multiattach: Option<bool>,
    /// `created_at` compared with a time (microversion 3.60), in microseconds.
    pub created_at: Option<(Compare, i64)>,
    /// The same for `updated_at`.
    pub updated_at: Option<(Compare, i64)>,
    /// Only volumes that have every one of these metadata items.
    pub metadata: BTreeMap<String, String>,
    /// Only volumes that have every one of these image properties (`glance_metadata`).
    pub image_metadata: BTreeMap<String, String>,
    pub size_gib: Option<i64>,
    pub bootable: Option<bool>,
    /// A filter on a field every volume here has the same value of, asking for another
    /// (another zone, one that does not count against quota, a group's): no volume matches.
    pub nothing: bool,
}

/// A comparison of a time filter (`created_at=gt:2026-11-24T10:00:00`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compare {
    Gt,
    Gte,
    Eq,
    Neq,
    Lt,
    Lte,
}

impl Compare {
    /// Cinder's operator names.
    pub fn parse(op: &str) -> Option<Compare> {
        Some(match op {
            "gt" => Compare::Gt,
            "gte" => Compare::Gte,
            "eq" => Compare::Eq,
            "neq" => Compare::Neq,
            "lt" => Compare::Lt,
            "lte" => Compare::Lte,
            _ => return None,
        })
    }

    /// The SQL operator.
    pub fn sql(self) -> &'static str {
        match self {
            Compare::Gt => ">",
            Compare::Gte => ">=",
            Compare::Eq => "=",
            Compare::Neq => "<>",
            Compare::Lt => "<",
            Compare::Lte => "<=",
        }
    }
}

/// The keys a volume list may be sorted by.
pub const VOLUME_SORT_KEYS: &[&str] =
    &["created_at", "updated_at", "id", "name", "status", "size_gib", "volume_type"];

/// Filters of an attachment list.
#[derive(Debug, Clone, Default)]
pub struct AttachmentFilter {
    pub volume_id: Option<String>,
    pub instance_uuid: Option<String>,
    pub attach_status: Option<String>,
}

/// The keys an attachment list may be sorted by (Cinder: columns of `volume_attachment`).
pub const ATTACHMENT_SORT_KEYS: &[&str] = &[
    "created_at",
    "updated_at",
    "id",
    "volume_id",
    "instance_uuid",
    "attach_status",
    "attach_mode",
    "attach_time",
    "detach_time",
];

/// Filters of a message list (Cinder's: `resource_filters.json`'s `message`).
#[derive(Debug, Clone, Default)]
pub struct MessageFilter {
    pub resource_uuid: Option<String>,
    pub resource_type: Option<String>,
    pub event_id: Option<String>,
    pub request_id: Option<String>,
    pub message_level: Option<String>,
}

/// The keys a message list may be sorted by (Cinder: columns of `messages`).
pub const MESSAGE_SORT_KEYS: &[&str] =
    &["created_at", "id", "event_id", "resource_uuid", "resource_type", "request_id", "message_level"];
