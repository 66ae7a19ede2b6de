-- Every event written dirties one page of each structure it is stored in, and on SQLite each page
-- is written again at commit: the history's cost per event is its pages. This keeps two fewer:
--
-- * No index on an event's id. An event is found by its chain's place (volume, seq) through
--   `attach_events_chain`; new events' ids are UUIDv7 carrying the millisecond of their `at`, so
--   a list's marker is found through the time index (`host/src/store/events.rs`, `get`). Ids of
--   events recorded before this migration are random (v4): `attach_event_earlier_ids` maps them
--   to their chain's place, written here once and never again.
-- * Each chain's head on its volume's row (`history_seq`, `history_hash`; 0 and '' before its
--   first event), which every change that records an event holds and has already written.
--   Where a chain starts after retention pruned older events moves to `attach_event_starts`
--   (written by pruning only; no row: it starts at seq 1, after the genesis hash).
ALTER TABLE volumes ADD COLUMN history_seq BIGINT NOT NULL DEFAULT 0;
ALTER TABLE volumes ADD COLUMN history_hash TEXT NOT NULL DEFAULT '';
UPDATE volumes SET
    history_seq = (SELECT h.seq FROM attach_event_heads h WHERE h.volume_id = volumes.id),
    history_hash = (SELECT h.hash FROM attach_event_heads h WHERE h.volume_id = volumes.id)
WHERE id IN (SELECT volume_id FROM attach_event_heads);

CREATE TABLE attach_event_starts (
    volume_id  TEXT PRIMARY KEY,
    first_seq  BIGINT NOT NULL,
    first_prev TEXT NOT NULL
);
INSERT INTO attach_event_starts (volume_id, first_seq, first_prev)
    SELECT volume_id, first_seq, first_prev FROM attach_event_heads WHERE first_seq <> 1;
DROP TABLE attach_event_heads;

CREATE TABLE attach_events_by_place (
    id                TEXT NOT NULL,
    volume_id         TEXT NOT NULL,
    seq               BIGINT NOT NULL,
    at                BIGINT NOT NULL,
    event             TEXT NOT NULL,
    access            TEXT NOT NULL,
    outcome           TEXT NOT NULL,
    project_id        TEXT NOT NULL,
    attachment_id     TEXT,
    instance_uuid     TEXT,
    host              TEXT,
    initiator         TEXT,
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
INSERT INTO attach_events_by_place (id, volume_id, seq, at, event, access, outcome, project_id,
    attachment_id, instance_uuid, host, initiator, user_id, caller_project_id, roles, service_token,
    request_id, global_request_id, node, driver_digest, prev_hash, hash)
    SELECT id, volume_id, seq, at, event, access, outcome, project_id, attachment_id, instance_uuid,
        host, initiator, user_id, caller_project_id, roles, service_token, request_id,
        global_request_id, node, driver_digest, prev_hash, hash
    FROM attach_events;
CREATE TABLE attach_event_earlier_ids (
    id        TEXT PRIMARY KEY,
    volume_id TEXT NOT NULL,
    seq       BIGINT NOT NULL
);
INSERT INTO attach_event_earlier_ids (id, volume_id, seq) SELECT id, volume_id, seq FROM attach_events;
DROP TABLE attach_events;
ALTER TABLE attach_events_by_place RENAME TO attach_events;
CREATE UNIQUE INDEX attach_events_chain ON attach_events (volume_id, seq);
CREATE INDEX attach_events_by_project ON attach_events (project_id, at, id);
CREATE INDEX attach_events_by_time ON attach_events (at, id);
