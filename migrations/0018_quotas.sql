-- Volume quotas (Cinder's `os-quota-sets` and `os-quota-class-sets`; `host/src/attach/quotas.rs`):
-- a hard limit per resource (`volumes`, `gigabytes`, `per_volume_gigabytes`, `volumes_<type>`,
-- `gigabytes_<type>`), held by a project (`holder = 'project'`, `name` its id) or by the
-- default quota class (`holder = 'class'`, `name = 'default'`), which every project without a
-- limit of its own for that resource gets. No row: unlimited. `-1`: unlimited, set explicitly.
-- What a project uses is not kept: it is counted from its live volumes (and the extends in
-- flight, from `operations`) in the transaction that changes it.
CREATE TABLE quota_limits (
    holder     TEXT NOT NULL,
    name       TEXT NOT NULL,
    resource   TEXT NOT NULL,
    hard_limit BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (holder, name, resource)
);

-- What a project's volumes use, by type, read from this index alone (it holds every column the
-- count needs), so that a quota's check stays cheap for a project of many volumes.
CREATE INDEX volumes_by_project_type ON volumes (project_id, volume_type, size_gib) WHERE deleted = 0;
