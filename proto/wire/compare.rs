//! The comparison of the contract now with its baseline: what a peer built from the baseline
//! would misread (breaking), and what it would only not know of (compatible, but not yet in the
//! baseline).
//!
//! Breaking: a field whose number now has another name (a number reused), type, label
//! (cardinality or presence) or oneof; a field removed without its number reserved; a field
//! renumbered; a number that was reserved and is no longer (or now has a field); the same of
//! enum values; a removed message or enum that a field or method still present used; a removed
//! service or method, or one whose input, output or streaming changed.
//!
//! Compatible: new messages, fields, enums, values, services and methods; a field or value
//! removed with its number reserved; newly reserved numbers; reserved names added or removed;
//! a message or enum removed that nothing left uses.

use std::collections::{BTreeMap, BTreeSet};

use super::contract::{Contract, Enum, Message, Service, range_text};

/// What changed between a baseline and the contract now.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// Changes a peer built from the baseline would misread, one sentence each.
    pub breaking: Vec<String>,
    /// Changes that keep the wire compatible, one sentence each.
    pub compatible: Vec<String>,
}

impl Report {
    /// Whether some change breaks the wire.
    pub fn is_breaking(&self) -> bool {
        !self.breaking.is_empty()
    }

    /// Whether nothing changed.
    pub fn is_unchanged(&self) -> bool {
        self.breaking.is_empty() && self.compatible.is_empty()
    }

    /// The report as lines for a person: the breaking changes, then the compatible ones.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for (title, list) in [
            ("wire-incompatible changes", &self.breaking),
            (
                "compatible changes not yet in the baseline",
                &self.compatible,
            ),
        ] {
            if !list.is_empty() {
                out.push_str(&format!("{title}:\n"));
                for change in list {
                    out.push_str(&format!("  - {change}\n"));
                }
            }
        }
        out
    }
}

/// Compares `current` with `baseline`.
pub fn compare(baseline: &Contract, current: &Contract) -> Report {
    let mut report = Report::default();
    messages(baseline, current, &mut report);
    enums(baseline, current, &mut report);
    services(&baseline.services, &current.services, &mut report);
    report
}

/// What in `contract` uses the message or enum `name`: fields (`message.field`, with the
/// message and number) and methods (`service.method`).
fn users(contract: &Contract, name: &str) -> Vec<User> {
    let mut users = Vec::new();
    for (message, m) in &contract.messages {
        for (number, f) in &m.fields {
            let used =
                f.ty.split_once(':')
                    .is_some_and(|(_, type_name)| type_name == name);
            if used {
                users.push(User::Field(message.clone(), *number, f.name.clone()));
            }
        }
    }
    for (service, s) in &contract.services {
        for (method, m) in &s.methods {
            if m.input == name || m.output == name {
                users.push(User::Method(service.clone(), method.clone()));
            }
        }
    }
    users
}

/// A user of a message or enum.
enum User {
    /// Message, number, field name.
    Field(String, i32, String),
    /// Service, method.
    Method(String, String),
}

impl User {
    /// Whether `current` still has this user (the same field number, the same method).
    fn survives(&self, current: &Contract) -> bool {
        match self {
            User::Field(message, number, _) => current
                .messages
                .get(message)
                .is_some_and(|m| m.fields.contains_key(number)),
            User::Method(service, method) => current
                .services
                .get(service)
                .is_some_and(|s| s.methods.contains_key(method)),
        }
    }

    fn describe(&self) -> String {
        match self {
            User::Field(message, number, name) => format!("field {message}.{name} ({number})"),
            User::Method(service, method) => format!("rpc {service}.{method}"),
        }
    }
}

/// A removed message or enum: breaking when a field or method still present used it.
fn removed_type(kind: &str, name: &str, baseline: &Contract, current: &Contract, r: &mut Report) {
    let still: Vec<String> = users(baseline, name)
        .iter()
        .filter(|u| u.survives(current))
        .map(User::describe)
        .collect();
    if still.is_empty() {
        r.compatible
            .push(format!("{kind} {name} removed (nothing left uses it)"));
    } else {
        r.breaking.push(format!(
            "{kind} {name} was removed, but {} still there used it",
            still.join(", ")
        ));
    }
}

fn messages(baseline: &Contract, current: &Contract, r: &mut Report) {
    for (name, old) in &baseline.messages {
        match current.messages.get(name) {
            None => removed_type("message", name, baseline, current, r),
            Some(new) => fields(name, old, new, r),
        }
    }
    for name in current.messages.keys() {
        if !baseline.messages.contains_key(name) {
            r.compatible.push(format!("message {name} added"));
        }
    }
}

