//! A worker that declares its inputs takes no other: an item naming an input the worker did not
//! declare is refused (INVALID_ARGUMENT) instead of being computed as if it were one of them (a
//! KServe request's lone BYTES input called `sentences` was embedded as the text it is not).
//! A worker that declares none takes any name, as before.

use modelshare_proto::v1 as pb;

/// The refusal of `item` by a worker that declared `declared`: the first input it names that is
/// not declared (`text_input`: the OIP input a text item came from; `None` for an OpenAI text,
/// which names no input). `None` when every name is declared, or the worker declared nothing.
pub(super) fn refusal(
    model: &str,
    declared: &[pb::TensorSpec],
    item: &pb::Item,
    text_input: Option<&str>,
) -> Option<String> {
    if declared.is_empty() {
        return None;
    }
    let known = |name: &str| declared.iter().any(|spec| spec.name == name);
    let unknown = match &item.input {
        Some(pb::item::Input::Tensors(t)) => t
            .tensors
            .iter()
            .map(|t| t.name.as_str())
            .find(|name| !known(name)),
        Some(pb::item::Input::Text(_)) => text_input.filter(|name| !known(name)),
        None => None,
    }?;
    let names: Vec<&str> = declared.iter().map(|spec| spec.name.as_str()).collect();
    Some(format!(
        "model '{model}' has no input '{unknown}' (its inputs: {})",
        names.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str) -> pb::TensorSpec {
        pb::TensorSpec {
            name: name.into(),
            datatype: "BYTES".into(),
            shape: vec![-1],
        }
    }

    fn tensors(names: &[&str]) -> pb::Item {
        pb::Item {
            input: Some(pb::item::Input::Tensors(pb::Tensors {
                tensors: names
                    .iter()
                    .map(|n| pb::TensorInput {
                        name: (*n).into(),
                        ..Default::default()
                    })
                    .collect(),
            })),
            ..Default::default()
        }
    }

    fn text() -> pb::Item {
        pb::Item {
            input: Some(pb::item::Input::Text(pb::TextInput { text: "hi".into() })),
            ..Default::default()
        }
    }

    /// An undeclared tensor name, or an OIP text input of an undeclared name, is no longer
    /// refused naming it and the declared ones.
    #[test]
    fn an_undeclared_name_is_refused_naming_the_inputs() {
        let declared = [spec("text"), spec("input_ids")];
        let refused = refusal("m", &declared, &tensors(&["input_ids", "x"]), None).unwrap();
        assert_eq!(
            refused,
            "model 'm' has no input 'x' (its inputs: text, input_ids)"
        );
        let refused = refusal("m", &declared, &text(), Some("sentences")).unwrap();
        assert!(refused.contains("no input 'sentences'"), "{refused}");
    }

    /// Declared names, an OpenAI text (no name), and a worker that declared nothing are no
    /// longer taken.
    #[test]
    fn declared_names_and_undeclared_workers_pass() {
        let declared = [spec("text"), spec("input_ids")];
        assert_eq!(
            refusal("m", &declared, &tensors(&["input_ids"]), None),
            None
        );
        assert_eq!(refusal("m", &declared, &text(), Some("text")), None);
        assert_eq!(refusal("m", &declared, &text(), None), None);
        assert_eq!(refusal("m", &[], &tensors(&["anything"]), None), None);
        assert_eq!(refusal("m", &[], &text(), Some("anything")), None);
    }
}
