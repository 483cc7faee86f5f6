#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets, one file each under seeds/<target>:

- header, index: valid safetensors files and index files, and broken ones (holes, trailing
  bytes, overlaps, bad lengths, duplicate keys, overflowing shapes, unknown dtypes, escapes...);
- openai: /v1/embeddings bodies of every input form, and broken ones;
- generate: bodies of the generating doors (a first byte: 0 /v1/completions, 1
  /v1/chat/completions, 2 KServe generate), good and broken;
- kserve: KServe v2 REST requests (4 bytes of Inference-Header-Content-Length, 0xffffffff for
  none, then the body): JSON data of every datatype, binary-extension bodies, broken ones;
- oip_grpc: protobuf ModelInferRequests, encoded by hand here: raw and typed contents of every
  datatype, parameters of every kind, broken ones.

It also writes regressions/<target>/ inputs that a bug once failed on. The fuzzers read the
seeds and write what they find to corpus/.

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


# --- The inference doors' requests -----------------------------------------------------------

def j(v):
    return json.dumps(v, separators=(",", ":")).encode()


openai = {
    "string": {"model": "m", "input": "hello"},
    "strings": {"model": "m", "input": ["a", "b", "é", ""]},
    "tokens": {"model": "m", "input": [1, 2, 3, -4, 9223372036854775807]},
    "token_lists": {"model": "m", "input": [[1], [2, 3]], "encoding_format": "base64"},
    "dimensions": {"model": "m", "input": ["x"], "dimensions": 8, "user": "u", "encoding_format": "float"},
    "nulls": {"model": "m", "input": "x", "encoding_format": None, "dimensions": None, "user": None},
    "extra_keys": {"model": "m", "input": "x", "other": {"deep": [1, 2.5, None]}},
    "empty_list": {"model": "m", "input": []},
    "empty_token_list": {"model": "m", "input": [[1], []]},
    "mixed": {"model": "m", "input": ["a", 1]},
    "object_input": {"model": "m", "input": {"x": 1}},
    "float_tokens": {"model": "m", "input": [1.0, 2]},
    "big_token": {"model": "m", "input": [18446744073709551615]},
    "bad_format": {"model": "m", "input": "x", "encoding_format": "int8"},
    "zero_dimensions": {"model": "m", "input": "x", "dimensions": 0},
    "no_model": {"input": "x"},
    "model_not_string": {"model": 3, "input": "x"},
    "too_many": {"model": "m", "input": ["x"] * 2049},
    "most": {"model": "m", "input": [[7]] * 2048},
    "long_format": {"model": "m", "input": "x", "encoding_format": "f" * 9000},
}
raw_openai = {
    "duplicate_model": b'{"model":"m","model":"n","input":"x"}',
    "escapes": b'{"model":"\\u00e9\\ud83d\\ude00","input":"\\n\\t\\"\\\\"}',
    "truncated": b'{"model":"m","input":["a",',
    "not_utf8_skipped": b'{"model":"m","input":"x","zz":"\xff"}',
    "not_utf8_read": b'{"model":"\xff","input":"x"}',
    "huge_number_skipped": b'{"model":"m","input":"x","zz":8e755}',
    "deep": b'{"model":"m","input":' + b"[" * 200 + b"]" * 200 + b"}",
    "not_json": b"\x00\x01",
    # serde reads a struct from an array of its fields in order too (see README.md).
    "positional": b'["hi","m",null,4]',
}


def kserve_body(head, blobs=b"", header=True):
    """The fuzz input of the kserve target: the header length (4 bytes, 0xffffffff for none),
    then the body (the JSON, then the binary blobs)."""
    h = j(head) if isinstance(head, dict) else head
    word = len(h) if header else 0xFFFFFFFF
    return struct.pack("<I", word) + h + blobs


def inp(name, shape, datatype, data=None, size=None, **params):
    d = {"name": name, "shape": shape, "datatype": datatype}
    if size is not None:
        params["binary_data_size"] = size
    if params:
        d["parameters"] = params
    if data is not None:
        d["data"] = data
    return d