fn fields(message: &str, old: &Message, new: &Message, r: &mut Report) {
    let new_numbers: BTreeMap<&str, i32> = new
        .fields
        .iter()
        .map(|(n, f)| (f.name.as_str(), *n))
        .collect();
    let old_numbers: BTreeMap<&str, i32> = old
        .fields
        .iter()
        .map(|(n, f)| (f.name.as_str(), *n))
        .collect();
    for (number, was) in &old.fields {
        let field = format!("field {message}.{} ({number})", was.name);
        if let Some(&moved) = new_numbers.get(was.name.as_str())
            && moved != *number
        {
            r.breaking.push(format!(
                "{field} was renumbered to {moved}: a peer built from the baseline reads \
                 {number} as this field and {moved} as unknown; keep the number"
            ));
        }
        let Some(now) = new.fields.get(number) else {
            if new_numbers.contains_key(was.name.as_str()) {
                // Renumbered: said above.
            } else if reserves(&new.reserved, *number) {
                r.compatible
                    .push(format!("{field} removed, its number reserved"));
            } else {
                r.breaking.push(format!(
                    "{field} was removed without reserving its number: add `reserved {number};` \
                     (and `reserved \"{}\";`) to {message}, so that the number is never reused",
                    was.name
                ));
            }
            continue;
        };
        if now.name != was.name {
            r.breaking.push(format!(
                "{field}: number {number} is now field '{}': a number is never reused for \
                 another field (a rename is one too: JSON and generated code change); reserve \
                 it and give the new field a new number",
                now.name
            ));
        }
        if now.ty != was.ty {
            r.breaking.push(format!(
                "{field} changed type from {} to {}",
                was.ty, now.ty
            ));
        }
        if now.label != was.label {
            r.breaking.push(format!(
                "{field} changed label from {} to {}",
                was.label.as_str(),
                now.label.as_str()
            ));
        }
        if now.oneof != was.oneof {
            let side = |o: &Option<String>| match o {
                Some(o) => format!("oneof {o}"),
                None => "no oneof".to_owned(),
            };
            r.breaking.push(format!(
                "{field} moved from {} to {}",
                side(&was.oneof),
                side(&now.oneof)
            ));
        }
    }
    for (number, now) in &new.fields {
        if old.fields.contains_key(number) || old_numbers.contains_key(now.name.as_str()) {
            continue; // Compared above (a renumbering included).
        }
        let field = format!("field {message}.{} ({number})", now.name);
        if reserves(&old.reserved, *number) {
            r.breaking.push(format!(
                "{field} takes number {number}, which the baseline reserves: it belonged to a \
                 removed field that old peers may still send"
            ));
        } else {
            r.compatible.push(format!("{field} added"));
        }
    }
    reserved(
        &format!("message {message}"),
        &old.reserved,
        &new.reserved,
        &old.reserved_names,
        &new.reserved_names,
        r,
    );
}

fn enums(baseline: &Contract, current: &Contract, r: &mut Report) {
    for (name, old) in &baseline.enums {
        match current.enums.get(name) {
            None => removed_type("enum", name, baseline, current, r),
            Some(new) => values(name, old, new, r),
        }
    }
    for name in current.enums.keys() {
        if !baseline.enums.contains_key(name) {
            r.compatible.push(format!("enum {name} added"));
        }
    }
}

fn values(e: &str, old: &Enum, new: &Enum, r: &mut Report) {
    let new_numbers: BTreeMap<&str, i32> =
        new.values.iter().map(|(n, v)| (v.as_str(), *n)).collect();
    let old_numbers: BTreeMap<&str, i32> =
        old.values.iter().map(|(n, v)| (v.as_str(), *n)).collect();
    for (number, was) in &old.values {
        let value = format!("value {e}.{was} ({number})");
        if let Some(&moved) = new_numbers.get(was.as_str())
            && moved != *number
        {
            r.breaking.push(format!(
                "{value} was renumbered to {moved}; keep the number"
            ));
        }
        match new.values.get(number) {
            Some(now) if now != was => r.breaking.push(format!(
                "{value}: number {number} is now value '{now}': a number is never reused; \
                 reserve it and give the new value a new number"
            )),
            Some(_) => {}
            None if new_numbers.contains_key(was.as_str()) => {}
            None if reserves(&new.reserved, *number) => r
                .compatible
                .push(format!("{value} removed, its number reserved")),
            None => r.breaking.push(format!(
                "{value} was removed without reserving its number: add `reserved {number};` \
                 (and `reserved \"{was}\";`) to {e}"
            )),
        }
    }
    for (number, now) in &new.values {
        if old.values.contains_key(number) || old_numbers.contains_key(now.as_str()) {
            continue;
        }
        let value = format!("value {e}.{now} ({number})");
        if reserves(&old.reserved, *number) {
            r.breaking.push(format!(
                "{value} takes number {number}, which the baseline reserves"
            ));
        } else {
            r.compatible.push(format!("{value} added"));
        }
    }
    reserved(
        &format!("enum {e}"),
        &old.reserved,
        &new.reserved,
        &old.reserved_names,
        &new.reserved_names,
        r,
    );
}

