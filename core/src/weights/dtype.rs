//! The element types a safetensors file may declare, with their names and sizes.

/// An element type, named as in the safetensors format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    Bool,
    U8,
    I8,
    I16,
    U16,
    F16,
    BF16,
    I32,
    U32,
    F32,
    F64,
    I64,
    U64,
    F8E4M3,
    F8E5M2,
    F8E8M0,
    C64,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 17] = [
        DType::Bool,
        DType::U8,
        DType::I8,
        DType::I16,
        DType::U16,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::U32,
        DType::F32,
        DType::F64,
        DType::I64,
        DType::U64,
        DType::F8E4M3,
        DType::F8E5M2,
        DType::F8E8M0,
        DType::C64,
    ];

    /// Parses a safetensors dtype name (`"F32"`, `"F8_E4M3"`...); `None` if unknown.
    pub fn parse(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.as_str() == s)
    }

    /// The safetensors name of this dtype.
    pub fn as_str(self) -> &'static str {
        match self {
            DType::Bool => "BOOL",
            DType::U8 => "U8",
            DType::I8 => "I8",
            DType::I16 => "I16",
            DType::U16 => "U16",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::I32 => "I32",
            DType::U32 => "U32",
            DType::F32 => "F32",
            DType::F64 => "F64",
            DType::I64 => "I64",
            DType::U64 => "U64",
            DType::F8E4M3 => "F8_E4M3",
            DType::F8E5M2 => "F8_E5M2",
            DType::F8E8M0 => "F8_E8M0",
            DType::C64 => "C64",
        }
    }

    /// Bytes per element: the contract's table (`modelshare_proto::dtype`); every dtype here
    /// is one of the contract's (the tests below check each size).
    pub fn size_bytes(self) -> u64 {
        use modelshare_proto::dtype::{from_safetensors_name, size_of};
        from_safetensors_name(self.as_str())
            .and_then(size_of)
            .map_or(0, |n| n as u64)
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dtype name would not round-trip, so a valid file would be rejected or mislabelled.
    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::parse(d.as_str()), Some(d));
        }
        assert_eq!(DType::parse("f32"), None);
        assert_eq!(DType::parse("F4"), None);
        assert_eq!(DType::parse(""), None);
    }

    /// Sizes would disagree with the official crate, so valid files would fail the size check.
    #[test]
    fn sizes_match_the_safetensors_crate() {
        use safetensors::Dtype as S;
        let pairs = [
            (DType::Bool, S::BOOL),
            (DType::U8, S::U8),
            (DType::I8, S::I8),
            (DType::I16, S::I16),
            (DType::U16, S::U16),
            (DType::F16, S::F16),
            (DType::BF16, S::BF16),
            (DType::I32, S::I32),
            (DType::U32, S::U32),
            (DType::F32, S::F32),
            (DType::F64, S::F64),
            (DType::I64, S::I64),
            (DType::U64, S::U64),
            (DType::F8E4M3, S::F8_E4M3),
            (DType::F8E5M2, S::F8_E5M2),
        ];
        for (ours, theirs) in pairs {
            assert_eq!(ours.size_bytes(), theirs.size() as u64, "{ours}");
            assert_eq!(ours.as_str(), format!("{theirs:?}"));
        }
        assert_eq!(DType::F8E8M0.size_bytes(), 1);
        assert_eq!(DType::C64.size_bytes(), 8);
    }
}
