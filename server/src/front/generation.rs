//! Generation items: how a door asks a worker for generated text, and reads its answer. The
//! OpenAI completion and chat doors (and, later, KServe's generate) share this convention,
//! which a generation worker implements (docs/ARCHITECTURE.md, "Generation items"):
//!
//! - The item's text input is the prompt (`task` `completion`), or the request's `messages`
//!   exactly as the client sent them, a JSON array (`task` `chat`): the worker applies the
//!   model's chat template and counts the tokens; the server runs no template.
//! - Its parameters: `task` (string), and those the client gave of `max_tokens` (int64),
//!   `temperature` and `top_p` (double), `seed` (int64), `stop` (string: a JSON array of
//!   strings); with the tenant's caps (quota `max_tokens`: a larger ask is refused, none asks
//!   the cap; quota `prompt_tokens`: `max_prompt_tokens` (int64), which the worker enforces, as
//!   it counts the tokens).
//! - Each part of the streamed answer carries the new text in the string parameter `text`;
//!   the final output carries what text is left (often none) in `text`, and `finish_reason`
//!   (string: `stop` or `length`), `prompt_tokens` and `completion_tokens` (int64).
//!
//! Every number a client sends is bounded here ([`Limits`]) before an item is made.

use std::time::Instant;

use modelshare_proto::v1 as pb;
use modelshare_serving::{InferError, InferResponse, PartStream, StreamLimits};
use prometheus::IntCounterVec;

use crate::app::App;
use crate::request_id::RequestTrace;
use modelshare_core::tenants::{Caller, Quota};

/// Most stop strings (OpenAI's own limit).
pub const MAX_STOP: usize = 4;
/// Most bytes of one stop string.
pub const MAX_STOP_BYTES: usize = 256;
/// The most `max_tokens` a request may ask.
pub const MAX_TOKENS: i64 = 1 << 20;

/// What a generation request asks, as the doors read it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Generation {
    /// `completion` or `chat`.
    pub task: Task,
    /// The prompt, or the chat's messages as a JSON array.
    pub input: String,
    /// Most tokens to generate.
    pub max_tokens: Option<i64>,
    /// Sampling temperature, 0 to 2.
    pub temperature: Option<f64>,
    /// Nucleus sampling's mass, above 0 and at most 1.
    pub top_p: Option<f64>,
    /// The sampler's seed.
    pub seed: Option<i64>,
    /// Strings that end the text (not included).
    pub stop: Vec<String>,
}

/// What is generated from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Task {
    /// A prompt.
    #[default]
    Completion,
    /// Chat messages.
    Chat,
}

impl Task {
    fn name(self) -> &'static str {
        match self {
            Task::Completion => "completion",
            Task::Chat => "chat",
        }
    }
}

impl Generation {
    /// Checks the numbers against their bounds; the message names the field as the client
    /// sent it.
    pub fn check(&self) -> Result<(), InferError> {
        let bad = |m: String| Err(InferError::InvalidInput(m));
        if let Some(n) = self.max_tokens
            && !(1..=MAX_TOKENS).contains(&n)
        {
            return bad(format!(
                "'max_tokens' must be from 1 to {MAX_TOKENS}, not {n}"
            ));
        }
        if let Some(t) = self.temperature
            && !(0.0..=2.0).contains(&t)
        {
            return bad(format!("'temperature' must be from 0 to 2, not {t}"));
        }
        if let Some(p) = self.top_p
            && !(p > 0.0 && p <= 1.0)
        {
            return bad(format!("'top_p' must be above 0 and at most 1, not {p}"));
        }
        if self.stop.len() > MAX_STOP {
            return bad(format!(
                "'stop' has {} strings; at most {MAX_STOP}",
                self.stop.len()
            ));
        }
        if self.stop.iter().any(|s| s.len() > MAX_STOP_BYTES) {
            return bad(format!(
                "a 'stop' string is longer than {MAX_STOP_BYTES} bytes"
            ));
        }
        Ok(())
    }

