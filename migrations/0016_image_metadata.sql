-- A volume's image properties (Cinder's `volume_image_metadata`, set with
-- `os-set_image_metadata`): what Nova reads of a volume it boots from (`hw_disk_bus`,
-- `hw_scsi_model`, ...). A JSON map, `{}` for every volume made before.
ALTER TABLE volumes ADD COLUMN image_metadata TEXT NOT NULL DEFAULT '{}';
