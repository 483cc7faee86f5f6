#!/usr/bin/env python3
"""Benchmark anchors for modelshare.

Each subcommand measures a baseline that modelshare's own figures are compared
against (see bench/README.md and the measured-GPU-facts list in DESIGN.md).
Every subcommand prints human-readable lines, then ONE JSON object as the last
line of stdout.  On failure the last line is a JSON object with "ok": false
and the exit status is non-zero.

Units: GB/s is 1e9 bytes per second; GiB is 2**30 bytes; ms is milliseconds.

Dependencies: Python 3.11+ stdlib, torch, safetensors, numpy.  torch is only
imported by the subcommands that need it, so `--help` and `make-model --gen
numpy` work without it.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import queue as _queue
import struct
import sys
import time
import traceback

GIB = 1 << 30
MIB = 1 << 20
CHUNK_BYTES = 64 * MIB  # generation / warm-read chunk size

# safetensors dtype name, element size, torch attribute name
DTYPES = {
    "bf16": ("BF16", 2, "bfloat16"),
    "f16": ("F16", 2, "float16"),
    "f32": ("F32", 4, "float32"),
}
ST_ELEM_SIZE = {
    "BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I8": 1, "U8": 1, "I16": 2,
    "U16": 2, "I32": 4, "U32": 4, "I64": 8, "U64": 8, "BOOL": 1,
    "F8_E4M3": 1, "F8_E5M2": 1,
}


class AnchorError(RuntimeError):
    """A failure that should be reported loudly and end the run."""


def log(msg: str) -> None:
    print(msg, flush=True)


def emit(obj: dict) -> None:
    """Print the result object as the last stdout line."""
    print(json.dumps(obj, sort_keys=False), flush=True)


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# --------------------------------------------------------------------------
# statistics


def percentile(values, q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]) of a non-empty list."""
    if not values:
        raise AnchorError("percentile of an empty list")
    xs = sorted(values)
    if len(xs) == 1:
        return float(xs[0])
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))


def median(values) -> float:
    return percentile(values, 50.0)


# --------------------------------------------------------------------------
# safetensors format (header writer / reader, streaming)


def plan_shapes(gib: float, tensors: int, dtype: str):
    """Return [(name, [rows, cols])] for `tensors` 2-D tensors summing to ~gib GiB.

    cols is a multiple of 256 (4096 when the tensors are big enough); rows is
    chosen so that each tensor holds gib/tensors GiB, rounded to whole rows.
    """
    if tensors < 1:
        raise AnchorError("--tensors must be >= 1")
    if gib <= 0:
        raise AnchorError("--gib must be > 0")
    if dtype not in DTYPES:
        raise AnchorError(f"unknown dtype {dtype!r}; choose from {sorted(DTYPES)}")
    esize = DTYPES[dtype][1]
    elems = (gib * GIB) / tensors / esize
    if elems >= 4096 * 16:
        cols = 4096
    else:
        cols = max(256, int(elems // 256) * 256)
    rows = max(1, int(round(elems / cols)))
    return [(f"layers.{i}.weight", [rows, cols]) for i in range(tensors)]


def build_header(specs, metadata=None):
    """specs: [(name, st_dtype, shape)] in data order.

    Returns (header_bytes_padded, [(name, start, end)], payload_bytes).
    The JSON header is padded with spaces to a multiple of 8 bytes, like the
    reference implementation does.
    """
    header = {}
    if metadata:
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise AnchorError("safetensors metadata must be str -> str")
        header["__metadata__"] = dict(metadata)
    offsets = []
    off = 0
    for name, st_dtype, shape in specs:
        if name in header:
            raise AnchorError(f"duplicate tensor name {name!r}")
        if st_dtype not in ST_ELEM_SIZE:
            raise AnchorError(f"unknown safetensors dtype {st_dtype!r}")
        n = ST_ELEM_SIZE[st_dtype]
        for d in shape:
            n *= int(d)
        header[name] = {"dtype": st_dtype, "shape": [int(d) for d in shape],
                        "data_offsets": [off, off + n]}
        offsets.append((name, off, off + n))
        off += n
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * ((-len(raw)) % 8)
    return raw, offsets, off


def write_safetensors_stream(path, specs, chunk_source, metadata=None) -> int:
    """Write a safetensors file without holding the payload in memory.

    chunk_source(name, nbytes) must yield bytes-like objects (anything with the
    buffer protocol: bytes, numpy arrays) whose lengths sum to exactly nbytes.
    Writes to path + ".partial" and renames at the end, so a killed run never
    leaves a truncated file under the final name.  Returns the file size.
    """
    header, offsets, payload = build_header(specs, metadata)
    tmp = str(path) + ".partial"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(header)))
        f.write(header)
        for name, start, end in offsets:
            want = end - start
            got = 0
            for chunk in chunk_source(name, want):
                mv = memoryview(chunk).cast("B")
                got += len(mv)
                if got > want:
                    raise AnchorError(f"{name}: source gave more than {want} bytes")
                f.write(mv)
            if got != want:
                raise AnchorError(f"{name}: source gave {got} bytes, expected {want}")
    size = os.path.getsize(tmp)
    expect = 8 + len(header) + payload
    if size != expect:
        raise AnchorError(f"{tmp}: wrote {size} bytes, expected {expect}")
    os.replace(tmp, path)
    return size


