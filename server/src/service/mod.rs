//! The gRPC services, thin over [`crate::app::App`] and [`modelshare_core::registry::Registry`]:
//! convert the request ([`convert`]), call the core, map the result; errors become
//! `tonic::Status` in [`status`] only.

pub mod admin;

pub mod inference;
pub mod oip_infer;
pub mod serve;
pub mod stream_infer;

#[cfg(test)]
mod tests;
pub mod triton;
pub mod worker;
