//! The gRPC services, thin over [`crate::app::App`] and [`crate::registry::Registry`]:
//! convert the request ([`convert`]), call the core, map the result; errors become
//! `tonic::Status` in [`status`] only.

pub mod admin;
pub mod convert;
pub mod inference;
pub mod serve;
pub mod status;
#[cfg(test)]
mod tests;
pub mod worker;
