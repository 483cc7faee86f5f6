//! End-to-end tests: the real `modelshare` binary on sockets in a temporary directory, models
//! written by the official `safetensors` crate, arenas read back through the worker SDK.
//! One test binary (faster to build and link); modules by subject.

mod common;
mod worker_util;

mod attack;
mod attack_handles;
mod attack_leftovers;
mod cli;
mod connections;
mod devices;
mod discovery;
mod front;
mod lifecycle;
mod load;
mod malformed;
mod metrics;
mod serving;
mod tenants;
mod tls;
mod transport;
mod worker_refusals;
mod workers;
