//! Tests of the OIP tensors: datatypes, the raw layout, items and stacking.

use std::collections::HashMap;

use modelshare_proto::inference as oip;
use modelshare_proto::v1 as pb;
use prost::bytes::Bytes;

use super::*;
use modelshare_serving::InferError;

fn f32s(v: &[f32]) -> Bytes {
    v.iter()
        .flat_map(|x| x.to_le_bytes())
        .collect::<Vec<u8>>()
        .into()
}

fn t(name: &str, dtype: pb::DType, shape: &[i64], data: Bytes) -> Tensor {
    Tensor {
        name: name.into(),
        dtype,
        shape: shape.to_vec(),
        data,
    }
}

#[test]
fn datatypes_round_trip_and_unknown_ones_are_named() {
    for name in [
        "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16",
        "BF16", "FP32", "FP64", "BYTES",
    ] {
        assert_eq!(datatype(dtype(name).expect("known")), name);
    }
    let e = dtype("FP8").expect_err("unknown");
    assert!(e.to_string().contains("'FP8'"), "{e}");
}

#[test]
fn typed_contents_become_the_raw_layout_with_counts_and_ranges_checked() {
    let c = oip::InferTensorContents {
        int_contents: vec![1, -2, 300],
        ..Default::default()
    };
    let raw = typed_to_raw("x", pb::DType::DtypeI16, &c, 3).expect("fits");
    assert_eq!(&raw[..], &[1, 0, 0xfe, 0xff, 0x2c, 0x01]);
    assert!(
        typed_to_raw("x", pb::DType::DtypeI8, &c, 3).is_err(),
        "300 is not an i8"
    );
    assert!(
        typed_to_raw("x", pb::DType::DtypeI32, &c, 4).is_err(),
        "count"
    );
    let c = oip::InferTensorContents {
        bytes_contents: vec![b"ab".to_vec(), Vec::new()],
        ..Default::default()
    };
    let raw = typed_to_raw("s", pb::DType::DtypeBytes, &c, 2).expect("bytes");
    assert_eq!(&raw[..], &[2, 0, 0, 0, b'a', b'b', 0, 0, 0, 0]);
    assert!(
        typed_to_raw("h", pb::DType::DtypeF16, &c, 2).is_err(),
        "raw only"
    );
}

#[test]
fn grpc_inputs_take_raw_or_typed_contents_but_not_both() {
    let input = |contents| oip::model_infer_request::InferInputTensor {
        name: "x".into(),
        datatype: "FP32".into(),
        shape: vec![1, 2],
        contents,
        ..Default::default()
    };
    let mut req = oip::ModelInferRequest {
        inputs: vec![input(None)],
        raw_input_contents: vec![f32s(&[1.0, 2.0])],
        ..Default::default()
    };
    let got = grpc_inputs(&mut req).expect("raw");
    assert_eq!(got[0].data, f32s(&[1.0, 2.0]));
    let typed = oip::InferTensorContents {
        fp32_contents: vec![1.0, 2.0],
        ..Default::default()
    };
    let mut req = oip::ModelInferRequest {
        inputs: vec![input(Some(typed.clone()))],
        raw_input_contents: vec![f32s(&[1.0, 2.0])],
        ..Default::default()
    };
    assert!(grpc_inputs(&mut req).is_err());
    let mut req = oip::ModelInferRequest {
        inputs: vec![input(None)],
        raw_input_contents: vec![f32s(&[1.0])],
        ..Default::default()
    };
    let e = grpc_inputs(&mut req).expect_err("short");
    assert!(e.to_string().contains("needs 8 bytes"), "{e}");
}

#[test]
fn inputs_split_into_items_by_rows_and_one_bytes_input_into_texts() {
    let x = t(
        "x",
        pb::DType::DtypeF32,
        &[2, 2],
        f32s(&[1.0, 2.0, 3.0, 4.0]),
    );
    let ids = t(
        "ids",
        pb::DType::DtypeI64,
        &[2],
        (0..2i64)
            .flat_map(i64::to_le_bytes)
            .collect::<Vec<u8>>()
            .into(),
    );
    let split = to_items(vec![x, ids], &HashMap::new(), 1 << 20).expect("split");
    assert_eq!(split.text_input, None);
    let items = split.items;
    assert_eq!(items.len(), 2);
    let Some(pb::item::Input::Tensors(second)) = &items[1].input else {
        panic!("tensors")
    };
    assert_eq!(
        second.tensors[0].shape,
        Vec::<i64>::new().into_iter().chain([2]).collect::<Vec<_>>()
    );
    assert_eq!(second.tensors[0].data, f32s(&[3.0, 4.0]));
    assert_eq!(second.tensors[1].shape, Vec::<i64>::new());
    let texts = t(
        "text",
        pb::DType::DtypeBytes,
        &[2],
        encode_bytes([&b"hi"[..], "é".as_bytes()]),
    );
    let split = to_items(vec![texts], &HashMap::new(), 1 << 20).expect("texts");
    assert_eq!(split.text_input.as_deref(), Some("text"));
    let items = split.items;
    let got: Vec<&str> = items
        .iter()
        .map(|i| match &i.input {
            Some(pb::item::Input::Text(t)) => t.text.as_str(),
            _ => panic!("text"),
        })
        .collect();
    assert_eq!(got, ["hi", "é"]);
    // Two BYTES per row stay tensors, sliced by element.
    let pairs = t(
        "p",
        pb::DType::DtypeBytes,
        &[2, 2],
        encode_bytes([&b"a"[..], b"bb", b"", b"c"]),
    );
    let items = to_items(vec![pairs], &HashMap::new(), 1 << 20)
        .expect("pairs")
        .items;
    let Some(pb::item::Input::Tensors(row)) = &items[1].input else {
        panic!("tensors")
    };
    assert_eq!(row.tensors[0].data, encode_bytes([&b""[..], b"c"]));
}

