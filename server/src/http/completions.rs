//! The OpenAI generation routes: `POST /v1/completions` and `POST /v1/chat/completions`, over
//! a streaming worker's generation items ([`crate::front::generation`]).
//!
//! - `stream: true` answers with server-sent events: one `data: {chunk}` per part the worker
//!   sends, a last chunk with the `finish_reason`, with `stream_options.include_usage` a chunk
//!   of `usage` and no choices, then `data: [DONE]`. Otherwise one JSON body with the whole
//!   text and `usage`.
//! - An error before the first part (a bad request, an unknown model, a full queue, no part
//!   within the deadline) is a plain JSON error in OpenAI's shape with its status; an error
//!   after it is a last event `data: {"error": {...}}`, and the stream ends without `[DONE]`.
//! - The reader's pace is the worker's: a part is taken from the request path only when the
//!   connection has taken the one before (the stream's window, `Engine::infer_stream`). A
//!   client that goes away cancels the item at its worker.
//! - Read: `model`, `prompt` (a string, or a list of one) or `messages` (a non-empty list of
//!   objects with a string `role`, forwarded to the worker as they came), `max_tokens` (chat:
//!   or `max_completion_tokens`), `temperature`, `top_p`, `seed`, `stop` (a string or a list of
//!   at most 4), `n` (1 only), `stream`, `stream_options`. Refused: `echo`, `logprobs`,
//!   `best_of` above 1, `suffix`, `tools` (not supported, 400). Other fields are ignored, as
//!   OpenAI's own server ignores fields it does not use.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::door::{self, DoorError};
use super::openai::error;
use super::state::HttpState;
use super::streamed::{self, Events};
use crate::connections::Connection;
use crate::front::generation::{self, Finish, Generation, Task, Tokens};
use crate::request_id::RequestTrace;
use modelshare_serving::InferError;

/// Most chat messages in one request.
const MAX_MESSAGES: usize = 4096;

/// `stop`: one string or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

