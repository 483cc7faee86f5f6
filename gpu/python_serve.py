#!/usr/bin/env python3
"""Python workers on a GPU (issue 27's GPU rows), against the carried wheel and a CUDA server:

  memory      N Python workers serving one model hold its weights once: device memory is
              W + N x (a torch process's context), not N x W; their answers are the file's
  pointers    each worker's torch tensors lie in the one imported mapping, at the native
              tensors' addresses
  write       a worker writing into a VMM-backed tensor fails alone: the others still answer
              right, the server stays ready, the weights' checksums hold, its session ends
  loading     a version attached while it loads: Model.torch() returns at once (the consumer's
              stream waits on the device for the ready event) and the values read are the file's
  attach      attach p50 from Python (the call to a ready dict of torch tensors) against the
              Rust SDK's (gpu_worker attach-bench), 256 tensors over CUDA VMM, alternated
  restart     a worker holding the views the two-step attach made while the server is killed
              and restarted: after the re-attach its views still read the same (their mapping
              kept alive by them) and torch() gives views of the new mapping
  parity      workers/python/encoder_worker.py on all-MiniLM-L6-v2 (f16) through /v1/embeddings
              against sentence-transformers on the same folder, mixed sentences
  throughput  that worker through the front door (8 client processes x 64 mixed sentences per
              request) against the same Encoder code alone in one process on the same
              sentences, in turn for --rounds rounds, medians compared; MiniLM and a
              BERT-base-sized model (random f16 weights, compute-bound); other loads once each

    python3 gpu/python_serve.py --carry gpu-carry/pyserve --minilm gpu-carry/minilm-files --out $OUT
        [--only memory,write,attach,parity,throughput]

--carry holds modelshare.xz and gpu_worker.xz (release, xz), the wheel, and wheels/ (the
sentence-transformers wheel, installed without dependencies when missing). Writes
python-serve.json and python-serve.md under --out; exit 0 when every row run passes.
"""

from __future__ import annotations

import argparse
import glob
import json
import lzma
import multiprocessing
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "workers", "python"))
from check import lib_path  # noqa: E402

#: The server's backend: cuda here; host for a dry run of the encoder rows on a machine without
#: a GPU (--backend host --bin target/debug).
BACKEND = ["cuda"]
ROWS = ("memory", "pointers", "write", "attach", "loading", "restart", "parity", "throughput")
WORKERS = 4
BIG_TENSORS = 256
BIG_BYTES = 2 << 30
MIXED = ["hello world", "", "日本語のテキスト 🎉", "word " * 400, "Ünïcödé façade — naïve café", "👨‍👩‍👧‍👦 🇯🇵",
         "مرحبا بالعالم", "Привет мир", "a", "The quick brown fox jumps over the lazy dog. " * 5,
         "Shared weights, many workers, one copy.", "x" * 3000]


