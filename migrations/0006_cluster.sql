-- Several nodes on one database (README, "Several nodes"): the URL other nodes forward a volume's
-- requests to, the backends a node serves together with other nodes (a driver that reaches its
-- backend over the network), and a fencing generation for operations: a take-over increments
-- it, and every write of an operation's owner names the generation it holds, so a node that lost
-- its lease can no longer record anything.
ALTER TABLE nodes ADD COLUMN url TEXT;
ALTER TABLE nodes ADD COLUMN shared_backends TEXT NOT NULL DEFAULT '';
ALTER TABLE operations ADD COLUMN generation BIGINT NOT NULL DEFAULT 1;
