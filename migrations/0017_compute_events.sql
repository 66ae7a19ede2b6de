-- Events owed to the compute service (Nova, `host/src/compute.rs`): a `volume-extended` event for
-- the instances attached to a volume that grew, written in the transaction that records its new
-- size and deleted once Nova took it (or gave an answer that trying again cannot change, then with
-- a user message), so that neither a kill nor Nova being down for a while loses it
-- (`host/src/attach/compute.rs`). `due_at`: when it may be sent (again); a sender claims it by
-- moving it on, and names its node in `claimed_by` (a node that starts again frees its claims).
CREATE TABLE compute_events (
    id         TEXT PRIMARY KEY,
    volume_id  TEXT NOT NULL,
    servers    TEXT NOT NULL,
    request_id TEXT,
    global_id  TEXT,
    attempts   BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    due_at     BIGINT NOT NULL,
    claimed_by TEXT
);
CREATE INDEX compute_events_due ON compute_events (due_at);
