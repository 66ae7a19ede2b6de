-- Whether a volume may be booted from (Cinder's `bootable`, set with `os-set_bootable`): Nova
-- refuses to boot an instance from a volume that is not. 0 for every volume made before.
ALTER TABLE volumes ADD COLUMN bootable BIGINT NOT NULL DEFAULT 0;