def log(msg: str) -> None:
    print(f"[python-serve] {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def smi_used() -> int:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                         capture_output=True, text=True).stdout
    return int(out.split()[0])


def sentences(n: int, seed: int = 27) -> list[str]:
    """Mixed English-like sentences of 4 to 100 words (a fixed draw)."""
    import random

    rng = random.Random(seed)
    words = ("model weights shared memory worker server tensor request answer token batch device "
             "the a of to and in is was for on with as by at from it this that be are have not").split()
    return [" ".join(rng.choice(words) for _ in range(rng.choice([4, 8, 12, 20, 32, 50, 100]))).capitalize() + "."
            for _ in range(n)]


class Server:
    def __init__(self, bin_dir: str, root: str, out: str, tag: str, *extra: str) -> None:
        self.bin, self.root = bin_dir, root
        self.tmp = tempfile.mkdtemp(prefix=f"pyserve-{tag}-")
        self.sock = os.path.join(self.tmp, "grpc.sock")
        self.address = f"unix:{self.sock}"
        self.http = f"http://127.0.0.1:{free_port()}"
        self.metrics = f"http://127.0.0.1:{free_port()}"
        self.out, self.tag = out, tag
        self.argv = [f"{bin_dir}/modelshare", "serve", "--backend", BACKEND[0], "--model-root", root,
                     "--unix-socket", self.sock, "--handle-socket", os.path.join(self.tmp, "h.sock"),
                     "--http-listen", self.http.removeprefix("http://"),
                     "--metrics-listen", self.metrics.removeprefix("http://"), "--no-worker-wait-ms", "10000", *extra]
        self.start(f"server-{tag}.log")

    def start(self, log_name: str) -> None:
        self.log = open(os.path.join(self.out, log_name), "w")
        env = dict(os.environ, LD_LIBRARY_PATH=lib_path())
        self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + 60
        while not self.ready():
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"the server did not start (see {log_name})")
            time.sleep(0.1)

    def kill_and_restart(self) -> None:
        """kill -9, then the same command line again (its workers keep their mappings, and the
        new server adopts the memory they offer)."""
        self.proc.kill()
        self.proc.wait(timeout=30)
        self.start(f"server-{self.tag}-restarted.log")

    def cli(self, *args: str) -> str:
        return subprocess.run([f"{self.bin}/modelshare", *args, "--server", self.address], capture_output=True,
                              text=True, check=True, timeout=300).stdout

    def ready(self) -> bool:
        return subprocess.run([f"{self.bin}/modelshare", "ready", "--server", self.address],
                              capture_output=True).returncode == 0

    def serving(self, name: str) -> int:
        ss = json.loads(self.cli("ps", "--output", "json"))["sessions"]
        return sum(1 for s in ss if s["worker_name"] == name and s["serving"])

    def sessions(self, name: str) -> int:
        return sum(1 for s in json.loads(self.cli("ps", "--output", "json"))["sessions"] if s["worker_name"] == name)

    def wait_serving(self, name: str, n: int, timeout: float = 180) -> None:
        deadline = time.time() + timeout
        while self.serving(name) < n:
            if time.time() > deadline:
                raise RuntimeError(f"{n} worker(s) {name} not serving in {timeout} s")
            time.sleep(0.2)

    def embed(self, model: str, texts: list[str], timeout: float = 60) -> list[list[float]]:
        body = json.dumps({"model": model, "input": texts}).encode()
        req = urllib.request.Request(f"{self.http}/v1/embeddings", body, {"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return [d["embedding"] for d in json.load(r)["data"]]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# --- worker roles (run as subprocesses of this script) ---------------------------------------

def role_worker(args: argparse.Namespace) -> int:
    """Attaches the big model, reports where its torch tensors lie, then serves: a text's answer
    is t000's first 8 values (as f32) plus the text's length, computed on the GPU."""
    import torch

    import modelshare

    with modelshare.Session.open(args.server, name=args.name) as session:
        model = session.attach(args.model)
        tensors = model.torch()
        native = {t.name: t.data_ptr for t in model._native.tensors()}
        arena = model._native.arena()
        inside = all(arena.data_ptr <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size()
                     <= arena.data_ptr + arena.byte_length for t in tensors.values())
        report = {"pid": os.getpid(), "devices": sorted({str(t.device) for t in tensors.values()}),
                  "same_pointers": all(t.data_ptr() == native[n] for n, t in tensors.items()),
                  "inside_one_mapping": inside, "read_only": model.read_only, "tensors": len(tensors)}
        with open(os.path.join(args.out, f"worker-{os.getpid()}.json"), "w") as f:
            json.dump(report, f)
        first = tensors["t000"]

        def handle(batch):
            base = first.reshape(-1)[:8].float()
            return [{"embedding": (base + len(t or "")).cpu().numpy()} for t in batch.texts]

        session.serve(model, handle, credits=2)
    return 0


def role_writer(args: argparse.Namespace) -> int:
    import torch

    import modelshare

    report: dict = {}
    try:
        with modelshare.Session.open(args.server, name="writer") as session:
            model = session.attach(args.model)
            t = model.torch(["t000"])["t000"]
            report["attached"] = True
            t.add_(1)
            torch.cuda.synchronize()
            report["wrote"] = True
    except Exception as e:  # noqa: BLE001 - the point of the row
        report["error"] = f"{type(e).__name__}: {e}"[:300]
    with open(os.path.join(args.out, "writer.json"), "w") as f:
        json.dump(report, f)
    sys.stdout.flush()
    os._exit(2 if "error" in report else 0)


def role_attach_bench(args: argparse.Namespace) -> int:
    import torch

    torch.zeros(1, device="cuda")  # CUDA initialised before timing, as the Rust bench makes its context first

    import modelshare

    session = modelshare.Session.open(args.server, name="py-attach-bench")
    times, torch_times = [], []
    for i in range(args.n + 10):
        t0 = time.perf_counter()
        model = session.attach(args.model)
        t1 = time.perf_counter()
        tensors = model.torch()
        elapsed = time.perf_counter() - t0
        assert len(tensors) == BIG_TENSORS
        del tensors, model
        if i >= 10:
            times.append(elapsed * 1e3)
            torch_times.append((elapsed - (t1 - t0)) * 1e3)
        # The drop releases the lease in the background: let that finish before the next timed
        # attach, as the Rust bench's awaited release does (both then wait the same, spinning:
        # a sleeping CPU would slow the next attach on both sides).
        until = time.perf_counter() + args.pause_us / 1e6
        while time.perf_counter() < until:
            pass
    times.sort()
    # The views Session.attach made while mapping (a process running CUDA through torch, over
    # VMM) against those made of the mapping afterwards: same addresses, same bytes.
    model = session.attach(args.model)
    early_made = model._early is not None
    early, fresh = model.torch(), model.torch()
    early_equal = all(early[k].data_ptr() == fresh[k].data_ptr() and torch.equal(early[k], fresh[k]) for k in fresh)
    first = early["t000"].reshape(-1)[:8].float().tolist()
    del early, fresh, model
    print(json.dumps({"n": len(times), "p50_ms": statistics.median(times), "p99_ms": times[int(len(times) * 0.99)],
                      "torch_p50_ms": statistics.median(torch_times), "early_views": early_made,
                      "early_equal": early_equal, "t000": first}))
    session.close()
    return 0


# --- rows ------------------------------------------------------------------------------------

def make_big(root: str) -> tuple[str, dict]:
    import torch
    from safetensors.torch import save_file

    folder = os.path.join(root, "big")
    os.makedirs(folder, exist_ok=True)
    per = BIG_BYTES // BIG_TENSORS // 2
    g = torch.Generator(device="cuda").manual_seed(27)
    tensors = {f"t{i:03d}": torch.randn(per, device="cuda", generator=g).to(torch.bfloat16).reshape(per // 256, 256).cpu()
               for i in range(BIG_TENSORS)}
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    return "big", {"t000": tensors["t000"].reshape(-1)[:8].float().numpy().tolist()}


LOADING_TENSORS = 16
LOADING_BYTES = 6 << 30


def make_loading(root: str) -> dict[str, float]:
    """A model of 16 bf16 tensors, 6 GiB; returns each tensor's sum (f64) as torch computes it."""
    import torch
    from safetensors.torch import save_file

    folder = os.path.join(root, "loading")
    os.makedirs(folder, exist_ok=True)
    per = LOADING_BYTES // LOADING_TENSORS // 2
    g = torch.Generator(device="cuda").manual_seed(28)
    tensors, sums = {}, {}
    for i in range(LOADING_TENSORS):
        t = torch.randn(per, device="cuda", generator=g).to(torch.bfloat16)
        sums[f"l{i:02d}"] = float(t.double().sum())
        tensors[f"l{i:02d}"] = t.cpu()
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    del tensors
    return sums


def role_loading(args: argparse.Namespace) -> int:
    """Attaches "loading" as soon as the server lets it (while it loads, if in time), times
    Model.torch(), then sums every tensor on the GPU (on torch's current stream)."""
    import torch

    import modelshare

    torch.zeros(1, device="cuda")
    session = modelshare.Session.open(args.server, name="loading")
    # Ready (torch's CUDA context and the session are up): the parent starts the load now.
    open(os.path.join(args.out, "loading.ready"), "w").close()
    deadline = time.time() + 120
    while True:
        try:
            model = session.attach("loading", 1)  # version 1 by name: attachable while it loads
            break
        except (modelshare.NotFound, modelshare.Unavailable):
            if time.time() > deadline:
                raise
            time.sleep(0.001)
    while_loading = model._native.attached_while_loading
    t0 = time.perf_counter()
    tensors = model.torch()
    torch_ms = (time.perf_counter() - t0) * 1e3
    sums = {n: float(t.double().sum()) for n, t in tensors.items()}
    print(json.dumps({"attached_while_loading": while_loading, "torch_ms": torch_ms, "sums": sums}))
    return 0


def role_restart(args: argparse.Namespace) -> int:
    """Attaches the big model in a process running CUDA through torch (the two-step attach:
    its views made while mapping), sums its first tensors, says it is ready, then waits for the
    parent's restart of the server and the session's re-attach: the early views must still read
    the same (their mapping kept alive by them), and torch() must give views of the model's
    mapping now."""
    import torch

    import modelshare

    on_cuda = torch.cuda.is_available()
    if on_cuda:
        torch.zeros(1, device="cuda")
    report: dict = {}
    with modelshare.Session.open(args.server, name="py-restart") as session:
        model = session.attach(args.model)
        report["early"] = model._early is not None
        views = model.torch()
        names = list(views)[:16]
        sums = lambda ts: [float(ts[n].double().sum()) for n in names]  # noqa: E731
        before, lease = sums(views), model.lease_id
        report["address_before"] = model._native.arena().data_ptr
        open(os.path.join(args.out, "restart.ready"), "w").close()
        deadline = time.time() + 120
        while model.lease_id == lease and time.time() < deadline:
            time.sleep(0.05)
        report["reattached"] = model.lease_id != lease
        report["old_views_same"] = sums(views) == before
        fresh = model.torch()
        report["address_after"] = model._native.arena().data_ptr
        report["fresh_views_same"] = sums(fresh) == before
        report["fresh_views_on_new_mapping"] = all(
            fresh[n].data_ptr() >= report["address_after"] for n in names)
        if on_cuda:
            torch.cuda.synchronize()
    print(json.dumps(report))
    return 0


def spawn(args: argparse.Namespace, role: str, *extra: str, name: str = "", log_filter: str = "info") -> subprocess.Popen:
    log_file = open(os.path.join(args.out, f"{role}-{name or 'x'}-{time.time_ns()}.log"), "w")
    env = dict(os.environ, LD_LIBRARY_PATH=lib_path(), MODELSHARE_LOG=log_filter)
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--role", role, "--out", args.out, *extra],
                            stdout=log_file, stderr=subprocess.STDOUT, env=env)


#: µs each attach bench waits (spinning) after a release (Rust: awaited; Python: the drop's, in the
#: background), so that no timed attach overlaps the previous release at the server.
ATTACH_PAUSE_US = 2000
#: The SDK's and the binding's attach stages, in their trace lines (`MODELSHARE_LOG`).
ATTACH_TRACE = "modelshare_worker=trace,modelshare_python=trace"


def attach_bench(args: argparse.Namespace, server: "Server", name: str, side: str, n: int, pause_us: int,
                 trace: bool = False) -> tuple[dict, str]:
    """One attach bench of ``n`` attaches on ``side`` ("rust": gpu_worker, "python": the
    package): its JSON report and its standard error / log (the trace lines when ``trace``)."""
    extra = ["--model", name, "--n", str(n), "--server", server.address, "--pause-us", str(pause_us)]
    log_filter = ATTACH_TRACE if trace else "info"
    if side == "rust":
        env = dict(os.environ, LD_LIBRARY_PATH=lib_path())
        if trace:
            env["MODELSHARE_LOG"] = log_filter
        r = subprocess.run([f"{args.bin}/gpu_worker", "attach-bench", *extra], capture_output=True, text=True,
                           env=env, timeout=300)
        return json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("{")][-1]), r.stderr
    p = spawn(args, "attach-bench", *extra, name="py-trace" if trace else "py", log_filter=log_filter)
    p.wait(300)
    pattern = "attach-bench-py-trace-*.log" if trace else "attach-bench-py-[0-9]*.log"
    text = open(sorted(glob.glob(os.path.join(args.out, pattern)))[-1]).read()
    return json.loads([ln for ln in text.splitlines() if ln.startswith("{")][-1]), text


