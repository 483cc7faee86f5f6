#!/usr/bin/env python3
"""Sentence-embedding throughput and GPU memory: modelshare (one server holding the weights, N
modelshare-embed workers computing from them) against sentence-transformers, on MiniLM-L6
(gpu-carry/minilm-f16) and a BERT-large-shaped model with random weights made here.

Run on the GPU machine after scripts/gpu-wheels prepared gpu-carry/ elsewhere:
    python3 gpu/embed_bench.py --bin gpu-carry/embed-bin --model-dir gpu-carry/minilm-f16 --out "$OUT"
        [--workers 1,2,4,8] [--sentences 60000] [--quick]
A CPU-only rehearsal of the whole flow at tiny scale (MiniLM only, sentence-transformers on the CPU):
    python3 gpu/embed_bench.py --bin target/release --model-dir DIR --out /tmp/eb \\
        --backend host --st-device cpu --models minilm --sentences 200 --workers 1,2

What it measures, per model:
  sentence-transformers  encode() in fp16 (fp32 on the CPU) at batch sizes 32, 64, 128, 256, each
                         timed on its second pass over the sentences: sentences/s, and tokens/s
                         (tokens as its tokenizer counts them: truncated to max_seq_length, special
                         tokens included).
  modelshare             `modelshare serve --backend cuda` holding the f16 weights once, N workers
                         (the worker's own batch defaults); clients are --concurrency processes POSTing
                         /v1/embeddings with 64 sentences each over keep-alive HTTP: sentences/s
                         and tokens/s (from usage.prompt_tokens) for the whole set, timed on the
                         second pass (several workers: after --warm-s seconds of load, by which the
                         server has measured how the GPU's workers share it; the row notes its choice).
                         A sample of the answers is checked against sentence-transformers (cosine
                         >= 0.999).
  PyTorch alone          the same model in transformers' BertModel (fp16, SDPA) on input tokenized
                         before the clock starts, sorted by length and batched (128, 256): the
                         model's own speed without any serving.
  cuBLAS ceiling         torch's fp16 products of the model's own shapes (q/k/v, output, up, down)
                         at 8192 rows: what the products can reach on this GPU; each row's MFU is
                         its tokens/s times the products' FLOPs per token over the dense f16 peak.
  CPU                    cores each side kept busy during a timed pass (clients, server, workers):
                         the load generator must not be the limit; beside them nvidia-smi's
                         utilization.gpu over the timed passes (the share of time a kernel ran).
  under MPS (--mps)      the worker counts again, server and workers clients of one MPS daemon
                         started for it (pipe and logs under the run's temporary folder).
  compute slots (--slots 2,4)  one worker of each of these --compute-slots counts (several
                         batches on the GPU at once in one process, against the same with workers
                         or MPS).
  GPU memory             nvidia-smi (memory.used, and per process) with the most workers serving,
                         against as many sentence-transformers processes each holding the model
                         (idle after one encode).
The reference vectors come from sentence-transformers in fp32 on the same f16 files (upcast at
load: the f32 originals are too big to carry), so they measure the engines' arithmetic, not the
f16 rounding of the weights, which both sides share.

Every part runs on its own: a failure is recorded (in the JSON and the table's notes) and the
rest goes on; parts are skipped once --budget-s is spent. Writes $OUT/embed_bench.json,
$OUT/embed_bench.md, $OUT/sentences.json and every subprocess's log under $OUT/logs/.
"""

import argparse
import base64
import glob
import http.client
import json
import lzma
import multiprocessing as mp
import os
import random
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "python"))
from embed_sentences import SENTENCES as PARITY_SENTENCES  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check import cpu_seconds  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SEED = 20240229
ST_BATCHES = (32, 64, 128, 256)
REQUEST_SIZES = (64, 64)  # sentences per HTTP request, drawn uniformly (issue 29's load: 64)
WORDS = (3, 160)  # words per sentence, drawn uniformly (issue 29's load)
MIXED_EVERY = 97  # every so many generated sentences, one of the parity set (empty, non-Latin...)
LONG_EVERY = 499  # and one very long (1 500 words: truncated)
#: Dense f16/bf16 tensor-core peak (no sparsity) by GPU name, FLOP/s: the MFU's denominator.
PEAK_F16 = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12, "L40S": 362e12}
SAMPLE = 256  # sentences whose vectors are checked per run
MIN_COSINE = 0.999
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
MIB = 1 << 20


def log(msg):
    print(msg, flush=True)


# ---------------------------------------------------------------------------------------------
# The workload


