-- Durable operations, target ownership, and Nova's live-migration slot.

-- Every flow that calls a driver to change a backend records its intent here, in the same
-- transaction as the state change that starts it, and deletes the row in the transaction that
-- records its outcome. A row whose owner is gone (a killed process, a lost lease) is driven to a
-- safe end by the reconciler (`host/src/attach/recover.rs`).
CREATE TABLE operations (
    id            TEXT PRIMARY KEY,
    -- connect, reconnect, disconnect, force-detach, create-volume, delete-volume, repair, revoke,
    -- remove-export
    kind          TEXT NOT NULL,
    volume_id     TEXT NOT NULL,
    attachment_id TEXT,
    -- The connector the operation grants or revokes (JSON text; initiator names, no secrets).
    connector     TEXT,
    -- What else the kind needs to finish or undo it (JSON text).
    detail        TEXT NOT NULL,
    -- The last step the owner recorded (informational: every recovery is idempotent).
    step          TEXT NOT NULL,
    -- The node and the process (incarnation) that own the operation, and until when.
    node          TEXT NOT NULL,
    incarnation   TEXT NOT NULL,
    lease_until   BIGINT NOT NULL,
    created_at    BIGINT NOT NULL,
    updated_at    BIGINT NOT NULL
);

-- One operation at a time per volume: a volume's driver calls never overlap, whichever process
-- makes them, and an interrupted operation is finished before the next one starts.
CREATE UNIQUE INDEX one_operation_per_volume ON operations (volume_id);

-- Targets this service created on its iSCSI target services, with the backend and volume whose
-- driver call created them: the reconciler removes only what is recorded here.
CREATE TABLE targets (
    iqn        TEXT PRIMARY KEY,
    backend    TEXT NOT NULL,
    volume_id  TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX targets_by_volume ON targets (volume_id);

-- Nova's live migration gives a non-multiattach volume a second live attachment for the same
-- instance (Cinder's `_attachment_reserve`, LP 1694530). `exclusive` becomes a slot: 0 for a
-- multiattach volume's attachments, 1 for the attachment of a non-multiattach volume, 2 for the
-- destination of a live migration. At most one live attachment per slot: the backstop now bounds
-- a non-multiattach volume to two live attachments, and the conditional logic in the same
-- transaction requires the second to name the instance of the first.
DROP INDEX one_live_attachment_per_exclusive_volume;
CREATE UNIQUE INDEX one_live_attachment_per_exclusive_slot
    ON volume_attachment (volume_id, exclusive) WHERE exclusive > 0 AND deleted = 0;
