#!/usr/bin/env python3
"""Where a Python attach's time goes (256-tensor model over CUDA VMM): the attach call alone,
Model.torch() alone on an attached model, and its parts (layout, the arena export, the views).
Starts a CUDA server of --bin with gpu/python_serve.py's "big" model, unless --server names one.

    python3 gpu/attach_profile.py --bin DIR_WITH_modelshare"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

import modelshare


def p50(f, n=300):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        times.append((time.perf_counter() - t0) * 1e3)
    return round(statistics.median(times), 4)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server")
    ap.add_argument("--bin")
    ap.add_argument("--model", default="big")
    a = ap.parse_args()
    server = None
    if a.server is None:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from python_serve import Server, make_big

        root = tempfile.mkdtemp()
        make_big(root)
        server = Server(os.path.abspath(a.bin), root, tempfile.mkdtemp(), "profile")
        server.cli("load", "big", "big")
        a.server = server.address
    torch.zeros(1, device="cuda")
    s = modelshare.Session.open(a.server, name="profile")
    m = s.attach(a.model)
    m.torch()
    native = m._native
    layout = native.layout()
    base = torch.from_dlpack(native.arena())
    typed = base[: base.numel() // 2 * 2].view(torch.bfloat16)
    out = {
        "attach_only": p50(lambda: s.attach(a.model)),
        "attach_native_only": p50(lambda: s._native.attach(a.model, None)),
        "torch_on_attached": p50(lambda: m.torch()),
        "layout": p50(lambda: native.layout()),
        "arena_export": p50(lambda: torch.from_dlpack(native.arena())),
        "as_strided_x256": p50(lambda: [typed.as_strided(shape, (shape[1], 1), off // 2) for _, _, shape, off in layout]),
        "split_x256": p50(lambda: typed[: 256 * layout[0][2][0] * layout[0][2][1]].split(layout[0][2][0] * layout[0][2][1])),
        "from_dlpack_x256": p50(lambda: [torch.from_dlpack(t) for t in native.tensors()], n=50),
    }
    print(json.dumps(out))
    if server is not None:
        server.stop()


if __name__ == "__main__":
    main()