def trace_medians(text: str) -> dict:
    """Median of each ``<stage>_us=<n>`` field over the attach trace lines in ``text``."""
    import re

    fields: dict[str, list[int]] = {}
    for line in text.splitlines():
        if "attach:" in line:
            for key, value in re.findall(r"(\w+_us)=(\d+)", line):
                fields.setdefault(key, []).append(int(value))
    return {k: statistics.median(v) for k, v in sorted(fields.items())}


def attach_row(args: argparse.Namespace, server: "Server", name: str) -> dict:
    """Python's attach + torch() p50 against the Rust SDK's attach, alternated over 3 rounds
    (medians), each bench pausing after a release; then one round without the pause, and one
    traced round of each for where the time goes. The Python rounds must also have made their
    views during the attach, equal to views made of the mapping afterwards."""
    rust, python = [], []
    for _ in range(3):
        rust.append(attach_bench(args, server, name, "rust", 300, ATTACH_PAUSE_US)[0])
        python.append(attach_bench(args, server, name, "python", 300, ATTACH_PAUSE_US)[0])
    rust_p50 = statistics.median(r["p50_ms"] for r in rust)
    py_p50 = statistics.median(r["p50_ms"] for r in python)
    back_to_back = {side: attach_bench(args, server, name, side, 300, 0)[0] for side in ("rust", "python")}
    traced = {side: trace_medians(attach_bench(args, server, name, side, 100, ATTACH_PAUSE_US, trace=True)[1])
              for side in ("rust", "python")}
    early = all(r.get("early_views") and r.get("early_equal") for r in python)
    result = {"ok": py_p50 <= 1.5 * rust_p50 and early, "early_views_right": early,
              "rust_p50_ms": rust_p50, "python_p50_ms": py_p50,
              "ratio": py_p50 / rust_p50, "pause_us": ATTACH_PAUSE_US, "rounds": {"rust": rust, "python": python},
              "back_to_back": back_to_back,
              "back_to_back_ratio": back_to_back["python"]["p50_ms"] / back_to_back["rust"]["p50_ms"],
              "trace_median_us": traced, "handle_kind": rust[0].get("kind"), "tensors": rust[0].get("tensors")}
    log(f"attach: Rust p50 {rust_p50:.3f} ms, Python {py_p50:.3f} ms, ratio {py_p50 / rust_p50:.2f} "
        f"(back to back {result['back_to_back_ratio']:.2f}); stages {traced}")
    return result


