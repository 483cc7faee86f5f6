#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets: valid safetensors files and index files, and
broken ones (holes, trailing bytes, overlaps, bad lengths, duplicate keys, overflowing shapes,
unknown dtypes, escapes...), one file each, under seeds/header and seeds/index. The fuzzers read
them and write what they find to corpus/.

Run from fuzz/: python3 seed.py. Standard library only."""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def st(header, data=b"", raw_header=None, pad=True):
    h = raw_header if raw_header is not None else json.dumps(header, separators=(",", ":")).encode()
    if pad and raw_header is None:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def t(dtype, shape, b, e):
    return {"dtype": dtype, "shape": shape, "data_offsets": [b, e]}


headers = {
    "empty_object": st({}),
    "one_f32": st({"w": t("F32", [2, 2], 0, 16)}, bytes(16)),
    "metadata": st({"__metadata__": {"format": "pt"}, "w": t("F16", [4], 0, 8)}, bytes(8)),
    "two_sorted": st({"a": t("BF16", [3], 0, 6), "b": t("U8", [2], 6, 8)}, bytes(8)),
    "unsorted_keys": st({"b": t("U8", [2], 6, 8), "a": t("BF16", [3], 0, 6)}, bytes(8)),
    "empty_tensor": st({"e": t("F32", [0, 3], 0, 0), "w": t("I8", [1], 0, 1)}, bytes(1)),
    "scalar": st({"s": t("F64", [], 0, 8)}, bytes(8)),
    "f8": st({"a": t("F8_E4M3", [2], 0, 2), "b": t("F8_E5M2", [2], 2, 4), "c": t("F8_E8M0", [1], 4, 5)}, bytes(5)),
    "c64": st({"c": t("C64", [1], 0, 8)}, bytes(8)),
    "hole": st({"a": t("F32", [1], 0, 4), "b": t("F32", [1], 8, 12)}, bytes(12)),
    "leading_hole": st({"a": t("F32", [1], 4, 8)}, bytes(8)),
    "trailing": st({"a": t("F32", [1], 0, 4)}, bytes(9)),
    "overlap": st({"a": t("F32", [2], 0, 8), "b": t("F32", [1], 4, 8)}, bytes(8)),
    "past_end": st({"a": t("F32", [4], 0, 16)}, bytes(8)),
    "shape_mismatch": st({"a": t("F32", [3], 0, 8)}, bytes(8)),
    "overflow_shape": st({"a": t("F32", [2**63, 4], 0, 8)}, bytes(8)),
    "negative": st({"a": t("F32", [-1], 0, 4)}, bytes(4)),
    "unknown_dtype": st({"a": t("F128", [1], 0, 16)}, bytes(16)),
    "duplicate_key": st(None, bytes(4), raw_header=b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'),
    "duplicate_field": st(None, bytes(4), raw_header=b'{"a":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}}'),
    "extra_field": st({"a": {**t("F32", [1], 0, 4), "x": 1}}, bytes(4)),
    "missing_field": st({"a": {"dtype": "F32", "shape": [1]}}, bytes(4)),
    "leading_space": st(None, bytes(4), raw_header=b' {"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'),
    "not_object": st(None, raw_header=b"[1,2,3] "),
    "bad_utf8": st(None, bytes(4), raw_header=b'{"\xff":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'),
    "metadata_not_string": st({"__metadata__": {"k": 1}}),
    "long_name": st({"n" * 300: t("U8", [1], 0, 1)}, bytes(1)),
    "deep_rank": st({"a": t("U8", [1] * 20, 0, 1)}, bytes(1)),
    "length_too_big": struct.pack("<Q", 2**63) + b"{}",
    "length_past_end": struct.pack("<Q", 100) + b"{}      ",
    "short": b"\x02\x00\x00",
    "nul": b"\x00" * 8,
    "offsets_reversed": st({"a": t("U8", [0], 4, 0)}, bytes(4)),
    "float_offsets": st(None, bytes(4), raw_header=b'{"a":{"dtype":"U8","shape":[4],"data_offsets":[0.0,4]}}'),
}

indexes = {
    "plain": {"metadata": {"total_size": 8}, "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}},
    "dot_slash": {"weight_map": {"a": "./x.safetensors", "b": "x.safetensors"}},
    "parent": {"weight_map": {"a": "../x.safetensors"}},
    "absolute": {"weight_map": {"a": "/etc/passwd"}},
    "nested": {"weight_map": {"a": "sub/dir/x.safetensors"}},
    "empty_map": {"weight_map": {}},
    "no_map": {"metadata": {}},
    "not_string": {"weight_map": {"a": 3}},
    "extra_keys": {"weight_map": {"a": "x.safetensors"}, "other": [1, {"b": None}]},
}
raw_indexes = {
    "duplicate_tensor": b'{"weight_map":{"a":"x.safetensors","a":"y.safetensors"}}',
    "duplicate_map": b'{"weight_map":{"a":"x.safetensors"},"weight_map":{"b":"y.safetensors"}}',
    "nul": b'{"weight_map":{"a":"x\\u0000.safetensors"}}',
    "truncated": b'{"weight_map":{"a":"x.saf',
    "not_json": b"\xff\xfe",
}

for kind, items in (("header", headers), ("index", {**{k: json.dumps(v).encode() for k, v in indexes.items()}, **raw_indexes})):
    out = os.path.join(HERE, "seeds", kind)
    os.makedirs(out, exist_ok=True)
    for name, data in items.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print(f"{len(items)} seeds in seeds/{kind}")
