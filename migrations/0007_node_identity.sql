-- Who holds a node's name, and what the node runs. `incarnation` is the process that registered
-- the name last (every heartbeat names it, so a second process cannot take a live node's name
-- unnoticed); `holder` is where that process runs (host and data directory: a restart from the
-- same data directory holds its lock, so its predecessor is gone). `lease_seconds` and
-- `backend_info` (per backend: shared or not, the driver and its digest) let a node that starts
-- find the settings on which it disagrees with the live nodes, and refuse to start.
ALTER TABLE nodes ADD COLUMN incarnation TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN holder TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN lease_seconds BIGINT NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN backend_info TEXT NOT NULL DEFAULT '{}';