def restart_row(args: argparse.Namespace, server: "Server", name: str) -> dict:
    """A worker holding views made by the two-step attach while the server is killed (-9) and
    restarted: its views still read the same after the session re-attached (their mapping kept
    alive by them, not unmapped by the re-attach), and torch() then gives views of the new
    mapping."""
    ready = os.path.join(args.out, "restart.ready")
    if os.path.exists(ready):
        os.unlink(ready)
    reader = spawn(args, "restart", "--server", server.address, "--model", name, name="restart")
    deadline = time.time() + 120
    while not os.path.exists(ready) and reader.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(3)  # the server's records name the workers holding memory (kept current every 2 s)
    server.kill_and_restart()
    reader.wait(180)
    out = sorted(glob.glob(os.path.join(args.out, "restart-restart-*.log")))[-1]
    lines = [ln for ln in open(out) if ln.startswith("{")]
    got = json.loads(lines[-1]) if lines else {"error": f"no report (exit {reader.returncode}); see {out}"}
    keys = ("reattached", "old_views_same", "fresh_views_same", "fresh_views_on_new_mapping")
    ok = all(got.get(k) for k in keys) and (got.get("early") or BACKEND[0] != "cuda")
    result = {"ok": bool(ok), **got}
    log(f"restart: {result}")
    return result


