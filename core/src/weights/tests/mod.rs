//! Tests of header, index, source and layout, on files written by the official
//! `safetensors` crate (valid cases) and by hand (malformed cases): one file per part, the
//! shared writers and assertions here.

use std::fmt::Debug;
use std::path::Path;

use safetensors::Dtype;
use safetensors::tensor::TensorView;

use super::*;

mod header;
mod index;
mod layout;
mod source;

const FILE: &str = "model.safetensors";

/// Serializes tensors (name, dtype, shape, data) with the official crate.
fn serialize(tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)], meta: &[(&str, &str)]) -> Vec<u8> {
    let views: Vec<(&str, TensorView<'_>)> = tensors
        .iter()
        .map(|(name, dtype, shape, data)| {
            (*name, TensorView::new(*dtype, shape.clone(), data).unwrap())
        })
        .collect();
    let meta = (!meta.is_empty()).then(|| {
        meta.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    });
    safetensors::serialize(views, &meta).unwrap()
}

/// A file of F32 tensors of shape [n], filled with a pattern that differs per tensor.
fn f32_file(tensors: &[(&str, usize)]) -> Vec<u8> {
    let owned: Vec<_> = tensors
        .iter()
        .enumerate()
        .map(|(i, (name, n))| {
            let data: Vec<u8> = (0..n * 4).map(|j| (i * 31 + j) as u8).collect();
            (*name, Dtype::F32, vec![*n], data)
        })
        .collect();
    serialize(&owned, &[])
}

/// A file with a hand-written header and `data_len` data bytes.
fn raw(header: &str, data_len: usize) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend(std::iter::repeat_n(0xAB, data_len));
    out
}

fn parse_with(bytes: &[u8], limits: &WeightLimits) -> Result<Header, WeightsError> {
    parse_header(FILE, &mut &bytes[..], bytes.len() as u64, limits)
}

fn parse(bytes: &[u8]) -> Result<Header, WeightsError> {
    parse_with(bytes, &WeightLimits::default())
}

/// Asserts a `Malformed` error for `file` whose message contains `needle`; returns the offset.
#[track_caller]
fn malformed<T: Debug>(r: Result<T, WeightsError>, file: &str, needle: &str) -> u64 {
    match r {
        Err(e @ WeightsError::Malformed { .. }) => {
            let msg = e.to_string();
            assert!(msg.starts_with(&format!("{file}: byte ")), "{msg}");
            assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
            let WeightsError::Malformed { offset, .. } = e else {
                unreachable!()
            };
            offset
        }
        other => panic!("expected Malformed {needle:?} in {file}, got {other:?}"),
    }
}

/// Asserts a `Limit` error for `file` whose message contains `needle`; returns (limit, actual).
#[track_caller]
fn limit<T: Debug>(r: Result<T, WeightsError>, file: &str, needle: &str) -> (u64, u64) {
    match r {
        Err(e @ WeightsError::Limit { .. }) => {
            let msg = e.to_string();
            assert!(msg.starts_with(&format!("{file}: ")), "{msg}");
            assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
            let WeightsError::Limit { limit, actual, .. } = e else {
                unreachable!()
            };
            (limit, actual)
        }
        other => panic!("expected Limit {needle:?} in {file}, got {other:?}"),
    }
}

/// Asserts a `BadPath` error for `path` whose message contains `needle`.
#[track_caller]
fn bad_path<T: Debug>(r: Result<T, WeightsError>, path: &str, needle: &str) {
    match r {
        Err(e @ WeightsError::BadPath { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(&format!("'{path}'")), "{msg}");
            assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
        }
        other => panic!("expected BadPath {needle:?} for {path}, got {other:?}"),
    }
}