    /// The item a worker receives.
    pub fn item(&self) -> pb::Item {
        use pb::parameter::Value;
        let mut item = pb::Item {
            input: Some(pb::item::Input::Text(pb::TextInput {
                text: self.input.clone(),
            })),
            ..Default::default()
        };
        let mut set = |name: &str, value: Value| {
            item.parameters
                .insert(name.to_owned(), pb::Parameter { value: Some(value) });
        };
        set("task", Value::StringValue(self.task.name().to_owned()));
        if let Some(n) = self.max_tokens {
            set("max_tokens", Value::Int64Value(n));
        }
        if let Some(t) = self.temperature {
            set("temperature", Value::DoubleValue(t));
        }
        if let Some(p) = self.top_p {
            set("top_p", Value::DoubleValue(p));
        }
        if let Some(s) = self.seed {
            set("seed", Value::Int64Value(s));
        }
        if !self.stop.is_empty() {
            let stop = serde_json::to_string(&self.stop).unwrap_or_default();
            set("stop", Value::StringValue(stop));
        }
        item
    }
}

/// The KServe (and Triton) generation parameters a request may carry: `max_tokens`,
/// `temperature`, `top_p`, `seed`, and `stop` (a string: one stop string, or a JSON array of
/// them). Others are ignored, as the doors ignore fields they do not use.
pub fn kserve(
    text_input: String,
    parameters: &std::collections::HashMap<String, pb::Parameter>,
) -> Result<Generation, InferError> {
    use pb::parameter::Value;
    let bad = |name: &str, what: &str| {
        InferError::InvalidInput(format!("parameter '{name}' must be {what}"))
    };
    let value = |name: &str| parameters.get(name).and_then(|p| p.value.as_ref());
    let int = |name: &str| match value(name) {
        None => Ok(None),
        Some(Value::Int64Value(n)) => Ok(Some(*n)),
        Some(Value::Uint64Value(n)) => i64::try_from(*n)
            .map(Some)
            .map_err(|_| bad(name, "an integer")),
        Some(_) => Err(bad(name, "an integer")),
    };
    let float = |name: &str| match value(name) {
        None => Ok(None),
        Some(Value::DoubleValue(x)) => Ok(Some(*x)),
        Some(Value::Int64Value(n)) => Ok(Some(*n as f64)),
        Some(_) => Err(bad(name, "a number")),
    };
    let stop = match value("stop") {
        None => Vec::new(),
        // A JSON array of strings, else one stop string (which may begin with `[`: "[/INST]").
        Some(Value::StringValue(s)) => {
            serde_json::from_str::<Vec<String>>(s).unwrap_or_else(|_| vec![s.clone()])
        }
        Some(_) => return Err(bad("stop", "a string or a JSON array of strings")),
    };
    let generation = Generation {
        task: Task::Completion,
        input: text_input,
        max_tokens: int("max_tokens")?,
        temperature: float("temperature")?,
        top_p: float("top_p")?,
        seed: int("seed")?,
        stop,
    };
    generation.check()?;
    Ok(generation)
}

/// The new text of a part (none when it has no `text`).
pub fn part_text(output: &pb::ItemOutput) -> &str {
    match output.parameters.get("text").and_then(|p| p.value.as_ref()) {
        Some(pb::parameter::Value::StringValue(s)) => s,
        _ => "",
    }
}

/// The end of a generated answer, from its final output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finish {
    /// Text left after the parts.
    pub text: String,
    /// `stop` or `length` (as the worker said; `stop` when it said nothing).
    pub reason: String,
    /// Tokens of the prompt.
    pub prompt_tokens: i64,
    /// Tokens generated.
    pub completion_tokens: i64,
}

