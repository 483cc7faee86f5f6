//! [`Vocab`]: a WordPiece vocabulary, each piece to its id, looked up for every piece the
//! tokenizer tries. A piece of up to [`INLINE`] bytes (all but a few) is held in the table
//! itself, so a lookup reads one slot of the table and no string elsewhere in memory: with a
//! vocabulary of 30,000 pieces and the cores shared with the server and the clients, the second
//! memory read per lookup cost about as much as the rest of the tokenizer.

use std::collections::HashMap;

use foldhash::fast::RandomState;

/// The longest piece held inline.
const INLINE: usize = 23;

/// A short piece in a fixed array: its length, its bytes, zeros after them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Inline([u8; INLINE + 1]);

impl Inline {
    fn new(piece: &str) -> Option<Self> {
        let bytes = piece.as_bytes();
        (bytes.len() <= INLINE).then(|| {
            let mut a = [0u8; INLINE + 1];
            a[0] = bytes.len() as u8;
            a[1..=bytes.len()].copy_from_slice(bytes);
            Self(a)
        })
    }
}

/// Pieces and their ids.
#[derive(Clone, Debug, Default)]
pub(super) struct Vocab {
    short: HashMap<Inline, u32, RandomState>,
    long: HashMap<Box<str>, u32, RandomState>,
}

impl Vocab {
    /// Sets `piece`'s id (a piece given twice keeps the last).
    pub(super) fn insert(&mut self, piece: &str, id: u32) {
        match Inline::new(piece) {
            Some(key) => {
                self.short.insert(key, id);
            }
            None => {
                self.long.insert(piece.into(), id);
            }
        }
    }

    /// `piece`'s id, if it is in the vocabulary.
    pub(super) fn get(&self, piece: &str) -> Option<u32> {
        match Inline::new(piece) {
            Some(key) => self.short.get(&key).copied(),
            None => self.long.get(piece).copied(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Vocab;

    /// Pieces around the inline length would be lost, confused with their prefixes, or
    /// confused with a piece padded with NULs.
    #[test]
    fn short_and_long_pieces_are_found_exactly() {
        let mut v = Vocab::default();
        let pieces = [
            "",
            "a",
            "ab",
            "a\0",
            "ünïcödé",
            "x".repeat(22).leak() as &str,
            "x".repeat(23).leak(),
            "x".repeat(24).leak(),
            "x".repeat(100).leak(),
        ];
        for (id, p) in pieces.iter().enumerate() {
            v.insert(p, id as u32);
        }
        for (id, p) in pieces.iter().enumerate() {
            assert_eq!(v.get(p), Some(id as u32), "{p:?}");
        }
        for missing in ["b", "a\0\0", "x", &"x".repeat(25), &"x".repeat(21)] {
            assert_eq!(v.get(missing), None, "{missing:?}");
        }
        v.insert("a", 99);
        assert_eq!(v.get("a"), Some(99), "the last id given wins");
    }
}
