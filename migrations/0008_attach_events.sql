-- The attach history: every change to a volume's or an attachment's access, appended in the
-- transaction that makes the change (`host/src/attach/history.rs`). Rows are never updated;
-- retention deletes the oldest of a volume's chain only.
--
-- Tamper evidence: the events of one volume form a hash chain (`seq` 1, 2, ...; `hash` is the
-- sha256 of `prev_hash` and the event's other fields, `host/src/domain/history.rs`), and
-- `attach_event_heads` holds each chain's last link, so an edited, inserted or deleted event,
-- the last one included, is found by `berth history verify`. A chain per volume, not one for
-- the whole service: a volume's changes are already serialised by its row's lock, so the
-- history adds no lock that nodes of a cluster would contend for.
CREATE TABLE attach_events (
    id                TEXT PRIMARY KEY,
    volume_id         TEXT NOT NULL,
    seq               BIGINT NOT NULL,
    -- Microseconds since the epoch.
    at                BIGINT NOT NULL,
    -- The state machine's event (reserve, connect, complete, detach, force-detach, ...).
    event             TEXT NOT NULL,
    -- What it did to a host's access to the volume: granted, revoked or none.
    access            TEXT NOT NULL,
    -- The attachment's status after the change (`failed`: a change that was undone).
    outcome           TEXT NOT NULL,
    -- The volume's project: who may read the event.
    project_id        TEXT NOT NULL,
    attachment_id     TEXT,
    instance_uuid     TEXT,
    -- The connector's host and initiator (never its secrets).
    host              TEXT,
    initiator         TEXT,
    -- The caller, as authenticated (roles: a JSON array).
    user_id           TEXT NOT NULL,
    caller_project_id TEXT NOT NULL,
    roles             TEXT NOT NULL,
    service_token     BIGINT NOT NULL,
    request_id        TEXT,
    global_request_id TEXT,
    node              TEXT NOT NULL,
    driver_digest     TEXT,
    prev_hash         TEXT NOT NULL,
    hash              TEXT NOT NULL
);
CREATE UNIQUE INDEX attach_events_chain ON attach_events (volume_id, seq);
-- Lists are in time order: a volume's (the usual question), an attachment's, a project's, all.
CREATE INDEX attach_events_by_volume ON attach_events (volume_id, at, id);
CREATE INDEX attach_events_by_attachment ON attach_events (attachment_id, at, id);
CREATE INDEX attach_events_by_project ON attach_events (project_id, at, id);
CREATE INDEX attach_events_by_time ON attach_events (at, id);

-- Each volume's chain: its last event's place and hash, and where it starts (the first `seq`
-- still stored, and the hash it links to, after retention pruned older events).
CREATE TABLE attach_event_heads (
    volume_id  TEXT PRIMARY KEY,
    seq        BIGINT NOT NULL,
    hash       TEXT NOT NULL,
    first_seq  BIGINT NOT NULL,
    first_prev TEXT NOT NULL
);
