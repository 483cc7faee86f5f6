//! The contract as facts: every message (its fields and reserved numbers), enum (its values and
//! reserved numbers), service and method of the packages in [`PACKAGES`], read from a descriptor
//! set, and written to (and read back from) the baseline's text, one line per fact:
//!
//! ```text
//! message <message> [map-entry]
//! field <message> <number> <name> <singular|optional|repeated|required> <type> [oneof=<name>]
//! reserved <message> <number>[-<last>]
//! reserved-name <message> <name>
//! enum <enum>
//! value <enum> <number> <name>
//! enum-reserved <enum> <number>[-<last>]
//! enum-reserved-name <enum> <name>
//! service <service>
//! rpc <service> <method> [stream] <input> returns [stream] <output>
//! ```
//!
//! Names are full names without the leading dot. A field's type is a scalar (`uint32`,
//! `string`, ...) or `message:<name>`, `enum:<name>`; its label `optional` is proto3's explicit
//! presence, `singular` the implicit kind (a proto3 field without a label). Lines starting with
//! `#` are comments. The text is sorted: entities by full name, each followed by its facts by
//! number.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use prost_types::field_descriptor_proto::{Label as PbLabel, Type};
use prost_types::{DescriptorProto, EnumDescriptorProto, FileDescriptorSet};

/// The packages the contract covers.
pub const PACKAGES: &[&str] = &["modelshare.v1", "inference"];

/// Every fact of the contract that the wire depends on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Contract {
    /// Messages by full name, nested ones (map entries included) under their parent's name.
    pub messages: BTreeMap<String, Message>,
    /// Enums by full name.
    pub enums: BTreeMap<String, Enum>,
    /// Services by full name.
    pub services: BTreeMap<String, Service>,
}

/// A message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Message {
    /// The synthesized entry message of a `map<..>` field.
    pub map_entry: bool,
    /// Fields by number.
    pub fields: BTreeMap<i32, Field>,
    /// Reserved numbers, as inclusive ranges.
    pub reserved: Vec<(i32, i32)>,
    /// Reserved names.
    pub reserved_names: BTreeSet<String>,
}

/// A field of a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// Its name.
    pub name: String,
    /// Its cardinality and presence.
    pub label: Label,
    /// A scalar type's name, or `message:<name>`, `enum:<name>`, `group:<name>`.
    pub ty: String,
    /// The (declared, not synthetic) oneof it belongs to.
    pub oneof: Option<String>,
}

/// A field's cardinality and presence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Label {
    /// proto3 without a label: implicit presence (an unset value reads as the default).
    Singular,
    /// proto3 `optional`: explicit presence.
    Optional,
    /// `repeated` (maps included).
    Repeated,
    /// proto2 `required`.
    Required,
}

impl Label {
    /// Its name in the baseline.
    pub fn as_str(self) -> &'static str {
        match self {
            Label::Singular => "singular",
            Label::Optional => "optional",
            Label::Repeated => "repeated",
            Label::Required => "required",
        }
    }

    fn parse(s: &str) -> Option<Label> {
        [
            Label::Singular,
            Label::Optional,
            Label::Repeated,
            Label::Required,
        ]
        .into_iter()
        .find(|l| l.as_str() == s)
    }
}

/// An enum.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Enum {
    /// Value names by number.
    pub values: BTreeMap<i32, String>,
    /// Reserved numbers, as inclusive ranges.
    pub reserved: Vec<(i32, i32)>,
    /// Reserved names.
    pub reserved_names: BTreeSet<String>,
}

/// A service.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Service {
    /// Methods by name.
    pub methods: BTreeMap<String, Method>,
}

/// A method of a service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Method {
    /// The request message's full name.
    pub input: String,
    /// The response message's full name.
    pub output: String,
    /// Whether the client sends a stream.
    pub client_streaming: bool,
    /// Whether the server answers with a stream.
    pub server_streaming: bool,
}