/// `prompt`: one string or a list of one.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Prompt {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Default, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// The fields both routes read.
#[derive(Debug, Deserialize)]
struct Common {
    model: String,
    #[serde(default)]
    max_tokens: Option<i64>,
    #[serde(default)]
    temperature: Option<f64>,
    #[serde(default)]
    top_p: Option<f64>,
    #[serde(default)]
    seed: Option<i64>,
    #[serde(default)]
    stop: Option<Stop>,
    #[serde(default)]
    n: Option<i64>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    logprobs: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct CompletionBody {
    #[serde(flatten)]
    common: Common,
    prompt: Prompt,
    #[serde(default)]
    echo: Option<bool>,
    #[serde(default)]
    best_of: Option<i64>,
    #[serde(default)]
    suffix: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ChatBody {
    #[serde(flatten)]
    common: Common,
    messages: Vec<Value>,
    #[serde(default)]
    max_completion_tokens: Option<i64>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
}

/// What a request asks, read and checked.
#[derive(Debug)]
pub struct Asked {
    /// The model asked.
    pub model: String,
    /// The generation item's contents.
    pub generation: Generation,
    /// `stream`.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
}

fn unsupported(field: &str) -> DoorError {
    DoorError::bad_request(format!("'{field}' is not supported by this server"))
}

fn stops(stop: Option<Stop>) -> Vec<String> {
    match stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
    }
}

/// Reads a request body of `task`. Public for the fuzz target.
pub fn asked(task: Task, body: &[u8]) -> Result<Asked, DoorError> {
    let malformed =
        |e: serde_json::Error| DoorError::bad_request(format!("malformed request JSON: {e}"));
    let (common, input, max_tokens) = match task {
        Task::Completion => {
            let super::json::Object(b) =
                serde_json::from_slice::<super::json::Object<CompletionBody>>(body)
                    .map_err(malformed)?;
            if b.echo == Some(true) {
                return Err(unsupported("echo"));
            }
            if b.best_of.is_some_and(|n| n != 1) {
                return Err(unsupported("best_of"));
            }
            if b.suffix.is_some() {
                return Err(unsupported("suffix"));
            }
            let prompt = match b.prompt {
                Prompt::One(p) => p,
                Prompt::Many(mut v) if v.len() == 1 => v.remove(0),
                Prompt::Many(_) => {
                    return Err(DoorError::bad_request(
                        "'prompt' must be a string or a list of one string",
                    ));
                }
            };
            let max = b.common.max_tokens;
            (b.common, prompt, max)
        }
        Task::Chat => {
            let super::json::Object(b) =
                serde_json::from_slice::<super::json::Object<ChatBody>>(body).map_err(malformed)?;
            if b.tools.as_ref().is_some_and(|t| !t.is_empty()) {
                return Err(unsupported("tools"));
            }
            if b.messages.is_empty() {
                return Err(DoorError::bad_request("'messages' is empty"));
            }
            if b.messages.len() > MAX_MESSAGES {
                return Err(DoorError::bad_request(format!(
                    "'messages' has {} entries; at most {MAX_MESSAGES}",
                    b.messages.len()
                )));
            }
            if let Some(i) = b
                .messages
                .iter()
                .position(|m| !m.get("role").is_some_and(Value::is_string))
            {
                return Err(DoorError::bad_request(format!(
                    "'messages[{i}]' is not an object with a string 'role'"
                )));
            }
            let messages = serde_json::to_string(&b.messages).map_err(malformed)?;
            let max = b.max_completion_tokens.or(b.common.max_tokens);
            (b.common, messages, max)
        }
    };
    if common.n.is_some_and(|n| n != 1) {
        return Err(DoorError::bad_request("'n' must be 1"));
    }
    if common
        .logprobs
        .as_ref()
        .is_some_and(|l| !l.is_null() && *l != Value::Bool(false))
    {
        return Err(unsupported("logprobs"));
    }
    let generation = Generation {
        task,
        input,
        max_tokens,
        temperature: common.temperature,
        top_p: common.top_p,
        seed: common.seed,
        stop: stops(common.stop),
    };
    generation.check().map_err(DoorError::from)?;
    Ok(Asked {
        model: common.model,
        generation,
        stream: common.stream.unwrap_or(false),
        include_usage: common.stream_options.unwrap_or_default().include_usage,
    })
}

/// `POST /v1/completions` (`CHAT` false) and `POST /v1/chat/completions` (`CHAT` true): the
/// caller admitted before the body is read, as `/v1/embeddings`.
pub async fn generate<const CHAT: bool>(
    State(state): State<HttpState>,
    connection: Option<Extension<Connection>>,
    trace: Option<Extension<RequestTrace>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let task = if CHAT { Task::Chat } else { Task::Completion };
    let connection = connection.map(|Extension(c)| c);
    let trace = trace.map(|Extension(t)| t);
    let arrived = Instant::now();
    let path = match task {
        Task::Completion => "/v1/completions",
        Task::Chat => "/v1/chat/completions",
    };
    let declared = super::body::declared_length(&headers);
    let mut body = Some(body);
    let result = async {
        let (caller, guard) = door::admit(&state, path, &headers)?;
        let deadline = door::deadline(&state, &headers, arrived)?;
        let (bytes, hold) =
            door::body(&state, connection.as_ref(), &headers, arrived, &mut body).await?;
        let asked = state
            .app
            .cpu
            .run_sized(bytes.len(), deadline, move || asked(task, &bytes))
            .await??;
        drop(hold);
        let id = trace.as_ref().map_or_else(
            || uuid::Uuid::new_v4().simple().to_string(),
            |t| t.id.clone(),
        );
        let parts = generation::stream(
            &state.app,
            &caller,
            &asked.model,
            asked.generation,
            trace.as_ref(),
            deadline,
        )?;
        // The first part (or the answer) decides between an error and a stream.
        let opening = streamed::open(parts).await?;
        let reply = Reply {
            task,
            id,
            model: asked.model,
            created: unix_now(),
            include_usage: asked.include_usage,
            tokens: Tokens::of(&state.app, &caller),
        };
        if asked.stream {
            // The in-flight count lasts as long as the stream.
            Ok::<_, DoorError>(streamed::sse(
                reply,
                opening,
                guard,
                state.app.config.serving.stream_idle,
            ))
        } else {
            let (text, finish, _) = opening.collect(&reply.tokens).await?;
            drop(guard);
            Ok(Json(reply.whole(&text, &finish)).into_response())
        }
    }
    .await;
    door::drain(&state, declared, body);
    result.unwrap_or_else(error)
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// What every chunk and answer of one request repeats, and where its tokens are counted.
#[derive(Debug, Clone)]
struct Reply {
    task: Task,
    id: String,
    model: String,
    created: u64,
    /// `stream_options.include_usage`.
    include_usage: bool,
    tokens: Tokens,
}

fn usage(f: &Finish) -> Value {
    json!({
        "prompt_tokens": f.prompt_tokens,
        "completion_tokens": f.completion_tokens,
        "total_tokens": f.prompt_tokens.saturating_add(f.completion_tokens),
    })
}

impl Reply {
    fn id(&self) -> String {
        match self.task {
            Task::Completion => format!("cmpl-{}", self.id),
            Task::Chat => format!("chatcmpl-{}", self.id),
        }
    }

    /// The answer of a request that is not streamed.
    fn whole(&self, text: &str, f: &Finish) -> Value {
        let (object, choice) = match self.task {
            Task::Completion => (
                "text_completion",
                json!({ "index": 0, "text": text, "logprobs": null, "finish_reason": f.reason }),
            ),
            Task::Chat => (
                "chat.completion",
                json!({
                    "index": 0,
                    "message": { "role": "assistant", "content": text },
                    "logprobs": null,
                    "finish_reason": f.reason,
                }),
            ),
        };
        json!({
            "id": self.id(),
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage(f),
        })
    }

    /// One chunk: `text` new, `finish` on the last; with usage asked, `usage: null` on each.
    fn chunk(
        &self,
        text: Option<&str>,
        first: bool,
        finish: Option<&str>,
        with_usage: bool,
    ) -> Value {
        let choice = match self.task {
            Task::Completion => json!({
                "index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": finish,
            }),
            Task::Chat => {
                let mut delta = serde_json::Map::new();
                if first {
                    delta.insert("role".into(), json!("assistant"));
                }
                if let Some(t) = text {
                    delta.insert("content".into(), json!(t));
                }
                json!({ "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish })
            }
        };
        let mut chunk = json!({
            "id": self.id(),
            "object": match self.task {
                Task::Completion => "text_completion",
                Task::Chat => "chat.completion.chunk",
            },
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        });
        if with_usage {
            chunk["usage"] = Value::Null;
        }
        chunk
    }

    /// The usage chunk of a stream that asked for it.
    fn usage_chunk(&self, f: &Finish) -> Value {
        let mut chunk = self.chunk(None, false, None, true);
        chunk["choices"] = json!([]);
        chunk["usage"] = usage(f);
        chunk
    }
}

impl Events for Reply {
    fn part(&self, text: &str, first: bool) -> Value {
        self.chunk(Some(text), first, None, self.include_usage)
    }

    fn last(&self, text: Option<&str>, first: bool, finish: &Finish, _version: u32) -> Vec<Value> {
        let mut events = vec![self.chunk(text, first, Some(&finish.reason), self.include_usage)];
        if self.include_usage {
            events.push(self.usage_chunk(finish));
        }
        events
    }

    fn error(&self, e: &InferError) -> Value {
        error_event(e)
    }

    fn done(&self) -> Option<&'static str> {
        Some("[DONE]")
    }

    fn tokens(&self) -> &Tokens {
        &self.tokens
    }
}

/// An error after the stream started, as OpenAI sends one: an event of `{"error": {...}}`.
fn error_event(e: &InferError) -> Value {
    let status = DoorError::from(e.clone()).status;
    let kind = if status.is_client_error() {
        "invalid_request_error"
    } else {
        "server_error"
    };
    json!({ "error": { "message": e.to_string(), "type": kind, "param": null, "code": null } })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_read_and_bounded() {
        let a = asked(
            Task::Completion,
            br#"{"model":"m","prompt":"hi","max_tokens":3,"stop":"x","stream":true,"stream_options":{"include_usage":true},"presence_penalty":0.5}"#,
        )
        .expect("completion");
        assert!(a.stream && a.include_usage);
        assert_eq!(a.generation.stop, ["x"]);
        assert_eq!(a.generation.max_tokens, Some(3));
        let a = asked(
            Task::Chat,
            br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":2,"max_tokens":9}"#,
        )
        .expect("chat");
        assert_eq!(a.generation.max_tokens, Some(2));
        assert_eq!(a.generation.input, r#"[{"content":"hi","role":"user"}]"#);
        for (task, bad) in [
            (Task::Completion, &br#"{"model":"m"}"#[..]),
            (Task::Completion, br#"{"model":"m","prompt":["a","b"]}"#),
            (Task::Completion, br#"{"model":"m","prompt":"a","n":2}"#),
            (
                Task::Completion,
                br#"{"model":"m","prompt":"a","echo":true}"#,
            ),
            (
                Task::Completion,
                br#"{"model":"m","prompt":"a","logprobs":2}"#,
            ),
            (
                Task::Completion,
                br#"{"model":"m","prompt":"a","max_tokens":0}"#,
            ),
            (
                Task::Completion,
                br#"{"model":"m","prompt":"a","stop":["a","b","c","d","e"]}"#,
            ),
            (Task::Completion, br#"["m","a"]"#),
            (Task::Chat, br#"{"model":"m","messages":[]}"#),
            (Task::Chat, br#"{"model":"m","messages":[{"content":"x"}]}"#),
            (Task::Chat, br#"{"model":"m","messages":[1]}"#),
            (
                Task::Chat,
                br#"{"model":"m","messages":[{"role":"user"}],"tools":[{}]}"#,
            ),
            (
                Task::Chat,
                br#"{"model":"m","messages":[{"role":"user"}],"temperature":3}"#,
            ),
        ] {
            let e = asked(task, bad).expect_err("bad");
            assert_eq!(
                e.status,
                axum::http::StatusCode::BAD_REQUEST,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn chunks_and_answers_have_openais_shape() {
        let r = Reply {
            task: Task::Chat,
            id: "abc".into(),
            model: "m".into(),
            created: 7,
            include_usage: false,
            tokens: Tokens {
                counter: modelshare_core::metrics::Metrics::new()
                    .expect("metrics")
                    .generated_tokens,
                tenant: "a".into(),
            },
        };
        let c = r.chunk(Some("hi"), true, None, false);
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(
            c["choices"][0]["delta"],
            json!({"role": "assistant", "content": "hi"})
        );
        assert!(c.get("usage").is_none());
        let f = Finish {
            text: String::new(),
            reason: "length".into(),
            prompt_tokens: 2,
            completion_tokens: 3,
        };
        let u = r.usage_chunk(&f);
        assert_eq!(u["choices"], json!([]));
        assert_eq!(u["usage"]["total_tokens"], 5);
        let w = r.whole("hello", &f);
        assert_eq!(w["id"], "chatcmpl-abc");
        assert_eq!(w["choices"][0]["message"]["content"], "hello");
        let r = Reply {
            task: Task::Completion,
            ..r
        };
        let w = r.whole("hello", &f);
        assert_eq!(
            (w["object"].as_str(), w["choices"][0]["text"].as_str()),
            (Some("text_completion"), Some("hello"))
        );
    }
}