def rows_on_big(args: argparse.Namespace, results: dict) -> None:
    import numpy as np

    root = tempfile.mkdtemp(prefix="pyserve-models-")
    name, expect = make_big(root)
    used0 = smi_used()
    # One load thread: the "loading" row's 6 GiB then takes about a second from the page cache
    # instead of a fifth, so its reader attaches while it loads rather than racing the load.
    server = Server(args.bin, root, args.out, "big", "--load-threads", "1")
    try:
        server.cli("load", name, name)
        used_loaded = smi_used()
        w_mib = BIG_BYTES / 2**20
        probe = subprocess.Popen([sys.executable, "-c", "import torch,time; torch.zeros(1, device='cuda').sum().item(); "
                                  "print('up', flush=True); time.sleep(30)"], stdout=subprocess.PIPE, text=True)
        probe.stdout.readline()
        time.sleep(1)
        ctx = smi_used() - used_loaded
        probe.kill()
        probe.wait()
        time.sleep(1)
        base = smi_used()
        workers = [spawn(args, "worker", "--server", server.address, "--model", name, "--name", "mem", name="mem")
                   for _ in range(WORKERS)]
        server.wait_serving("mem", WORKERS)
        time.sleep(1)
        used_n = smi_used()
        per_worker = (used_n - base) / WORKERS
        want = np.array(expect["t000"], dtype=np.float32)

        def answers_right(n: int = 40) -> bool:
            texts = [f"text {i}" * (i % 5) for i in range(n)]
            got = [server.embed(name, [t])[0] for t in texts]
            return all(np.allclose(g, want + len(t), rtol=0, atol=0) for g, t in zip(got, texts))

        right = answers_right()
        reports = [json.load(open(p)) for p in glob.glob(os.path.join(args.out, "worker-*.json"))]
        # Each worker adds about a torch process's context, far from another copy of W.
        memory_ok = right and per_worker < ctx * 1.25 + 64 and per_worker < w_mib / 2
        results["memory"] = {"ok": memory_ok, "weights_mib": w_mib, "server_delta_mib": used_loaded - used0,
                             "torch_context_mib": ctx, "per_worker_mib": per_worker, "workers": WORKERS,
                             "total_mib": used_n - used0, "answers_right": right}
        log(f"memory: W {w_mib:.0f} MiB, server +{used_loaded - used0} MiB, torch context {ctx} MiB, "
            f"{WORKERS} workers +{per_worker:.0f} MiB each; answers right: {right}")
        results["pointers"] = {"ok": len(reports) == WORKERS and all(
            r["same_pointers"] and r["inside_one_mapping"] and r["devices"] == ["cuda:0"] and r["read_only"]
            and r["tensors"] == BIG_TENSORS for r in reports), "reports": reports}
        log(f"pointers: {results['pointers']['ok']}")

        if "write" in args.rows:
            writer = spawn(args, "writer", "--server", server.address, "--model", name, name="writer")
            code = writer.wait(120)
            wrote = json.load(open(os.path.join(args.out, "writer.json")))
            time.sleep(2)
            still_right = answers_right()
            alive = all(p.poll() is None for p in workers)
            import modelshare

            with modelshare.Session.open(server.address, name="verifier") as s:
                bad = s.attach(name)._native.verify()
            gone = server.sessions("writer") == 0
            ok = (code != 0 and "error" in wrote and "wrote" not in wrote and still_right and alive and server.ready()
                  and not bad and gone)
            results["write"] = {"ok": ok, "writer_exit": code, "writer": wrote, "others_right": still_right,
                                "others_alive": alive, "server_ready": server.ready(), "checksums_bad": bad,
                                "writer_session_gone": gone}
            log(f"write: {results['write']}")
        for p in workers:
            p.send_signal(signal.SIGTERM)
        for p in workers:
            p.wait(60)

        if "attach" in args.rows:
            results["attach"] = attach_row(args, server, name)

        if "loading" in args.rows:
            sums = make_loading(root)
            ready = os.path.join(args.out, "loading.ready")
            if os.path.exists(ready):
                os.unlink(ready)
            reader = spawn(args, "loading", "--server", server.address, name="loading")
            # Its CUDA context and session up first (a fixed wait was too short on a slow
            # machine: the 6 GiB load ended before the reader first asked), then the load.
            deadline = time.time() + 120
            while not os.path.exists(ready) and reader.poll() is None and time.time() < deadline:
                time.sleep(0.01)
            t0 = time.perf_counter()
            server.cli("load", "loading", "loading")
            load_s = time.perf_counter() - t0
            reader.wait(180)
            out = sorted(glob.glob(os.path.join(args.out, "loading-loading-*.log")))[-1]
            got = json.loads([ln for ln in open(out) if ln.startswith("{")][-1])
            equal = all(abs(got["sums"][n] - v) <= 1e-6 * max(1.0, abs(v)) for n, v in sums.items())
            ok = equal and got["attached_while_loading"] and got["torch_ms"] < 50
            results["loading"] = {"ok": ok, "attached_while_loading": got["attached_while_loading"],
                                  "torch_ms": got["torch_ms"], "load_s": load_s, "sums_equal": equal,
                                  "gib": LOADING_BYTES / 2**30}
            log(f"loading: {results['loading']}")

        if "restart" in args.rows:
            results["restart"] = restart_row(args, server, name)
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def client_proc(url: str, model: str, texts: list[str], per_request: int, conn_out) -> None:
    import http.client

    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    done = 0
    for i in range(0, len(texts), per_request):
        # base64, as the official openai client asks by default.
        body = json.dumps({"model": model, "input": texts[i:i + per_request], "encoding_format": "base64"})
        conn.request("POST", "/v1/embeddings", body, {"content-type": "application/json"})
        r = conn.getresponse()
        payload = r.read()
        if r.status != 200:
            conn_out.send(("error", payload[:300].decode(errors="replace")))
            return
        done += len(texts[i:i + per_request])
    conn_out.send(("ok", done))


