#!/usr/bin/env python3
"""The multi-GPU part of the GPU check (needs 2 GPUs): device selection and renumbering.

  python3 gpu/multi_gpu.py --bin gpu-carry/bin --out "$OUT"

- `--backend auto --device 1` picks CUDA and the second GPU (GetStats names it by UUID);
- a worker started with CUDA_VISIBLE_DEVICES=1 sees that GPU as its ordinal 0, finds it by the
  UUID in the attach reply, and computes correctly on it;
- a worker that cannot see the GPU (CUDA_VISIBLE_DEVICES=0) fails with an error naming the UUID;
- `--device 9` fails at start with an error naming the device.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check import last_json, lib_path  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="gpu-carry/bin")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/multi-gpu-out"))
    ap.add_argument("--work", default="/tmp/multi-gpu")
    args = ap.parse_args()
    b = os.path.abspath(args.bin)
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    env = dict(os.environ, LD_LIBRARY_PATH=lib_path())
    env.pop("CUDA_VISIBLE_DEVICES", None)
    rows = []

    def row(name, ok, text):
        rows.append((name, "PASS" if ok else "FAIL", text))
        print(f"[{'PASS' if ok else 'FAIL'}] {name}: {text}", flush=True)

    gpus = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,name", "--format=csv,noheader"], capture_output=True,
                          text=True).stdout.strip().splitlines()
    uuids = [g.split(",")[1].strip() for g in gpus]
    print("\n".join(gpus), flush=True)
    if len(uuids) < 2:
        row("gpus", False, f"{len(uuids)} GPU(s): this check needs 2")
        return 1
    model = os.path.join(args.work, "models", "m", "model.safetensors")
    if not os.path.exists(model):
        subprocess.run([sys.executable, os.path.join(ROOT, "bench", "anchors.py"), "make-model", "--out", model, "--gib", "1",
                        "--tensors", "16", "--dtype", "bf16"], check=True, env=env)
    sock = os.path.join(args.work, "grpc.sock")
    addr = f"unix:{sock}"
    log = open(os.path.join(args.out, "multi-gpu-server.log"), "w")
    srv = subprocess.Popen([f"{b}/modelshare", "serve", "--backend", "auto", "--device", "1", "--unix-socket", sock,
                            "--handle-socket", os.path.join(args.work, "h.sock"), "--model-root",
                            os.path.join(args.work, "models"), "--log-format", "json", "--load-threads", "8"],
                           stdout=log, stderr=log, env=env)
    cli = lambda *a: subprocess.run([f"{b}/modelshare", "--server", addr, "--output", "json", *a],  # noqa: E731
                                    capture_output=True, text=True, env=env)
    try:
        for _ in range(600):
            p = cli("stats")
            if p.returncode == 0:
                break
            time.sleep(0.1)
        stats = last_json(p.stdout) or {}
        dev = stats.get("device", {})
        row("auto + --device 1", dev.get("backend") == "cuda-ipc" and dev.get("uuid") == uuids[1],
            f"backend {dev.get('backend')}, device {dev.get('uuid')} (GPU 1 is {uuids[1]})")
        cli("load", "m", "m")
        w = subprocess.run([f"{b}/gpu_worker", "check", "--server", addr, "--model", "m"], capture_output=True, text=True,
                           env=dict(env, CUDA_VISIBLE_DEVICES="1"))
        r = last_json(w.stdout) or {}
        row("remapped worker", bool(r.get("ok")),
            f"CUDA_VISIBLE_DEVICES=1 (the server's GPU 1 is this worker's ordinal 0): {r.get('matrices')} GEMVs and "
            f"{r.get('ms64_checked')} device checksums correct: {r.get('ok')}")
        w = subprocess.run([f"{b}/gpu_worker", "check", "--server", addr, "--model", "m"], capture_output=True, text=True,
                           env=dict(env, CUDA_VISIBLE_DEVICES="0"))
        r = last_json(w.stdout) or {}
        err = r.get("error", "")
        row("invisible device", w.returncode != 0 and uuids[1] in err, f"CUDA_VISIBLE_DEVICES=0: {err[:160]}")
    finally:
        srv.send_signal(signal.SIGTERM)
        rc = srv.wait(timeout=60)
    row("shutdown", rc == 0, f"exit {rc}")
    bad = subprocess.run([f"{b}/modelshare", "serve", "--backend", "cuda", "--device", "9", "--unix-socket",
                          os.path.join(args.work, "bad.sock"), "--handle-socket", os.path.join(args.work, "bad-h.sock")],
                         capture_output=True, text=True, env=env, timeout=60)
    row("bad device", bad.returncode != 0 and "'9'" in bad.stderr and "panicked" not in bad.stderr,
        bad.stderr.strip().splitlines()[-1][:200] if bad.stderr.strip() else "(no message)")
    text = "| check | result | figures |\n| --- | --- | --- |\n" + "\n".join(f"| {n} | {s} | {t} |" for n, s, t in rows)
    print("\n" + text, flush=True)
    open(os.path.join(args.out, "multi-gpu.md"), "w").write(text + "\n")
    return 0 if all(s == "PASS" for _, s, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
