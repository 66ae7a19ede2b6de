-- Attachments made by the legacy volume actions (os-reserve, os-initialize_connection). Those
-- calls name no attachment, so the legacy flow finds its own pending reservation by this flag.
ALTER TABLE volume_attachment ADD COLUMN legacy BIGINT NOT NULL DEFAULT 0;
