//! What the contract says of each [`DType`]: its size per element, and the safetensors name
//! it stands for. The one table of element sizes; the server (weight files, OIP requests) and
//! the worker SDK (batches) both read it.

use crate::v1::DType;

/// Bytes per element of `dtype`; `None` for `DTYPE_BYTES` (variable: a length before each
/// element) and `DTYPE_UNSPECIFIED`.
pub fn size_of(dtype: DType) -> Option<usize> {
    match dtype {
        DType::DtypeBool | DType::DtypeU8 | DType::DtypeI8 => Some(1),
        DType::DtypeF8E4m3 | DType::DtypeF8E5m2 | DType::DtypeF8E8m0 => Some(1),
        DType::DtypeI16 | DType::DtypeU16 | DType::DtypeF16 | DType::DtypeBf16 => Some(2),
        DType::DtypeI32 | DType::DtypeU32 | DType::DtypeF32 => Some(4),
        DType::DtypeF64 | DType::DtypeI64 | DType::DtypeU64 | DType::DtypeC64 => Some(8),
        DType::DtypeBytes | DType::DtypeUnspecified => None,
    }
}

/// The dtype a safetensors header names `name` (`"F32"`, `"BF16"`, `"F8_E4M3"`, ...): the
/// value named `DTYPE_<name>` in `common.proto`. `None` for a name no dtype has, and for
/// `BYTES` and `UNSPECIFIED`, which no weight file holds.
pub fn from_safetensors_name(name: &str) -> Option<DType> {
    if matches!(name, "BYTES" | "UNSPECIFIED") {
        return None;
    }
    DType::from_str_name(&format!("DTYPE_{name}"))
}

/// The name the OIP gives `dtype` ("FP32", "INT64", "BYTES", ...), as a [`crate::v1::TensorSpec`]
/// carries it; dtypes the OIP lacks keep their safetensors name ("F8_E4M3", "C64").
pub fn oip_datatype(dtype: DType) -> &'static str {
    use DType as D;
    match dtype {
        D::DtypeBool => "BOOL",
        D::DtypeU8 => "UINT8",
        D::DtypeI8 => "INT8",
        D::DtypeI16 => "INT16",
        D::DtypeU16 => "UINT16",
        D::DtypeF16 => "FP16",
        D::DtypeBf16 => "BF16",
        D::DtypeI32 => "INT32",
        D::DtypeU32 => "UINT32",
        D::DtypeF32 => "FP32",
        D::DtypeF64 => "FP64",
        D::DtypeI64 => "INT64",
        D::DtypeU64 => "UINT64",
        D::DtypeF8E4m3 => "F8_E4M3",
        D::DtypeF8E5m2 => "F8_E5M2",
        D::DtypeF8E8m0 => "F8_E8M0",
        D::DtypeC64 => "C64",
        D::DtypeBytes => "BYTES",
        D::DtypeUnspecified => "UNSPECIFIED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every value of the enum, from the generated code.
    fn all() -> Vec<DType> {
        (0..256).filter_map(|n| DType::try_from(n).ok()).collect()
    }

    /// Sizes would disagree with the data's layout (the safetensors format's, the OIP's), so
    /// valid tensors would be refused or misread; only the variable and unset dtypes have none.
    #[test]
    fn sizes_are_the_formats() {
        let cases = [
            (DType::DtypeBool, 1),
            (DType::DtypeU8, 1),
            (DType::DtypeF8E5m2, 1),
            (DType::DtypeBf16, 2),
            (DType::DtypeU16, 2),
            (DType::DtypeF32, 4),
            (DType::DtypeI32, 4),
            (DType::DtypeF64, 8),
            (DType::DtypeC64, 8),
            (DType::DtypeU64, 8),
        ];
        for (d, size) in cases {
            assert_eq!(size_of(d), Some(size), "{d:?}");
        }
        let unsized_: Vec<DType> = all()
            .into_iter()
            .filter(|d| size_of(*d).is_none())
            .collect();
        assert_eq!(unsized_, [DType::DtypeUnspecified, DType::DtypeBytes]);
    }

    /// A safetensors name would map to the wrong dtype (or none), so the server would size a
    /// weight file's tensors wrongly.
    #[test]
    fn safetensors_names_map_to_their_dtype() {
        assert_eq!(from_safetensors_name("F32"), Some(DType::DtypeF32));
        assert_eq!(from_safetensors_name("BOOL"), Some(DType::DtypeBool));
        assert_eq!(from_safetensors_name("F8_E4M3"), Some(DType::DtypeF8E4m3));
        assert_eq!(from_safetensors_name("F8_E8M0"), Some(DType::DtypeF8E8m0));
        assert_eq!(from_safetensors_name("C64"), Some(DType::DtypeC64));
        for refused in ["BYTES", "UNSPECIFIED", "f32", "F4", "", "DTYPE_F32"] {
            assert_eq!(from_safetensors_name(refused), None, "{refused}");
        }
        for d in all() {
            let name = d.as_str_name().trim_start_matches("DTYPE_");
            if size_of(d).is_some() {
                assert_eq!(from_safetensors_name(name), Some(d));
            }
        }
    }
}
