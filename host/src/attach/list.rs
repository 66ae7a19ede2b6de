//! What a list shows: who may see which rows, the filters, and keyset paging as Cinder pages
//! (`limit`, `marker`, `offset`, `sort`). The API fills these in; the store turns them into SQL.

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