impl Finish {
    /// Reads the final output.
    pub fn of(output: &pb::ItemOutput) -> Self {
        let int = |name: &str| match output.parameters.get(name).and_then(|p| p.value.as_ref()) {
            Some(pb::parameter::Value::Int64Value(n)) => (*n).max(0),
            Some(pb::parameter::Value::Uint64Value(n)) => i64::try_from(*n).unwrap_or(i64::MAX),
            _ => 0,
        };
        let reason = match output
            .parameters
            .get("finish_reason")
            .and_then(|p| p.value.as_ref())
        {
            Some(pb::parameter::Value::StringValue(s)) if !s.is_empty() => s.clone(),
            _ => "stop".to_owned(),
        };
        Self {
            text: part_text(output).to_owned(),
            reason,
            prompt_tokens: int("prompt_tokens"),
            completion_tokens: int("completion_tokens"),
        }
    }
}

/// Where an answer's tokens are counted: `modelshare_generated_tokens_total` for the caller's
/// tenant. Every door that generates reads an answer's end through it.
#[derive(Debug, Clone)]
pub struct Tokens {
    /// The counter family.
    pub counter: IntCounterVec,
    /// The caller's tenant label.
    pub tenant: String,
}

impl Tokens {
    /// `caller`'s, on `app`'s metrics.
    pub fn of(app: &App, caller: &Caller) -> Self {
        Self {
            counter: app.host.metrics.generated_tokens.clone(),
            tenant: caller
                .tenant()
                .unwrap_or(modelshare_core::metrics::ADMIN_TENANT)
                .to_owned(),
        }
    }

    /// The end of the answer, from its final output; its tokens are counted.
    pub fn finish(&self, r: &InferResponse) -> Result<Finish, InferError> {
        let finish = r
            .outputs
            .first()
            .map(Finish::of)
            .ok_or_else(|| InferError::BadOutput {
                model: r.model.clone(),
                reason: "no output".into(),
            })?;
        self.counter
            .with_label_values(&[r.model.as_str(), self.tenant.as_str()])
            .inc_by(u64::try_from(finish.completion_tokens).unwrap_or(0));
        Ok(finish)
    }
}

/// Submits what `asked` to `model` for `caller` as a streamed request (see
/// [`modelshare_serving::Engine::infer_stream`]), within the tenant's caps ([`capped`]) and
/// marked with the request's `trace`: the deadline bounds the time to its first part, the
/// server's stream limits (`stream_idle_secs`, `max_stream_secs`) the rest. A model the caller
/// may not see is unknown.
pub fn stream(
    app: &App,
    caller: &Caller,
    model: &str,
    asked: Generation,
    trace: Option<&RequestTrace>,
    deadline: Instant,
) -> Result<PartStream, InferError> {
    let model = super::visible_model(app, caller, model)?;
    let mut item = match caller {
        Caller::Admin => asked.item(),
        Caller::Tenant { quota, .. } => capped(asked, quota)?,
    };
    if let Some(trace) = trace {
        trace.stamp(std::slice::from_mut(&mut item));
    }
    let request = super::request(caller, &model, vec![item], deadline, None);
    let limits = StreamLimits {
        idle: app.config.serving.stream_idle,
        longest: app.config.serving.max_stream_time,
        ..StreamLimits::default()
    };
    app.engine.infer_stream(request, limits)
}