/// Reserved numbers that are no longer reserved break; new ones and name changes do not.
fn reserved(
    owner: &str,
    old: &[(i32, i32)],
    new: &[(i32, i32)],
    old_names: &BTreeSet<String>,
    new_names: &BTreeSet<String>,
    r: &mut Report,
) {
    for range in old {
        for gap in uncovered(*range, new) {
            r.breaking.push(format!(
                "{owner} no longer reserves {}: a removed field's number must stay reserved",
                range_text(gap)
            ));
        }
    }
    for range in new {
        for gap in uncovered(*range, old) {
            r.compatible
                .push(format!("{owner} reserves {}", range_text(gap)));
        }
    }
    for name in old_names.difference(new_names) {
        r.compatible
            .push(format!("{owner} no longer reserves the name '{name}'"));
    }
    for name in new_names.difference(old_names) {
        r.compatible
            .push(format!("{owner} reserves the name '{name}'"));
    }
}

/// Whether `ranges` holds `number`.
fn reserves(ranges: &[(i32, i32)], number: i32) -> bool {
    ranges.iter().any(|(a, b)| (*a..=*b).contains(&number))
}

/// The parts of `range` that no range of `by` covers.
fn uncovered((first, last): (i32, i32), by: &[(i32, i32)]) -> Vec<(i32, i32)> {
    let mut by = by.to_vec();
    by.sort_unstable();
    let mut gaps = Vec::new();
    let mut next = i64::from(first);
    for (a, b) in by {
        if next > i64::from(last) {
            break;
        }
        if i64::from(b) < next {
            continue;
        }
        if i64::from(a) > next {
            let gap_end = (i64::from(a) - 1).min(i64::from(last));
            gaps.push((next, gap_end));
        }
        next = next.max(i64::from(b) + 1);
    }
    if next <= i64::from(last) {
        gaps.push((next, i64::from(last)));
    }
    // Every bound lies within `first..=last`, so within i32.
    gaps.into_iter()
        .map(|(a, b)| (a as i32, b as i32))
        .collect()
}

fn services(old: &BTreeMap<String, Service>, new: &BTreeMap<String, Service>, r: &mut Report) {
    for (name, was) in old {
        let now = new.get(name);
        for (method, m) in &was.methods {
            let rpc = format!("rpc {name}.{method}");
            let Some(n) = now.and_then(|s| s.methods.get(method)) else {
                let why = if now.is_none() {
                    format!("service {name} was removed")
                } else {
                    "removed".to_owned()
                };
                r.breaking
                    .push(format!("{rpc} {why}: workers and clients still call it"));
                continue;
            };
            let shape = |input: &str, client: bool, output: &str, server: bool| {
                let s = |yes| if yes { "stream " } else { "" };
                format!("({}{input}) returns ({}{output})", s(client), s(server))
            };
            let (before, after) = (
                shape(&m.input, m.client_streaming, &m.output, m.server_streaming),
                shape(&n.input, n.client_streaming, &n.output, n.server_streaming),
            );
            if before != after {
                r.breaking
                    .push(format!("{rpc} changed from {before} to {after}"));
            }
        }
    }
    for (name, now) in new {
        let was = old.get(name);
        if was.is_none() {
            r.compatible.push(format!("service {name} added"));
        }
        for method in now.methods.keys() {
            if !was.is_some_and(|s| s.methods.contains_key(method)) {
                r.compatible.push(format!("rpc {name}.{method} added"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reserved ranges that shrink would go unreported, or covered ones be reported.
    #[test]
    fn uncovered_finds_the_gaps() {
        assert_eq!(uncovered((5, 9), &[(5, 9)]), []);
        assert_eq!(uncovered((5, 9), &[(1, 20)]), []);
        assert_eq!(uncovered((5, 9), &[]), [(5, 9)]);
        assert_eq!(uncovered((5, 9), &[(6, 7)]), [(5, 5), (8, 9)]);
        assert_eq!(uncovered((5, 9), &[(8, 12), (1, 5)]), [(6, 7)]);
        assert_eq!(uncovered((1, i32::MAX), &[(1, i32::MAX)]), []);
    }
}