def batch_items(server: Server, model: str) -> tuple[float, float]:
    """(sum, count) of the server's items-per-batch histogram for ``model``."""
    text = urllib.request.urlopen(f"{server.metrics}/metrics", timeout=10).read().decode()
    got = {"sum": 0.0, "count": 0.0}
    for line in text.splitlines():
        for part in got:
            if line.startswith(f"modelshare_inference_batch_items_{part}{{") and f'model="{model}"' in line:
                got[part] = float(line.rsplit(" ", 1)[1])
    return got["sum"], got["count"]


def door_throughput(server: Server, model: str, pool: list[str], clients: int = 16,
                    per_request: int = 8) -> tuple[float, float]:
    """Sentences per second through /v1/embeddings from ``clients`` processes, each sending
    ``per_request`` sentences per request, one request at a time; and the mean batch size."""
    chunks = [pool[i::clients] for i in range(clients)]
    ctx = multiprocessing.get_context("fork")
    pipes, procs = [], []
    server.embed(model, pool[:64])  # warm
    items0, batches0 = batch_items(server, model)
    start = time.perf_counter()
    for chunk in chunks:
        a, b = ctx.Pipe()
        p = ctx.Process(target=client_proc, args=(server.http, model, chunk, per_request, b))
        p.start()
        pipes.append(a)
        procs.append(p)
    results = [a.recv() for a in pipes]
    elapsed = time.perf_counter() - start
    for p in procs:
        p.join()
    errors = [r for r in results if r[0] == "error"]
    if errors:
        raise RuntimeError(f"door errors: {errors[:2]}")
    items1, batches1 = batch_items(server, model)
    mean_batch = (items1 - items0) / max(1.0, batches1 - batches0)
    return sum(r[1] for r in results) / elapsed, mean_batch


#: Whether the encoder runs CUDA graphs (--no-cuda-graphs: eagerly), worker and alone alike.
GRAPHS = [True]


def alone_encoder(folder: str):
    """The worker's ``Encoder`` over the folder's files, in this process, on the GPU."""
    from encoder_worker import Encoder
    from safetensors.torch import load_file

    files = {}
    for path in glob.glob(os.path.join(folder, "**", "*.json"), recursive=True):
        files[os.path.relpath(path, folder)] = open(path, "rb").read()
    device = "cuda:0" if BACKEND[0] == "cuda" else "cpu"
    return Encoder(files, load_file(os.path.join(folder, "model.safetensors"), device=device),
                   cuda_graphs=GRAPHS[0])


def alone_pass(encoder, pool: list[str], batch: int = 64, gpu_times: bool = False) -> dict:
    """``encoder`` over ``pool`` in batches of ``batch`` (tokenized here, sorted by length as the
    worker does), in this process, after four batches of warm-up: sentences per second and each
    batch's milliseconds (all, tokenizing, the model; with ``gpu_times``, the GPU's, from CUDA
    events)."""
    for i in range(0, 256, batch):
        encoder.embed_ids(sorted(encoder.tokenize(pool[i:i + batch]), key=len))
    tok = model = 0.0
    encoder.gpu_ms = [] if gpu_times else None
    start = time.perf_counter()
    for i in range(0, len(pool), batch):
        t0 = time.perf_counter()
        ids = sorted(encoder.tokenize(pool[i:i + batch]), key=len)
        t1 = time.perf_counter()
        encoder.embed_ids(ids)
        tok += t1 - t0
        model += time.perf_counter() - t1
    wall = time.perf_counter() - start
    n = (len(pool) + batch - 1) // batch
    gpu = encoder.gpu_ms or []
    encoder.gpu_ms = None
    return {"per_s": len(pool) / wall, "batch_ms": wall / n * 1e3, "tokenize_ms": tok / n * 1e3,
            "model_ms": model / n * 1e3, "gpu_ms": sum(gpu) / max(1, len(gpu))}


def alone_throughput(encoder, pool: list[str], batch: int = 64) -> float:
    """Sentences per second of ``encoder`` alone over ``pool`` (``alone_pass``), logged."""
    r = alone_pass(encoder, pool, batch)
    log(f"alone: per batch {r['batch_ms']:.2f} ms, of which the model {r['model_ms']:.2f} ms")
    return r["per_s"]


def random_weights(folder: str) -> bool:
    """Writes random f16 weights of the folder's config.json (BertModel, seeded) when it has none:
    all-MiniLM-L6-v2's own (45 MB in f16) do not fit the carry beside the binaries, and parity
    with sentence-transformers on one folder holds for any weights. True if it wrote them."""
    if os.path.exists(os.path.join(folder, "model.safetensors")):
        return False
    import torch
    from transformers import BertConfig, BertModel

    config = json.load(open(os.path.join(folder, "config.json")))
    torch.manual_seed(0)
    model = BertModel(BertConfig(**{k: v for k, v in config.items() if not k.startswith("_")}), add_pooling_layer=False)
    model.half().save_pretrained(folder, safe_serialization=True)
    return True


