#!/usr/bin/env python3
"""Where a Python attach's time goes (256-tensor model over CUDA VMM): the attach call alone,
Model.torch() alone on an attached model, and its parts (the plan, the arena export, the views),
and the SDK's phases (the Attach call, the descriptor's redemption, the import) from its trace.
Starts a CUDA server of --bin with gpu/python_serve.py's "big" model, unless --server names one.

    python3 gpu/attach_profile.py --bin DIR_WITH_modelshare"""
import argparse
import gc
import json
import os
import re
import subprocess
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


def phases(log: str) -> dict[str, float]:
    """p50 of each phase the SDK's (and the binding's) trace log names, the first 10 left out."""
    found: dict[str, list[int]] = {}
    for line in log.splitlines():
        for key in ("rpc_us", "redeem_us", "import_us", "mapped_us", "binding_us"):
            match = re.search(key + r"=(\d+)", line)
            if match:
                found.setdefault(key, []).append(int(match.group(1)))
    return {k: statistics.median(v[10:]) for k, v in found.items() if len(v) > 10}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server")
    ap.add_argument("--bin")
    ap.add_argument("--model", default="big")
    ap.add_argument("--phases", action="store_true", help="(the child) attach 300 times, tracing")
    a = ap.parse_args()
    if a.phases:
        torch.zeros(1, device="cuda")
        s = modelshare.Session.open(a.server, name="phases")
        for _ in range(310):
            s.attach(a.model).torch()
        s.close()
        return
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
    runs, order = native.runs()
    base = torch.from_dlpack(native.arena())
    typed = base[: base.numel() // 2 * 2].view(torch.bfloat16)
    dtype, shape, strides, first, step, names = max(runs, key=lambda r: len(r[5]))
    stacked = (len(names), *shape), (step, *strides), first

    def unbind():
        return typed.as_strided(*stacked).unbind(0)

    def unbind_inference():
        with torch.inference_mode():
            return typed.as_strided(*stacked).unbind(0)

    def loop(keep: bool, n: int = 300) -> dict:
        """The bench's loop (attach, then torch(), timed apart), each model dropped after its
        timing (its lease released in the background, its mapping unmapped at once) or kept."""
        kept, attach, views, both = [], [], [], []
        for _ in range(n):
            t0 = time.perf_counter()
            model = s.attach(a.model)
            t1 = time.perf_counter()
            tensors = model.torch()
            t2 = time.perf_counter()
            attach.append((t1 - t0) * 1e3)
            views.append((t2 - t1) * 1e3)
            both.append((t2 - t0) * 1e3)
            if keep:
                kept.append((model, tensors))
            del model, tensors
        del kept
        gc.collect()
        return {k: round(statistics.median(v), 4) for k, v in (("attach", attach), ("torch", views), ("both", both))}

    def fresh(stream: bool, n: int = 200) -> dict:
        """torch()'s steps on a freshly attached model each time: the plan, the arena's export
        (the consumer's stream made to wait on the ready event, or not), the views."""
        parts: dict[str, list[float]] = {}
        for _ in range(n):
            model = s.attach(a.model)
            nat = model._native
            t0 = time.perf_counter()
            r, _ = nat.runs()
            t1 = time.perf_counter()
            if stream:
                b = torch.from_dlpack(nat.arena())
            else:
                b = torch.utils.dlpack.from_dlpack(nat.arena().__dlpack__(max_version=(1, 0)))
            t2 = time.perf_counter()
            ty = b[: b.numel() // 2 * 2].view(torch.bfloat16)
            for _dt, shp, st, fst, stp, nms in r:
                ty.as_strided((len(nms), *shp), (stp, *st), fst).unbind(0)
            t3 = time.perf_counter()
            for k, v in (("plan", t1 - t0), ("export", t2 - t1), ("views", t3 - t2)):
                parts.setdefault(k, []).append(v * 1e3)
            del model, nat, b, ty
        return {k: round(statistics.median(v), 4) for k, v in parts.items()}

    out = {
        "fresh_stream": fresh(True),
        "fresh_no_stream": fresh(False),
        "fresh_stream_again": fresh(True),
        "runs": len(runs),
        "loop_drop": loop(False),
        "loop_keep": loop(True, n=100),
        "loop_drop_again": loop(False),
        "torch_on_attached": p50(lambda: m.torch()),
        "plan": p50(lambda: native.runs()),
        "arena_export": p50(lambda: torch.from_dlpack(native.arena())),
        f"unbind_x{len(names)}": p50(unbind),
        f"unbind_inference_x{len(names)}": p50(unbind_inference),
        "from_dlpack_x256": p50(lambda: [torch.from_dlpack(t) for t in native.tensors()], n=50),
    }
    # The SDK's own phases (its trace log), in a child that attaches n times.
    env = dict(os.environ, MODELSHARE_LOG="modelshare_worker=trace,modelshare_python=trace")
    child = subprocess.run([sys.executable, os.path.abspath(__file__), "--phases", "--server", a.server,
                            "--model", a.model], env=env, capture_output=True, text=True, timeout=300)
    out["python_phases_p50_us"] = phases(child.stderr)
    if a.bin:
        # The Rust SDK's own bench, the same phases from its log, and its p50 untraced.
        bench = [os.path.join(a.bin, "gpu_worker"), "attach-bench", "--model", a.model, "--n", "300",
                 "--server", a.server]
        child = subprocess.run(bench, env=env, capture_output=True, text=True, timeout=300)
        out["rust_phases_p50_us"] = phases(child.stderr)
        for key in ("rust_untraced", "python_untraced", "rust_untraced_again"):
            if key.startswith("rust"):
                child = subprocess.run(bench, capture_output=True, text=True, timeout=300)
                out[key] = json.loads([ln for ln in child.stdout.splitlines() if ln.startswith("{")][-1])["p50_ms"]
            else:
                out[key] = loop(False)
    print(json.dumps(out))
    if server is not None:
        server.stop()


if __name__ == "__main__":
    main()
