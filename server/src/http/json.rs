//! JSON bodies read strictly: serde's derived `Deserialize` also reads a struct from an array
//! of its fields in order (`["hi", "m"]` as `{"input": "hi", "model": "m"}`), which no client
//! sends and a proxy reading fields by key would see otherwise; [`Object`] and [`objects`]
//! take a struct only from a JSON object (found by the `openai` fuzzer).

use std::marker::PhantomData;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// A `T` read only from a JSON object.
#[derive(Debug)]
pub struct Object<T>(pub T);

struct ObjectVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(ObjectVisitor(PhantomData)).map(Object)
    }
}

/// A list of `T`, each read only from a JSON object (`#[serde(deserialize_with)]`).
pub fn objects<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct ListVisitor<T>(PhantomData<T>);
    impl<'de, T: Deserialize<'de>> Visitor<'de> for ListVisitor<T> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a list of JSON objects")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
            while let Some(Object(v)) = seq.next_element::<Object<T>>()? {
                out.push(v);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(ListVisitor(PhantomData))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize, PartialEq)]
    struct S {
        a: String,
        #[serde(default, deserialize_with = "objects")]
        list: Vec<S>,
    }

    #[test]
    fn structs_come_only_from_objects() {
        let Object(s) =
            serde_json::from_str::<Object<S>>(r#"{"a":"x","list":[{"a":"y"}]}"#).expect("objects");
        assert_eq!(s.list[0].a, "y");
        assert!(
            serde_json::from_str::<S>(r#"["x"]"#).is_ok(),
            "serde's derive alone"
        );
        assert!(serde_json::from_str::<Object<S>>(r#"["x"]"#).is_err());
        assert!(serde_json::from_str::<Object<S>>(r#"{"a":"x","list":[["y"]]}"#).is_err());
    }
}
