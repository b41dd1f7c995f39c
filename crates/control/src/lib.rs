//! The control plane: the daemon (`lamina serve`), its configuration, the admin
//! API on a Unix socket (HTTP + JSON) that `lamina volume ...` talks to while the
//! daemon runs, the offline path used when it does not, and the adapter that
//! exposes engine volumes as NBD exports.

pub mod access;
pub mod admin;
pub mod api;
pub mod arrays;
pub mod cache_contents;
pub mod client;
pub mod config;
pub mod daemon;
mod data_files;
pub mod devices;
pub mod export;
pub mod exposition;
pub mod layout;
pub mod object_tier;
pub mod store;
pub mod systemd;
pub mod volume_statistics;
pub mod web;

pub use lamina_api::size;

pub use config::Config;