def make_bert_base(minilm: str, root: str) -> str:
    import torch
    from transformers import BertConfig, BertModel

    folder = os.path.join(root, "bertbase")
    shutil.copytree(minilm, folder, ignore=shutil.ignore_patterns("model.safetensors", "config.json"))
    config = BertConfig(vocab_size=30522)
    torch.manual_seed(0)
    BertModel(config, add_pooling_layer=False).half().save_pretrained(folder, safe_serialization=True)
    return folder


def rows_on_minilm(args: argparse.Namespace, results: dict) -> None:
    import numpy as np

    root = tempfile.mkdtemp(prefix="pyserve-enc-")
    minilm = os.path.join(root, "minilm")
    shutil.copytree(args.minilm, minilm)
    results["minilm_weights"] = "random f16 (MiniLM's config and tokenizer)" if random_weights(minilm) else "all-MiniLM-L6-v2"
    models = {"minilm": minilm}
    if "throughput" in args.rows and args.sentences[1]:
        models["bertbase"] = make_bert_base(minilm, root)
    server = Server(args.bin, root, args.out, "enc")
    workers = []
    try:
        for name in models:
            server.cli("load", name, name)
            workers.append(subprocess.Popen(
                [sys.executable, os.path.join(ROOT, "workers", "python", "encoder_worker.py"), "--model", name,
                 "--server", server.address, "--name", name, "--credits", str(args.credits), "--max-batch-items", "64",
                 "--stats", *(["--concurrency", str(args.concurrency)] if args.concurrency else []),
                 *([] if GRAPHS[0] else ["--no-cuda-graphs"])],
                stdout=open(os.path.join(args.out, f"encoder-{name}.log"), "w"), stderr=subprocess.STDOUT,
                env=dict(os.environ, LD_LIBRARY_PATH=lib_path(), MODELSHARE_LOG="info")))
        for name in models:
            server.wait_serving(name, 1)
        if "parity" in args.rows:
            from sentence_transformers import SentenceTransformer

            got = np.array(server.embed("minilm", MIXED), dtype=np.float32)
            device = "cuda" if BACKEND[0] == "cuda" else "cpu"
            st = SentenceTransformer(minilm, device=device)
            ref = st.encode(MIXED, convert_to_numpy=True)
            cos = (got * ref).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(ref, axis=1)
            # The same weights upcast to f32 in sentence-transformers: the precise reference (an
            # f16 model pools in f16 there; the worker pools in f32).
            ref32 = st.float().encode(MIXED, convert_to_numpy=True)
            cos32 = (got * ref32).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(ref32, axis=1)
            f16_vs_f32 = (ref * ref32).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(ref32, axis=1)
            results["parity"] = {"ok": bool(cos32.min() >= 0.9999), "min_cosine_vs_st_f32": float(cos32.min()),
                                 "min_cosine_vs_st_f16": float(cos.min()),
                                 "st_f16_vs_st_f32": float(f16_vs_f32.min()), "sentences": len(MIXED)}
            log(f"parity: min cosine {cos32.min():.7f} against sentence-transformers in f32, {cos.min():.7f} in f16 "
                f"(its f16 against its f32: {f16_vs_f32.min():.7f}) over {len(MIXED)} mixed sentences")
        if "throughput" in args.rows:
            rows = {}
            clients, per_request = args.loads[-1]
            for name, n in zip(("minilm", "bertbase"), args.sentences):
                if not n:
                    continue
                pool = sentences(n)
                encoder = alone_encoder(models[name])
                # Alone and through the door in turn, --rounds times: the host-bound figures
                # follow the CPU's clock, which falls after the first seconds of load (the
                # first of several alone passes in a row ran 12% faster than the last), so
                # a single alone pass measured first flatters the anchor.
                # Warm: a pass each way first, not counted (the encoder captures a CUDA graph
                # for each shape bucket the first time it meets it, in the worker and here).
                alone_throughput(encoder, pool)
                door_throughput(server, name, pool, clients, per_request)
                rounds = []
                for r in range(args.rounds):
                    alone = alone_throughput(encoder, pool)
                    door, mean_batch = door_throughput(server, name, pool, clients, per_request)
                    rounds.append({"alone_per_s": alone, "door_per_s": door, "mean_batch": mean_batch})
                    log(f"throughput {name} round {r + 1}: alone {alone:.0f}/s, door {door:.0f}/s "
                        f"({clients} clients x {per_request}, mean batch {mean_batch:.1f}), ratio {door / alone:.2f}")
                del encoder
                alone = statistics.median(x["alone_per_s"] for x in rounds)
                door = statistics.median(x["door_per_s"] for x in rounds)
                # The other loads, once each, for the record (not in the ratio).
                loads = {}
                for c, per in args.loads[:-1]:
                    d, mean_batch = door_throughput(server, name, pool, c, per)
                    loads[f"{c}x{per}"] = {"door_per_s": d, "mean_batch": mean_batch}
                    log(f"throughput {name}: {c} clients x {per}: door {d:.0f}/s (mean batch {mean_batch:.1f})")
                rows[name] = {"door_per_s": door, "alone_per_s": alone, "ratio": door / alone, "sentences": n,
                              "load": f"{clients}x{per_request}", "rounds": rounds, "other_loads": loads}
            results["throughput"] = {"ok": all(r["ratio"] >= 0.9 for r in rows.values()), "models": rows,
                                     "method": f"median of {args.rounds} rounds, each alone then door",
                                     "cuda_graphs": GRAPHS[0],
                                     "worker": f"1 process, credits {args.credits}, concurrency "
                                               f"{args.concurrency or 'default (credits)'}, 64 items"}
    finally:
        for p in workers:
            p.send_signal(signal.SIGTERM)
        for p in workers:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
        for name in models:
            stats = [ln.split("stats: ", 1)[1].strip() for ln in open(os.path.join(args.out, f"encoder-{name}.log"))
                     if "stats: " in ln]
            if stats and name in results.get("throughput", {}).get("models", {}):
                results["throughput"]["models"][name]["worker_stats"] = stats[-1]
                log(f"worker {name}: {stats[-1]}")
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def setup(args: argparse.Namespace) -> None:
    if args.bin:
        args.bin = os.path.abspath(args.bin)
        return
    bin_dir = tempfile.mkdtemp(prefix="pyserve-bin-")
    for xz in glob.glob(os.path.join(args.carry, "*.xz")):
        target = os.path.join(bin_dir, os.path.basename(xz)[:-3])
        with lzma.open(xz) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.chmod(target, 0o755)
    args.bin = bin_dir
    wheel = glob.glob(os.path.join(args.carry, "modelshare-*.whl"))[0]
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall", wheel], check=True)
    try:
        import sentence_transformers  # noqa: F401
    except ImportError:
        for w in glob.glob(os.path.join(args.carry, "wheels", "*.whl")):
            subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", w], check=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", default="main")
    ap.add_argument("--carry", default="gpu-carry/pyserve")
    ap.add_argument("--minilm", default="gpu-carry/minilm-files",
                    help="MiniLM's folder; random f16 weights are written when it has none")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/python-serve"))
    ap.add_argument("--only", default=",".join(ROWS))
    ap.add_argument("--server")
    ap.add_argument("--model")
    ap.add_argument("--name", default="py")
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--pause-us", type=int, default=0,
                    help="attach-bench: µs to wait (spinning) after each drop, before the next timed attach")
    ap.add_argument("--backend", default="cuda", choices=["cuda", "host"])
    ap.add_argument("--bin", help="binaries already there (instead of --carry's .xz)")
    ap.add_argument("--loads", default="16x8,32x16,8x64",
                    help="client loads of the door: processes x sentences per request, comma-separated; "
                         "the last is the one compared with the encoder alone")
    ap.add_argument("--rounds", type=int, default=3, help="throughput rounds (alone, then door) per model")
    ap.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True,
                    help="the encoder (worker and alone) runs CUDA graphs (default) or eagerly")
    ap.add_argument("--credits", type=int, default=2, help="the encoder worker's credits")
    ap.add_argument("--concurrency", type=int, help="the encoder worker's concurrency (default: the package's)")
    ap.add_argument("--sentences", default="20000,6000",
                    help="sentences per throughput pool: MiniLM, BERT-base (0: skip that model)")
    args = ap.parse_args()
    BACKEND[0] = args.backend
    GRAPHS[0] = args.cuda_graphs
    args.sentences = [int(n) for n in args.sentences.split(",")]
    args.loads = [tuple(int(x) for x in load.split("x")) for load in args.loads.split(",")]
    os.makedirs(args.out, exist_ok=True)
    if args.role != "main":
        return {"worker": role_worker, "writer": role_writer, "attach-bench": role_attach_bench,
                "restart": role_restart, "loading": role_loading}[args.role](args)
    args.rows = set(args.only.split(","))
    setup(args)
    smi = shutil.which("nvidia-smi")
    device = subprocess.run([smi, "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True,
                            text=True).stdout.strip() if smi else "no GPU (host backend)"
    results: dict = {"device": device, "date": time.strftime("%Y-%m-%d")}
    if args.rows & {"memory", "pointers", "write", "attach", "loading", "restart"}:
        try:
            rows_on_big(args, results)
        except Exception as e:  # noqa: BLE001 - report, go on with the other rows
            results["big_error"] = f"{type(e).__name__}: {e}"
            log(f"rows on the big model failed: {e}")
    if args.rows & {"parity", "throughput"}:
        try:
            rows_on_minilm(args, results)
        except Exception as e:  # noqa: BLE001
            results["encoder_error"] = f"{type(e).__name__}: {e}"
            log(f"encoder rows failed: {e}")
    with open(os.path.join(args.out, "python-serve.json"), "w") as f:
        json.dump(results, f, indent=1)
    ran = [r for r in ROWS if r in results]
    lines = ["| row | result | figures |", "|---|---|---|"]
    for r in ran:
        figures = {k: v for k, v in results[r].items() if k not in ("ok", "reports", "rounds", "models")}
        if r == "throughput":
            figures = results[r]["models"]
        lines.append(f"| {r} | {'PASS' if results[r]['ok'] else 'FAIL'} | {json.dumps(figures)[:400]} |")
    open(os.path.join(args.out, "python-serve.md"), "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))
    ok = all(results[r]["ok"] for r in ran) and not any(k.endswith("_error") for k in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
