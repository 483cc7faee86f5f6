//! The echo worker's text generation (a streaming worker, `--streams N`), exactly, for tests of
//! streamed answers through the doors without a language model. An item is a generation
//! request when it has the string parameter `task` (`completion` or `chat`), as the OpenAI
//! and KServe generate doors send it (docs/ARCHITECTURE.md, "Generation items"):
//!
//! - The source text: a completion's prompt (the text input); for `chat`, the text input is
//!   the request's `messages` (a JSON array), and the source is the `content` string of its
//!   last message (anything else fails with INVALID_ARGUMENT).
//! - `sleep:N ...` at the start of the source (N all ASCII digits) waits N ms before each
//!   token; the word `sleep:N` itself is generated like any other.
//! - The tokens are the source's words (Rust's `split_whitespace`), the first as is, each next
//!   one with one space before it. Generation stops after `max_tokens` (int64 parameter,
//!   default 16, at least 1) tokens (`finish_reason` `length`, unless that was the last word:
//!   `stop`), or at the end of the words (`stop`), or at the first token after which the
//!   text contains one of the `stop` strings (parameter `stop`, a JSON array of strings): the
//!   text is cut before that string (tokens are cut or dropped: the worker knows its words
//!   ahead, so it never sends what a stop string later takes back) and `finish_reason` is
//!   `stop`.
//! - Streamed (the caller takes a stream), each token is one part with the string parameter
//!   `text`; the final output's `text` is empty. Not streamed, the final output's `text` is the
//!   whole text. The final output also carries `finish_reason` (string), `prompt_tokens` (the
//!   source's word count) and `completion_tokens` (tokens generated, through the one that
//!   completed a stop string), int64.
//! - `max_prompt_tokens` (int64, the tenant's cap): a source of more words fails with
//!   INVALID_ARGUMENT.
//! - Cancelled, it stops at the next token.

use std::time::Duration;

use modelshare_worker::serve::{Input, Item, ItemFailure, Outcome, Output, Parameter, PartSink};

/// Tokens generated when the request names no `max_tokens`.
pub const DEFAULT_MAX_TOKENS: i64 = 16;

/// Whether `item` is a generation request (it has a `task` parameter).
pub fn is_generation(item: &Item) -> bool {
    item.parameter("task").is_some()
}

/// What one generation request asks.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    source: String,
    max_tokens: i64,
    stop: Vec<String>,
    sleep: Duration,
}

