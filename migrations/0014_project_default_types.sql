-- A project's own default volume type (Cinder's default types, 3.62: `cinder default-type-set`):
-- a volume made in the project without a type gets this one instead of the configured default
-- (`host/src/attach/default_types.rs`). The type is named by its id (stable: derived from its
-- name). A row per project that has one; unsetting deletes it.
CREATE TABLE project_default_types (
    project_id     TEXT PRIMARY KEY,
    volume_type_id TEXT NOT NULL,
    updated_at     BIGINT NOT NULL
);
