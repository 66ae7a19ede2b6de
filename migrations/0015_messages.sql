-- User messages (Cinder's `/messages`, 3.3; `cinder message-list`): what failed in an operation
-- on a project's volume, for its users to read afterwards, as Cinder records them: a volume whose
-- driver failed to make it, to grow it, to attach or to detach it (`host/src/attach/messages.rs`).
-- Recorded in the transaction of the failure; an action and a detail by Cinder's ids, never the
-- driver's own words. Each expires (`[messages] keep_days`).
CREATE TABLE messages (
    id            TEXT PRIMARY KEY,
    project_id    TEXT NOT NULL,
    request_id    TEXT,
    resource_type TEXT NOT NULL,
    resource_uuid TEXT,
    event_id      TEXT NOT NULL,
    action_id     TEXT NOT NULL,
    detail_id     TEXT NOT NULL,
    message_level TEXT NOT NULL,
    created_at    BIGINT NOT NULL,
    expires_at    BIGINT NOT NULL
);
CREATE INDEX messages_by_project ON messages (project_id, created_at);
CREATE INDEX messages_by_expiry ON messages (expires_at);