def make_sentences(model_dir, count):
    """`count` deterministic sentences of 3-160 words drawn from the tokenizer's whole-word
    vocabulary, with one of the parity set (empty, whitespace, non-Latin scripts, emoji, code...)
    every MIXED_EVERY and a very long one every LONG_EVERY, as issue 29's load asks."""
    with open(os.path.join(model_dir, "tokenizer.json")) as f:
        vocab = json.load(f)["model"]["vocab"]
    words = sorted(w for w in vocab if w.isascii() and w.isalpha() and len(w) >= 3)
    rng = random.Random(SEED)
    sentences = []
    for i in range(count):
        if i % MIXED_EVERY == MIXED_EVERY - 1:
            sentences.append(PARITY_SENTENCES[(i // MIXED_EVERY) % len(PARITY_SENTENCES)])
            continue
        n = 1500 if i % LONG_EVERY == LONG_EVERY - 1 else rng.randint(*WORDS)
        text = " ".join(rng.choice(words) for _ in range(n))
        sentences.append(text[0].upper() + text[1:] + ".")
    return sentences


def make_requests(count):
    """Consecutive [start, end) slices of REQUEST_SIZES sentences covering `count` sentences."""
    rng = random.Random(SEED + 1)
    chunks, start = [], 0
    while start < count:
        end = min(count, start + rng.randint(*REQUEST_SIZES))
        chunks.append((start, end))
        start = end
    return chunks


def sample_indices(count):
    """The sentences whose vectors are checked: SAMPLE of them, evenly spread."""
    return sorted(set(np.linspace(0, count - 1, min(SAMPLE, count)).astype(int).tolist()))


# ---------------------------------------------------------------------------------------------
# Child processes (this script with --child): they import torch; the parent never does, so that
# it can fork the HTTP clients.


def child_st_bench(job):
    """sentence-transformers: token counts, fp32 reference vectors of the sample, then encode()
    throughput per batch size (fp16 on CUDA), each timed on a second pass over the sentences: the
    first pass of a batch size meets new tensor shapes, which costs ~0.1 s each on CUDA."""
    import torch
    from sentence_transformers import SentenceTransformer
    sentences = load_json(job["sentences"])
    model = SentenceTransformer(job["model_dir"], device=job["device"]).float()
    ids = model.tokenizer(sentences, truncation=True, max_length=model.max_seq_length)["input_ids"]
    tokens = sum(len(x) for x in ids)
    ref = model.encode([sentences[i] for i in job["sample"]], batch_size=64, convert_to_numpy=True)
    np.save(job["ref"], ref.astype(np.float32))
    cuda = job["device"].startswith("cuda")
    if cuda:
        model.half()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    rows = []
    for batch in job["batches"]:
        model.encode(sentences, batch_size=batch)
        sync()
        t0 = time.perf_counter()
        model.encode(sentences, batch_size=batch, convert_to_numpy=True)
        sync()
        seconds = time.perf_counter() - t0
        rows.append({"batch": batch, "seconds": seconds, "sentences_per_s": len(sentences) / seconds,
                     "tokens_per_s": tokens / seconds})
    peak = torch.cuda.max_memory_allocated() if cuda else None
    result = {"tokens": tokens, "max_seq_length": model.max_seq_length, "dtype": "fp16" if cuda else "fp32",
              "rows": rows, "peak_allocated_bytes": peak, "torch": torch.__version__}
    if cuda and job.get("profile"):
        result["kernels"] = st_kernels(model, sentences[:2048], max(rows, key=lambda r: r["sentences_per_s"])["batch"])
    return result


def st_kernels(model, sentences, batch):
    """Where sentence-transformers' GPU time goes at its best batch: torch.profiler's CUDA time
    per kernel over `sentences`, the top 15 and the total, with the wall time of the pass."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    model.encode(sentences, batch_size=batch)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        model.encode(sentences, batch_size=batch)
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    device_us = lambda e: getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)  # noqa: E731
    total = sum(device_us(e) for e in events)
    top = sorted(events, key=lambda e: -device_us(e))[:15]
    return {"batch": batch, "sentences": len(sentences), "wall_ms": wall * 1e3, "gpu_ms": total / 1e3,
            "top": [{"kernel": e.key[:90], "calls": e.count, "ms": device_us(e) / 1e3} for e in top]}


def child_torch_alone(job):
    """The same model in PyTorch alone (transformers' BertModel, fp16, SDPA) on pre-tokenized
    input: the tokens made before the clock starts, sequences sorted by length and batched,
    mean pooling and normalization as sentence-transformers does; each batch size timed on its
    second pass. Sentences/s and tokens/s."""
    import torch
    from transformers import AutoModel, AutoTokenizer
    sentences = load_json(job["sentences"])
    device = job["device"]
    cuda = device.startswith("cuda")
    tok = AutoTokenizer.from_pretrained(job["model_dir"])
    st_config = load_json(os.path.join(job["model_dir"], "sentence_bert_config.json"))
    ids = tok(sentences, truncation=True, max_length=st_config.get("max_seq_length", 512))["input_ids"]
    tokens = sum(len(x) for x in ids)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    model = AutoModel.from_pretrained(job["model_dir"], torch_dtype=torch.float16 if cuda else torch.float32,
                                      attn_implementation="sdpa").to(device).eval()
    pad = tok.pad_token_id or 0
    rows = []
    for batch in job["batches"]:
        # Padded batches made before the clock as well: only the model is timed.
        batches = []
        for at in range(0, len(order), batch):
            members = [ids[i] for i in order[at:at + batch]]
            longest = max(len(m) for m in members)
            x = torch.full((len(members), longest), pad, dtype=torch.long)
            mask = torch.zeros((len(members), longest), dtype=torch.long)
            for r, m in enumerate(members):
                x[r, :len(m)] = torch.tensor(m)
                mask[r, :len(m)] = 1
            batches.append((x.to(device), mask.to(device)))

        def one_pass():
            with torch.inference_mode():
                for x, mask in batches:
                    h = model(input_ids=x, attention_mask=mask).last_hidden_state
                    m = mask.unsqueeze(-1).to(h.dtype)
                    v = (h * m).sum(1) / m.sum(1).clamp(min=1)
                    torch.nn.functional.normalize(v.float(), dim=1).cpu()
        one_pass()
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        one_pass()
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        rows.append({"batch": batch, "seconds": seconds, "sentences_per_s": len(sentences) / seconds,
                     "tokens_per_s": tokens / seconds})
    return {"tokens": tokens, "rows": rows}


def child_ceiling(job):
    """cuBLAS on the model's own products (fp16, f32 accumulation as torch does them): rows x
    hidden x 3·hidden (q, k, v), x hidden (attention output), x intermediate and back, at
    `rows` tokens; TFLOP/s of each (median of 20 timed with CUDA events) and of all together."""
    import torch
    h, inter, rows = job["hidden"], job["intermediate"], job["rows"]
    shapes = {"qkv": (h, 3 * h), "attn_out": (h, h), "up": (h, inter), "down": (inter, h)}
    out, flops_all, secs_all = {}, 0.0, 0.0
    for name, (k, n) in shapes.items():
        a = torch.randn(rows, k, device="cuda", dtype=torch.float16)
        b = torch.randn(k, n, device="cuda", dtype=torch.float16)
        for _ in range(5):
            a @ b
        times = []
        for _ in range(20):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            a @ b
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) / 1e3)
        t = sorted(times)[len(times) // 2]
        flops = 2.0 * rows * k * n
        out[name] = {"shape": [rows, k, n], "tflops": flops / t / 1e12}
        flops_all += flops
        secs_all += t
    return {"rows": rows, "products": out, "tflops": flops_all / secs_all / 1e12}


def child_st_hold(job):
    """Loads the model in fp16 on the GPU, encodes one batch, reports ready, then waits to be stopped."""
    import torch
    from sentence_transformers import SentenceTransformer
    model = SentenceTransformer(job["model_dir"], device=job["device"]).half()
    model.encode(load_json(job["sentences"])[:64], batch_size=64)
    torch.cuda.synchronize()
    write_json(job["ready"], {"pid": os.getpid(), "allocated_bytes": torch.cuda.memory_allocated(),
                              "reserved_bytes": torch.cuda.memory_reserved()})
    while True:
        signal.pause()


def child_make_large(job):
    """A BERT-large-shaped model with random weights (seeded), f16, as a sentence-transformers
    directory with MiniLM's tokenizer, mean pooling, normalize, max_seq_length 256."""
    import torch
    from safetensors.torch import save_file
    from transformers import BertConfig, BertModel
    torch.manual_seed(SEED)
    config = BertConfig(vocab_size=30522, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                        intermediate_size=4096, max_position_embeddings=512)
    device = job["device"] if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = BertModel(config).half().eval()
    dst = job["dst"]
    os.makedirs(os.path.join(dst, "1_Pooling"), exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(tensors, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    config.to_json_file(os.path.join(dst, "config.json"))
    for name in TOKENIZER_FILES:
        shutil.copy(os.path.join(job["tokenizer_from"], name), dst)
    write_sentence_transformers_files(dst, config.hidden_size)
    return {"parameters": sum(t.numel() for t in tensors.values()), "bytes": sum(t.nbytes for t in tensors.values())}


def write_sentence_transformers_files(dst, hidden):
    """modules.json (Transformer, mean Pooling, Normalize), sentence_bert_config.json, 1_Pooling."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    write_json(os.path.join(dst, "modules.json"), modules)
    write_json(os.path.join(dst, "sentence_bert_config.json"), {"max_seq_length": 256, "do_lower_case": False})
    write_json(os.path.join(dst, "1_Pooling", "config.json"), {
        "word_embedding_dimension": hidden, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False})


CHILDREN = {"st-bench": child_st_bench, "st-hold": child_st_hold, "make-large": child_make_large,
            "torch-alone": child_torch_alone, "ceiling": child_ceiling}


def load_json(path):
    with open(path) as f:
        return json.load(f)


def write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f, indent=1)


# ---------------------------------------------------------------------------------------------
# HTTP clients (forked processes, one keep-alive connection each)

_CLIENT = {}


def _client_init(port, model, sentences, sample):
    """Pool initializer: the connection and the workload, kept in the process."""
    _CLIENT.update(port=port, model=model, sentences=sentences, sample=set(sample), conn=None)


def _post(chunk):
    """One /v1/embeddings request of sentences[start:end]: (n, prompt_tokens, {i: vector}, error)."""
    start, end = chunk
    body = json.dumps({"model": _CLIENT["model"], "input": _CLIENT["sentences"][start:end],
                       "encoding_format": "base64"})
    try:
        if _CLIENT["conn"] is None:
            _CLIENT["conn"] = http.client.HTTPConnection("127.0.0.1", _CLIENT["port"], timeout=300)
        conn = _CLIENT["conn"]
        conn.request("POST", "/v1/embeddings", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            return end - start, 0, {}, f"HTTP {resp.status}: {data[:300]!r}"
        answer = json.loads(data)
    except Exception as e:  # noqa: BLE001
        _CLIENT["conn"] = None
        return end - start, 0, {}, f"{type(e).__name__}: {e}"
    vectors = {start + d["index"]: np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4")
               for d in answer["data"] if start + d["index"] in _CLIENT["sample"]}
    return len(answer["data"]), answer["usage"]["prompt_tokens"], vectors, None


class GpuBusy:
    """nvidia-smi's utilization.gpu (the share of each sample period in which a kernel ran)
    sampled every 100 ms while it is open: whether the GPU had idle gaps during a row. None
    without nvidia-smi."""

    def __init__(self):
        self.proc = None
        if shutil.which("nvidia-smi"):
            self.proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "100"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def close(self):
        """The mean of the samples (percent), or None."""
        if self.proc is None:
            return None
        self.proc.terminate()
        try:
            out, _ = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        samples = [float(v) for v in out.split() if v.replace(".", "", 1).isdigit()]
        return round(sum(samples) / len(samples), 1) if samples else None


def http_load(port, model, sentences, chunks, concurrency, sample=()):
    """Sends `chunks` from `concurrency` client processes; returns seconds and the answers' totals."""
    ctx = mp.get_context("fork")
    with ctx.Pool(concurrency, initializer=_client_init, initargs=(port, model, sentences, sample)) as pool:
        t0 = time.perf_counter()
        results = list(pool.imap_unordered(_post, chunks, chunksize=1))
        seconds = time.perf_counter() - t0
    errors = [e for _, _, _, e in results if e]
    vectors = {i: v for _, _, vs, _ in results for i, v in vs.items()}
    return {"seconds": seconds, "sentences": sum(n for n, _, _, e in results if not e),
            "prompt_tokens": sum(t for _, t, _, _ in results), "errors": len(errors),
            "first_errors": errors[:3]}, vectors


def cosines(got, want):
    """Row-wise cosine similarity."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    norms = np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1)
    return np.einsum("ij,ij->i", got, want) / np.maximum(norms, 1e-30)


# ---------------------------------------------------------------------------------------------
# GPU memory


def nvidia_smi(*query):
    """Rows of `nvidia-smi --query-...=... --format=csv,noheader,nounits` (GPU 0 for GPU queries)."""
    out = subprocess.run(["nvidia-smi", *query, "--format=csv,noheader,nounits"], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    return [[c.strip() for c in line.split(",")] for line in out.strip().splitlines() if line.strip()]


def gpu_memory():
    """memory.used of GPU 0 (MiB) and the compute processes' used memory {pid: MiB}."""
    used = int(nvidia_smi("-i", "0", "--query-gpu=memory.used")[0][0])
    apps = {int(pid): int(mib) for pid, mib in nvidia_smi("--query-compute-apps=pid,used_memory")
            if pid.isdigit() and mib.isdigit()}
    return {"used_mib": used, "apps_mib": apps}


# ---------------------------------------------------------------------------------------------
# The modelshare stack


def cuda_library_path():
    """gpu/check.py's lib_path(), found in a subprocess: it imports torch, which this process
    must not before it forks the clients."""
    code = f"import sys; sys.path.insert(0, {HERE!r}); from check import lib_path; print(lib_path())"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return p.stdout.strip() if p.returncode == 0 else ""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stack:
    """A modelshare server holding one model, and its modelshare-embed workers."""

    def __init__(self, bench, name, model_dir, tag="", bin_dir=None, worker_args=None):
        self.bench, self.name, self.workers, self.tag, self.bin_dir = bench, name, [], tag, bin_dir
        # The workers' own flags: --baseline-worker-args for a baseline build, else --worker-args.
        self.worker_args = worker_args if worker_args is not None else (
            bench.args.baseline_worker_args if bin_dir else bench.args.worker_args)
        self.tmp = tempfile.mkdtemp(prefix="embed-bench-")
        config = os.path.join(self.tmp, "modelshare.toml")
        with open(config, "w") as f:
            f.write("[serving]\nmax_queue_items = 1048576\nmax_tenant_requests = 4096\n")
            for line in bench.args.serving:
                f.write(line + "\n")
        self.port, self.metrics_port = free_port(), free_port()
        self.prefix = f"{name}-{tag}" if tag else name
        self.server = bench.spawn(f"{self.prefix}-server", [
            bench.binary("modelshare", bin_dir), "serve", "--backend", bench.args.backend, "--config", config,
            "--model-root", os.path.dirname(os.path.abspath(model_dir)),
            "--unix-socket", os.path.join(self.tmp, "grpc.sock"),
            "--handle-socket", os.path.join(self.tmp, "handles.sock"),
            "--http-listen", f"127.0.0.1:{self.port}", "--metrics-listen", f"127.0.0.1:{self.metrics_port}",
            "--model", f"{name}={os.path.basename(os.path.abspath(model_dir))}"])
        self.wait(lambda: self.get("/readyz"), "the server is ready", self.server, 180)

    def get(self, path):
        """The body of GET `path` (`/metrics` from the operators' port), or None."""
        port = self.metrics_port if path == "/metrics" else self.port
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                return r.read().decode()
        except Exception:  # noqa: BLE001
            return None

    def sharing_measured(self):
        """The server's last measuring of how the GPU's workers share it (driver::gpus logs
        "measured both ways" with the items/s of each), or None if it has not measured."""
        try:
            with open(os.path.join(self.bench.logs, f"{self.prefix}-server.log"), errors="replace") as f:
                lines = [line for line in f if "measured both ways" in line]
        except OSError:
            return None
        if not lines:
            return None
        fields = dict(re.findall(r"(\w+)=(\S+)", lines[-1]))
        keep = ("workers", "side_by_side_items_per_s", "turns_items_per_s", "taking_turns")
        return {k: fields[k] for k in keep if k in fields}

    def serving(self):
        """Workers serving the model, from /metrics (modelshare_serving_workers)."""
        want = f'modelshare_serving_workers{{model="{self.name}"}} '
        for line in (self.get("/metrics") or "").splitlines():
            if line.startswith(want):
                return int(float(line.split()[-1]))
        return 0

    def wait(self, done, what, procs, timeout):
        """Until done(); fails when a process in `procs` exits or after `timeout` seconds."""
        procs = procs if isinstance(procs, list) else [procs]
        deadline = time.time() + timeout
        while not done():
            dead = [p for p in procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"waiting until {what}: process {dead[0].pid} exited with {dead[0].returncode} "
                                   f"(see {self.bench.logs})")
            if time.time() > deadline:
                raise RuntimeError(f"waiting until {what}: not after {timeout} s")
            time.sleep(0.2)

    def scale(self, n):
        """Starts workers until `n` serve."""
        while len(self.workers) < n:
            i = len(self.workers)
            self.workers.append(self.bench.spawn(f"{self.prefix}-worker-{i}", [
                self.bench.binary("modelshare-embed", self.bin_dir), "--server", f"unix:{os.path.join(self.tmp, 'grpc.sock')}",
                "--model", self.name, "--name", f"bench-{i}",
                *(["--max-batch-items", str(self.bench.args.max_batch_items)] if self.bench.args.max_batch_items else []),
                *(["--max-batch-tokens", str(self.bench.args.max_batch_tokens)] if self.bench.args.max_batch_tokens else []),
                *(["--profile-stages"] if self.bench.args.profile_stages else []),
                *self.worker_args.split()]))
        self.wait(lambda: self.serving() >= n, f"{n} workers serve", [self.server, *self.workers], 120)

    def close(self):
        """Stops the workers, then the server."""
        for p in [*self.workers, self.server]:
            stop(p)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def path_times(self):
        """The server's figures for this model so far: sums and counts of its queue and request
        durations and of its batches' items, and its CPU seconds."""
        got = {}
        for line in (self.get("/metrics") or "").splitlines():
            if f'model="{self.name}"' not in line:
                continue
            for metric in ("inference_queue_duration_seconds", "inference_request_duration_seconds",
                           "inference_batch_items"):
                for part in ("sum", "count"):
                    if line.startswith(f"modelshare_{metric}_{part}{{"):
                        key = f"{metric}_{part}"
                        got[key] = got.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
        got["server_cpu_s"] = cpu_seconds(self.server.pid)
        got["workers_cpu_s"] = sum(cpu_seconds(p.pid) for p in self.workers)
        got["server_threads"] = thread_cpu_s(self.server.pid)
        workers = {}
        for p in self.workers:
            for k, v in thread_cpu_s(p.pid).items():
                workers[k] = workers.get(k, 0.0) + v
        got["workers_threads"] = workers
        return got


def path_breakdown(before, after, seconds, clients_cpu_s):
    """Means over one timed pass from two `Stack.path_times`: time queued and in the server per
    request, items per batch, and the CPU each side used (cores busy on average)."""
    def mean(metric):
        n = after.get(f"{metric}_count", 0) - before.get(f"{metric}_count", 0)
        return (after.get(f"{metric}_sum", 0) - before.get(f"{metric}_sum", 0)) / n if n else None
    queue, request, items = (mean("inference_queue_duration_seconds"), mean("inference_request_duration_seconds"),
                             mean("inference_batch_items"))
    return {"queue_ms": queue and queue * 1e3, "request_ms": request and request * 1e3, "batch_items": items,
            "server_cores": (after["server_cpu_s"] - before["server_cpu_s"]) / seconds,
            "workers_cores": (after["workers_cpu_s"] - before["workers_cpu_s"]) / seconds,
            "clients_cores": clients_cpu_s / seconds,
            "server_threads_cores": threads_cores(before["server_threads"], after["server_threads"], seconds),
            "workers_threads_cores": threads_cores(before["workers_threads"], after["workers_threads"], seconds)}


def thread_cpu_s(pid):
    """CPU seconds of process `pid`'s live threads so far, summed by thread name with digits,
    dashes and hashes cut (`tokio-runtime-worker`, `minilm-3` -> `minilm`): which threads a
    process's cores go to."""
    out = {}
    for stat in glob.glob(f"/proc/{pid}/task/*/stat"):
        try:
            text = open(stat).read()
        except OSError:
            continue
        comm = text[text.index("(") + 1:text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        name = re.sub(r"[-_#]*\d+$", "", comm) or comm
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def threads_cores(before, after, seconds, top=6):
    """The cores each thread name kept busy between two `thread_cpu_s` (summed over
    processes), the busiest `top`."""
    cores = {k: (after.get(k, 0.0) - before.get(k, 0.0)) / seconds for k in after}
    return {k: round(v, 2) for k, v in sorted(cores.items(), key=lambda kv: -kv[1])[:top] if v >= 0.01}


def children_cpu_s():
    """CPU seconds of this process's reaped children (the HTTP clients) so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def worker_profiles(logs, name):
    """The `profile:` lines of the model's worker logs (--profile-stages), by worker."""
    found = {}
    for path in sorted(glob.glob(os.path.join(logs, f"{name}-worker-*.log"))):
        lines = [ln.strip() for ln in open(path, errors="replace") if "profile:" in ln]
        if lines:
            found[os.path.basename(path)[:-4]] = lines
    return found


def stop(p, grace=15):
    """SIGTERM, then SIGKILL after `grace` seconds."""
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


# ---------------------------------------------------------------------------------------------
# The benchmark


class Bench:
    """The parts, their results and their failures."""

    def __init__(self, args):
        self.args = args
        self.t0 = time.time()
        self.logs = os.path.join(args.out, "logs")
        os.makedirs(self.logs, exist_ok=True)
        self.tmp = tempfile.mkdtemp(prefix="embed-bench-")
        self.env = dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "info"),
                        LD_LIBRARY_PATH=cuda_library_path() + ":" + os.environ.get("LD_LIBRARY_PATH", ""))
        self.procs = []
        self.result = {"config": {k: v for k, v in vars(args).items() if k != "child"}, "runs": [], "memory": [],
                       "models": {}, "errors": [], "skipped": []}
        # The parity set first (its every vector is checked), then the generated workload.
        fixed = list(PARITY_SENTENCES)
        self.sentences = fixed + make_sentences(args.model_dir, max(args.sentences - len(fixed), 0))
        self.sentences_file = os.path.join(args.out, "sentences.json")
        write_json(self.sentences_file, self.sentences)
        self.sample = sorted(set(range(len(fixed))) | set(sample_indices(len(self.sentences))))
        self.fixed = len(fixed)

    def remaining(self):
        return self.args.budget_s - (time.time() - self.t0)

    def part(self, name, fn, need_s=30):
        """Runs one part; records its failure (and goes on), or skips it when the budget is spent."""
        if self.remaining() < need_s:
            log(f"== {name}: skipped ({self.remaining():.0f} s of the budget left)")
            self.result["skipped"].append(name)
            return None
        log(f"== {name}")
        t0 = time.time()
        try:
            value = fn()
            log(f"   done in {time.time() - t0:.1f} s")
            return value
        except Exception as e:  # noqa: BLE001
            log(f"   FAILED after {time.time() - t0:.1f} s: {type(e).__name__}: {e}")
            self.result["errors"].append({"part": name, "error": f"{type(e).__name__}: {e}",
                                          "traceback": traceback.format_exc()[-3000:]})
            return None

    def spawn(self, name, cmd):
        """A subprocess with its output in logs/<name>.log."""
        out = open(os.path.join(self.logs, f"{name}.log"), "w")
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env)
        self.procs.append(p)
        return p

    def child(self, kind, name, job, timeout=None):
        """Runs this script as a --child `kind` with `job`; returns its result."""
        job = dict(job, result=os.path.join(self.tmp, f"{name}.result.json"))
        path = os.path.join(self.tmp, f"{name}.job.json")
        write_json(path, job)
        p = self.spawn(name, [sys.executable, os.path.abspath(__file__), "--child", kind, "--job", path])
        try:
            p.wait(timeout=timeout or max(10.0, self.remaining()))
        except subprocess.TimeoutExpired:
            stop(p, grace=5)
            raise RuntimeError(f"{name} ran out of time (see logs/{name}.log)")
        if p.returncode != 0:
            raise RuntimeError(f"{name} exited with {p.returncode} (see logs/{name}.log)")
        return load_json(job["result"])

    def binary(self, name, folder=None):
        """The binary `name` from `folder` (default --bin), unpacked first when only `name`.xz
        is there."""
        folder = folder or self.args.bin
        path = os.path.join(folder, name)
        if os.path.exists(path) or not os.path.exists(path + ".xz"):
            return os.path.abspath(path)
        unpacked = os.path.join(self.tmp, "bin", os.path.basename(os.path.abspath(folder)), name)
        if not os.path.exists(unpacked):
            os.makedirs(os.path.dirname(unpacked), exist_ok=True)
            with lzma.open(path + ".xz") as src, open(unpacked, "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.chmod(unpacked, 0o755)
        return unpacked

    # -- parts ----------------------------------------------------------------------------------

    def ensure_sentence_transformers(self):
        """Installs sentence-transformers from --wheels when this Python lacks it."""
        probe = [sys.executable, "-c", "import sentence_transformers as s; print(s.__version__)"]
        have = subprocess.run(probe, capture_output=True, text=True)
        if have.returncode != 0:
            p = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--find-links",
                                self.args.wheels, "sentence-transformers"], capture_output=True, text=True)
            with open(os.path.join(self.logs, "pip-install.log"), "w") as f:
                f.write(p.stdout + p.stderr)
            if p.returncode != 0:
                raise RuntimeError("pip install from the wheels failed (see logs/pip-install.log)")
            have = subprocess.run(probe, capture_output=True, text=True, check=True)
        self.result["sentence_transformers"] = have.stdout.strip()

    def make_large(self):
        """The BERT-large-shaped model, in a temporary directory."""
        dst = os.path.join(self.tmp, "bert-large")
        info = self.child("make-large", "bert-large-make", {
            "dst": dst, "tokenizer_from": self.args.model_dir, "device": self.args.st_device})
        self.result["models"].setdefault("bert-large", {}).update(info)
        return dst

    def st_bench(self, name, model_dir):
        """sentence-transformers' throughput rows; returns (tokens, reference vectors of the sample)."""
        ref = os.path.join(self.tmp, f"{name}-ref.npy")
        out = self.child("st-bench", f"{name}-st", {
            "model_dir": model_dir, "sentences": self.sentences_file, "sample": self.sample, "ref": ref,
            "device": self.args.st_device, "batches": list(self.args.st_batches),
            "profile": self.args.profile_stages})
        engine = f"sentence-transformers {out['dtype']} {self.args.st_device}"
        for row in out["rows"]:
            self.add_run(name, engine, f"batch {row['batch']}", row)
        self.result["models"].setdefault(name, {}).update(
            tokens=out["tokens"], max_seq_length=out["max_seq_length"], torch=out["torch"],
            st_peak_allocated_mib=round(out["peak_allocated_bytes"] / MIB) if out["peak_allocated_bytes"] else None)
        if "kernels" in out:
            self.result["models"][name]["st_kernels"] = out["kernels"]
            log(f"   sentence-transformers' GPU time: {json.dumps(out['kernels'], indent=1)}")
        return out["tokens"], np.load(ref)

    def torch_alone(self, name, model_dir):
        """The PyTorch-alone anchor's rows (pre-tokenized, fp16, SDPA)."""
        out = self.child("torch-alone", f"{name}-torch", {
            "model_dir": model_dir, "sentences": self.sentences_file, "device": self.args.st_device,
            "batches": [b for b in self.args.st_batches if b >= 128] or list(self.args.st_batches)})
        engine = "PyTorch alone, pre-tokenized, " + ("fp16 SDPA" if self.args.st_device.startswith("cuda") else "fp32")
        for row in out["rows"]:
            self.add_run(name, engine, f"batch {row['batch']}", row)

    def ceiling(self, name, model_dir):
        """cuBLAS on the model's product shapes, and the FLOPs per token the MFU counts."""
        config = load_json(os.path.join(model_dir, "config.json"))
        h, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
        out = self.child("ceiling", f"{name}-ceiling", {"hidden": h, "intermediate": inter, "rows": 8192})
        model = self.result["models"].setdefault(name, {})
        model["cublas_ceiling"] = out
        # The products' FLOPs per token: q, k, v, output, up and down, in every layer.
        model["product_flops_per_token"] = 2.0 * layers * (4 * h * h + 2 * h * inter)
        log(f"   cuBLAS on its products at {out['rows']} rows: {out['tflops']:.0f} TFLOP/s")

    def modelshare(self, name, model_dir, reference):
        """Throughput with each worker count, answers checked; GPU memory with the most workers;
        then, with --mps, the same counts with the server and workers as clients of one MPS
        daemon."""
        self.stack_runs(Stack(self, name, model_dir), name, reference, self.args.workers)
        for slots in self.args.slots:
            self.part(f"{name}: modelshare, 1 worker of {slots} compute slots",
                      lambda: self.slots_run(name, model_dir, reference, slots), need_s=30)
        if self.args.baseline_bin:
            self.part(f"{name}: modelshare, baseline build",
                      lambda: self.baseline(name, model_dir, reference), need_s=40)
        if self.args.mps:
            self.part(f"{name}: modelshare under MPS", lambda: self.under_mps(name, model_dir, reference), need_s=60)

    def slots_run(self, name, model_dir, reference, slots):
        """One worker of `slots` compute slots (its own streams and buffers per slot)."""
        args = f"{self.args.worker_args} --compute-slots {slots}".strip()
        stack = Stack(self, name, model_dir, tag=f"slots{slots}", worker_args=args)
        self.stack_runs(stack, name, reference, [1], "", f"{slots} slots")

    def baseline(self, name, model_dir, reference):
        """The worker counts again with --baseline-bin's build (an A/B of two builds in one run)."""
        stack = Stack(self, name, model_dir, tag="baseline", bin_dir=self.args.baseline_bin)
        self.stack_runs(stack, name, reference, self.args.workers, ", baseline build", "baseline")

    def stack_runs(self, stack, name, reference, counts, suffix="", label=None):
        """Timed passes with each worker count of `counts` on `stack` (closed after), while the
        budget lasts; then its GPU memory with the most workers, and with --profile-stages its
        workers' profiles, under `label` (none: the build's own default stack)."""
        tag = f" ({label})" if label else ""
        try:
            for n in counts:
                if self.remaining() < 20:
                    self.result["skipped"].append(f"{name} {label or 'modelshare'} {n} workers")
                    continue
                self.modelshare_run(stack, name, n, reference, setup_suffix=suffix)
            if shutil.which("nvidia-smi") and not self.args.no_memory and stack.workers:
                self.record_memory(name, f"modelshare{tag}: server + {len(stack.workers)} workers",
                                   [stack.server.pid] + [p.pid for p in stack.workers])
        finally:
            stack.close()
            if self.args.profile_stages:
                profiles = self.result.setdefault("worker_profiles", {})
                profiles[f"{name}{tag}"] = worker_profiles(self.logs, stack.prefix)
                log(f"   worker profiles: {json.dumps(profiles[f'{name}{tag}'], indent=1)}")

    def under_mps(self, name, model_dir, reference):
        """The worker counts again, server and workers clients of one MPS daemon (its pipe and
        log folders under this run's temporary folder), the daemon stopped after."""
        mps = os.path.join(self.tmp, f"mps-{name}")
        env = dict(self.env, CUDA_MPS_PIPE_DIRECTORY=os.path.join(mps, "pipe"),
                   CUDA_MPS_LOG_DIRECTORY=os.path.join(mps, "log"))
        for d in ("pipe", "log"):
            os.makedirs(os.path.join(mps, d), exist_ok=True)
        subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, check=True, timeout=30)
        saved, self.env = self.env, env
        stack = None
        try:
            stack = Stack(self, f"{name}", model_dir, tag="mps")
            for n in self.args.workers:
                if self.remaining() < 20:
                    self.result["skipped"].append(f"{name} modelshare {n} workers under MPS")
                    continue
                self.modelshare_run(stack, name, n, reference, setup_suffix=", MPS")
        finally:
            if stack:
                stack.close()
            self.env = saved
            subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, env=env, timeout=30)

    def modelshare_run(self, stack, name, n, reference, setup_suffix=""):
        """One timed pass over the sentences with `n` workers."""
        stack.scale(n)
        chunks = make_requests(len(self.sentences))
        http_load(stack.port, name, self.sentences, chunks, self.args.concurrency)  # warm, as for sentence-transformers
        # Several workers on one GPU: load until the server has chosen how they share it (by
        # default it measures both ways for ~6 s once they are warm), so that the row is the
        # steady state; the measuring itself is reported from the server's log.
        warm_until = time.monotonic() + (self.args.warm_s if n > 1 else 0)
        while time.monotonic() < warm_until:
            http_load(stack.port, name, self.sentences, chunks, self.args.concurrency)
        before, clients0 = stack.path_times(), children_cpu_s()
        # --passes timed passes; the row is the median pass (a pass of a small model is short).
        runs, vectors = [], None
        busy = GpuBusy() if self.args.backend == "cuda" else None
        try:
            for _ in range(max(1, self.args.passes)):
                run, got = http_load(stack.port, name, self.sentences, chunks, self.args.concurrency, self.sample)
                runs.append(run)
                vectors = vectors if vectors is not None else got
            # Before the sampler is reaped: its CPU is not the clients'.
            clients_s = children_cpu_s() - clients0
        finally:
            gpu_busy = busy.close() if busy else None
        seconds = sum(r["seconds"] for r in runs)
        path = path_breakdown(before, stack.path_times(), seconds, clients_s)
        path["gpu_busy_percent"] = gpu_busy
        run = sorted(runs, key=lambda r: r["sentences"] / r["seconds"])[len(runs) // 2]
        row = {"seconds": run["seconds"], "sentences_per_s": run["sentences"] / run["seconds"],
               "tokens_per_s": run["prompt_tokens"] / run["seconds"], "prompt_tokens": run["prompt_tokens"],
               "errors": sum(r["errors"] for r in runs), "first_errors": run["first_errors"], "path": path,
               "passes_sentences_per_s": [round(r["sentences"] / r["seconds"]) for r in runs]}
        row.update(self.verify(vectors, reference))
        if n > 1:
            row["gpu_sharing"] = stack.sharing_measured()
        flags = stack.worker_args
        setup = f"{n} worker{'s' if n > 1 else ''}{setup_suffix}" + (f" ({flags})" if flags else "")
        self.add_run(name, f"modelshare {self.args.backend}", setup, row)
        log(f"   {n} worker(s): {row['sentences_per_s']:.0f} sentences/s (passes {row['passes_sentences_per_s']}), "
            f"{row['tokens_per_s']:.0f} tokens/s, "
            f"{run['errors']} errors, cosine min {row.get('cosine_min')}; path {json.dumps(path)}")

    def verify(self, vectors, reference):
        """The sample's cosines against the reference (None where there is none)."""
        if reference is None:
            return {"cosine_min": None, "verified": "no reference"}
        have = [i for i in self.sample if i in vectors]
        if not have:
            return {"cosine_min": None, "verified": "no answers"}
        pos = {i: k for k, i in enumerate(self.sample)}
        cos = cosines([vectors[i] for i in have], reference[[pos[i] for i in have]])
        ok = len(have) == len(self.sample) and bool((cos >= MIN_COSINE).all())
        fixed = [k for k, i in enumerate(have) if i < self.fixed]
        parity = float(cos[fixed].min()) if fixed else None
        return {"cosine_min": round(float(cos.min()), 6), "cosine_mean": round(float(cos.mean()), 6),
                "parity_set": f"{len(fixed)}/{self.fixed} fixed sentences, min cosine {parity}",
                "verified": f"{'ok' if ok else 'FAILED'}: {len(have)}/{len(self.sample)} answers, "
                            f"{int((cos < MIN_COSINE).sum())} below {MIN_COSINE}"}

    def st_memory(self, name, model_dir, n):
        """GPU memory with `n` sentence-transformers processes each holding the model."""
        ready = [os.path.join(self.tmp, f"{name}-hold-{i}.ready") for i in range(n)]
        procs = []
        try:
            for i, path in enumerate(ready):
                job = {"model_dir": model_dir, "device": self.args.st_device, "sentences": self.sentences_file,
                       "ready": path}
                write_json(path + ".job", job)
                procs.append(self.spawn(f"{name}-st-hold-{i}", [sys.executable, os.path.abspath(__file__),
                                                                "--child", "st-hold", "--job", path + ".job"]))
            deadline = time.time() + 180
            while not all(os.path.exists(r) for r in ready):
                if time.time() > deadline or any(p.poll() is not None for p in procs):
                    raise RuntimeError(f"the sentence-transformers holders did not start (see {self.logs})")
                time.sleep(0.5)
            torch_side = [load_json(r) for r in ready]
            self.record_memory(name, f"sentence-transformers: {n} processes", [p.pid for p in procs],
                               torch_allocated_mib=[round(t["allocated_bytes"] / MIB) for t in torch_side])
        finally:
            for p in procs:
                stop(p, grace=10)

    def record_memory(self, name, setup, pids, **extra):
        """nvidia-smi now, less the idle figure taken at the start."""
        now = gpu_memory()
        idle = self.result.get("gpu_idle_used_mib", 0)
        self.result["memory"].append({
            "model": name, "setup": setup, "used_mib": now["used_mib"], "over_idle_mib": now["used_mib"] - idle,
            "per_process_mib": {str(p): now["apps_mib"].get(p) for p in pids}, "all_apps_mib": now["apps_mib"], **extra})
        log(f"   GPU memory, {setup}: {now['used_mib'] - idle} MiB over idle")

    def add_run(self, model, engine, setup, row):
        self.result["runs"].append({"model": model, "engine": engine, "setup": setup, **row})

    def bench_model(self, name, model_dir):
        """sentence-transformers, then modelshare, then the memory comparison, for one model."""
        st = None if self.args.no_anchors else self.part(
            f"{name}: sentence-transformers", lambda: self.st_bench(name, model_dir), need_s=40)
        tokens, reference = st if st else (None, None)
        if not self.args.no_anchors:
            self.part(f"{name}: PyTorch alone", lambda: self.torch_alone(name, model_dir), need_s=40)
        if self.args.st_device.startswith("cuda") and not self.args.no_anchors:
            self.part(f"{name}: cuBLAS ceiling", lambda: self.ceiling(name, model_dir), need_s=20)
        self.part(f"{name}: modelshare", lambda: self.modelshare(name, model_dir, reference), need_s=40)
        for run in self.result["runs"]:
            if run["model"] == name and "prompt_tokens" in run and tokens is not None:
                run["tokens_match_st"] = run["prompt_tokens"] == tokens
        if (shutil.which("nvidia-smi") and self.args.st_device.startswith("cuda") and not self.args.no_memory
                and not self.args.no_anchors):
            n = max(self.args.workers)
            self.part(f"{name}: GPU memory of {n} sentence-transformers processes",
                      lambda: self.st_memory(name, model_dir, n), need_s=40)

    def run(self):
        """Every part, then the reports."""
        try:
            if shutil.which("nvidia-smi"):
                self.part("GPU", self.gpu_info, need_s=0)
            self.part("sentence-transformers installed", self.ensure_sentence_transformers, need_s=0)
            for name in self.args.models:
                model_dir = self.args.model_dir if name == "minilm" else self.part(
                    "bert-large: make the model", self.make_large, need_s=60)
                if model_dir:
                    self.bench_model(name, model_dir)
        finally:
            for p in self.procs:
                stop(p, grace=5)
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.report()

    def gpu_info(self):
        name, driver, total = nvidia_smi("-i", "0", "--query-gpu=name,driver_version,memory.total")[0]
        self.result["gpu"] = {"name": name, "driver": driver, "memory_total_mib": int(total)}
        self.result["gpu_idle_used_mib"] = gpu_memory()["used_mib"]

    # -- reports --------------------------------------------------------------------------------

    def report(self):
        """The markdown tables (printed and written) and the JSON."""
        self.result["elapsed_s"] = round(time.time() - self.t0, 1)
        md = self.markdown()
        print(md, flush=True)
        with open(os.path.join(self.args.out, "embed_bench.md"), "w") as f:
            f.write(md)
        write_json(os.path.join(self.args.out, "embed_bench.json"), self.result)

    def markdown(self):
        r = self.result
        gpu = r.get("gpu", {}).get("name", "none")
        peak = next((v for k, v in PEAK_F16.items() if k in gpu), None)
        lines = ["# Sentence embeddings: modelshare vs sentence-transformers",
                 "", f"{len(self.sentences)} sentences ({WORDS[0]}-{WORDS[1]} words, with empty, very long and "
                 f"non-Latin ones), requests of {'-'.join(map(str, sorted(set(REQUEST_SIZES))))} sentences as base64 from "
                 f"{self.args.concurrency} client processes; GPU: {gpu}; {r['elapsed_s']} s in all.", ""]
        for name, m in r["models"].items():
            if "cublas_ceiling" in m and peak:
                c = m["cublas_ceiling"]
                lines.append(f"{name}: cuBLAS on its own products at {c['rows']} rows {c['tflops']:.0f} TFLOP/s "
                             f"({c['tflops'] * 1e12 / peak:.0%} of the {peak / 1e12:.0f} TFLOP/s dense f16 peak); "
                             f"MFU below counts {m['product_flops_per_token'] / 1e6:.0f} MFLOP of products per token.")
        lines += ["", "| model | engine | workers/batch | sentences/s | tokens/s | ×ST | MFU | CPU cores: clients / server / "
                  "workers | check |", "| --- | --- | --- | ---: | ---: | ---: | ---: | --- | --- |"]
        best = {}
        for run in r["runs"]:
            if run["engine"].startswith("sentence-transformers"):
                best[run["model"]] = max(best.get(run["model"], 0), run["sentences_per_s"])
        for run in r["runs"]:
            ratio = run["sentences_per_s"] / best[run["model"]] if best.get(run["model"]) else None
            check = run.get("verified", "")
            if run.get("errors"):
                check += f"; {run['errors']} failed requests"
            if run.get("tokens_match_st") is False:
                check += "; usage tokens differ from sentence-transformers'"
            sharing = run.get("gpu_sharing")
            if sharing:
                way = "turns" if sharing.get("taking_turns") == "true" else "side by side"
                check += (f"; GPU shared {way} (measured side by side {sharing.get('side_by_side_items_per_s')}, "
                          f"turns {sharing.get('turns_items_per_s')} items/s)")
            per_token = r["models"].get(run["model"], {}).get("product_flops_per_token")
            mfu = f"{run['tokens_per_s'] * per_token / peak:.0%}" if per_token and peak else ""
            path = run.get("path") or {}
            cpu = (f"{path['clients_cores']:.1f} / {path['server_cores']:.1f} / {path['workers_cores']:.1f}"
                   if path else "")
            if path.get("gpu_busy_percent") is not None:
                cpu += f"; GPU busy {path['gpu_busy_percent']:.0f}%"
            lines.append(f"| {run['model']} | {run['engine']} | {run['setup']} | {run['sentences_per_s']:.0f} | "
                         f"{run['tokens_per_s']:.0f} | {'' if ratio is None else f'{ratio:.2f}'} | {mfu} | {cpu} | {check} |")
        if r["memory"]:
            lines += ["", "| model | GPU memory held by | MiB over idle | per process (MiB) |", "| --- | --- | ---: | --- |"]
            for m in r["memory"]:
                per = ", ".join(str(v) for v in m["per_process_mib"].values() if v is not None) or "not shown"
                lines.append(f"| {m['model']} | {m['setup']} | {m['over_idle_mib']} | {per} |")
        for e in r["errors"]:
            lines.append(f"\n**FAILED** {e['part']}: {e['error']}")
        for s in r["skipped"]:
            lines.append(f"\nskipped (time budget): {s}")
        return "\n".join(lines) + "\n"


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="gpu-carry/embed-bin", help="directory of modelshare and modelshare-embed (or .xz)")
    ap.add_argument("--model-dir", default="gpu-carry/minilm-f16", help="MiniLM-L6 as sentence-transformers files")
    ap.add_argument("--out", help="where the reports and logs go")
    ap.add_argument("--workers", help="worker counts, comma-separated (1,2,4,8; 1,8 with --quick)")
    ap.add_argument("--sentences", type=int, help="how many sentences (60000; 2000 with --quick)")
    ap.add_argument("--quick", action="store_true", help="2,000 sentences, 1 and 8 workers")
    ap.add_argument("--models", default="minilm,bert-large", help="minilm and/or bert-large")
    ap.add_argument("--backend", choices=["cuda", "host"], default="cuda", help="the server's backend")
    ap.add_argument("--st-device", default="cuda", help="where sentence-transformers runs (cuda, cpu)")
    ap.add_argument("--concurrency", type=int, default=32, help="HTTP requests in flight")
    ap.add_argument("--max-batch-items", type=int, help="each worker's --max-batch-items (default: the worker's)")
    ap.add_argument("--st-batches", default=",".join(map(str, ST_BATCHES)), type=lambda v: [int(x) for x in v.split(",")],
                    help="sentence-transformers batch sizes")
    ap.add_argument("--no-anchors", action="store_true",
                    help="modelshare rows only (no sentence-transformers, PyTorch or cuBLAS rows): an A/B of builds")
    ap.add_argument("--no-memory", action="store_true", help="skip the GPU memory comparison")
    ap.add_argument("--mps", action="store_true",
                    help="then the worker counts again under one MPS daemon (nvidia-cuda-mps-control)")
    ap.add_argument("--profile-stages", action="store_true",
                    help="workers log where their time went (modelshare-embed --profile-stages), kept in the report")
    ap.add_argument("--max-batch-tokens", type=int, help="each worker's --max-batch-tokens (default: the worker's)")
    ap.add_argument("--baseline-bin", help="another build's modelshare and modelshare-embed (or .xz): its rows "
                    "follow this build's, same worker counts (an A/B in one run)")
    ap.add_argument("--slots", default="", type=lambda v: [int(x) for x in v.split(",") if x],
                    help="also one worker of each of these --compute-slots counts (e.g. 2,4)")
    ap.add_argument("--worker-args", default="", help="flags for this build's workers (e.g. --compute-slots 2), "
                    "shown in the rows' setup")
    ap.add_argument("--baseline-worker-args", default="", help="flags for the baseline build's workers only "
                    "(an older build's defaults made explicit)")
    ap.add_argument("--budget-s", type=float, default=480, help="parts starting after this are skipped")
    ap.add_argument("--serving", action="append", default=[],
                    help="a line for the servers' [serving] table (e.g. 'gpu_sharing = \"turns\"'); repeatable")
    ap.add_argument("--warm-s", type=float, default=15,
                    help="with several workers, load for at least this long before the timed passes (the server "
                         "measures how its GPU's workers share it in their first seconds)")
    ap.add_argument("--passes", type=int, default=1,
                    help="timed passes per modelshare row; the row shows the median pass (all in the JSON)")
    ap.add_argument("--wheels", default="gpu-carry/wheels", help="wheels to install sentence-transformers from")
    ap.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    ap.add_argument("--job", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return args
    if not args.out:
        ap.error("--out is required")
    args.workers = [int(n) for n in (args.workers or ("1,8" if args.quick else "1,2,4,8")).split(",")]
    args.sentences = args.sentences or (2000 if args.quick else 60000)
    args.models = args.models.split(",")
    return args


def main():
    args = parse_args()
    if args.child:
        job = load_json(args.job)
        result = CHILDREN[args.child](job)
        write_json(job["result"], result)
        return 0
    bench = Bench(args)
    bench.run()
    return 1 if bench.result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
