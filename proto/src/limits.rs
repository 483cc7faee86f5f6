//! The sizes and counts both sides of the contract must agree on: the server enforces them, the
//! worker SDK refuses options the server would refuse, and the `.proto` comments quote them.
//!
//! A Serve batch travels in one gRPC message, so its payload ([`MAX_BATCH_BYTES`]) is smaller
//! than the message bound of `Serve` ([`PAYLOAD_MESSAGE_BYTES`]): the difference,
//! [`BATCH_ENVELOPE_BYTES`], is room for what wraps the payload (item ids, tensor names and
//! shapes, parameters, deadlines, the protobuf framing of every field).

/// The most bytes of gRPC request message for methods that carry no payload (names, ids,
/// heartbeats): 64 KiB.
pub const SMALL_REQUEST_BYTES: u32 = 64 << 10;

/// The most bytes of an admin request message: 1 MiB. Names, paths and access lists need
/// kilobytes (answers may be larger: see [`PAYLOAD_MESSAGE_BYTES`]).
pub const ADMIN_REQUEST_BYTES: u32 = 1 << 20;

/// The most bytes of a message of the methods that carry payloads (`WorkerService.Serve` in
/// both directions, `GRPCInferenceService.ModelInfer`), and of any message the server sends:
/// 128 MiB.
pub const PAYLOAD_MESSAGE_BYTES: u32 = 128 << 20;

/// The most bytes of item input (text bytes plus tensor data bytes, summed over its items) in
/// one Serve batch, and so the largest `ServeOffer.max_batch_bytes` a worker may declare (0
/// declares this): 120 MiB, leaving [`BATCH_ENVELOPE_BYTES`] of the message for the rest.
pub const MAX_BATCH_BYTES: u64 = 120 << 20;

/// What a batch's message holds besides its items' input bytes, at most: the message bound
/// less [`MAX_BATCH_BYTES`] (8 MiB).
pub const BATCH_ENVELOPE_BYTES: u64 = PAYLOAD_MESSAGE_BYTES as u64 - MAX_BATCH_BYTES;

/// The most credits (unanswered batches at once) a worker may declare in a `ServeOffer`.
pub const MAX_CREDITS: u32 = 1024;

/// The most items per batch a worker may declare in a `ServeOffer` (`max_batch_items`).
pub const MAX_BATCH_ITEMS: u32 = 65_536;

// The bounds nest: a payload method's bound over the admin's over the small one's, and a
// batch's input under its message's bound.
const _: () = {
    assert!(SMALL_REQUEST_BYTES < ADMIN_REQUEST_BYTES);
    assert!(ADMIN_REQUEST_BYTES < PAYLOAD_MESSAGE_BYTES);
    assert!(MAX_BATCH_BYTES < PAYLOAD_MESSAGE_BYTES as u64);
    assert!(MAX_CREDITS >= 1 && MAX_BATCH_ITEMS >= 1);
};
