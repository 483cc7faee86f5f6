//! Tests of the encoder's sizes: the weights' expected sizes, padding, and the limits.

use super::placement::expected_sizes;
use super::sizes::{buffer_tokens, check_dims, padded_len, scores_elems};
use super::*;
use crate::WeightDtype;
use crate::encoder::Pooling;

fn dims(type_vocab: usize) -> Dims {
    Dims {
        vocab: 50,
        hidden: 8,
        heads: 2,
        intermediate: 16,
        max_positions: 64,
        type_vocab,
        position_offset: 0,
        eps: 1e-12,
        pooling: Pooling::Mean,
        normalize: true,
    }
}

fn limits() -> Limits {
    Limits {
        max_tokens: 256,
        max_sequences: 8,
        max_seq_len: 30,
    }
}

fn weights(layers: usize, token_types: bool) -> EncoderWeights<u32> {
    let lin = || Linear { weight: 0, bias: 0 };
    let norm = || Norm { gamma: 0, beta: 0 };
    EncoderWeights {
        dtype: WeightDtype::F16,
        embeddings: Embeddings {
            word: 0,
            position: 0,
            token_type: token_types.then_some(0),
            norm: norm(),
        },
        layers: (0..layers)
            .map(|_| Layer {
                query: lin(),
                key: lin(),
                value: lin(),
                attn_out: lin(),
                attn_norm: norm(),
                up: lin(),
                down: lin(),
                out_norm: norm(),
            })
            .collect(),
    }
}

/// The expected sizes would drift from try_map's order, checking each weight against
/// another's size.
#[test]
fn expected_sizes_follow_try_maps_order() {
    for token_types in [true, false] {
        let d = dims(if token_types { 2 } else { 0 });
        let w = weights(3, token_types);
        let mut visited = 0;
        w.try_map(|_| -> Result<(), ()> {
            visited += 1;
            Ok(())
        })
        .expect("maps");
        let sizes: Vec<u64> = expected_sizes(&d, 3, token_types).collect();
        assert_eq!(sizes.len(), visited);
        let mut want = vec![50 * 8, 64 * 8];
        if token_types {
            want.push(2 * 8);
        }
        want.extend([8, 8, 8 * 8, 8]);
        assert_eq!(&sizes[..want.len()], &want[..]);
        // The last layer ends with up (16x8, 16), down (8x16, 8), out_norm (8, 8).
        assert_eq!(&sizes[sizes.len() - 6..], &[16 * 8, 16, 8 * 16, 8, 8, 8]);
    }
}

/// Padding would pass the position table or shrink a length; limits past the kernels' or
/// memory sizes would be accepted.
#[test]
fn padding_and_limits_are_checked() {
    assert_eq!(padded_len(1, 512), 8);
    assert_eq!(padded_len(8, 512), 8);
    assert_eq!(padded_len(250, 252), 252);
    assert_eq!(padded_len(252, 252), 252);
    assert!(check_dims(&dims(2), &limits()).is_ok());
    let l = Limits {
        max_seq_len: 65,
        ..limits()
    };
    assert!(check_dims(&dims(2), &l).is_err(), "past the position table");
    let wide = Dims {
        hidden: 8194,
        heads: 2,
        ..dims(2)
    };
    assert!(check_dims(&wide, &limits()).is_err(), "past MAX_ROW_LEN");
    assert_eq!(
        buffer_tokens(&dims(2), &limits(), 2).expect("fits"),
        256 + 8 * 8
    );
    for l in [
        Limits {
            max_sequences: 1 << 62,
            ..limits()
        },
        Limits {
            max_tokens: usize::MAX - 10,
            ..limits()
        },
        Limits {
            max_tokens: 1 << 60,
            ..limits()
        },
    ] {
        assert!(buffer_tokens(&dims(2), &l, 2).is_err(), "{l:?}");
    }
    assert!(scores_elems(&dims(2), &limits(), 2) >= 2 * 32 * 32);
}