def read_safetensors_header(path):
    """Pure-Python header reader.  Returns (header_len, header_dict, payload_bytes).

    Validates: the header length fits in the file, every tensor's offsets are
    consistent with its dtype and shape, and the tensors tile the payload with
    no gaps or overlaps and cover it exactly.
    """
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise AnchorError(f"{path}: shorter than 8 bytes")
        (hlen,) = struct.unpack("<Q", head)
        if hlen > size - 8 or hlen > 100 * MIB:
            raise AnchorError(f"{path}: header length {hlen} impossible for size {size}")
        header = json.loads(f.read(hlen).decode("utf-8"))
    payload = size - 8 - hlen
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        n = ST_ELEM_SIZE[info["dtype"]]
        for d in info["shape"]:
            n *= d
        s, e = info["data_offsets"]
        if e - s != n:
            raise AnchorError(f"{path}: {name} spans {e - s} bytes, shape needs {n}")
        spans.append((s, e, name))
    spans.sort()
    pos = 0
    for s, e, name in spans:
        if s != pos:
            raise AnchorError(f"{path}: gap or overlap before {name} at {s} (expected {pos})")
        pos = e
    if pos != payload:
        raise AnchorError(f"{path}: tensors cover {pos} bytes, payload is {payload}")
    return hlen, header, payload


# --------------------------------------------------------------------------
# random sources for make-model


