//! The KServe v2 / Open Inference Protocol tensors, shared by its gRPC and REST doors: datatype
//! names, typed contents to the raw layout, a request's inputs split into items along their
//! first (batch) dimension, and the items' outputs stacked back.
//!
//! Raw layout: elements row-major, little-endian, no padding; BYTES elements each a 4-byte
//! little-endian length and that many bytes (the OIP's `raw_input_contents` layout, and
//! `DTYPE_BYTES` on the worker protocol).
//!
//! # Layout
//! - here: the map; everything the doors use is re-exported here.
//! - `error`: a request that is not valid, as an [`InferError`](modelshare_serving::InferError).
//! - `datatypes`: OIP datatype names and the dtypes they stand for, element sizes.
//! - `layout`: the raw layout: [`Tensor`], element counts, BYTES elements, the check that a
//!   tensor's data fits its shape.
//! - `grpc`: a gRPC ModelInfer request's inputs (typed or raw contents) and parameters.
//! - `json`: JSON elements (the REST door's `data`) to and from the raw layout.
//! - `items`: a request's tensors split into the items of the request path.
//! - `stack`: the items' outputs stacked back into tensors.

mod datatypes;
mod error;
mod grpc;
mod items;
mod json;
mod layout;
mod stack;
#[cfg(test)]
mod tests;

pub use self::datatypes::{datatype, dtype, element_size};
pub use self::grpc::{grpc_inputs, parameter, parameters, typed_to_raw};
pub use self::items::{Items, to_items};
pub use self::json::{json_to_raw, raw_to_json};
pub use self::layout::{Tensor, bytes_elements, check_data, element_count, encode_bytes};
pub use self::stack::stack;
