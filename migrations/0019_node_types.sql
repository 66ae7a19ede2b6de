-- What each node's configuration makes of volume types (`[[volume_types]]`, `[[qos_specs]]`,
-- `default_volume_type`), as JSON: a node that starts compares it with the live nodes' and
-- refuses to start where one name would mean two things (`attach/nodes.rs`, `refusal`). Empty
-- for a node registered by a berth from before this column.
ALTER TABLE nodes ADD COLUMN volume_types TEXT NOT NULL DEFAULT '';