/// The item of a tenant's generation, within its caps: `max_tokens` over `max_tokens` is
/// refused, and a request naming none asks that many; more stop strings than `stop_strings`
/// are refused; `prompt_tokens` goes to the worker as the item parameter `max_prompt_tokens`
/// (it tokenizes, and refuses a longer prompt).
fn capped(mut asked: Generation, quota: &Quota) -> Result<pb::Item, InferError> {
    if let Some(cap) = quota.stop_strings
        && asked.stop.len() > cap as usize
    {
        return Err(InferError::InvalidInput(format!(
            "'stop' has {} strings; this tenant may send at most {cap}",
            asked.stop.len()
        )));
    }
    if let Some(cap) = quota.max_tokens {
        match asked.max_tokens {
            Some(n) if n > i64::from(cap) => {
                return Err(InferError::InvalidInput(format!(
                    "'max_tokens' is {n}; this tenant may ask at most {cap}"
                )));
            }
            Some(_) => {}
            None => asked.max_tokens = Some(i64::from(cap)),
        }
    }
    let mut item = asked.item();
    if let Some(cap) = quota.prompt_tokens {
        item.parameters.insert(
            "max_prompt_tokens".into(),
            pb::Parameter {
                value: Some(pb::parameter::Value::Int64Value(i64::from(cap))),
            },
        );
    }
    Ok(item)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_bounded_and_items_carry_what_was_given() {
        let g = Generation {
            task: Task::Chat,
            input: "[]".into(),
            max_tokens: Some(5),
            temperature: Some(0.0),
            stop: vec!["\n".into()],
            ..Default::default()
        };
        g.check().expect("fine");
        let item = g.item();
        assert_eq!(
            item.parameters["task"].value,
            Some(pb::parameter::Value::StringValue("chat".into()))
        );
        assert_eq!(
            item.parameters["stop"].value,
            Some(pb::parameter::Value::StringValue(r#"["\n"]"#.into()))
        );
        assert!(!item.parameters.contains_key("top_p"));
        for bad in [
            Generation {
                max_tokens: Some(0),
                ..g.clone()
            },
            Generation {
                max_tokens: Some(MAX_TOKENS + 1),
                ..g.clone()
            },
            Generation {
                temperature: Some(2.5),
                ..g.clone()
            },
            Generation {
                temperature: Some(f64::NAN),
                ..g.clone()
            },
            Generation {
                top_p: Some(0.0),
                ..g.clone()
            },
            Generation {
                stop: vec!["a".into(); 5],
                ..g.clone()
            },
            Generation {
                stop: vec!["a".repeat(MAX_STOP_BYTES + 1)],
                ..g.clone()
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_tenants_caps_bound_max_tokens_and_reach_the_worker() {
        let int = |item: &pb::Item, name: &str| match item
            .parameters
            .get(name)
            .and_then(|p| p.value.as_ref())
        {
            Some(pb::parameter::Value::Int64Value(n)) => Some(*n),
            _ => None,
        };
        let asked = |n: Option<i64>| Generation {
            max_tokens: n,
            ..Default::default()
        };
        let quota = |max_tokens, prompt_tokens, stop_strings| Quota {
            max_tokens,
            prompt_tokens,
            stop_strings,
            ..Quota::default()
        };
        let item = capped(asked(None), &quota(Some(64), Some(1000), None)).expect("capped");
        assert_eq!(
            (int(&item, "max_tokens"), int(&item, "max_prompt_tokens")),
            (Some(64), Some(1000))
        );
        let item = capped(asked(Some(10)), &quota(Some(64), None, None)).expect("under the cap");
        assert_eq!(
            (int(&item, "max_tokens"), int(&item, "max_prompt_tokens")),
            (Some(10), None)
        );
        assert!(capped(asked(Some(65)), &quota(Some(64), None, None)).is_err());
        let item = capped(asked(Some(1 << 20)), &Quota::default()).expect("no cap");
        assert_eq!(int(&item, "max_tokens"), Some(1 << 20));
        let stops = |n: usize| Generation {
            stop: vec!["x".into(); n],
            ..Default::default()
        };
        let one = quota(None, None, Some(1));
        assert!(capped(stops(1), &one).is_ok());
        assert!(capped(stops(0), &one).is_ok());
        let err = capped(stops(2), &one).expect_err("two stop strings over a cap of one");
        assert!(err.to_string().contains("at most 1"), "{err}");
    }

    #[test]
    fn a_final_output_reads_with_defaults() {
        let mut out = pb::ItemOutput::default();
        assert_eq!(
            Finish::of(&out),
            Finish {
                text: String::new(),
                reason: "stop".into(),
                prompt_tokens: 0,
                completion_tokens: 0
            }
        );
        out.parameters.insert(
            "finish_reason".into(),
            pb::Parameter {
                value: Some(pb::parameter::Value::StringValue("length".into())),
            },
        );
        out.parameters.insert(
            "completion_tokens".into(),
            pb::Parameter {
                value: Some(pb::parameter::Value::Int64Value(7)),
            },
        );
        let f = Finish::of(&out);
        assert_eq!((f.reason.as_str(), f.completion_tokens), ("length", 7));
    }
}
