"""CPU-only checks of bench/anchors.py (not part of CI).

Run: python3 -m pytest bench/test_anchors.py
Needs numpy and safetensors; torch is not needed (and the GPU anchors are
expected to fail loudly where there is no CUDA device).
"""

import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "anchors.py")
sys.path.insert(0, HERE)
import anchors  # noqa: E402

SUBCOMMANDS = ["make-model", "load-baseline", "ipc-baseline", "copy-bandwidth", "all"]


def run_cli(*args):
    p = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                       timeout=300)
    last = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    return p, last


def test_help_top():
    p, _ = run_cli("--help")
    assert p.returncode == 0, p.stderr
    for s in SUBCOMMANDS:
        assert s in p.stdout


@pytest.mark.parametrize("sub", SUBCOMMANDS)
def test_help_sub(sub):
    p, _ = run_cli(sub, "--help")
    assert p.returncode == 0, p.stderr
    assert "usage:" in p.stdout


def test_no_subcommand_fails():
    p, _ = run_cli()
    assert p.returncode != 0


@pytest.mark.parametrize("gib,n,dtype", [(12, 256, "bf16"), (8, 100, "f16"), (1, 7, "f32"),
                                         (0.001, 4, "bf16"), (1e-6, 3, "f32")])
def test_plan_shapes(gib, n, dtype):
    shapes = anchors.plan_shapes(gib, n, dtype)
    assert len(shapes) == n
    assert [s[0] for s in shapes] == [f"layers.{i}.weight" for i in range(n)]
    esize = anchors.DTYPES[dtype][1]
    rows, cols = shapes[0][1]
    assert cols % 256 == 0 and rows >= 1
    total = sum(r * c * esize for _, (r, c) in shapes)
    target = gib * anchors.GIB
    if target / n >= 256 * 64 * esize:  # big enough that rounding to whole rows is small
        assert abs(total - target) <= n * cols * esize
        assert abs(total - target) / target < 0.01


def test_plan_12gib_is_exact():
    shapes = anchors.plan_shapes(12, 256, "bf16")
    assert shapes[0][1] == [6144, 4096]
    assert sum(r * c * 2 for _, (r, c) in shapes) == 12 * anchors.GIB


def test_bf16_conversion():
    src = anchors.numpy_random_source("bf16", 0)
    # feed known values through the same conversion by monkeypatching the rng
    x = np.array([1.0, -2.0, 0.5, 1.00390625, 1.01171875, 3.0e-30], dtype=np.float32)
    u = x.view(np.uint32)
    want = []
    for v in u.tolist():
        # round to nearest even on the low 16 bits
        lo = v & 0xFFFF
        hi = v >> 16
        if lo > 0x8000 or (lo == 0x8000 and hi & 1):
            hi += 1
        want.append(hi)
    conv = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    assert conv.tolist() == want
    assert conv[0] == 0x3F80 and conv[1] == 0xC000
    # and the source yields exactly nbytes, as uint16, non-zero
    chunks = list(src("t", 2 * 1000))
    arr = np.concatenate(chunks)
    assert arr.dtype == np.uint16 and arr.size == 1000 and np.count_nonzero(arr) > 990


def test_header_padding_and_offsets():
    specs = [("a", "F32", [2, 3]), ("b", "BF16", [5]), ("c", "F16", [1, 256])]
    raw, offsets, payload = anchors.build_header(specs, {"format": "pt"})
    assert len(raw) % 8 == 0
    h = json.loads(raw)
    assert h["__metadata__"] == {"format": "pt"}
    assert h["a"]["data_offsets"] == [0, 24]
    assert h["b"]["data_offsets"] == [24, 34]
    assert h["c"]["data_offsets"] == [34, 34 + 512]
    assert payload == 34 + 512


@pytest.mark.parametrize("dtype", ["f16", "f32"])
def test_writer_roundtrip_with_safetensors_numpy(tmp_path, dtype):
    from safetensors.numpy import load_file

    shapes = anchors.plan_shapes(0.002, 5, dtype)
    st = anchors.DTYPES[dtype][0]
    specs = [(n, st, s) for n, s in shapes]
    # small chunks so a tensor spans several chunks
    path = tmp_path / "m.safetensors"
    anchors.write_safetensors_stream(path, specs,
                                     anchors.numpy_random_source(dtype, 7, chunk_bytes=40000),
                                     metadata={"format": "pt"})
    got = load_file(str(path))
    # regenerate the expected values in one go from the same seed
    rng = np.random.default_rng(7)
    npdt = {"f16": np.float16, "f32": np.float32}[dtype]
    assert set(got) == {n for n, _ in shapes}
    total = sum(int(np.prod(s)) for _, s in shapes)
    flat = rng.standard_normal(total, dtype=np.float32).astype(npdt)
    # chunked draws must equal one draw of the total (the writer writes tensors in
    # list order, so the payload is one continuous random stream)
    off = 0
    for name, shape in shapes:
        k = int(np.prod(shape))
        assert got[name].dtype == npdt and list(got[name].shape) == shape
        np.testing.assert_array_equal(got[name].reshape(-1), flat[off:off + k])
        off += k
        assert np.count_nonzero(got[name]) > 0.99 * k


