//! `modelshare-embed`
#![forbid(unsafe_code)]
mod spec;
mod weights;
fn main() {}
