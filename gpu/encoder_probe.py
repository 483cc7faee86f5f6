#!/usr/bin/env python3
"""Where the Python encoder worker's batch time goes, beside the same ``Encoder`` alone (issue
27's throughput row): the same 64-sentence batches of MiniLM's shape (random f16 weights),

  file       ``Encoder`` over ``safetensors.torch.load_file`` tensors, in the main thread (the
             row's anchor);
  attached   ``Encoder`` over ``model.torch()`` of the server's copy, main thread;
  gc frozen  the same after ``gc.freeze()``;
  child      the attached loop in a process of its own, alone and beside the door's load;
  door cN    the encoder worker through ``/v1/embeddings`` (8 clients x 64 sentences) with
             concurrency N, its own ``--stats`` (handler, model and GPU time per batch) and the
             CPU seconds of its threads, the server's and the clients'.
  profiles   torch.profiler's CPU time per operator over 40 batches: the file loop in the main
             thread; the same loop run inside a serving worker's handler thread (``selfloop``,
             no door traffic); and 40 of that worker's batches under the door's load
             (``door``): which operators get slower in the worker, and where.

Run on the GPU machine, with the carry of ``scripts/gpu-python``:
    python3 gpu/encoder_probe.py --carry gpu-carry/pyserve --minilm gpu-carry/minilm-files --out "$OUT"
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "workers", "python"))

import python_serve as ps  # noqa: E402
from check import cpu_seconds  # noqa: E402


PROFILED = int(os.environ.get("PROBE_PROFILED", "40"))  # batches profiled (fewer for a dry run)


def profile_of(prof) -> dict:
    """Self CPU microseconds and calls of the top operators in a finished torch.profiler run."""
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:25]
    return {e.key: {"calls": e.count, "self_us": round(e.self_cpu_time_total), "per_call_us":
                    round(e.self_cpu_time_total / max(1, e.count), 2)} for e in rows}


def profiled_loop(encoder, pool: list[str], batch: int = 64) -> dict:
    """The loop's figures, then ``PROFILED`` batches of it under torch.profiler (CPU)."""
    import torch

    result = ps.alone_pass(encoder, pool, batch, gpu_times=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for i in range(0, PROFILED * batch, batch):
            encoder.embed_ids(sorted(encoder.tokenize(pool[i:i + batch]), key=len))
    result["profile"] = profile_of(prof)
    return result


def profiling_worker(args: argparse.Namespace) -> int:
    """A serving encoder worker (the encoder worker's own handler) that, on its first batch, runs
    the profiled loop in its handler thread (``selfloop``), then profiles its batches
    ``PROFILED`` to ``2 * PROFILED`` under the door's load; writes both to ``--report``."""
    import modelshare
    import torch
    from encoder_worker import Encoder, handler_for

    pool = ps.sentences(args.sentences)
    report: dict = {}
    state = {"n": 0, "prof": None}

    def on_version(model):
        encoder = Encoder(model.metadata, model.torch())
        inner = handler_for(encoder)

        def handle(batch):
            n = state["n"]
            state["n"] += 1
            if n == 0:
                report["selfloop"] = profiled_loop(encoder, pool)
            if n == PROFILED:
                state["prof"] = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
                state["prof"].__enter__()
            try:
                return inner(batch)
            finally:
                if n == 2 * PROFILED - 1 and state["prof"] is not None:
                    state["prof"].__exit__(None, None, None)
                    report["door"] = {"profile": profile_of(state["prof"])}
                    with open(args.report, "w") as f:
                        json.dump(report, f)

        return handle

    with modelshare.Session.open(args.server, name="probe-worker") as session:
        session.serve("minilm", on_version=on_version, credits=2, concurrency=args.concurrency,
                      max_batch_items=64, inputs=[("text", "BYTES", [-1])], outputs=[("embedding", "FP32", [-1])])
    return 0


def attached_child(args: argparse.Namespace) -> int:
    """In a process of its own (the environment the parent gives it): the attached loop."""
    import modelshare
    from encoder_worker import Encoder

    pool = ps.sentences(args.sentences)
    with modelshare.Session.open(args.server, name="probe-child") as session:
        model = session.attach("minilm")
        encoder = Encoder(model.metadata, model.torch())
        encoder.embed(pool[:64])
        print("ready", flush=True)
        before = thread_cpu(os.getpid())
        result = ps.alone_pass(encoder, pool, gpu_times=True)
        after = thread_cpu(os.getpid())
        busy = {k: round(v - before.get(k, 0.0), 2) for k, v in after.items()}
        result["threads_s"] = dict(sorted(((k, v) for k, v in busy.items() if v >= 0.02), key=lambda kv: -kv[1]))
        print(json.dumps(result), flush=True)
    return 0


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of each thread of process ``pid`` so far, by ``name/tid``."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
            fields = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
            out[f"{name}/{tid}"] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            continue
    return out


def in_thread(fn):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", fn()))
    t.start()
    t.join()
    return out["r"]


def compare_profiles(results: dict) -> None:
    """Per-call self CPU time of the file loop's top operators beside the worker's."""
    runs = [k for k in ("file", "worker_selfloop", "worker_door") if "profile" in results.get(k, {})]
    if not runs:
        return
    base = results[runs[0]]["profile"]
    print("operator | " + " | ".join(f"{r} us/call (calls)" for r in runs))
    for op in list(base)[:20]:
        cells = []
        for r in runs:
            e = results[r]["profile"].get(op)
            cells.append(f"{e['per_call_us']} ({e['calls']})" if e else "-")
        print(f"{op[:40]} | " + " | ".join(cells))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--carry", default="gpu-carry/pyserve")
    ap.add_argument("--minilm", default="gpu-carry/minilm-files")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/encoder-probe"))
    ap.add_argument("--bin")
    ap.add_argument("--sentences", type=int, default=12000)
    ap.add_argument("--role", default="main", help="main, or 'attached' (a child: the attached loop, printed)")
    ap.add_argument("--server")
    ap.add_argument("--report", help="--role worker: where its profiles go")
    ap.add_argument("--concurrency", type=int, default=1, help="--role worker: its concurrency")
    ap.add_argument("--backend", default="cuda", choices=["cuda", "host"],
                    help="host: a dry run without a GPU (with --bin target/debug)")
    ap.add_argument("--skip", default="", help="parts to leave out: gc,child,door")
    args = ap.parse_args()
    if args.role == "attached":
        return attached_child(args)
    if args.role == "worker":
        return profiling_worker(args)
    skip = set(args.skip.split(","))
    ps.BACKEND[0] = args.backend
    os.makedirs(args.out, exist_ok=True)
    ps.setup(args)
    import modelshare
    import torch
    from encoder_worker import Encoder
    from safetensors.torch import load_file

    root = tempfile.mkdtemp(prefix="probe-")
    folder = os.path.join(root, "minilm")
    shutil.copytree(args.minilm, folder)
    ps.random_weights(folder)
    files = {os.path.relpath(os.path.join(d, f), folder): open(os.path.join(d, f), "rb").read()
             for d, _, fs in os.walk(folder) for f in fs if f.endswith(".json")}
    pool = ps.sentences(args.sentences)
    cuda = ps.BACKEND[0] == "cuda"
    results: dict = {"device": torch.cuda.get_device_name(0) if cuda else "cpu (host backend dry run)"}
    file_encoder = Encoder(files, load_file(os.path.join(folder, "model.safetensors"),
                                            device="cuda:0" if cuda else "cpu"))
    results["file"] = profiled_loop(file_encoder, pool)
    server = ps.Server(args.bin, root, args.out, "probe")
    try:
        server.cli("load", "minilm", "minilm")
        with modelshare.Session.open(server.address, name="probe") as session:
            model = session.attach("minilm")
            attached = Encoder(model.metadata, model.torch())
            results["attached"] = ps.alone_pass(attached, pool, gpu_times=True)
            if "gc" not in skip:
                import gc

                gc.collect()
                gc.freeze()
                results["attached_gc_frozen"] = ps.alone_pass(attached, pool, gpu_times=True)
            del attached, model
        # The profiling worker: the loop in its handler thread, then 40 door batches profiled.
        report = os.path.join(args.out, "worker-profile.json")
        log = os.path.join(args.out, "profiling-worker.log")
        worker = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--role", "worker", "--server",
                                   server.address, "--sentences", str(args.sentences), "--report", report,
                                   "--carry", args.carry], stdout=open(log, "w"), stderr=subprocess.STDOUT)
        server.wait_serving("probe-worker", 1)
        server.embed("minilm", pool[:8], timeout=300)  # the selfloop runs inside this batch
        ps.door_throughput(server, "minilm", pool, 8, 64)
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
        if os.path.exists(report):
            results.update({f"worker_{k}": v for k, v in json.load(open(report)).items()})
        else:
            results["worker_error"] = open(log).read()[-800:]
        time.sleep(1)
        # The attached loop in a child process, with and without the library path the door's
        # worker is started with.
        for env_name, env in (() if "child" in skip else (("plain", dict(os.environ)),)):
            child = subprocess.run([sys.executable, os.path.abspath(__file__), "--role", "attached", "--server",
                                    server.address, "--sentences", str(args.sentences), "--carry", args.carry],
                                   capture_output=True, text=True, env=env, timeout=300)
            lines = [ln for ln in child.stdout.splitlines() if ln.startswith("{")]
            results[f"child_{env_name}"] = json.loads(lines[-1]) if lines else {"error": child.stderr[-500:]}
        for concurrency, env_name in (() if "door" in skip else ((1, "plain"), (2, "plain"))):
            log = os.path.join(args.out, f"encoder-c{concurrency}-{env_name}.log")
            env = dict(os.environ, MODELSHARE_LOG="info")
            worker = subprocess.Popen(
                [sys.executable, os.path.join(ps.ROOT, "workers", "python", "encoder_worker.py"), "--model", "minilm",
                 "--server", server.address, "--name", "minilm", "--credits", "2", "--concurrency", str(concurrency),
                 "--max-batch-items", "64", "--stats"],
                stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
            server.wait_serving("minilm", 1)
            # Beside the first door run: the attached loop in a process of its own, at the same
            # time (does the load slow the machine, or only the worker?).
            beside = None
            if concurrency == 1 and env_name == "plain":
                beside = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--role", "attached", "--server",
                                           server.address, "--sentences", str(args.sentences), "--carry", args.carry],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                while beside.stdout.readline().strip() != "ready" and beside.poll() is None:
                    pass
            cpu0 = cpu_seconds(server.proc.pid), cpu_seconds(worker.pid), resource.getrusage(resource.RUSAGE_CHILDREN)
            threads0 = thread_cpu(worker.pid)
            door, mean_batch = ps.door_throughput(server, "minilm", pool, 8, 64)
            threads1 = thread_cpu(worker.pid)
            cpu1 = cpu_seconds(server.proc.pid), cpu_seconds(worker.pid), resource.getrusage(resource.RUSAGE_CHILDREN)
            busy = {k: round(v - threads0.get(k, 0.0), 2) for k, v in threads1.items()}
            busy = dict(sorted(((k, v) for k, v in busy.items() if v >= 0.02), key=lambda kv: -kv[1]))
            clients = (cpu1[2].ru_utime + cpu1[2].ru_stime) - (cpu0[2].ru_utime + cpu0[2].ru_stime)
            cpu = {"server_s": cpu1[0] - cpu0[0], "worker_s": cpu1[1] - cpu0[1], "clients_s": clients,
                   "worker_threads_s": busy}
            if beside is not None:
                out, err = beside.communicate(timeout=300)
                lines = [ln for ln in out.splitlines() if ln.startswith("{")]
                results["child_beside_door"] = json.loads(lines[-1]) if lines else {"error": err[-500:]}
            worker.send_signal(signal.SIGTERM)
            worker.wait(60)
            stats = [ln.split("stats: ", 1)[1].strip() for ln in open(log) if "stats: " in ln]
            results[f"door_c{concurrency}_{env_name}"] = {"per_s": door, "mean_batch": mean_batch, "cpu": cpu,
                                               "worker_stats": stats[-1] if stats else None}
            time.sleep(1)
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    with open(os.path.join(args.out, "encoder-probe.json"), "w") as f:
        json.dump(results, f, indent=1)
    for k, v in results.items():
        if isinstance(v, dict):
            v = {a: b for a, b in v.items() if a != "profile"}
        print(k, json.dumps(v) if isinstance(v, dict) else v)
    compare_profiles(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