impl Request {
    /// Reads the request from an item's input and parameters.
    pub fn of(item: &Item) -> Result<Self, ItemFailure> {
        let bad = |m: &str| Err(ItemFailure::invalid_argument(m));
        let Input::Text(text) = &item.input else {
            return bad("a generation request's input is text");
        };
        let source = match item.parameter("task") {
            Some(Parameter::String(t)) if t == "completion" => text.clone(),
            Some(Parameter::String(t)) if t == "chat" => last_content(text)?,
            _ => return bad("parameter 'task' must be 'completion' or 'chat'"),
        };
        let max_tokens = match item.parameter("max_tokens") {
            None => DEFAULT_MAX_TOKENS,
            Some(Parameter::Int64(n)) if *n >= 1 => *n,
            Some(Parameter::Uint64(n)) if *n >= 1 => i64::try_from(*n).unwrap_or(i64::MAX),
            Some(_) => return bad("parameter 'max_tokens' must be an integer of at least 1"),
        };
        let stop = match item.parameter("stop") {
            None => Vec::new(),
            Some(Parameter::String(s)) => serde_json::from_str::<Vec<String>>(s).map_err(|_| {
                ItemFailure::invalid_argument("parameter 'stop' must be a JSON array of strings")
            })?,
            Some(_) => return bad("parameter 'stop' must be a JSON array of strings"),
        };
        let words = source.split_whitespace().count();
        if let Some(Parameter::Int64(cap)) = item.parameter("max_prompt_tokens")
            && i64::try_from(words).unwrap_or(i64::MAX) > *cap
        {
            return Err(ItemFailure::invalid_argument(format!(
                "the prompt has {words} tokens; at most {cap}"
            )));
        }
        let sleep = source
            .strip_prefix("sleep:")
            .and_then(|rest| rest.split_whitespace().next())
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|n| n.parse::<u64>().ok())
            .map_or(Duration::ZERO, Duration::from_millis);
        Ok(Self {
            source,
            max_tokens,
            stop: stop.into_iter().filter(|s| !s.is_empty()).collect(),
            sleep,
        })
    }

    /// The tokens to send (cut at a stop string), the answer's `finish_reason`, and the
    /// number of tokens generated (through the one that completed the stop string).
    fn tokens(&self) -> (Vec<String>, &'static str, usize) {
        let words: Vec<&str> = self.source.split_whitespace().collect();
        let max = usize::try_from(self.max_tokens).unwrap_or(usize::MAX);
        let mut tokens = Vec::new();
        let mut text = String::new();
        for (i, word) in words.iter().enumerate() {
            if i == max {
                return (tokens, "length", i);
            }
            let token = if i == 0 {
                (*word).to_owned()
            } else {
                format!(" {word}")
            };
            text.push_str(&token);
            tokens.push(token);
            if let Some(at) = self.stop.iter().filter_map(|s| text.find(s.as_str())).min() {
                // The text ends before the stop string, which may have begun tokens ago.
                let generated = tokens.len();
                let mut kept = Vec::new();
                let mut length = 0;
                for t in tokens {
                    let keep = at.saturating_sub(length).min(t.len());
                    length += t.len();
                    if keep > 0 {
                        kept.push(t[..keep].to_owned());
                    }
                }
                return (kept, "stop", generated);
            }
        }
        let generated = tokens.len();
        (tokens, "stop", generated)
    }

    fn prompt_tokens(&self) -> i64 {
        i64::try_from(self.source.split_whitespace().count()).unwrap_or(i64::MAX)
    }
}

/// The last message's `content` of a chat request's `messages`.
fn last_content(messages: &str) -> Result<String, ItemFailure> {
    let bad = || {
        ItemFailure::invalid_argument(
            "a chat request's input is a JSON array of messages whose last has string content",
        )
    };
    let value: serde_json::Value = serde_json::from_str(messages).map_err(|_| bad())?;
    value
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m.get("content"))
        .and_then(|c| c.as_str())
        .map(str::to_owned)
        .ok_or_else(bad)
}

/// Runs a generation request: streams its tokens through `sink` when the item is streamed,
/// and returns the final output.
pub async fn generate(item: &Item, sink: &mut PartSink) -> Outcome {
    let request = Request::of(item)?;
    let (tokens, finish_reason, generated) = request.tokens();
    let generated = i64::try_from(generated).unwrap_or(i64::MAX);
    let mut whole = String::new();
    for token in tokens {
        if !request.sleep.is_zero() {
            tokio::select! {
                () = tokio::time::sleep(request.sleep) => {}
                () = item.cancelled() => return Err(cancelled()),
            }
        }
        if item.is_cancelled() {
            return Err(cancelled());
        }
        if sink.is_streamed() {
            let part = Output::new().with_parameter("text", token);
            sink.send(part)
                .await
                .map_err(|e| ItemFailure::cancelled(e.to_string()))?;
        } else {
            whole.push_str(&token);
        }
    }
    Ok(Output::new()
        .with_parameter("text", whole)
        .with_parameter("finish_reason", finish_reason)
        .with_parameter("prompt_tokens", request.prompt_tokens())
        .with_parameter("completion_tokens", generated))
}

fn cancelled() -> ItemFailure {
    ItemFailure::cancelled("the server cancelled the item")
}

#[cfg(test)]
mod tests {
    use modelshare_proto::v1 as pb;

    use super::*;

