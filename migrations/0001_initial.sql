-- Berth's state: volumes, their attachments, and each attachment's connector.
-- This SQL runs unchanged on SQLite and PostgreSQL. Times are microseconds since the Unix epoch
-- (UTC); JSON is stored as text; flags are BIGINT 0/1 (sqlx's Any driver cannot read SQLite
-- BOOLEAN columns). Migrations are never edited once released: add a new file.

CREATE TABLE volumes (
    id                TEXT PRIMARY KEY,
    project_id        TEXT NOT NULL,
    user_id           TEXT NOT NULL,
    name              TEXT,
    description       TEXT,
    size_gib          BIGINT NOT NULL,
    volume_type       TEXT NOT NULL,
    backend           TEXT NOT NULL,
    multiattach       BIGINT NOT NULL,
    status            TEXT NOT NULL,
    attach_status     TEXT NOT NULL,
    provider_location TEXT,
    provider_auth     TEXT,
    provider_id       TEXT,
    driver_data       TEXT NOT NULL,
    metadata          TEXT NOT NULL,
    shared_targets    BIGINT,
    service_uuid      TEXT,
    created_at        BIGINT NOT NULL,
    updated_at        BIGINT NOT NULL,
    deleted           BIGINT NOT NULL DEFAULT 0,
    deleted_at        BIGINT
);

CREATE INDEX volumes_by_project ON volumes (project_id, created_at) WHERE deleted = 0;

CREATE TABLE volume_attachment (
    id              TEXT PRIMARY KEY,
    volume_id       TEXT NOT NULL REFERENCES volumes (id),
    project_id      TEXT NOT NULL,
    instance_uuid   TEXT,
    attached_host   TEXT,
    mountpoint      TEXT,
    attach_mode     TEXT,
    attach_status   TEXT NOT NULL,
    -- True when the volume is not multiattach: such a volume has at most one live attachment.
    exclusive       BIGINT NOT NULL,
    connection_info TEXT,
    attach_time     BIGINT,
    detach_time     BIGINT,
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL,
    deleted         BIGINT NOT NULL DEFAULT 0,
    deleted_at      BIGINT
);

-- The backstop behind the state machine's conditional updates: no race, bug or manual edit can
-- give a non-multiattach volume two live attachments.
CREATE UNIQUE INDEX one_live_attachment_per_exclusive_volume
    ON volume_attachment (volume_id) WHERE exclusive = 1 AND deleted = 0;

CREATE INDEX volume_attachment_by_volume ON volume_attachment (volume_id) WHERE deleted = 0;
CREATE INDEX volume_attachment_by_project ON volume_attachment (project_id, created_at) WHERE deleted = 0;

-- The connector of each attachment, one row per key (the design of the Ocata attach spec). The
-- value is the key's JSON text, so types survive and values may be of any length.
CREATE TABLE attachment_specs (
    attachment_id TEXT NOT NULL REFERENCES volume_attachment (id),
    key           TEXT NOT NULL,
    value         TEXT NOT NULL,
    PRIMARY KEY (attachment_id, key)
);
