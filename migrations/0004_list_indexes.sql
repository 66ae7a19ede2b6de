-- Indexes for lists at scale (100,000 attachments and more): every list is ordered by
-- (created_at, id) by default, within a project or across all of them (an admin's all_tenants),
-- and reads only live rows, so soft-deleted rows (one per finished attach cycle) cost nothing.
DROP INDEX volumes_by_project;
CREATE INDEX volumes_by_project ON volumes (project_id, created_at, id) WHERE deleted = 0;
CREATE INDEX volumes_live ON volumes (created_at, id) WHERE deleted = 0;
DROP INDEX volume_attachment_by_project;
CREATE INDEX volume_attachment_by_project ON volume_attachment (project_id, created_at, id) WHERE deleted = 0;
CREATE INDEX volume_attachment_live ON volume_attachment (created_at, id) WHERE deleted = 0;
-- A volume's attachments, in list order: the filter and the order from one index (SQLite would
-- otherwise take the project's index for the order and filter every row of the project).
DROP INDEX volume_attachment_by_volume;
CREATE INDEX volume_attachment_by_volume ON volume_attachment (volume_id, created_at, id) WHERE deleted = 0;
