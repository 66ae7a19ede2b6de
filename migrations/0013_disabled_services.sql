-- Services an admin disabled (`cinder service-disable`, `PUT /os-services/disable` and
-- `disable-log-reason`): a node's backend, `node@backend`, that takes no new volumes until it is
-- enabled again (`host/src/attach/services.rs`). Its volumes are served as before. A row per
-- disabled service; enabling deletes it.
CREATE TABLE disabled_services (
    host        TEXT PRIMARY KEY,
    reason      TEXT,
    disabled_at BIGINT NOT NULL
);