def numpy_random_source(dtype: str, seed: int, chunk_bytes: int = CHUNK_BYTES):
    """Random N(0,1) values converted to dtype, produced with numpy."""
    import numpy as np

    rng = np.random.default_rng(seed)
    esize = DTYPES[dtype][1]

    def convert(x):  # x: float32 array
        if dtype == "f32":
            return x
        if dtype == "f16":
            return x.astype(np.float16)
        # bf16: round-to-nearest-even on the top 16 bits of the float32
        u = x.view(np.uint32)
        u = u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
        return (u >> np.uint32(16)).astype(np.uint16)

    def source(name, nbytes):
        left = nbytes // esize
        per = max(1, chunk_bytes // esize)
        while left > 0:
            k = min(per, left)
            yield convert(rng.standard_normal(k, dtype=np.float32))
            left -= k

    return source


def torch_random_source(dtype: str, seed: int, device: str, chunk_bytes: int = CHUNK_BYTES):
    """Random N(0,1) values generated by torch on `device`, copied to host."""
    import torch

    tdtype = getattr(torch, DTYPES[dtype][2])
    esize = DTYPES[dtype][1]
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)

    def source(name, nbytes):
        left = nbytes // esize
        per = max(1, chunk_bytes // esize)
        while left > 0:
            k = min(per, left)
            t = torch.randn(k, device=device, dtype=torch.float32, generator=gen)
            t = t.to(tdtype).cpu().contiguous()
            yield t.view(torch.uint8).numpy()
            left -= k

    return source


def pick_generator(gen: str) -> str:
    if gen != "auto":
        return gen
    try:
        import torch

        if torch.cuda.is_available():
            return "cuda"
    except ImportError:
        pass
    try:
        import numpy  # noqa: F401

        return "numpy"
    except ImportError:
        return "torch-cpu"


def make_model(out: str, gib: float, tensors: int, dtype: str, seed: int = 0,
               gen: str = "auto") -> dict:
    shapes = plan_shapes(gib, tensors, dtype)
    st_dtype = DTYPES[dtype][0]
    specs = [(n, st_dtype, s) for n, s in shapes]
    gen = pick_generator(gen)
    if gen == "numpy":
        source = numpy_random_source(dtype, seed)
    elif gen == "cuda":
        source = torch_random_source(dtype, seed, "cuda")
    elif gen == "torch-cpu":
        source = torch_random_source(dtype, seed, "cpu")
    else:
        raise AnchorError(f"unknown generator {gen!r}")
    rows, cols = shapes[0][1]
    log(f"make-model: {out}: {tensors} tensors [{rows}, {cols}] {dtype}, "
        f"~{gib} GiB, random N(0,1) from {gen}, seed {seed}")
    d = os.path.dirname(os.path.abspath(out))
    os.makedirs(d, exist_ok=True)
    t0 = time.perf_counter()
    size = write_safetensors_stream(out, specs, source, metadata={"format": "pt"})
    secs = time.perf_counter() - t0
    hlen, _, payload = read_safetensors_header(out)
    log(f"make-model: wrote {size} bytes ({payload / GIB:.3f} GiB payload) "
        f"in {secs:.2f} s ({size / secs / 1e9:.2f} GB/s)")
    return {"ok": True, "anchor": "make-model", "path": os.path.abspath(out),
            "bytes": size, "payload_bytes": payload, "tensors": tensors,
            "shape": [rows, cols], "dtype": dtype, "generator": gen,
            "seed": seed, "seconds": round(secs, 3)}


def model_matches(path: str, gib: float, tensors: int, dtype: str) -> bool:
    """True when path is a complete safetensors file with the planned layout."""
    if not os.path.exists(path):
        return False
    try:
        _, header, payload = read_safetensors_header(path)
    except Exception as e:  # noqa: BLE001 - any parse problem means rebuild
        log(f"existing {path} is not usable ({e}); rebuilding")
        return False
    shapes = plan_shapes(gib, tensors, dtype)
    st_dtype = DTYPES[dtype][0]
    for name, shape in shapes:
        info = header.get(name)
        if info is None or info["dtype"] != st_dtype or info["shape"] != shape:
            log(f"existing {path} has a different layout; rebuilding")
            return False
    if len(header) - ("__metadata__" in header) != tensors:
        log(f"existing {path} has extra tensors; rebuilding")
        return False
    return True


# --------------------------------------------------------------------------
# CUDA helpers


def require_cuda():
    try:
        import torch
    except ImportError as e:
        raise AnchorError(f"torch is not importable ({e}); this anchor needs PyTorch with CUDA") from e
    if not torch.cuda.is_available():
        raise AnchorError(
            "torch.cuda.is_available() is False: no usable CUDA device "
            f"(torch {torch.__version__}, built for CUDA {torch.version.cuda}); "
            "this anchor needs a GPU")
    torch.empty(1, device="cuda")  # create the context outside any timed region
    torch.cuda.synchronize()
    return torch


def device_info(torch) -> dict:
    p = torch.cuda.get_device_properties(0)
    return {"device": torch.cuda.get_device_name(0),
            "device_memory_gib": round(p.total_memory / GIB, 2),
            "torch": torch.__version__, "torch_cuda": torch.version.cuda,
            "python": platform.python_version()}


# --------------------------------------------------------------------------
# load-baseline


def warm_read(path: str) -> tuple[int, float]:
    """Read the whole file in 64 MiB chunks, discarding it (fills the page cache)."""
    buf = bytearray(CHUNK_BYTES)
    mv = memoryview(buf)
    total = 0
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(mv)
            if not n:
                break
            total += n
    return total, time.perf_counter() - t0


def load_baseline(path: str, repeat: int = 3) -> dict:
    torch = require_cuda()
    from safetensors.torch import load_file
    import safetensors

    if repeat < 1:
        raise AnchorError("--repeat must be >= 1")
    hlen, header, payload = read_safetensors_header(path)
    names = [k for k in header if k != "__metadata__"]
    log(f"load-baseline: {path}: {len(names)} tensors, {payload / GIB:.3f} GiB payload")
    total, secs = warm_read(path)
    log(f"load-baseline: page-cache warm-up read of {total / GIB:.3f} GiB took "
        f"{secs:.2f} s ({total / secs / 1e9:.2f} GB/s); timed loads read from the page cache")
    times = []
    for r in range(repeat):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        sd = load_file(path, device="cuda")
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        times.append(dt)
        # checks outside the timed region
        if sorted(sd) != sorted(names):
            raise AnchorError(f"load_file returned {len(sd)} tensors, header has {len(names)}")
        got = sum(t.numel() * t.element_size() for t in sd.values())
        if got != payload:
            raise AnchorError(f"loaded {got} bytes, payload is {payload}")
        if any(not t.is_cuda for t in sd.values()):
            raise AnchorError("load_file(device='cuda') returned a tensor not on the GPU")
        if r == 0:
            for name in (names[0], names[-1]):
                if not bool(torch.any(sd[name] != 0)):
                    raise AnchorError(f"{name} is all zeros: the model file is not random")
        log(f"load-baseline: run {r + 1}/{repeat}: {dt * 1e3:.1f} ms, {payload / dt / 1e9:.2f} GB/s")
        del sd
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    med = median(times)
    gbps = payload / med / 1e9
    log(f"load-baseline: median {med * 1e3:.1f} ms -> {gbps:.2f} GB/s "
        f"(DESIGN.md: 4.1 GB/s for 12 GiB on an H100)")
    return {"ok": True, "anchor": "load-baseline", "path": os.path.abspath(path),
            "payload_bytes": payload, "tensors": len(names),
            "safetensors": getattr(safetensors, "__version__", "?"),
            "page_cache_warmed": True, "warm_read_gbps": round(total / secs / 1e9, 3),
            "runs_ms": [round(t * 1e3, 2) for t in times],
            "median_ms": round(med * 1e3, 2), "gbps": round(gbps, 3),
            **device_info(torch)}


# --------------------------------------------------------------------------
# ipc-baseline


def _ipc_child(data_q, ack_q, rounds: int, expect_tensors: int, expect_bytes: int) -> None:
    """Consumer process: times torch's CUDA IPC take-over of a state dict."""
    try:
        t0 = time.perf_counter()
        import torch

        t_import = time.perf_counter() - t0
        t0 = time.perf_counter()
        torch.cuda.init()
        torch.empty(1, device="cuda")
        torch.cuda.synchronize()
        ctx_ms = (time.perf_counter() - t0) * 1e3
        ack_q.put(("ready", {"context_ms": ctx_ms, "import_torch_ms": t_import * 1e3}))
        times = []
        for r in range(rounds):
            t0 = time.perf_counter()
            msg = data_q.get()
            sd = msg["sd"]
            torch.cuda.synchronize()
            dt = (time.perf_counter() - t0) * 1e3
            times.append(dt)
            # checks outside the timed region
            if msg["round"] != r:
                raise AnchorError(f"child got round {msg['round']}, expected {r}")
            if len(sd) != expect_tensors:
                raise AnchorError(f"child got {len(sd)} tensors, expected {expect_tensors}")
            nbytes = sum(t.numel() * t.element_size() for t in sd.values())
            if nbytes != expect_bytes:
                raise AnchorError(f"child got {nbytes} bytes, expected {expect_bytes}")
            if any(not t.is_cuda for t in sd.values()):
                raise AnchorError("child got a tensor that is not on the GPU")
            for name, want in msg["probe"].items():
                got = sd[name].view(-1)[:8].float().cpu().tolist()
                if got != want:
                    raise AnchorError(f"child read {name}[:8]={got}, parent wrote {want}")
            del sd, msg
            torch.cuda.synchronize()
            ack_q.put(("ack", {"round": r, "ms": dt}))
        ack_q.put(("done", {"rounds_ms": times, "context_ms": ctx_ms}))
    except BaseException:  # noqa: BLE001 - report everything to the parent
        try:
            ack_q.put(("error", traceback.format_exc()))
        except Exception:  # noqa: BLE001
            pass
        raise


def _get_or_die(q, proc, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            kind, payload = q.get(timeout=0.5)
        except _queue.Empty:
            if not proc.is_alive():
                raise AnchorError(f"IPC child died (exit code {proc.exitcode}) while waiting for {what}")
            if time.monotonic() > deadline:
                raise AnchorError(f"timed out after {timeout_s:.0f} s waiting for {what}")
            continue
        if kind == "error":
            raise AnchorError(f"IPC child failed:\n{payload}")
        return kind, payload


def ipc_baseline(tensors: int = 256, gib: float = 12.0, repeat: int = 20,
                 timeout_s: float = 300.0) -> dict:
    torch = require_cuda()
    import torch.multiprocessing as tmp

    if repeat < 2:
        raise AnchorError("--repeat must be >= 2 (round 1 is reported separately)")
    shapes = plan_shapes(gib, tensors, "bf16")
    log(f"ipc-baseline: parent builds {tensors} random bf16 CUDA tensors "
        f"{shapes[0][1]} (~{gib} GiB)")
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1234)
    sd = {}
    for name, shape in shapes:
        sd[name] = torch.randn(*shape, device="cuda", dtype=torch.float32,
                               generator=gen).to(torch.bfloat16)
    torch.cuda.synchronize()
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    probe_names = [shapes[0][0], shapes[len(shapes) // 2][0], shapes[-1][0]]
    probe = {n: sd[n].view(-1)[:8].float().cpu().tolist() for n in probe_names}
    if all(v == 0 for vals in probe.values() for v in vals):
        raise AnchorError("parent tensors are zeros")

    ctx = tmp.get_context("spawn")
    data_q = ctx.Queue()
    ack_q = ctx.Queue()
    proc = ctx.Process(target=_ipc_child, args=(data_q, ack_q, repeat, tensors, nbytes),
                       daemon=True)
    proc.start()
    try:
        _, ready = _get_or_die(ack_q, proc, timeout_s, "child start")
        log(f"ipc-baseline: child ready: import torch {ready['import_torch_ms']:.0f} ms, "
            f"CUDA context {ready['context_ms']:.1f} ms")
        for r in range(repeat):
            # The parent holds `sd` for the whole run: PyTorch's CUDA IPC needs
            # the producer to keep the tensors alive while a consumer uses them.
            data_q.put({"round": r, "sd": sd, "probe": probe})
            kind, ack = _get_or_die(ack_q, proc, timeout_s, f"ack of round {r}")
            if kind != "ack" or ack["round"] != r:
                raise AnchorError(f"unexpected message from child: {kind} {ack}")
        kind, done = _get_or_die(ack_q, proc, timeout_s, "final report")
        if kind != "done":
            raise AnchorError(f"unexpected message from child: {kind}")
        proc.join(timeout=60)
        if proc.exitcode != 0:
            raise AnchorError(f"IPC child exited with code {proc.exitcode}")
    finally:
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=10)
    rounds = done["rounds_ms"]
    steady = rounds[1:]
    res = {"p50": percentile(steady, 50), "p99": percentile(steady, 99),
           "min": min(steady), "max": max(steady), "first_round": rounds[0],
           "context_create": ready["context_ms"]}
    res = {k: round(v, 3) for k, v in res.items()}
    res.update({"steady_rounds": len(steady), "tensors": tensors,
                "bytes": nbytes})
    log(f"ipc-baseline: child take-over of {tensors} tensors / {nbytes / GIB:.2f} GiB: "
        f"p50 {res['p50']:.2f} ms, p99 {res['p99']:.2f} ms, min {res['min']:.2f} ms "
        f"over {len(steady)} rounds; first round {res['first_round']:.2f} ms; "
        f"child CUDA context {res['context_create']:.1f} ms "
        f"(DESIGN.md: 53 ms for 256 tensors / 12 GiB on an H100)")
    del sd
    torch.cuda.empty_cache()
    return {"ok": True, "anchor": "ipc-baseline", "ipc_baseline_ms": res,
            "rounds_ms": [round(x, 3) for x in rounds],
            "timed_from": "child: before queue.get() to after torch.cuda.synchronize(), "
                          "includes the parent's put of the same dict after the previous ack",
            **device_info(torch)}


# --------------------------------------------------------------------------
# copy-bandwidth


def _time_copies(torch, fn, warmup: int = 3, iters: int = 10):
    """Returns (event_ms list, wall_ms list) for fn() on the current stream."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev, wall = [], []
    for _ in range(iters):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        wall.append((time.perf_counter() - t0) * 1e3)
        ev.append(s.elapsed_time(e))
    return ev, wall


def copy_bandwidth(mib: int = 1024, iters: int = 10) -> dict:
    torch = require_cuda()
    if mib < 1:
        raise AnchorError("--mib must be >= 1")
    n = mib * MIB
    log(f"copy-bandwidth: {mib} MiB buffers, median of {iters} after 3 warm-up copies")
    src_dev = torch.randint(1, 256, (n,), device="cuda", dtype=torch.uint8)
    dst = torch.empty(n, device="cuda", dtype=torch.uint8)
    host_pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    host_pinned.copy_(src_dev)
    host_page = torch.empty(n, dtype=torch.uint8)
    host_page.copy_(host_pinned)  # touches every page
    if not host_pinned.is_pinned() or host_page.is_pinned():
        raise AnchorError("pinned/pageable host buffers are not what they should be")
    torch.cuda.synchronize()

    def check(what):
        if not torch.equal(dst, src_dev):
            raise AnchorError(f"{what}: destination differs from source")
        dst.zero_()

    out = {}
    ev, wall = _time_copies(torch, lambda: dst.copy_(host_pinned, non_blocking=True), iters=iters)
    check("pinned H2D")
    out["h2d_pinned"] = (n / (median(ev) / 1e3) / 1e9, n / (median(wall) / 1e3) / 1e9)
    ev, wall = _time_copies(torch, lambda: dst.copy_(host_page, non_blocking=True), iters=iters)
    check("pageable H2D")
    out["h2d_pageable"] = (n / (median(ev) / 1e3) / 1e9, n / (median(wall) / 1e3) / 1e9)
    ev, wall = _time_copies(torch, lambda: dst.copy_(src_dev, non_blocking=True), iters=iters)
    check("D2D")
    out["d2d"] = (2 * n / (median(ev) / 1e3) / 1e9, 2 * n / (median(wall) / 1e3) / 1e9)
    for k, (e_, w_) in out.items():
        log(f"copy-bandwidth: {k}: {e_:.1f} GB/s (events), {w_:.1f} GB/s (host clock)")
    log("copy-bandwidth: DESIGN.md: pinned H2D 54.5 GB/s, pageable 7.5 GB/s, D2D 3.0 TB/s (read+write)")
    del src_dev, dst, host_pinned, host_page
    torch.cuda.empty_cache()
    return {"ok": True, "anchor": "copy-bandwidth", "mib": mib,
            "h2d_pinned_gbps": round(out["h2d_pinned"][0], 2),
            "h2d_pageable_gbps": round(out["h2d_pageable"][0], 2),
            "d2d_gbps": round(out["d2d"][0], 1),
            "host_clock_gbps": {k: round(v[1], 2) for k, v in out.items()},
            "d2d_counts": "bytes read + bytes written",
            **device_info(torch)}


# --------------------------------------------------------------------------
# all


def run_all(workdir: str, gib: float, tensors: int = 256, dtype: str = "bf16",
            load_repeat: int = 3, ipc_repeat: int = 20, mib: int = 1024) -> dict:
    torch = require_cuda()
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, f"model-{gib:g}gib-{tensors}t-{dtype}.safetensors")
    results = {}
    if model_matches(path, gib, tensors, dtype):
        log(f"all: reusing {path}")
        results["make_model"] = {"reused": True, "path": path}
    else:
        results["make_model"] = make_model(path, gib, tensors, dtype, seed=0)
    results["load"] = load_baseline(path, repeat=load_repeat)
    results["ipc"] = ipc_baseline(tensors=tensors, gib=gib, repeat=ipc_repeat)
    results["copy"] = copy_bandwidth(mib=mib)
    info = device_info(torch)
    log("all: summary")
    log(f"  device              {info['device']}")
    log(f"  load_file -> cuda   {results['load']['gbps']:.2f} GB/s   (DESIGN.md 4.1)")
    ipc = results["ipc"]["ipc_baseline_ms"]
    log(f"  torch IPC take-over p50 {ipc['p50']:.2f} ms, first {ipc['first_round']:.2f} ms, "
        f"context {ipc['context_create']:.1f} ms   (DESIGN.md 53 ms; context 150-320 ms)")
    log(f"  H2D pinned          {results['copy']['h2d_pinned_gbps']:.1f} GB/s   (DESIGN.md 54.5)")
    log(f"  H2D pageable        {results['copy']['h2d_pageable_gbps']:.1f} GB/s   (DESIGN.md 7.5)")
    log(f"  D2D read+write      {results['copy']['d2d_gbps']:.0f} GB/s   (DESIGN.md 3000)")
    return {"ok": True, "anchor": "all",
            "device": info["device"], "date": now_iso(),
            "load_baseline_gbps": results["load"]["gbps"],
            "ipc_baseline_ms": results["ipc"]["ipc_baseline_ms"],
            "h2d_pinned_gbps": results["copy"]["h2d_pinned_gbps"],
            "h2d_pageable_gbps": results["copy"]["h2d_pageable_gbps"],
            "d2d_gbps": results["copy"]["d2d_gbps"],
            "model": {"path": path, "gib": gib, "tensors": tensors, "dtype": dtype,
                      "payload_bytes": results["load"]["payload_bytes"]},
            "torch": info["torch"], "torch_cuda": info["torch_cuda"],
            "safetensors": results["load"]["safetensors"],
            "load_runs_ms": results["load"]["runs_ms"],
            "ipc_rounds_ms": results["ipc"]["rounds_ms"],
            "copy_host_clock_gbps": results["copy"]["host_clock_gbps"]}


# --------------------------------------------------------------------------
# CLI


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="anchors.py",
        description="Benchmark anchors for modelshare: safetensors loading, PyTorch CUDA IPC, "
                    "copy bandwidth. Each subcommand prints one JSON object as its last stdout line.")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="SUBCOMMAND")

    m = sub.add_parser("make-model", help="write a random safetensors model file",
                       description="Write a safetensors file of about GIB GiB in N random 2-D "
                                   "tensors named layers.{i}.weight, streamed to disk.")
    m.add_argument("--out", required=True, help="output path")
    m.add_argument("--gib", type=float, required=True, help="total payload in GiB")
    m.add_argument("--tensors", type=int, required=True, help="number of tensors")
    m.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--gen", choices=["auto", "cuda", "numpy", "torch-cpu"], default="auto",
                   help="where random values are generated (auto: cuda if available, else numpy)")

    lb = sub.add_parser("load-baseline", help="time safetensors.torch.load_file(device='cuda')",
                        description="Warm the page cache with one read of the file, then time "
                                    "load_file(path, device='cuda') + synchronize; median of R runs.")
    lb.add_argument("--path", required=True)
    lb.add_argument("--repeat", type=int, default=3)

    ip = sub.add_parser("ipc-baseline", help="time PyTorch CUDA IPC take-over of a state dict",
                        description="Parent sends a state dict of random bf16 CUDA tensors through "
                                    "a torch.multiprocessing Queue (spawn) R times; the child times "
                                    "queue.get() to usable tensors.")
    ip.add_argument("--tensors", type=int, default=256)
    ip.add_argument("--gib", type=float, required=True)
    ip.add_argument("--repeat", type=int, default=20)
    ip.add_argument("--timeout", type=float, default=300.0,
                    help="seconds to wait for any single child message")

    cb = sub.add_parser("copy-bandwidth", help="pinned/pageable H2D and D2D copy bandwidth",
                        description="Median of 10 copies after warm-up, timed with CUDA events.")
    cb.add_argument("--mib", type=int, default=1024)

    a = sub.add_parser("all", help="run every anchor and print one combined JSON object",
                       description="make-model (if the file is not there), load-baseline, "
                                   "ipc-baseline, copy-bandwidth.")
    a.add_argument("--workdir", required=True, help="where the model file lives")
    a.add_argument("--gib", type=float, default=12.0)
    a.add_argument("--tensors", type=int, default=256)
    a.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    a.add_argument("--load-repeat", type=int, default=3)
    a.add_argument("--ipc-repeat", type=int, default=20)
    a.add_argument("--mib", type=int, default=1024)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.cmd == "make-model":
            res = make_model(args.out, args.gib, args.tensors, args.dtype, args.seed, args.gen)
        elif args.cmd == "load-baseline":
            res = load_baseline(args.path, args.repeat)
        elif args.cmd == "ipc-baseline":
            res = ipc_baseline(args.tensors, args.gib, args.repeat, args.timeout)
        elif args.cmd == "copy-bandwidth":
            res = copy_bandwidth(args.mib)
        elif args.cmd == "all":
            res = run_all(args.workdir, args.gib, args.tensors, args.dtype,
                          args.load_repeat, args.ipc_repeat, args.mib)
        else:  # argparse prevents this
            raise AnchorError(f"unknown subcommand {args.cmd}")
    except Exception as e:  # noqa: BLE001 - print loudly, then a failing JSON line
        traceback.print_exc()
        sys.stderr.flush()
        log(f"FAILED: {args.cmd}: {e}")
        emit({"ok": False, "anchor": args.cmd, "error": f"{type(e).__name__}: {e}"})
        return 1
    res.setdefault("date", now_iso())
    emit(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
