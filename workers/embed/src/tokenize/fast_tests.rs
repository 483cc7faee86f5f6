//! [`FastBert`] against the `tokenizers` crate, id for id: thousands of generated texts (every
//! kind of whitespace, control and format characters, accents composed and not, CJK, scripts
//! with final sigma and dotted capitals, emoji, punctuation of every class, words longer than
//! the WordPiece limit, added tokens written inside the text), each normalizer setting, both
//! post-processors, with and without truncation.

use serde_json::{Value, json};
use tokenizers::{Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};

use super::bert::FastBert;

/// Word pieces of the generated vocabulary: whole words, pieces that continue one, single
/// characters of several scripts (so that most words split, some do not).
fn vocab() -> Value {
    let mut pieces: Vec<String> = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    for w in [
        "the",
        "quick",
        "brown",
        "fox",
        "jump",
        "over",
        "lazy",
        "dog",
        "hello",
        "world",
        "token",
        "model",
        "share",
        "cafe",
        "naive",
        "resume",
        "über",
        "strasse",
        "straße",
        "istanbul",
        "οδος",
        "οδοσ",
        "привет",
        "мир",
        "日",
        "本",
        "語",
        "中",
        "文",
        "un",
        "re",
        "in",
        "a",
        "i",
        "e",
        "o",
        "s",
        "t",
    ] {
        pieces.push(w.to_owned());
    }
    for w in [
        "s", "ing", "ed", "er", "ly", "ation", "e", "a", "o", "u", "n", "t", "r", "x", "é", "ö",
        "ς", "σ", "ι", "ь", "р", "и", "в", "т", "̇", "1", "2", "3",
    ] {
        pieces.push(format!("##{w}"));
    }
    for c in ('a'..='z')
        .chain('0'..='9')
        .chain("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~¿¡«»—–…‘’“”、。・".chars())
    {
        pieces.push(c.to_string());
    }
    for c in "αβγδεζηθικλμνξοπρστυφχψωабвгдежзийклмнопрстуфхцчшщыэюяçñü".chars()
    {
        pieces.push(c.to_string());
    }
    pieces.sort();
    pieces.dedup();
    let map: serde_json::Map<String, Value> = pieces
        .into_iter()
        .enumerate()
        .map(|(i, p)| (p, json!(i)))
        .collect();
    Value::Object(map)
}

/// A BERT `tokenizer.json` over [`vocab`] with these normalizer flags and post-processor.
fn tokenizer_json(normalizer: Value, bert_processing: bool) -> Value {
    tokenizer_json_with(normalizer, bert_processing, "##", 100, false)
}