kserve = {
    "fp32_nested": ({"id": "1", "inputs": [inp("x", [2, 2], "FP32", [[1, 2], [3.5, -4]])]}, b""),
    "every_datatype": ({"inputs": [
        inp("b", [2], "BOOL", [True, False]), inp("u8", [2], "UINT8", [0, 255]),
        inp("u16", [2], "UINT16", [1, 65535]), inp("u32", [2], "UINT32", [1, 4294967295]),
        inp("u64", [2], "UINT64", [1, 18446744073709551615]), inp("i8", [2], "INT8", [-128, 127]),
        inp("i16", [2], "INT16", [-1, 2]), inp("i32", [2], "INT32", [-1, 2]),
        inp("i64", [2], "INT64", [-9223372036854775808, 2]), inp("f16", [2], "FP16", [0.5, 65504]),
        inp("bf16", [2], "BF16", [1e30, -0.0]), inp("f64", [2], "FP64", [1e300, 5e-324]),
        inp("s", [2], "BYTES", ["a", "é"])]}, b""),
    "texts": ({"inputs": [inp("text", [3], "BYTES", ["hi", "", "é"])], "parameters": {"max_tokens": 5, "t": 0.5, "s": "x", "b": True, "u": 18446744073709551615}}, b""),
    "texts_n1": ({"inputs": [inp("text", [2, 1], "BYTES", [["a"], ["b"]])]}, b""),
    "bytes_pairs": ({"inputs": [inp("p", [2, 2], "BYTES", ["a", "bb", "", "c"])]}, b""),
    "binary_one": ({"inputs": [inp("x", [2], "FP32", size=8)], "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}, struct.pack("<2f", 1, 2)),
    "binary_two": ({"inputs": [inp("x", [2, 1], "INT64", size=16), inp("m", [2, 3], "UINT8", size=6)], "parameters": {"binary_data_output": True}}, struct.pack("<2q", 7, 8) + bytes(6)),
    "binary_bytes": ({"inputs": [inp("s", [2], "BYTES", size=11)]}, struct.pack("<I", 2) + b"hi" + struct.pack("<I", 1) + b"x"),
    "binary_and_json": ({"inputs": [inp("x", [1, 2], "FP16", size=4), inp("y", [1], "INT32", [5])]}, bytes(4)),
    "zero_rows_of_zero": ({"inputs": [inp("x", [3, 0], "FP32", [])]}, b""),
    "scalar": ({"inputs": [inp("x", [], "FP32", [1])]}, b""),
    "rows_disagree": ({"inputs": [inp("a", [2], "INT32", [1, 2]), inp("b", [1], "INT32", [1])]}, b""),
    "twice": ({"inputs": [inp("a", [1], "INT32", [1]), inp("a", [1], "INT32", [1])]}, b""),
    "too_many_rows": ({"inputs": [inp("a", [65], "UINT8", [0] * 65)]}, b""),
    "negative_dim": ({"inputs": [inp("a", [-1], "UINT8", [])]}, b""),
    "huge_shape": ({"inputs": [inp("a", [4294967296, 4294967296], "UINT8", [])]}, b""),
    "count_mismatch": ({"inputs": [inp("a", [3], "INT32", [1, 2])]}, b""),
    "out_of_range": ({"inputs": [inp("a", [1], "INT8", [128])]}, b""),
    "unknown_datatype": ({"inputs": [inp("a", [1], "FP8", [1])]}, b""),
    "both_data": ({"inputs": [inp("a", [1], "UINT8", [1], size=1)]}, b"\x00"),
    "no_data": ({"inputs": [inp("a", [1], "UINT8")]}, b""),
    "no_inputs": ({"inputs": []}, b""),
    "bad_utf8_text": ({"inputs": [inp("s", [1], "BYTES", size=5)]}, struct.pack("<I", 1) + b"\xff"),
    "bytes_short": ({"inputs": [inp("s", [1], "BYTES", size=6)]}, struct.pack("<I", 5) + b"ab"),
    "parameter_object": ({"inputs": [inp("a", [1], "UINT8", [1])], "parameters": {"p": {"x": 1}}}, b""),
}
raw_kserve = {
    "no_header": kserve_body(j({"inputs": [inp("x", [1], "INT32", [1])]}), header=False),
    "header_past_end": struct.pack("<I", 1000) + j({"inputs": []}),
    "leftover_blob": kserve_body({"inputs": [inp("x", [1], "UINT8", size=1)]}, b"\x01\x02"),
    "blob_past_end": kserve_body({"inputs": [inp("x", [4], "UINT8", size=4)]}, b"\x01"),
    "binary_without_header": kserve_body(j({"inputs": [inp("x", [1], "UINT8", size=1)]}) + b"\x01", header=False),
    "truncated": struct.pack("<I", 0xFFFFFFFF) + b'{"inputs":[{"name":"x","shape":[1],',
    "long_name": kserve_body({"inputs": [inp("n" * 9000, [1], "UINT8", [1, 2])]}),
    "long_datatype": kserve_body({"inputs": [inp("x", [1], "X" * 9000, [1])]}),
    "short": b"\x01\x00",
    "positional": kserve_body(j(["7", {}, [["x", [1], "INT32", {}, [1]]], []]), header=False),
}


# Protocol buffers, by hand: the ModelInferRequest of grpc_predict_v2.proto.
def varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(num, wire, payload):
    key = varint(num << 3 | wire)
    if wire == 0:
        return key + varint(payload)
    if wire == 2:
        return key + varint(len(payload)) + payload
    return key + payload  # fixed 32 or 64


def ld(num, payload):
    return field(num, 2, payload if isinstance(payload, bytes) else payload.encode())


def packed(num, values, fmt=None):
    if fmt is None:
        body = b"".join(varint(v) for v in values)
    else:
        body = b"".join(struct.pack(fmt, v) for v in values)
    return ld(num, body)


def param(choice, value):
    """An InferParameter: bool 1, int64 2, string 3, double 4, uint64 5."""
    if choice == 3:
        return ld(3, value)
    if choice == 4:
        return field(4, 1, struct.pack("<d", value))
    return field(choice, 0, value)


def entry(num, key, value):
    """One entry of a map<string, InferParameter> field."""
    return ld(num, ld(1, key) + ld(2, value))


def contents(**fields):
    """InferTensorContents: bool 1, int 2, int64 3, uint 4, uint64 5, fp32 6, fp64 7, bytes 8."""
    out = b""
    for name, values in fields.items():
        if name == "bool":
            out += packed(1, [int(v) for v in values])
        elif name == "int":
            out += packed(2, values)
        elif name == "int64":
            out += packed(3, values)
        elif name == "uint":
            out += packed(4, values)
        elif name == "uint64":
            out += packed(5, values)
        elif name == "fp32":
            out += packed(6, values, "<f")
        elif name == "fp64":
            out += packed(7, values, "<d")
        elif name == "bytes":
            out += b"".join(ld(8, v) for v in values)
    return out


def tensor(name, datatype, shape, typed=None, params=b""):
    t = ld(1, name) + ld(2, datatype) + packed(3, shape) + params
    if typed is not None:
        t += ld(5, typed)
    return t


def infer(*inputs, raw=(), params=b"", model="m", outputs=()):
    out = ld(1, model) + ld(2, "") + ld(3, "id") + params
    out += b"".join(ld(5, t) for t in inputs)
    out += b"".join(ld(6, ld(1, o)) for o in outputs)
    out += b"".join(ld(7, r) for r in raw)
    return out


grpc = {
    "raw_fp32": infer(tensor("x", "FP32", [2, 2]), raw=[struct.pack("<4f", 1, 2, 3, 4)], outputs=["y"]),
    "raw_two": infer(tensor("a", "INT64", [2]), tensor("b", "FP16", [2, 3]), raw=[struct.pack("<2q", 1, 2), bytes(12)]),
    "typed_every": infer(
        tensor("b", "BOOL", [2], contents(bool=[True, False])),
        tensor("i8", "INT8", [2], contents(int=[-128, 127])),
        tensor("i16", "INT16", [2], contents(int=[-1, 300])),
        tensor("i32", "INT32", [2], contents(int=[-1, 2])),
        tensor("i64", "INT64", [2], contents(int64=[-(1 << 63), 5])),
        tensor("u8", "UINT8", [2], contents(uint=[0, 255])),
        tensor("u16", "UINT16", [2], contents(uint=[1, 65535])),
        tensor("u32", "UINT32", [2], contents(uint=[1, 4294967295])),
        tensor("u64", "UINT64", [2], contents(uint64=[1, (1 << 64) - 1])),
        tensor("f32", "FP32", [2], contents(fp32=[0.5, -1])),
        tensor("f64", "FP64", [2], contents(fp64=[1e300, 5e-324])),
        tensor("s", "BYTES", [2], contents(bytes=[b"a", b""])),
    ),
    "texts": infer(tensor("text", "BYTES", [2], contents(bytes=[b"hi", "é".encode()])),
                   params=entry(4, "max_tokens", param(2, 5)) + entry(4, "t", param(4, 0.5))
                   + entry(4, "s", param(3, "x")) + entry(4, "b", param(1, 1)) + entry(4, "u", param(5, (1 << 64) - 1))
                   + entry(4, "empty", b"")),
    "texts_raw_n1": infer(tensor("text", "BYTES", [2, 1]), raw=[struct.pack("<I", 1) + b"a" + struct.pack("<I", 1) + b"b"]),
    "bytes_pairs_raw": infer(tensor("p", "BYTES", [2, 2]), raw=[b"".join(struct.pack("<I", len(e)) + e for e in [b"a", b"bb", b"", b"c"])]),
    "zero_rows_of_zero": infer(tensor("x", "FP32", [3, 0])),
    "input_params": infer(tensor("x", "UINT8", [1], contents(uint=[1]), params=entry(4, "p", param(1, 1)))),
    "i8_out_of_range": infer(tensor("x", "INT8", [1], contents(int=[128]))),
    "fp16_typed": infer(tensor("x", "FP16", [1], contents(fp32=[1]))),
    "wrong_field": infer(tensor("x", "INT32", [1], contents(int64=[1]))),
    "both": infer(tensor("x", "UINT8", [1], contents(uint=[1])), raw=[b"\x01"]),
    "raw_count": infer(tensor("x", "UINT8", [1]), tensor("y", "UINT8", [1]), raw=[b"\x01"]),
    "raw_short": infer(tensor("x", "FP32", [2]), raw=[bytes(4)]),
    "no_data": infer(tensor("x", "UINT8", [1])),
    "no_inputs": infer(),
    "scalar": infer(tensor("x", "FP32", []), raw=[bytes(4)]),
    "rows_disagree": infer(tensor("a", "UINT8", [2]), tensor("b", "UINT8", [1]), raw=[bytes(2), bytes(1)]),
    "twice": infer(tensor("a", "UINT8", [1]), tensor("a", "UINT8", [1]), raw=[bytes(1), bytes(1)]),
    "too_many_rows": infer(tensor("a", "UINT8", [65]), raw=[bytes(65)]),
    "negative_dim": infer(tensor("a", "UINT8", [-1])),
    "unknown_datatype": infer(tensor("a", "FP8", [1]), raw=[bytes(1)]),
    "bad_utf8_text": infer(tensor("s", "BYTES", [1], contents(bytes=[b"\xff"]))),
    "long_name": infer(tensor("n" * 9000, "UINT8", [1]), raw=[bytes(2)]),
    "not_protobuf": b"\xff\xff\xff\xff",
}

# Inputs a bug once failed on: kept in regressions/ so that it cannot come back.
regressions = {
    # 85 bytes of OIP: a batch of 2^32 rows of nothing (zero elements, zero bytes of data)
    # once built one item per row and aborted the server; to_items now refuses a batch past
    # max_queue_items before building anything per row.
    "kserve/batch-4294967296-of-nothing": kserve_body({"inputs": [inp("x", [4294967296, 0], "FP32", [])]}),
    "kserve/batch-4294967296-of-nothing-binary": kserve_body({"inputs": [inp("x", [4294967296, 0], "FP32", size=0)]}),
    "oip_grpc/batch-4294967296-of-nothing": infer(tensor("x", "FP32", [4294967296, 0])),
}

M = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
generate = {
    "completion": (0, {"model": "m", "prompt": "hello", "max_tokens": 8, "temperature": 0.5, "top_p": 0.9,
                       "seed": 3, "stop": ["\n", "."], "stream": True, "stream_options": {"include_usage": True}}),
    "completion_list": (0, {"model": "m", "prompt": ["one"], "stop": "x", "n": 1, "logprobs": None}),
    "completion_two_prompts": (0, {"model": "m", "prompt": ["a", "b"]}),
    "completion_echo": (0, {"model": "m", "prompt": "a", "echo": True}),
    "completion_n2": (0, {"model": "m", "prompt": "a", "n": 2}),
    "completion_tokens_zero": (0, {"model": "m", "prompt": "a", "max_tokens": 0}),
    "completion_tokens_huge": (0, {"model": "m", "prompt": "a", "max_tokens": 2**62}),
    "completion_temperature": (0, {"model": "m", "prompt": "a", "temperature": 2.5}),
    "completion_top_p_zero": (0, {"model": "m", "prompt": "a", "top_p": 0}),
    "completion_stops": (0, {"model": "m", "prompt": "a", "stop": ["a", "b", "c", "d", "e"]}),
    "completion_long_stop": (0, {"model": "m", "prompt": "a", "stop": ["s" * 300]}),
    "chat": (1, {"model": "m", "messages": M, "max_completion_tokens": 4, "max_tokens": 9, "tools": []}),
    "chat_empty": (1, {"model": "m", "messages": []}),
    "chat_no_role": (1, {"model": "m", "messages": [{"content": "x"}]}),
    "chat_not_objects": (1, {"model": "m", "messages": ["x", 1]}),
    "chat_tools": (1, {"model": "m", "messages": M, "tools": [{"type": "function"}]}),
    "chat_deep": (1, {"model": "m", "messages": [{"role": "user", "content": [[[[["x"]]]]]}]}),
    "kserve": (2, {"text_input": "hi", "parameters": {"max_tokens": 3, "stop": ["x"]}, "temperature": 0.1, "id": "r"}),
    "kserve_stop_string": (2, {"text_input": "hi", "stop": "[\"a\"]"}),
    "kserve_bad_parameter": (2, {"text_input": "hi", "parameters": {"top_p": {"x": 1}}}),
    "kserve_no_text": (2, {"parameters": {}}),
    "kserve_number_text": (2, {"text_input": 5}),
}
raw_generate = {
    "completion_array_body": b"\x00" + b'["m","hi"]',
    "chat_truncated": b"\x01" + b'{"model":"m","messages":[{"role":"user",',
    "kserve_duplicate": b"\x02" + b'{"text_input":"a","text_input":"b"}',
    "empty": b"",
}

requests = {
    "openai": {**{k: j(v) for k, v in openai.items()}, **raw_openai},
    "generate": {**{k: bytes([door]) + j(v) for k, (door, v) in generate.items()}, **raw_generate},
    "kserve": {**{k: kserve_body(h, b) for k, (h, b) in kserve.items()}, **raw_kserve},
    "oip_grpc": grpc,
}

for name, data in regressions.items():
    path = os.path.join(HERE, "regressions", name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
print(f"{len(regressions)} regression inputs in regressions/")

for kind, items in (("header", headers), ("index", {**{k: json.dumps(v).encode() for k, v in indexes.items()}, **raw_indexes}), *requests.items()):
    out = os.path.join(HERE, "seeds", kind)
    os.makedirs(out, exist_ok=True)
    for name, data in items.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print(f"{len(items)} seeds in seeds/{kind}")