#[test]
fn bad_splits_say_why() {
    let scalar = t("s", pb::DType::DtypeF32, &[], f32s(&[1.0]));
    assert!(to_items(vec![scalar], &HashMap::new(), 1 << 20).is_err());
    let a = t("a", pb::DType::DtypeF32, &[2], f32s(&[1.0, 2.0]));
    let b = t("b", pb::DType::DtypeF32, &[1], f32s(&[1.0]));
    let e = to_items(vec![a.clone(), b], &HashMap::new(), 1 << 20).expect_err("rows");
    assert!(e.to_string().contains("disagree"), "{e}");
    assert!(
        to_items(vec![a.clone(), a], &HashMap::new(), 1 << 20).is_err(),
        "twice"
    );
    let bad_utf8 = t(
        "t",
        pb::DType::DtypeBytes,
        &[1],
        encode_bytes([&[0xff_u8][..]]),
    );
    assert!(to_items(vec![bad_utf8], &HashMap::new(), 1 << 20).is_err());
}

/// A batch dimension of 2^32 rows with no data at all (zero elements) once aborted the
/// server building one item per row; it is refused before anything is built per row.
#[test]
fn a_batch_past_the_limit_is_refused_before_any_row_is_built() {
    for shape in [vec![4_294_967_296, 0], vec![16_777_215, 0], vec![5, 0]] {
        let t = Tensor {
            name: "x".into(),
            dtype: pb::DType::DtypeF32,
            shape: shape.clone(),
            data: Bytes::new(),
        };
        check_data(&t).expect("zero elements, zero bytes");
        let e = to_items(vec![t], &HashMap::new(), 4).expect_err("too many rows");
        assert!(
            matches!(e, InferError::TooLarge { limit: 4, .. }),
            "{shape:?}: {e:?}"
        );
        assert!(e.never_fits());
    }
    let e = bytes_elements("t", &[5, 0, 0, 0, b'a'], 1).expect_err("short");
    assert!(e.to_string().contains("past the end"), "{e}");
}

#[test]
fn json_elements_round_trip_through_the_raw_layout() {
    let v = serde_json::json!([[1, 2], [3, 4]]);
    let raw = json_to_raw("x", pb::DType::DtypeI16, &v, 4).expect("fits");
    assert_eq!(raw_to_json(pb::DType::DtypeI16, &raw), vec![1, 2, 3, 4]);
    let v = serde_json::json!(["hi", "é"]);
    let raw = json_to_raw("s", pb::DType::DtypeBytes, &v, 2).expect("strings");
    assert_eq!(raw_to_json(pb::DType::DtypeBytes, &raw), vec!["hi", "é"]);
    let v = serde_json::json!([0.5, 1.5]);
    let raw = json_to_raw("h", pb::DType::DtypeF16, &v, 2).expect("halves");
    assert_eq!(raw_to_json(pb::DType::DtypeF16, &raw), vec![0.5, 1.5]);
    assert!(json_to_raw("x", pb::DType::DtypeU8, &serde_json::json!([256]), 1).is_err());
    assert!(json_to_raw("x", pb::DType::DtypeI32, &serde_json::json!([1.5]), 1).is_err());
    let e =
        json_to_raw("x", pb::DType::DtypeF32, &serde_json::json!([1, 2, 3]), 4).expect_err("count");
    assert!(
        e.to_string()
            .contains("holds 4 elements but its data has 3"),
        "{e}"
    );
}

#[test]
fn outputs_stack_and_mismatches_are_the_models_fault() {
    let out = |v: &[f32]| pb::ItemOutput {
        tensors: vec![pb::TensorOutput {
            name: "y".into(),
            dtype: pb::DType::DtypeF32 as i32,
            shape: vec![v.len() as i64],
            data: f32s(v),
        }],
        parameters: HashMap::new(),
    };
    let s = stack("m", &[out(&[1.0, 2.0]), out(&[3.0, 4.0])], &[]).expect("stacks");
    assert_eq!(s[0].shape, vec![2, 2]);
    assert_eq!(s[0].data, f32s(&[1.0, 2.0, 3.0, 4.0]));
    let e = stack("m", &[out(&[1.0]), out(&[3.0, 4.0])], &[]).expect_err("shapes differ");
    assert_eq!(e.kind(), modelshare_serving::Kind::Internal);
    let e = stack("m", &[out(&[1.0])], &["z".into()]).expect_err("unknown output");
    assert_eq!(e.kind(), modelshare_serving::Kind::InvalidArgument);
}
