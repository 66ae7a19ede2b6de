//! The Cinder-compatible API against a real service, on SQLite and on PostgreSQL: every endpoint,
//! status code and transition, bad input, driver failures, and concurrency.

mod absent;
mod attachments;
mod bad_input;
mod capacity;
mod compute_events;
mod concurrency;
mod database_backup;
mod driver_failures;
mod history;
mod identity;
mod legacy;
mod limits;
mod messages;
mod migration;
mod nova;
mod policy;
mod qos;
mod quotas;
mod services;
mod transfers;
mod versions;
mod volumes;
