#!/usr/bin/env python3
"""Public loaders beside modelshare's: one safetensors file onto the GPU, page cache warm.

    python3 bench/loader_anchors.py fastsafetensors --path P [--repeat 3] [--site DIR]
    python3 bench/loader_anchors.py instanttensor --path P [--repeat 3] [--site DIR]

- fastsafetensors (IBM; PyPI): `SafeTensorsFileLoader(None, "cuda:0", nogds=True)` (no GDS on
  the GPU machine: reads into a bounce buffer, then to the device), `add_filenames`,
  `copy_files_to_device`, `get_tensor` for every key; with `FASTSAFETENSORS_ODIRECT=0`
  (buffered reads, from the page cache, as modelshare's warm load) and with its default on a
  disk file system (`O_DIRECT`: from the disk, one run).
- instanttensor (PyPI; used by vLLM and SGLang): `safe_open(P, framework="pt", device=0,
  backend=...)` and every tensor of `f.tensors()`, with `BackendPolicy.BUFFERED` and
  `Backend.MMAP` (page cache), and its default on a disk file system (io_uring `O_DIRECT`: from
  the disk, one run).
The figure compared (`gbps`) is the best page-cache mode's median.

Each run times from the call that opens the file until every tensor is on the device and
`torch.cuda.synchronize()` returned; the tensors' count and bytes are checked against the
file's header. The median of `--repeat` runs, after one read of the file that warms the page
cache, goes out as one JSON line (last on stdout) with `gbps`; a loader that cannot be imported
or fails prints `{"error": ...}` and exits 0, so that the GPU check goes on.

The GPU machine has no network: `scripts/anchor-wheels` downloads the wheels into
gpu-carry/anchor-wheels/ here; gpu/loader_steps.py installs them with
`pip install --no-index --no-deps --target DIR` there and passes `--site DIR`.
"""

import argparse
import gc
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def header_totals(path):
    sys.path.insert(0, HERE)
    import anchors

    _, header, _ = anchors.read_safetensors_header(path)
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    return len(tensors), sum(v["data_offsets"][1] - v["data_offsets"][0] for v in tensors.values())


def warm(path):
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def fastsafetensors_once(path, odirect):
    import torch
    from fastsafetensors import SafeTensorsFileLoader

    os.environ["FASTSAFETENSORS_ODIRECT"] = "1" if odirect else "0"
    t = time.perf_counter()
    loader = SafeTensorsFileLoader(None, "cuda:0", nogds=True)
    try:
        loader.add_filenames({0: [path]})
        bufs = loader.copy_files_to_device()
        tensors = {k: bufs.get_tensor(k) for k in loader.get_keys()}
        torch.cuda.synchronize()
        secs = time.perf_counter() - t
        out = (len(tensors), sum(x.numel() * x.element_size() for x in tensors.values()),
               all(x.is_cuda for x in tensors.values()))
        del tensors
        bufs.close()
    finally:
        loader.close()
    return secs, out


def instanttensor_once(path, backend):
    import torch
    import instanttensor
    from instanttensor import safe_open

    chosen = {"buffered": instanttensor.BackendPolicy.BUFFERED, "mmap": instanttensor.Backend.MMAP,
              "default": None}[backend]
    t = time.perf_counter()
    tensors = {}
    with safe_open(path, framework="pt", device=0, backend=chosen) as f:
        backend = getattr(getattr(f, "backend", None), "name", None)
        for name, x in f.tensors():
            tensors[name] = x
    torch.cuda.synchronize()
    secs = time.perf_counter() - t
    out = (len(tensors), sum(x.numel() * x.element_size() for x in tensors.values()),
           all(x.is_cuda for x in tensors.values()))
    del tensors
    return secs, out, backend


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("loader", choices=["fastsafetensors", "instanttensor"])
    ap.add_argument("--path", required=True)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--site", help="directory the wheels were installed into (prepended to sys.path)")
    args = ap.parse_args()
    if args.site:
        sys.path.insert(0, args.site)
    result = {"anchor": args.loader, "path": args.path}
    try:
        import importlib.metadata

        import torch

        result["version"] = importlib.metadata.version(args.loader)
        want_n, want_bytes = header_totals(args.path)
        # (mode, argument, page cache or not)
        modes = [("buffered", False, True), ("O_DIRECT (its default)", True, False)] \
            if args.loader == "fastsafetensors" else \
            [("buffered", "buffered", True), ("mmap", "mmap", True), ("default", "default", False)]
        result["modes"] = {}
        for mode, flag, cached in modes:
            secs = []
            for _ in range(args.repeat if cached else 1):
                warm(args.path)
                if args.loader == "fastsafetensors":
                    s, (n, nbytes, on_gpu) = fastsafetensors_once(args.path, flag)
                else:
                    s, (n, nbytes, on_gpu), backend = instanttensor_once(args.path, flag)
                    mode_backend = backend
                if (n, nbytes, on_gpu) != (want_n, want_bytes, True):
                    raise RuntimeError(f"loaded {n} tensors, {nbytes} bytes, on GPU {on_gpu}; "
                                       f"the header says {want_n}, {want_bytes}")
                secs.append(s)
                gc.collect()
                torch.cuda.empty_cache()
            result["modes"][mode] = {"runs": secs, "gbps": want_bytes / statistics.median(secs) / 1e9,
                                     "page_cache": cached}
            if args.loader == "instanttensor":
                result["modes"][mode]["backend"] = mode_backend
        result["gbps"] = max(m["gbps"] for m in result["modes"].values() if m["page_cache"])
    except Exception as e:  # noqa: BLE001 - reported, and the check goes on
        result["error"] = f"{type(e).__name__}: {e}"
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
