//! Bearer tokens: generation, hashing and constant-time checking.
//!
//! The config holds only `sha256:<hex>` hashes of tokens, never a token. Tokens are 32 random
//! bytes (256 bits, shown as `ms_` + 64 hex digits), so a plain SHA-256 is enough to make the
//! file useless to a reader: there is nothing to guess. Checking a presented token hashes it
//! once and compares the digest with every configured hash in constant time, without stopping
//! at the first match, so the time taken says nothing about which byte or which hash differed.

use sha2::{Digest, Sha256};
use subtle::{Choice, ConstantTimeEq};

/// Prefix of a hash in the config.
pub const HASH_PREFIX: &str = "sha256:";
/// Prefix of a generated token (it makes a leaked token easy to find in logs and repositories).
pub const TOKEN_PREFIX: &str = "ms_";
/// Longest token accepted on the wire; longer ones are refused before hashing.
pub const MAX_TOKEN_BYTES: usize = 512;

/// SHA-256 digest of a token.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenHash([u8; 32]);

impl std::fmt::Debug for TokenHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")
    }
}

impl std::fmt::Display for TokenHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{HASH_PREFIX}{}", hex::encode(self.0))
    }
}

impl TokenHash {
    /// The hash of `token`.
    pub fn of(token: &str) -> Self {
        Self(Sha256::digest(token.as_bytes()).into())
    }

    /// Constant-time equality.
    pub fn ct_eq(&self, other: &TokenHash) -> Choice {
        self.0.ct_eq(&other.0)
    }

    /// The first 8 bytes of the digest, to find candidates in an index. Looking a digest up by
    /// its prefix tells an observer of the timing only whether some configured digest shares 64
    /// bits with the digest of what they sent, which they cannot steer (SHA-256 is preimage
    /// resistant): it reveals nothing about any token. The full comparison stays constant-time.
    pub fn prefix(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[..8]);
        u64::from_le_bytes(b)
    }
}

impl std::str::FromStr for TokenHash {
    type Err = String;

    /// Parses `sha256:<64 hex digits>`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let hexpart = s
            .strip_prefix(HASH_PREFIX)
            .ok_or_else(|| format!("a token hash must start with '{HASH_PREFIX}'"))?;
        let bytes = hex::decode(hexpart).map_err(|e| {
            format!("a token hash must be 64 hex digits after '{HASH_PREFIX}': {e}")
        })?;
        let arr: [u8; 32] = bytes.try_into().map_err(|b: Vec<u8>| {
            format!(
                "a token hash must be 64 hex digits after '{HASH_PREFIX}', got {}",
                b.len() * 2
            )
        })?;
        Ok(Self(arr))
    }
}

/// A new random token.
pub fn generate() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(format!("{TOKEN_PREFIX}{}", hex::encode(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_round_trips_through_text() {
        let h = TokenHash::of("ms_secret");
        let text = h.to_string();
        assert!(text.starts_with("sha256:"));
        assert_eq!(text.len(), 7 + 64);
        assert_eq!(text.parse::<TokenHash>().expect("parse"), h);
        // The well-known SHA-256 of "abc".
        assert_eq!(
            TokenHash::of("abc").to_string(),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn malformed_hashes_are_refused() {
        assert!("ba7816bf".parse::<TokenHash>().is_err());
        assert!("sha256:zz".parse::<TokenHash>().is_err());
        assert!("sha256:abcd".parse::<TokenHash>().is_err());
        assert!(
            "md5:ba7816bf8f01cfea414140de5dae2223"
                .parse::<TokenHash>()
                .is_err()
        );
    }

    #[test]
    fn generated_tokens_are_distinct_and_match_their_hash() {
        let a = generate().expect("random");
        let b = generate().expect("random");
        assert_ne!(a, b);
        assert!(a.starts_with(TOKEN_PREFIX) && a.len() == 3 + 64);
        assert!(bool::from(TokenHash::of(&a).ct_eq(&TokenHash::of(&a))));
        assert!(!bool::from(TokenHash::of(&a).ct_eq(&TokenHash::of(&b))));
        assert_eq!(TokenHash::of(&a).prefix(), TokenHash::of(&a).prefix());
    }
}