/// The same, with another continuing-subword prefix (the vocabulary's `##` pieces renamed), a
/// word-length limit, and with `odd_template`, a single template of two ids before the
/// sequence and type ids 1 after it.
fn tokenizer_json_with(
    normalizer: Value,
    bert_processing: bool,
    prefix: &str,
    max_chars: usize,
    odd_template: bool,
) -> Value {
    let mut vocab = vocab();
    if prefix != "##" {
        let renamed: serde_json::Map<String, Value> = vocab
            .as_object()
            .expect("an object")
            .iter()
            .map(|(k, v)| match k.strip_prefix("##") {
                Some(rest) => (format!("{prefix}{rest}"), v.clone()),
                None => (k.clone(), v.clone()),
            })
            .collect();
        vocab = Value::Object(renamed);
    }
    let id = |t: &str| vocab[t].as_u64().expect("in the vocabulary");
    let (cls, sep) = (id("[CLS]"), id("[SEP]"));
    let mask = id("[MASK]");
    let post = if bert_processing {
        json!({"type": "BertProcessing", "sep": ["[SEP]", sep], "cls": ["[CLS]", cls]})
    } else if odd_template {
        json!({"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 1}},
                       {"SpecialToken": {"id": "[SEP]", "type_id": 1}}],
            "pair": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 1}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [cls, mask], "tokens": ["[CLS]", "[MASK]"]},
                               "[SEP]": {"id": "[SEP]", "ids": [sep], "tokens": ["[SEP]"]}}})
    } else {
        json!({"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "[SEP]", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}},
                     {"SpecialToken": {"id": "[SEP]", "type_id": 1}}],
            "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [cls], "tokens": ["[CLS]"]},
                               "[SEP]": {"id": "[SEP]", "ids": [sep], "tokens": ["[SEP]"]}}})
    };
    let added: Vec<Value> = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        .iter()
        .map(|t| {
            json!({"id": id(t), "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": false, "special": true})
        })
        .collect();
    json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": normalizer, "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": post, "decoder": null,
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": prefix,
                  "max_input_chars_per_word": max_chars, "vocab": vocab}
    })
}

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn pick(&mut self, items: &[&'static str]) -> &'static str {
        items[(self.next() % items.len() as u64) as usize]
    }
}

/// Fragments texts are made of.
const FRAGMENTS: &[&str] = &[
    "the",
    "Quick",
    "BROWN",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dogs",
    "hello",
    "World",
    "tokens",
    "modelshare",
    "café",
    "cafe\u{301}",
    "naïve",
    "Résumé",
    "ÜBER",
    "Straße",
    "STRASSE",
    "İstanbul",
    "ΟΔΟΣ",
    "οδος",
    "Привет",
    "мир",
    "日本語",
    "中文字",
    "漢",
    "ｆｕｌｌ",
    "ﬁ",
    "Ⅻ",
    "①",
    "x²",
    "😀",
    "👨‍👩‍👧",
    "🇯🇵",
    "e\u{301}\u{323}",
    "\u{301}",
    "a\u{308}",
    "ǅ",
    "ŉ",
    "\u{130}",
    "ß",
    "ẞ",
    "don't",
    "e.g.",
    "U.S.A.",
    "$5",
    "3.14",
    "50%",
    "a+b=c",
    "<tag>",
    "~tilde",
    "^caret",
    "`tick`",
    "|pipe|",
    "¿qué?",
    "¡sí!",
    "«quote»",
    "—dash—",
    "…",
    "“smart”",
    "日本、東京。",
    "·",
    "、",
    "[CLS]",
    "[MASK]",
    "[sep]",
    "[UNK",
    "]",
    "[",
    "##",
    "#hash",
    "@user",
    "#",
    "under_score",
    "\u{200b}",
    "\u{200d}",
    "\u{feff}",
    "\u{ad}",
    "\u{e000}",
    "\u{378}",
    "\u{fffd}",
    "\0",
    "\u{1}",
    "\u{7f}",
    "\u{85}",
    "\u{9f}",
    "\u{2028}",
    "\u{2029}",
    "\u{202e}",
    "\u{1680}",
    "\u{180e}",
    "ab\u{b}cd",
    "ab\u{c}cd",
    "a\u{1c}b",
    "a\u{1f}b",
];

const SPACES: &[&str] = &[
    " ", " ", " ", "  ", "\t", "\n", "\r\n", "\u{a0}", "\u{3000}", "\u{2009}", "\u{b}", "\u{c}",
    "", "",
];

fn text(rng: &mut Rng) -> String {
    let n = rng.next() % 24;
    let mut s = String::new();
    for _ in 0..n {
        match rng.next() % 10 {
            // A long word: past the WordPiece limit, or just under it.
            0 if rng.next().is_multiple_of(8) => {
                let len = 90 + (rng.next() % 20) as usize;
                s.extend(std::iter::repeat_n('a', len));
            }
            // Random characters from the whole Unicode range (valid ones).
            1 => {
                for _ in 0..(1 + rng.next() % 4) {
                    if let Some(c) = char::from_u32((rng.next() % 0x3_0000) as u32) {
                        s.push(c);
                    }
                }
            }
            _ => s.push_str(rng.pick(FRAGMENTS)),
        }
        s.push_str(rng.pick(SPACES));
    }
    s
}

/// The crate's tokenizer for `json`, without padding, truncating to `max_len` if given.
fn reference(json: &Value, max_len: Option<usize>) -> Tokenizer {
    let mut t = Tokenizer::from_bytes(json.to_string().as_bytes()).expect("the crate reads it");
    t.with_padding(None);
    t.with_truncation(max_len.map(|max_length| TruncationParams {
        max_length,
        strategy: TruncationStrategy::LongestFirst,
        stride: 0,
        direction: TruncationDirection::Right,
    }))
    .expect("truncation");
    t
}

#[test]
fn fast_bert_gives_the_crates_ids() {
    let normalizers = [
        json!({"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true, "strip_accents": null, "lowercase": true}),
        json!({"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true, "strip_accents": null, "lowercase": false}),
        json!({"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": false, "strip_accents": true, "lowercase": false}),
        json!({"type": "BertNormalizer", "clean_text": false, "handle_chinese_chars": true, "strip_accents": false, "lowercase": true}),
    ];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut compared, mut left_to_crate) = (0, 0);
    let first = normalizers[0].clone();
    let mut configs: Vec<Value> = normalizers
        .into_iter()
        .enumerate()
        .map(|(k, n)| tokenizer_json(n, k % 2 == 1))
        .collect();
    // Another prefix and a short word limit; an empty prefix; a template of three special ids
    // with type ids 1.
    configs.push(tokenizer_json_with(first.clone(), false, "@@", 8, false));
    configs.push(tokenizer_json_with(first.clone(), false, "", 100, false));
    configs.push(tokenizer_json_with(first, false, "##", 100, true));
    for (k, json) in configs.iter().enumerate() {
        let fast = FastBert::new(json).expect("a BERT tokenizer.json is taken");
        for max_len in [None, Some(12), Some(3)] {
            let crate_tok = reference(json, max_len);
            let mut texts: Vec<String> = (0..1500).map(|_| text(&mut rng)).collect();
            texts.extend(["", " ", "\t\n", "[CLS]", "x[SEP]y", "\u{fffd}\0"].map(str::to_owned));
            texts.extend(FRAGMENTS.iter().map(|f| (*f).to_owned()));
            for t in &texts {
                let want = crate_tok
                    .encode_fast(t.as_str(), true)
                    .expect("the crate encodes it");
                match fast.encode(t, max_len) {
                    Some((ids, types)) => {
                        assert_eq!(
                            (ids.as_slice(), types.as_slice()),
                            (want.get_ids(), want.get_type_ids()),
                            "normalizer {k}, max_len {max_len:?}, text {t:?}"
                        );
                        compared += 1;
                    }
                    None => {
                        assert!(
                            ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                                .iter()
                                .any(|a| t.contains(a)),
                            "left to the crate without an added token: {t:?}"
                        );
                        left_to_crate += 1;
                    }
                }
            }
        }
    }
    assert!(
        compared > 25_000 && left_to_crate > 0,
        "{compared} compared, {left_to_crate} left"
    );
    // Below the special tokens the crate's arithmetic wraps (it does not truncate at all):
    // left to it.
    let odd = FastBert::new(&configs[configs.len() - 1]).expect("taken");
    assert_eq!(odd.encode("hello world", Some(2)), None);
}

/// Another shape is refused, so that the crate tokenizes it.
#[test]
fn other_tokenizers_are_left_to_the_crate() {
    let bert = tokenizer_json(
        json!({"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true, "strip_accents": null, "lowercase": true}),
        false,
    );
    assert!(FastBert::new(&bert).is_some());
    let changed = |path: &[&str], value: Value| {
        let mut j = bert.clone();
        let mut at = &mut j;
        for p in &path[..path.len() - 1] {
            at = &mut at[*p];
        }
        at[path[path.len() - 1]] = value;
        FastBert::new(&j)
    };
    assert!(changed(&["normalizer"], json!({"type": "NFKC"})).is_none());
    assert!(changed(&["pre_tokenizer"], json!({"type": "Whitespace"})).is_none());
    assert!(changed(&["model", "type"], json!("BPE")).is_none());
    assert!(changed(&["post_processor"], json!({"type": "RobertaProcessing"})).is_none());
    assert!(changed(&["post_processor"], Value::Null).is_none());
    let mut normalized_added = bert.clone();
    normalized_added["added_tokens"][0]["normalized"] = json!(true);
    assert!(FastBert::new(&normalized_added).is_none());
}

/// Not a check: microseconds of CPU per sentence, one thread, [`FastBert`] beside the crate, on
/// sentences of 4-128 words as `gpu/embed_bench.py` makes them, over the `tokenizer.json` that
/// `MODELSHARE_TOKENIZER_JSON` names (all-MiniLM-L6-v2's, say), else the generated one.
///     cargo test --release -p modelshare-embed tokenize_speed -- --ignored --nocapture
#[test]
#[ignore = "a benchmark: prints figures"]
fn tokenize_speed() {
    let json: Value = match std::env::var("MODELSHARE_TOKENIZER_JSON") {
        Ok(path) => serde_json::from_slice(&std::fs::read(path).expect("readable")).expect("JSON"),
        Err(_) => tokenizer_json(
            json!({"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true, "strip_accents": null, "lowercase": true}),
            false,
        ),
    };
    let words: Vec<String> = json["model"]["vocab"]
        .as_object()
        .expect("vocab")
        .keys()
        .filter(|w| w.len() >= 3 && w.chars().all(|c| c.is_ascii_alphabetic()))
        .cloned()
        .collect();
    let mut rng = Rng(7);
    let sentences: Vec<String> = (0..4000)
        .map(|_| {
            let n = 4 + rng.next() % 125;
            let s: Vec<&str> = (0..n)
                .map(|_| words[(rng.next() % words.len() as u64) as usize].as_str())
                .collect();
            format!("{}.", s.join(" "))
        })
        .collect();
    let fast = FastBert::new(&json).expect("BERT's shape");
    let crate_tok = reference(&json, Some(256));
    let time = |f: &dyn Fn(&str) -> usize| {
        let t = std::time::Instant::now();
        let tokens: usize = sentences.iter().map(|s| f(s)).sum();
        (
            t.elapsed().as_secs_f64() / sentences.len() as f64 * 1e6,
            tokens,
        )
    };
    let (crate_us, crate_tokens) = time(&|s| {
        crate_tok
            .encode_fast(s, true)
            .expect("encodes")
            .get_ids()
            .len()
    });
    let (fast_us, fast_tokens) =
        time(&|s| fast.encode(s, Some(256)).expect("no added token").0.len());
    assert_eq!(crate_tokens, fast_tokens);
    println!("| tokenizer | µs per sentence | tokens |");
    println!("| --- | ---: | ---: |");
    println!("| tokenizers crate | {crate_us:.1} | {crate_tokens} |");
    println!("| FastBert | {fast_us:.1} | {fast_tokens} |");
}
