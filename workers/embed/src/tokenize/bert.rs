//! [`FastBert`]: BERT's tokenizer without the `tokenizers` crate's bookkeeping, for the
//! `tokenizer.json` files of exactly BERT's shape (a `BertNormalizer`, the `BertPreTokenizer`, a
//! `WordPiece` model, `[CLS] $A [SEP]` after it). It gives the same ids as the crate, the same
//! steps in the same order, with the same Unicode tables (`unicode_categories` for the control,
//! punctuation and mark classes, `unicode-normalization-alignments` for NFD, the standard
//! library's `char::is_whitespace` and `char::to_lowercase`), but without tracking where each
//! character came from: the crate's alignments cost ~160 µs of CPU for a sentence of 500
//! characters, more than the GPU's work for it on a small model. ASCII text skips the Unicode
//! steps that cannot change it.
//!
//! What it does not take is refused when it is built (`None`: the crate tokenizes, as before):
//! another normalizer, pre-tokenizer, model or post-processor, added tokens matched after
//! normalization. A text that holds an added token (`[CLS]` written inside an input, which the
//! crate splits out as that token) is left to the crate too (`encode` returns `None`).

use serde_json::Value;
use unicode_categories::UnicodeCategories;
use unicode_normalization_alignments::UnicodeNormalization;

use super::vocab::Vocab;

/// BERT's tokenizer over one `tokenizer.json`.
#[derive(Debug)]
pub(crate) struct FastBert {
    clean_text: bool,
    chinese: bool,
    strip_accents: bool,
    lowercase: bool,
    /// Pieces that start a word.
    starts: Vocab,
    /// Pieces that continue one, without their prefix (`##`).
    continuations: Vocab,
    unk: u32,
    max_word_chars: usize,
    /// The special tokens around the sequence, with their type ids.
    before: Vec<(u32, u32)>,
    after: Vec<(u32, u32)>,
    /// The sequence's type id.
    type_id: u32,
    /// Added tokens (matched in the raw text by the crate).
    added: Vec<String>,
}

impl FastBert {
    /// BERT's tokenizer for `json` (a parsed `tokenizer.json`), or `None` when it is not of
    /// BERT's shape in every part this type reproduces.
    pub(crate) fn new(json: &Value) -> Option<Self> {
        let norm = json.get("normalizer")?;
        if norm.get("type")?.as_str()? != "BertNormalizer" {
            return None;
        }
        let flag = |name: &str| norm.get(name).and_then(Value::as_bool);
        let (clean_text, chinese, lowercase) = (
            flag("clean_text")?,
            flag("handle_chinese_chars")?,
            flag("lowercase")?,
        );
        let strip_accents = match norm.get("strip_accents") {
            None | Some(Value::Null) => lowercase,
            Some(v) => v.as_bool()?,
        };
        if json.get("pre_tokenizer")?.get("type")?.as_str()? != "BertPreTokenizer" {
            return None;
        }
        let model = json.get("model")?;
        if model.get("type")?.as_str()? != "WordPiece" {
            return None;
        }
        let prefix = model.get("continuing_subword_prefix")?.as_str()?;
        let max_word_chars =
            usize::try_from(model.get("max_input_chars_per_word")?.as_u64()?).ok()?;
        let mut starts = Vocab::default();
        let mut continuations = Vocab::default();
        for (piece, id) in model.get("vocab")?.as_object()? {
            let id = u32::try_from(id.as_u64()?).ok()?;
            starts.insert(piece, id);
            if let Some(rest) = piece.strip_prefix(prefix).filter(|_| !prefix.is_empty()) {
                continuations.insert(rest, id);
            }
        }
        if prefix.is_empty() {
            continuations = starts.clone();
        }
        let unk = starts.get(model.get("unk_token")?.as_str()?)?;
        let mut added = Vec::new();
        for token in json.get("added_tokens")?.as_array()? {
            // Matched in the normalized text: not reproduced here.
            if token.get("normalized").and_then(Value::as_bool) != Some(false) {
                return None;
            }
            added.push(token.get("content")?.as_str()?.to_owned());
        }
        let (before, after, type_id) = template(json.get("post_processor")?)?;
        Some(Self {
            clean_text,
            chinese,
            strip_accents,
            lowercase,
            starts,
            continuations,
            unk,
            max_word_chars,
            before,
            after,
            type_id,
            added,
        })
    }

