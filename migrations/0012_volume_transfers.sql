-- Volume transfers (Cinder's `os-volume-transfer`, `volume-transfers` from 3.55): a volume's
-- project offers it, with a key it gives out of band, and the project that presents the key
-- takes it over (`host/src/attach/transfers.rs`). A row lives from the offer to its acceptance
-- or cancellation; the volume is `awaiting-transfer` meanwhile. The key is kept as a salted
-- sha256, never as given.
CREATE TABLE volume_transfers (
    id                TEXT PRIMARY KEY,
    volume_id         TEXT NOT NULL REFERENCES volumes (id),
    name              TEXT,
    source_project_id TEXT NOT NULL,
    salt              TEXT NOT NULL,
    key_hash          TEXT NOT NULL,
    created_at        BIGINT NOT NULL
);
CREATE UNIQUE INDEX one_transfer_per_volume ON volume_transfers (volume_id);
CREATE INDEX volume_transfers_by_project ON volume_transfers (source_project_id, created_at);
