//! The limits of `modelshare_proto::limits` against each other and against real messages: the
//! largest batch a worker may ask for must travel in one message of the Serve bound, or the
//! server would send a batch that the worker's side of the stream (or the server's own encoder)
//! refuses.

use modelshare_proto::limits::{
    ADMIN_REQUEST_BYTES, BATCH_ENVELOPE_BYTES, MAX_BATCH_BYTES, MAX_BATCH_ITEMS, MAX_CREDITS,
    PAYLOAD_MESSAGE_BYTES, SMALL_REQUEST_BYTES,
};
use modelshare_proto::v1 as pb;
use prost::Message;

/// A batch event of `items` items, each carrying `input(i)`, with the envelope at its largest:
/// ids and deadlines as long as varints get, and a parameter per item.
fn batch(items: u32, input: impl Fn(u64) -> pb::item::Input) -> pb::ServeEvent {
    let items = (0..u64::from(items))
        .map(|i| pb::Item {
            item_id: u64::MAX - i,
            input: Some(input(i)),
            parameters: [(
                "max_tokens".to_owned(),
                pb::Parameter {
                    value: Some(pb::parameter::Value::Int64Value(i64::MAX)),
                },
            )]
            .into(),
            deadline_unix_ms: i64::MAX,
            // The request id and trace context count as item bytes (the server's batch byte
            // limit), not in the envelope.
            ..Default::default()
        })
        .collect();
    pb::ServeEvent {
        kind: Some(pb::serve_event::Kind::Batch(pb::Batch {
            batch_id: u64::MAX,
            version: u32::MAX,
            items,
        })),
    }
}

/// The figures would differ from those `worker.proto` and `serving.proto` quote to workers
/// written in other languages (120 MiB, 128 MiB, 1024 credits, 65536 items).
#[test]
fn the_figures_are_those_the_proto_files_quote() {
    assert_eq!(MAX_BATCH_BYTES, 120 << 20);
    assert_eq!(PAYLOAD_MESSAGE_BYTES, 128 << 20);
    assert_eq!(
        MAX_BATCH_BYTES + BATCH_ENVELOPE_BYTES,
        u64::from(PAYLOAD_MESSAGE_BYTES)
    );
    assert_eq!((MAX_CREDITS, MAX_BATCH_ITEMS), (1024, 65_536));
    assert_eq!(
        (SMALL_REQUEST_BYTES, ADMIN_REQUEST_BYTES),
        (64 << 10, 1 << 20)
    );
}

/// A batch at every limit at once (the most items, their text input summing to the most bytes)
/// would not fit the Serve message bound: the envelope would be larger than the room left.
#[test]
fn a_full_batch_of_text_fits_one_message() {
    let per_item = MAX_BATCH_BYTES / u64::from(MAX_BATCH_ITEMS);
    let text = "x".repeat(usize::try_from(per_item).unwrap());
    let event = batch(MAX_BATCH_ITEMS, |_| {
        pb::item::Input::Text(pb::TextInput { text: text.clone() })
    });
    let len = event.encoded_len() as u64;
    assert!(
        len <= u64::from(PAYLOAD_MESSAGE_BYTES),
        "{len} bytes, over {PAYLOAD_MESSAGE_BYTES}"
    );
    assert!(len - MAX_BATCH_BYTES <= BATCH_ENVELOPE_BYTES);
}

/// The same with tensor input (a name, a dtype and a shape per tensor around its data).
#[test]
fn a_full_batch_of_tensors_fits_one_message() {
    let per_item = MAX_BATCH_BYTES / u64::from(MAX_BATCH_ITEMS);
    let data = prost::bytes::Bytes::from(vec![0u8; usize::try_from(per_item).unwrap()]);
    let event = batch(MAX_BATCH_ITEMS, |_| {
        pb::item::Input::Tensors(pb::Tensors {
            tensors: vec![pb::TensorInput {
                name: "input_ids".into(),
                dtype: pb::DType::DtypeI64.into(),
                shape: vec![1, i64::try_from(per_item / 8).unwrap()],
                data: data.clone(),
            }],
        })
    });
    let len = event.encoded_len() as u64;
    assert!(
        len <= u64::from(PAYLOAD_MESSAGE_BYTES),
        "{len} bytes, over {PAYLOAD_MESSAGE_BYTES}"
    );
}