    fn completion(prompt: &str) -> Item {
        Item::new(1, Input::Text(prompt.into())).with_parameter("task", "completion")
    }

    fn text(o: &Output, name: &str) -> String {
        match o.parameters.get(name) {
            Some(Parameter::String(s)) => s.clone(),
            other => panic!("{name}: {other:?}"),
        }
    }

    fn int(o: &Output, name: &str) -> i64 {
        match o.parameters.get(name) {
            Some(Parameter::Int64(n)) => *n,
            other => panic!("{name}: {other:?}"),
        }
    }

    async fn streamed(item: Item) -> (Vec<String>, Output) {
        let (mut sink, mut rx) = PartSink::collecting(true);
        let out = generate(&item, &mut sink).await.expect("generated");
        drop(sink);
        let mut parts = Vec::new();
        while let Some(pb::ServeRequest {
            kind: Some(pb::serve_request::Kind::Part(p)),
        }) = rx.recv().await
        {
            let o = p.output.expect("output");
            match o.parameters["text"].value.as_ref() {
                Some(pb::parameter::Value::StringValue(s)) => parts.push(s.clone()),
                other => panic!("{other:?}"),
            }
        }
        (parts, out)
    }

    #[tokio::test]
    async fn words_stream_one_part_each_up_to_max_tokens() {
        let (parts, out) = streamed(completion("the quick  brown fox")).await;
        assert_eq!(parts, ["the", " quick", " brown", " fox"]);
        assert_eq!(text(&out, "text"), "");
        assert_eq!(text(&out, "finish_reason"), "stop");
        assert_eq!(
            (int(&out, "prompt_tokens"), int(&out, "completion_tokens")),
            (4, 4)
        );
        let (parts, out) = streamed(completion("a b c d").with_parameter("max_tokens", 2i64)).await;
        assert_eq!(parts, ["a", " b"]);
        assert_eq!(text(&out, "finish_reason"), "length");
        // max_tokens at the last word: the words ended, so `stop`.
        let (_, out) = streamed(completion("a b").with_parameter("max_tokens", 2i64)).await;
        assert_eq!(text(&out, "finish_reason"), "stop");
    }

    #[tokio::test]
    async fn stop_strings_cut_the_text_and_whole_answers_carry_it_all() {
        let item = completion("one two three four").with_parameter("stop", r#"["ee f", "zz"]"#);
        let (parts, out) = streamed(item.clone()).await;
        assert_eq!(parts, ["one", " two", " thr"]);
        assert_eq!(text(&out, "finish_reason"), "stop");
        assert_eq!(int(&out, "completion_tokens"), 4);
        let (mut sink, _rx) = PartSink::collecting(false);
        let out = generate(&item, &mut sink).await.expect("whole");
        assert_eq!(text(&out, "text"), "one two thr");
    }

    #[tokio::test]
    async fn chat_answers_the_last_message_and_bad_requests_fail() {
        let chat = Item::new(
            1,
            Input::Text(
                r#"[{"role":"system","content":"x"},{"role":"user","content":"hi there"}]"#.into(),
            ),
        )
        .with_parameter("task", "chat");
        let (parts, _) = streamed(chat).await;
        assert_eq!(parts, ["hi", " there"]);
        let (mut sink, _rx) = PartSink::collecting(true);
        for bad in [
            Item::new(1, Input::Text("[]".into())).with_parameter("task", "chat"),
            Item::new(1, Input::Text("{".into())).with_parameter("task", "chat"),
            completion("x").with_parameter("max_tokens", 0i64),
            completion("x").with_parameter("stop", "nope"),
            Item::new(1, Input::Text("x".into())).with_parameter("task", "poem"),
            completion("a b c").with_parameter("max_prompt_tokens", 2i64),
        ] {
            let e = generate(&bad, &mut sink).await.expect_err("bad");
            assert_eq!(e.code, tonic::Code::InvalidArgument, "{bad:?}");
        }
    }
}
