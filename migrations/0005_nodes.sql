-- The Berth nodes that serve this database, each with the backends it serves and a heartbeat
-- (GET /v3/{project}/os-services).
CREATE TABLE nodes (
    name VARCHAR(255) PRIMARY KEY,
    backends TEXT NOT NULL,
    version VARCHAR(64) NOT NULL,
    started_at BIGINT NOT NULL,
    heartbeat_at BIGINT NOT NULL
);