def test_bf16_file_readable_by_safetensors_and_own_reader(tmp_path):
    import safetensors

    shapes = anchors.plan_shapes(0.001, 3, "bf16")
    specs = [(n, "BF16", s) for n, s in shapes]
    path = tmp_path / "b.safetensors"
    size = anchors.write_safetensors_stream(path, specs, anchors.numpy_random_source("bf16", 3))
    hlen, header, payload = anchors.read_safetensors_header(path)
    assert size == 8 + hlen + payload
    assert hlen % 8 == 0
    # the real library parses the header and agrees on names/shapes/dtypes
    with safetensors.safe_open(str(path), framework="numpy") as f:
        assert set(f.keys()) == {n for n, _ in shapes}
        for n, s in shapes:
            sl = f.get_slice(n)
            assert sl.get_shape() == s
            assert sl.get_dtype() == "BF16"
    # raw bytes == the source's uint16 stream
    want = np.concatenate(list(anchors.numpy_random_source("bf16", 3)("x", payload)))
    with open(path, "rb") as fh:
        fh.seek(8 + hlen)
        raw = np.frombuffer(fh.read(), dtype=np.uint16)
    np.testing.assert_array_equal(raw, want)


def test_writer_rejects_short_or_long_source(tmp_path):
    specs = [("a", "F32", [4])]
    with pytest.raises(anchors.AnchorError):
        anchors.write_safetensors_stream(tmp_path / "s", specs, lambda n, b: [b"\0" * (b - 1)])
    with pytest.raises(anchors.AnchorError):
        anchors.write_safetensors_stream(tmp_path / "l", specs, lambda n, b: [b"\1" * (b + 1)])
    assert not os.path.exists(tmp_path / "s") and not os.path.exists(tmp_path / "l")


def test_reader_rejects_bad_files(tmp_path):
    good = tmp_path / "g.safetensors"
    anchors.write_safetensors_stream(good, [("a", "F32", [4]), ("b", "F32", [4])],
                                     lambda n, b: [b"\1" * b])
    data = good.read_bytes()
    trunc = tmp_path / "t.safetensors"
    trunc.write_bytes(data[:-1])
    with pytest.raises(anchors.AnchorError):
        anchors.read_safetensors_header(trunc)
    hlen = struct.unpack("<Q", data[:8])[0]
    h = json.loads(data[8:8 + hlen])
    h["b"]["data_offsets"] = [20, 36]  # gap at 16..20
    raw = json.dumps(h).encode()
    gap = tmp_path / "gap.safetensors"
    gap.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + hlen:] + b"\0" * 4)
    with pytest.raises(anchors.AnchorError):
        anchors.read_safetensors_header(gap)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(anchors.AnchorError):
        anchors.read_safetensors_header(bad)


def test_make_model_cli_numpy(tmp_path):
    out = tmp_path / "sub" / "m.safetensors"
    p, last = run_cli("make-model", "--out", str(out), "--gib", "0.01", "--tensors", "6",
                      "--dtype", "bf16", "--gen", "numpy", "--seed", "5")
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads(last)
    assert res["ok"] and res["bytes"] == os.path.getsize(out) and res["tensors"] == 6
    assert "seconds" in res and res["path"] == str(out)
    assert not os.path.exists(str(out) + ".partial")
    assert anchors.model_matches(str(out), 0.01, 6, "bf16")
    assert not anchors.model_matches(str(out), 0.01, 7, "bf16")
    assert not anchors.model_matches(str(out), 0.02, 6, "bf16")
    assert not anchors.model_matches(str(tmp_path / "missing"), 0.01, 6, "bf16")


@pytest.mark.parametrize("args", [
    ["copy-bandwidth", "--mib", "1"],
    ["ipc-baseline", "--gib", "0.01", "--tensors", "4", "--repeat", "3"],
    ["load-baseline", "--path", "/nonexistent.safetensors"],
    ["all", "--workdir", "/tmp/anchors-test-workdir", "--gib", "0.01"],
])
def test_gpu_anchors_fail_loudly_without_cuda(args):
    try:
        import torch
        if torch.cuda.is_available():
            pytest.skip("a CUDA device is present")
    except ImportError:
        pass
    p, last = run_cli(*args)
    assert p.returncode == 1
    res = json.loads(last)
    assert res["ok"] is False and res["anchor"] == args[0]
    assert "torch" in res["error"] or "CUDA" in res["error"]
    assert "FAILED" in p.stdout


def test_percentile():
    assert anchors.percentile([3, 1, 2], 50) == 2
    assert anchors.percentile([1, 2, 3, 4], 50) == 2.5
    assert anchors.percentile([5], 99) == 5
    assert anchors.percentile(list(range(101)), 99) == 99
    with pytest.raises(anchors.AnchorError):
        anchors.percentile([], 50)