    /// The ids and type ids of `text`, special tokens included, its word pieces cut to
    /// `max_len` minus the special tokens when `max_len` is given (longest-first from the
    /// right, as the crate truncates one sequence); `None` when the text holds an added token,
    /// or when `max_len` is below the special tokens (where the crate's arithmetic wraps).
    pub(crate) fn encode(
        &self,
        text: &str,
        max_len: Option<usize>,
    ) -> Option<(Vec<u32>, Vec<u32>)> {
        let specials = self.before.len() + self.after.len();
        if max_len.is_some_and(|m| m < specials)
            || self
                .added
                .iter()
                .any(|a| !a.is_empty() && text.contains(a.as_str()))
        {
            return None;
        }
        let mut pieces = Vec::with_capacity(text.len() / 4 + 2);
        if text.is_ascii() {
            self.ascii_words(text, &mut pieces);
        } else {
            let normalized = self.normalize(text);
            for word in split_words(&normalized) {
                self.word_pieces(word, &mut pieces);
            }
        }
        if let Some(max) = max_len {
            pieces.truncate(max.saturating_sub(specials));
        }
        let mut ids = Vec::with_capacity(pieces.len() + specials);
        let mut types = Vec::with_capacity(pieces.len() + specials);
        for &(id, t) in &self.before {
            ids.push(id);
            types.push(t);
        }
        ids.extend_from_slice(&pieces);
        types.resize(ids.len(), self.type_id);
        for &(id, t) in &self.after {
            ids.push(id);
            types.push(t);
        }
        Some((ids, types))
    }

    /// ASCII text: control characters dropped (`clean_text`), letters lowercased, words split
    /// at whitespace and around punctuation, each word's pieces appended. (ASCII has no
    /// Chinese characters and no accents, and NFD leaves it as it is.)
    fn ascii_words(&self, text: &str, pieces: &mut Vec<u32>) {
        let mut word = String::with_capacity(32);
        for &b in text.as_bytes() {
            let c = b as char;
            // `clean_text` drops the control characters first (vertical tab and form feed
            // too), then maps what is left of whitespace to a space.
            if self.clean_text && b.is_ascii_control() && !matches!(b, b'\t' | b'\n' | b'\r') {
                continue;
            }
            // char::is_whitespace in ASCII: tab, newline, vertical tab, form feed, return, space.
            if matches!(b, b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | b' ') {
                self.flush(&mut word, pieces);
            } else if c.is_ascii_punctuation() {
                self.flush(&mut word, pieces);
                word.push(c);
                self.flush(&mut word, pieces);
            } else {
                word.push(if self.lowercase {
                    c.to_ascii_lowercase()
                } else {
                    c
                });
            }
        }
        self.flush(&mut word, pieces);
    }

    fn flush(&self, word: &mut String, pieces: &mut Vec<u32>) {
        if !word.is_empty() {
            self.word_pieces(word, pieces);
            word.clear();
        }
    }

    /// The normalizer's steps on non-ASCII text, in its order.
    fn normalize(&self, text: &str) -> String {
        let mut s = String::with_capacity(text.len() + 8);
        for c in text.chars() {
            if self.clean_text {
                if c == '\0' || c == '\u{fffd}' || is_control(c) {
                    continue;
                }
                if is_whitespace(c) {
                    s.push(' ');
                    continue;
                }
            }
            if self.chinese && is_chinese(c) {
                s.push(' ');
                s.push(c);
                s.push(' ');
            } else {
                s.push(c);
            }
        }
        if self.strip_accents {
            s = s
                .as_str()
                .nfd()
                .map(|(c, _)| c)
                .filter(|c| !c.is_mark_nonspacing())
                .collect();
        }
        if self.lowercase {
            // Per character, as the crate does (not `str::to_lowercase`, whose final sigma
            // differs).
            s = s.chars().flat_map(char::to_lowercase).collect();
        }
        s
    }

