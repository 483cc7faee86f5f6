#!/usr/bin/env python3
"""Does a second, idle CUDA context on the GPU slow one busy process down, and does MPS?

Issue 29's open question: one MiniLM worker (8 compute slots, one context) serves ~7% less
than the same worker under MPS, where the model-host server's context and the worker's are
one on the GPU. This probe takes the server out: one process runs a MiniLM-shaped encoder
(six layers of its products, GELU and LayerNorm over 10,752 tokens, captured as a CUDA graph)
on 8 streams at once, and its throughput is timed
  - alone;
  - while a second process holds a context (1 GiB allocated, a stream made) and sleeps;
  - the same two under an MPS daemon started here (pipe and logs under a temporary folder).
Each condition runs twice, interleaved, for --seconds each. Prints a table; --json writes it.

    python3 gpu/probe/contexts.py [--seconds 4] [--json out.json]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

TOKENS, HIDDEN, INTER, LAYERS, STREAMS = 10752, 384, 1536, 6, 8


def busy(seconds):
    """The busy process: tokens/s of the multi-stream encoder-shaped graph."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    h, f = HIDDEN, INTER

    def weights():
        return [(torch.randn(h, 3 * h, device=dev, dtype=torch.half) * 0.05,
                 torch.randn(h, h, device=dev, dtype=torch.half) * 0.05,
                 torch.randn(h, f, device=dev, dtype=torch.half) * 0.05,
                 torch.randn(f, h, device=dev, dtype=torch.half) * 0.05) for _ in range(LAYERS)]

    layers = weights()

    def forward(y):
        for wqkv, wo, wup, wdown in layers:
            qkv = y @ wqkv
            a = qkv[:, :h] @ wo
            y = torch.nn.functional.layer_norm(a + y, (h,))
            u = torch.nn.functional.gelu(y @ wup)
            y = torch.nn.functional.layer_norm(u @ wdown + y, (h,))
        return y

    streams = [torch.cuda.Stream() for _ in range(STREAMS)]
    graphs, inputs = [], []
    for s in streams:
        x = torch.randn(TOKENS, h, device=dev, dtype=torch.half)
        with torch.cuda.stream(s):
            forward(x)  # warm: cuBLAS picks its kernels
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            forward(x)
        graphs.append(g)
        inputs.append(x)
    torch.cuda.synchronize()

    def run(rounds):
        for _ in range(rounds):
            for s, g in zip(streams, graphs):
                with torch.cuda.stream(s):
                    g.replay()
        torch.cuda.synchronize()

    run(20)
    t0, rounds = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        run(10)
        rounds += 10
    dt = time.perf_counter() - t0
    return rounds * STREAMS * TOKENS / dt


def idle(ready_path):
    """The idle process: a context with memory and a stream, asleep."""
    import torch

    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    torch.cuda.Stream()
    torch.cuda.synchronize()
    with open(ready_path, "w") as f:
        f.write(str(x.numel()))
    time.sleep(3600)


def measure(env, with_idle, seconds, tmp):
    """One condition: the busy process's tokens/s, with or without the idle one beside it."""
    idle_proc = None
    if with_idle:
        ready = os.path.join(tmp, f"ready-{time.monotonic_ns()}")
        idle_proc = subprocess.Popen([sys.executable, __file__, "--role", "idle", "--ready", ready], env=env)
        deadline = time.monotonic() + 120
        while not os.path.exists(ready):
            if idle_proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the idle process did not start")
            time.sleep(0.2)
    try:
        out = subprocess.run([sys.executable, __file__, "--role", "busy", "--seconds", str(seconds)],
                             env=env, capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            raise RuntimeError(out.stderr[-2000:])
        return float(out.stdout.strip().splitlines()[-1])
    finally:
        if idle_proc is not None:
            idle_proc.kill()
            idle_proc.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", choices=["main", "busy", "idle"], default="main")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--ready")
    ap.add_argument("--json")
    ap.add_argument("--no-mps", action="store_true")
    args = ap.parse_args()
    if args.role == "busy":
        print(busy(args.seconds))
        return
    if args.role == "idle":
        idle(args.ready)
        return
    tmp = tempfile.mkdtemp(prefix="contexts-")
    env = dict(os.environ)
    mps_env = dict(env, CUDA_MPS_PIPE_DIRECTORY=os.path.join(tmp, "pipe"),
                   CUDA_MPS_LOG_DIRECTORY=os.path.join(tmp, "log"))
    conditions = [("alone", env, False), ("+ idle context", env, True)]
    mps = not args.no_mps
    if mps:
        for d in ("pipe", "log"):
            os.makedirs(os.path.join(tmp, d), exist_ok=True)
        subprocess.run(["nvidia-cuda-mps-control", "-d"], env=mps_env, check=True, timeout=30)
        conditions += [("MPS alone", mps_env, False), ("MPS + idle context", mps_env, True)]
    results = {name: [] for name, _, _ in conditions}
    try:
        for _ in range(2):
            for name, e, with_idle in conditions:
                results[name].append(measure(e, with_idle, args.seconds, tmp))
                print(f"{name}: {results[name][-1] / 1e6:.2f} M tokens/s", flush=True)
    finally:
        if mps:
            subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, env=mps_env, timeout=30)
    base = max(results["alone"])
    print(f"\n{STREAMS} streams, {LAYERS} MiniLM-shaped layers over {TOKENS} tokens each, CUDA graphs\n")
    print("| condition | M tokens/s (best of 2) | ÷ alone |")
    print("| --- | ---: | ---: |")
    for name, _, _ in conditions:
        best = max(results[name])
        print(f"| {name} | {best / 1e6:.2f} | {best / base:.3f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