/// Packing would pad the token rows, misplace a sequence's start or its positions, or let
/// an id outside the vocabulary or a group past the limits through.
#[test]
fn groups_are_packed_without_padding() {
    use super::pack::{Group, Padding, Tokens, input_ints, pack};
    let (a, b, c) = ([5u32, 6, 7], [8u32], [9u32, 10, 11, 12, 13]);
    let types = [0u32; 5];
    let seqs = [
        Tokens {
            ids: &a,
            type_ids: &types[..3],
        },
        Tokens {
            ids: &b,
            type_ids: &types[..1],
        },
        Tokens {
            ids: &c,
            type_ids: &types[..5],
        },
    ];
    let p = pack(dims(2), limits(), Padding::Padded, &seqs)
        .expect("fits")
        .expect("some");
    assert_eq!((p.group.b, p.group.s, p.group.t), (3, 8, 9));
    assert_eq!(p.ids, [5, 6, 7, 8, 9, 10, 11, 12, 13]);
    assert_eq!(p.positions, [0, 1, 2, 0, 0, 1, 2, 3, 4]);
    assert_eq!(p.lengths, [3, 1, 5]);
    assert_eq!(p.offsets, [0, 3, 4, 9]);
    assert_eq!(p.types.len(), 9);
    // One copy up brings them all, in the order Buffers::inputs_of reads them.
    let n = input_ints(p.group.t, p.group.b);
    assert_eq!(n, 3 * 9 + 2 * 3 + 1);
    let mut ints = vec![-7; n + 2];
    p.write_ints(&mut ints, p.group);
    let want: Vec<i32> = [&p.ids, &p.types, &p.positions, &p.lengths, &p.offsets]
        .into_iter()
        .flatten()
        .copied()
        .chain([-7, -7])
        .collect();
    assert_eq!(ints, want);
    // At a graph's launch shape (more rows and sequences): the rows past the tokens are
    // token 0 at position 0, the sequences past the group's empty and starting at its end.
    let at = Group { b: 4, s: 32, t: 12 };
    let mut ints = vec![-7; input_ints(12, 4) + 1];
    p.write_ints(&mut ints, at);
    let pad = |v: &[i32], n: usize, fill: i32| {
        let mut v = v.to_vec();
        v.resize(n, fill);
        v
    };
    let want: Vec<i32> = [
        pad(&p.ids, 12, 0),
        pad(&p.types, 12, 0),
        pad(&p.positions, 12, 0),
        pad(&p.lengths, 4, 0),
        pad(&p.offsets, 5, 9),
        vec![-7],
    ]
    .concat();
    assert_eq!(ints, want);
    assert!(
        pack(dims(2), limits(), Padding::Padded, &[])
            .expect("empty")
            .is_none()
    );
    let bad = [10_000u32];
    let outside = [Tokens {
        ids: &bad,
        type_ids: &types[..1],
    }];
    assert!(pack(dims(2), limits(), Padding::Padded, &outside).is_err());
    let long = [1u32; 40];
    let too_long = [Tokens {
        ids: &long,
        type_ids: &[0; 40],
    }];
    assert!(
        pack(dims(2), limits(), Padding::Padded, &too_long).is_err(),
        "past max_seq_len 30"
    );
}

/// Packed (the fused attention), `max_tokens` bounds the real tokens: one long sequence and
/// many short ones fit a group that padded to the longest would not.
#[test]
fn packed_groups_count_real_tokens() {
    use super::pack::{Padding, Tokens, pack};
    let long = [1u32; 30];
    let short = [2u32; 2];
    let types = [0u32; 30];
    let mut seqs = vec![Tokens {
        ids: &long,
        type_ids: &types,
    }];
    seqs.extend((0..7).map(|_| Tokens {
        ids: &short,
        type_ids: &types[..2],
    }));
    // 8 × 30 = 240 padded, 44 real; a limit of 100 tokens takes it only packed.
    let l = Limits {
        max_tokens: 100,
        ..limits()
    };
    assert!(pack(dims(2), l, Padding::Padded, &seqs).is_err());
    let p = pack(dims(2), l, Padding::Packed, &seqs)
        .expect("fits")
        .expect("some");
    assert_eq!((p.group.b, p.group.s, p.group.t), (8, 32, 44));
    // Past the limit in real tokens, refused either way.
    let tight = Limits {
        max_tokens: 43,
        ..limits()
    };
    assert!(pack(dims(2), tight, Padding::Packed, &seqs).is_err());
}