/// A baseline line that does not read.
#[derive(Debug, thiserror::Error)]
#[error("line {line}: {reason}: '{text}'")]
pub struct ParseError {
    /// 1-based line number.
    pub line: usize,
    /// The line.
    pub text: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl Contract {
    /// The facts of the files of `fds` in [`PACKAGES`] (other files, such as imports of
    /// well-known types, are left out).
    pub fn from_descriptors(fds: &FileDescriptorSet) -> Contract {
        let mut contract = Contract::default();
        for file in &fds.file {
            let package = file.package();
            if !PACKAGES.contains(&package) {
                continue;
            }
            for message in &file.message_type {
                contract.add_message(package, message);
            }
            for e in &file.enum_type {
                contract.add_enum(package, e);
            }
            for service in &file.service {
                let methods = service
                    .method
                    .iter()
                    .map(|m| {
                        let method = Method {
                            input: full(m.input_type()),
                            output: full(m.output_type()),
                            client_streaming: m.client_streaming(),
                            server_streaming: m.server_streaming(),
                        };
                        (m.name().to_owned(), method)
                    })
                    .collect();
                let name = format!("{package}.{}", service.name());
                contract.services.insert(name, Service { methods });
            }
        }
        contract
    }

    fn add_message(&mut self, scope: &str, message: &DescriptorProto) {
        let name = format!("{scope}.{}", message.name());
        let fields = message
            .field
            .iter()
            .map(|f| {
                let label = match f.label() {
                    PbLabel::Repeated => Label::Repeated,
                    PbLabel::Required => Label::Required,
                    PbLabel::Optional if f.proto3_optional() => Label::Optional,
                    PbLabel::Optional => Label::Singular,
                };
                let ty = match f.r#type() {
                    Type::Message => format!("message:{}", full(f.type_name())),
                    Type::Enum => format!("enum:{}", full(f.type_name())),
                    Type::Group => format!("group:{}", full(f.type_name())),
                    scalar => scalar
                        .as_str_name()
                        .trim_start_matches("TYPE_")
                        .to_lowercase(),
                };
                // proto3 `optional` puts the field in a synthetic oneof: its label says it.
                let oneof = f
                    .oneof_index
                    .filter(|_| !f.proto3_optional())
                    .and_then(|i| message.oneof_decl.get(usize::try_from(i).ok()?))
                    .map(|o| o.name().to_owned());
                let field = Field {
                    name: f.name().to_owned(),
                    label,
                    ty,
                    oneof,
                };
                (f.number(), field)
            })
            .collect();
        // A message's reserved ranges end before `end`; an enum's include it.
        let reserved = sorted(
            message
                .reserved_range
                .iter()
                .map(|r| (r.start(), r.end() - 1)),
        );
        let entry = Message {
            map_entry: message.options.as_ref().is_some_and(|o| o.map_entry()),
            fields,
            reserved,
            reserved_names: message.reserved_name.iter().cloned().collect(),
        };
        for nested in &message.nested_type {
            self.add_message(&name, nested);
        }
        for e in &message.enum_type {
            self.add_enum(&name, e);
        }
        self.messages.insert(name, entry);
    }

    fn add_enum(&mut self, scope: &str, e: &EnumDescriptorProto) {
        let entry = Enum {
            values: e
                .value
                .iter()
                .map(|v| (v.number(), v.name().to_owned()))
                .collect(),
            reserved: sorted(e.reserved_range.iter().map(|r| (r.start(), r.end()))),
            reserved_names: e.reserved_name.iter().cloned().collect(),
        };
        self.enums.insert(format!("{scope}.{}", e.name()), entry);
    }

    /// The baseline's text: `header` (each line prefixed with `# `), then one line per fact.
    pub fn render(&self, header: &str) -> String {
        let mut out = String::new();
        for line in header.lines() {
            out.push_str(format!("# {line}").trim_end());
            out.push('\n');
        }
        for (name, m) in &self.messages {
            let _ = writeln!(
                out,
                "message {name}{}",
                if m.map_entry { " map-entry" } else { "" }
            );
            for (number, f) in &m.fields {
                let _ = write!(
                    out,
                    "field {name} {number} {} {} {}",
                    f.name,
                    f.label.as_str(),
                    f.ty
                );
                if let Some(oneof) = &f.oneof {
                    let _ = write!(out, " oneof={oneof}");
                }
                out.push('\n');
            }
            for range in &m.reserved {
                let _ = writeln!(out, "reserved {name} {}", range_text(*range));
            }
            for reserved in &m.reserved_names {
                let _ = writeln!(out, "reserved-name {name} {reserved}");
            }
        }
        for (name, e) in &self.enums {
            let _ = writeln!(out, "enum {name}");
            for (number, value) in &e.values {
                let _ = writeln!(out, "value {name} {number} {value}");
            }
            for range in &e.reserved {
                let _ = writeln!(out, "enum-reserved {name} {}", range_text(*range));
            }
            for reserved in &e.reserved_names {
                let _ = writeln!(out, "enum-reserved-name {name} {reserved}");
            }
        }
        for (name, s) in &self.services {
            let _ = writeln!(out, "service {name}");
            for (method, m) in &s.methods {
                let stream = |yes: bool| if yes { "stream " } else { "" };
                let _ = writeln!(
                    out,
                    "rpc {name} {method} {}{} returns {}{}",
                    stream(m.client_streaming),
                    m.input,
                    stream(m.server_streaming),
                    m.output
                );
            }
        }
        out
    }

    /// Reads a baseline written by [`Contract::render`]. Every fact must follow the line that
    /// declares its message, enum or service.
    pub fn parse(text: &str) -> Result<Contract, ParseError> {
        let mut contract = Contract::default();
        for (index, line) in text.lines().enumerate() {
            let fact = line.trim();
            if fact.is_empty() || fact.starts_with('#') {
                continue;
            }
            let words: Vec<&str> = fact.split_whitespace().collect();
            contract.add_fact(&words).map_err(|reason| ParseError {
                line: index + 1,
                text: line.to_owned(),
                reason,
            })?;
        }
        Ok(contract)
    }