    /// WordPiece on one word: the longest piece of the vocabulary at each place, continuing
    /// pieces after the first; the unknown token for the whole word if one place has none or
    /// the word is longer than `max_word_chars` characters.
    fn word_pieces(&self, word: &str, pieces: &mut Vec<u32>) {
        if word.chars().count() > self.max_word_chars {
            pieces.push(self.unk);
            return;
        }
        let first = pieces.len();
        let mut start = 0;
        while start < word.len() {
            let vocab = if start == 0 {
                &self.starts
            } else {
                &self.continuations
            };
            let mut end = word.len();
            let found = loop {
                if let Some(id) = vocab.get(&word[start..end]) {
                    break Some(id);
                }
                match word[start..end].chars().next_back() {
                    Some(c) if end - c.len_utf8() > start => end -= c.len_utf8(),
                    _ => break None,
                }
            };
            match found {
                Some(id) => {
                    pieces.push(id);
                    start = end;
                }
                None => {
                    pieces.truncate(first);
                    pieces.push(self.unk);
                    return;
                }
            }
        }
    }
}

/// The special tokens before and after the sequence, and its type id, of a post-processor
/// that puts specials around one sequence (`TemplateProcessing`'s single template, or
/// `BertProcessing`); `None` for anything else.
type Specials = Vec<(u32, u32)>;

fn template(post: &Value) -> Option<(Specials, Specials, u32)> {
    let type_id = |v: &Value| {
        v.get("type_id")
            .and_then(Value::as_u64)
            .and_then(|t| u32::try_from(t).ok())
    };
    match post.get("type")?.as_str()? {
        "BertProcessing" => {
            let id = |name: &str| {
                post.get(name)?
                    .as_array()?
                    .get(1)?
                    .as_u64()
                    .and_then(|i| u32::try_from(i).ok())
            };
            Some((vec![(id("cls")?, 0)], vec![(id("sep")?, 0)], 0))
        }
        "TemplateProcessing" => {
            let specials = post.get("special_tokens")?.as_object()?;
            let (mut before, mut after, mut sequence) = (Vec::new(), Vec::new(), None);
            for item in post.get("single")?.as_array()? {
                if let Some(special) = item.get("SpecialToken") {
                    let name = special.get("id")?.as_str()?;
                    let ids = specials.get(name)?.get("ids")?.as_array()?;
                    let t = type_id(special)?;
                    let side = if sequence.is_none() {
                        &mut before
                    } else {
                        &mut after
                    };
                    for id in ids {
                        side.push((u32::try_from(id.as_u64()?).ok()?, t));
                    }
                } else if let Some(seq) = item.get("Sequence") {
                    if seq.get("id")?.as_str()? != "A" || sequence.is_some() {
                        return None;
                    }
                    sequence = Some(type_id(seq)?);
                } else {
                    return None;
                }
            }
            Some((before, after, sequence?))
        }
        _ => None,
    }
}

/// Words of the normalized text: split at whitespace (removed) and around punctuation (each
/// mark a word of its own), as `BertPreTokenizer` does.
fn split_words(text: &str) -> impl Iterator<Item = &str> {
    let mut words = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices() {
        if c.is_whitespace() {
            if let Some(s) = start.take() {
                words.push(&text[s..i]);
            }
        } else if is_punctuation(c) {
            if let Some(s) = start.take() {
                words.push(&text[s..i]);
            }
            words.push(&text[i..i + c.len_utf8()]);
        } else if start.is_none() {
            start = Some(i);
        }
    }
    if let Some(s) = start {
        words.push(&text[s..]);
    }
    words.into_iter()
}

/// `BertNormalizer`'s whitespace: tab, newline, carriage return, and what Unicode calls
/// whitespace.
fn is_whitespace(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r') || c.is_whitespace()
}

/// `BertNormalizer`'s control characters: what `unicode_categories` calls "other" (Cc, Cf and
/// Co in its tables) but tab, newline and carriage return.
fn is_control(c: char) -> bool {
    !matches!(c, '\t' | '\n' | '\r') && c.is_other()
}

/// `BertPreTokenizer`'s punctuation.
fn is_punctuation(c: char) -> bool {
    c.is_ascii_punctuation() || c.is_punctuation()
}

/// The CJK ideographs `BertNormalizer` puts spaces around.
fn is_chinese(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF
        | 0x3400..=0x4DBF
        | 0x20000..=0x2A6DF
        | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F
        | 0x2B920..=0x2CEAF
        | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}
