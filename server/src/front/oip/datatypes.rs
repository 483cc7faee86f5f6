//! OIP datatype names (`FP32`, `BYTES`, ...) and the worker protocol's dtypes they stand for.

use modelshare_proto::v1 as pb;

use super::error::invalid;
use modelshare_serving::InferError;

/// The dtype of an OIP datatype name.
pub fn dtype(datatype: &str) -> Result<pb::DType, InferError> {
    use pb::DType as D;
    Ok(match datatype {
        "BOOL" => D::DtypeBool,
        "UINT8" => D::DtypeU8,
        "UINT16" => D::DtypeU16,
        "UINT32" => D::DtypeU32,
        "UINT64" => D::DtypeU64,
        "INT8" => D::DtypeI8,
        "INT16" => D::DtypeI16,
        "INT32" => D::DtypeI32,
        "INT64" => D::DtypeI64,
        "FP16" => D::DtypeF16,
        "BF16" => D::DtypeBf16,
        "FP32" => D::DtypeF32,
        "FP64" => D::DtypeF64,
        "BYTES" => D::DtypeBytes,
        other => {
            return Err(invalid(format!(
                "unknown datatype '{}' (BOOL, UINT8..UINT64, INT8..INT64, FP16, BF16, FP32, FP64, BYTES)",
                other.escape_debug()
            )));
        }
    })
}

/// The OIP datatype name of a dtype (`""` for a dtype the OIP has no name for): the SDK's
/// name, where it is one the OIP knows.
pub fn datatype(d: pb::DType) -> &'static str {
    let name = modelshare_proto::dtype::oip_datatype(d);
    if dtype(name).is_ok() { name } else { "" }
}

/// Bytes per element; `None` for BYTES (variable) and dtypes the OIP does not carry.
pub fn element_size(d: pb::DType) -> Option<usize> {
    if datatype(d).is_empty() {
        None
    } else {
        modelshare_proto::dtype::size_of(d)
    }
}