    /// Adds the fact of one baseline line, split into its words; `Err` says what is wrong
    /// with the line.
    fn add_fact(&mut self, words: &[&str]) -> Result<(), &'static str> {
        match words {
            ["message", name] | ["message", name, "map-entry"] => {
                let m = Message {
                    map_entry: words.len() == 3,
                    ..Message::default()
                };
                self.messages.insert((*name).to_owned(), m);
            }
            ["field", message, n, name, label, ty, rest @ ..] => {
                self.add_field(message, n, name, label, ty, rest)?;
            }
            ["reserved", message, r] => self
                .messages
                .get_mut(*message)
                .ok_or("a range of a message not declared above")?
                .reserved
                .push(range(r)?),
            ["reserved-name", message, name] => {
                self.messages
                    .get_mut(*message)
                    .ok_or("a name of a message not declared above")?
                    .reserved_names
                    .insert((*name).to_owned());
            }
            ["enum", name] => {
                self.enums.insert((*name).to_owned(), Enum::default());
            }
            ["value", e, n, name] => {
                self.enums
                    .get_mut(*e)
                    .ok_or("a value of an enum not declared above")?
                    .values
                    .insert(number(n)?, (*name).to_owned());
            }
            ["enum-reserved", e, r] => self
                .enums
                .get_mut(*e)
                .ok_or("a range of an enum not declared above")?
                .reserved
                .push(range(r)?),
            ["enum-reserved-name", e, name] => {
                self.enums
                    .get_mut(*e)
                    .ok_or("a name of an enum not declared above")?
                    .reserved_names
                    .insert((*name).to_owned());
            }
            ["service", name] => {
                self.services.insert((*name).to_owned(), Service::default());
            }
            ["rpc", service, method, rest @ ..] => self.add_method(service, method, rest)?,
            _ => return Err("not a fact of the baseline"),
        }
        Ok(())
    }

    /// A `field` line: `<message> <number> <name> <label> <type> [oneof=<name>]`.
    fn add_field(
        &mut self,
        message: &str,
        n: &str,
        name: &str,
        label: &str,
        ty: &str,
        rest: &[&str],
    ) -> Result<(), &'static str> {
        let oneof = match rest {
            [] => None,
            [o] => Some(
                o.strip_prefix("oneof=")
                    .ok_or("expected oneof=<name>")?
                    .to_owned(),
            ),
            _ => return Err("too many words"),
        };
        let field = Field {
            name: name.to_owned(),
            label: Label::parse(label).ok_or("unknown label")?,
            ty: ty.to_owned(),
            oneof,
        };
        let m = self
            .messages
            .get_mut(message)
            .ok_or("a field of a message not declared above")?;
        m.fields.insert(number(n)?, field);
        Ok(())
    }

    /// An `rpc` line after its service and method: `[stream] <input> returns [stream]
    /// <output>`.
    fn add_method(
        &mut self,
        service: &str,
        method: &str,
        rest: &[&str],
    ) -> Result<(), &'static str> {
        let (client_streaming, rest) = match rest {
            ["stream", rest @ ..] => (true, rest),
            rest => (false, rest),
        };
        let (input, server_streaming, output) = match rest {
            [input, "returns", "stream", output] => (input, true, output),
            [input, "returns", output] => (input, false, output),
            _ => return Err("expected [stream] <input> returns [stream] <output>"),
        };
        let m = Method {
            input: (*input).to_owned(),
            output: (*output).to_owned(),
            client_streaming,
            server_streaming,
        };
        self.services
            .get_mut(service)
            .ok_or("a method of a service not declared above")?
            .methods
            .insert(method.to_owned(), m);
        Ok(())
    }
}

/// A baseline number.
fn number(s: &str) -> Result<i32, &'static str> {
    s.parse::<i32>().map_err(|_| "not a number")
}

/// A baseline range, `7` or `8-10`.
fn range(s: &str) -> Result<(i32, i32), &'static str> {
    match s.split_once('-') {
        Some((a, b)) => Ok((number(a)?, number(b)?)),
        None => number(s).map(|n| (n, n)),
    }
}

/// A type name without its leading dot.
fn full(type_name: &str) -> String {
    type_name.trim_start_matches('.').to_owned()
}

/// Ranges in order (as the baseline lists them).
fn sorted(ranges: impl Iterator<Item = (i32, i32)>) -> Vec<(i32, i32)> {
    let mut ranges: Vec<_> = ranges.collect();
    ranges.sort_unstable();
    ranges
}

/// `7`, or `8-10`.
pub fn range_text((first, last): (i32, i32)) -> String {
    if first == last {
        first.to_string()
    } else {
        format!("{first}-{last}")
    }
}
