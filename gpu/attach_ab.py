#!/usr/bin/env python3
"""Attach latency of two builds, measured alternately on the same GPU in one run.

A change to the attach path is judged against the build before it, not against a figure from
another day (attach p50 moves by tens of percent between runs and machines). Each round starts
a server of each build in turn, loads the same model, and runs `gpu_worker attach-bench` of the
same build (1000 attaches: RPC, export on the server, handle opens in the worker); the builds
alternate so that drift of the machine hits both.

    python3 gpu/attach_ab.py --a gpu-carry-old/bin --b gpu-carry/bin --rounds 3 --out "$OUT"

The model (8 GiB of bf16 in 256 tensors by default) is made with bench/anchors.py if missing.
Prints one JSON line per measurement and a table with the median p50 of each build.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check import ROOT, last_json, lib_path  # noqa: E402


def measure(bin_dir, work, env, n):
    bin_dir = os.path.abspath(bin_dir)
    sock = os.path.join(work, "ab.sock")
    address = f"unix:{sock}"
    log = open(os.path.join(work, "ab-server.log"), "w")
    server = subprocess.Popen(
        [f"{bin_dir}/modelshare", "serve", "--backend", "cuda", "--device", "0", "--unix-socket", sock,
         "--handle-socket", os.path.join(work, "ab-handles.sock"), "--model-root", os.path.join(work, "models"),
         "--log-format", "json"], stdout=log, stderr=log, env=env)
    try:
        cli = [f"{bin_dir}/modelshare", "--server", address, "--output", "json"]
        for _ in range(600):
            if os.path.exists(sock) and subprocess.run(cli + ["stats"], capture_output=True, env=env).returncode == 0:
                break
            time.sleep(0.1)
        subprocess.run(cli + ["load", "m", "m"], capture_output=True, env=env, check=True, timeout=300)
        p = subprocess.run([f"{bin_dir}/gpu_worker", "attach-bench", "--model", "m", "--n", str(n), "--server", address],
                           capture_output=True, text=True, env=env, timeout=600)
        return last_json(p.stdout) or {"error": p.stderr[-500:]}
    finally:
        server.terminate()
        server.wait(timeout=60)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="bin folder of the first build (the anchor)")
    ap.add_argument("--b", required=True, help="bin folder of the second build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--gib", type=float, default=8)
    ap.add_argument("--work", default="/tmp/gpu-check")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/attach-ab"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    model = os.path.join(args.work, "models", "m", "model.safetensors")
    if not os.path.exists(model):
        os.makedirs(os.path.dirname(model), exist_ok=True)
        subprocess.run([sys.executable, os.path.join(ROOT, "bench", "anchors.py"), "make-model", "--out", model,
                        "--gib", str(args.gib), "--tensors", "256", "--dtype", "bf16"], check=True, timeout=900)
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = lib_path() + ":" + env.get("LD_LIBRARY_PATH", "")
    results = {"a": [], "b": []}
    for r in range(args.rounds):
        for name, bin_dir in (("a", args.a), ("b", args.b)):
            m = measure(bin_dir, args.work, env, args.n)
            m.update(round=r, build=name, bin=bin_dir)
            print(json.dumps(m), flush=True)
            results[name].append(m)
    lines = ["| build | p50 ms per round | median p50 ms | median p99 ms |", "| --- | --- | ---: | ---: |"]
    for name, bin_dir in (("a", args.a), ("b", args.b)):
        p50 = [m.get("p50_ms", float("nan")) for m in results[name]]
        p99 = [m.get("p99_ms", float("nan")) for m in results[name]]
        lines.append(f"| {name}: {bin_dir} | {', '.join(f'{x:.3f}' for x in p50)} | {statistics.median(p50):.3f} | "
                     f"{statistics.median(p99):.3f} |")
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(args.out, "attach-ab.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, "attach-ab.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
