//! What identifies a compiled module's text: an FNV-1a hash of the source and the options.

use super::source::KernelSource;

/// FNV-1a (64-bit) over the source's name, code and the options, each NUL-terminated.
pub fn source_hash(source: &KernelSource, options: &[String]) -> u64 {
    let mut h = Fnv1a::new();
    h.write(source.name.as_bytes());
    h.write(&[0]);
    h.write(source.code.as_bytes());
    h.write(&[0]);
    for option in options {
        h.write(option.as_bytes());
        h.write(&[0]);
    }
    h.0
}

/// A 64-bit FNV-1a hasher; the hash so far is its field.
pub(super) struct Fnv1a(pub(super) u64);

impl Fnv1a {
    /// The hasher of no bytes (the FNV offset basis).
    pub(super) fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
    /// Hashes `bytes` on.
    pub(super) fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}
