#!/usr/bin/env python3
"""Text generation from shared weights on a GPU (issue 30's GPU rows), against the carried wheel
and a CUDA server, with workers/python/generate_worker.py:

  alone     transformers' generate alone in one process on the same GPU (the anchor): the
            model loaded from the file (time from the process's start to its first token), then
            batches of 1, 8 and 32 prompts, each generating --new tokens (EOS ignored): tokens/s
            and time to first token (a generate of one token)
  served    one generation worker: time from its process's start to its first token (weights
            attached, not read), then 1, 8 and 32 concurrent streams through
            /v1/completions (server-sent events, --new tokens each, EOS ignored): tokens/s of
            all streams, time to first token (median, p90) and between tokens
  memory    --workers generation workers on the GPU: device memory of the server (W) and of each
            worker (context + cache), against N x W; then 32 streams over them

The model: a Llama of about 1.1B parameters (TinyLlama's shape) with random bf16 weights and a
word-level tokenizer of its 32,000 words, made here (no hub is reachable).

    python3 gpu/generate_bench.py --carry gpu-carry/pyserve --out $OUT [--only alone,served,memory]
                                  [--engine auto|continuous|steps]

--engine is the workers' (auto: transformers' continuous batching where it has it). --carry holds modelshare.xz (release, xz) and the wheel. Writes generate-bench.json and
generate-bench.md under --out.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import python_serve  # noqa: E402
from python_serve import Server, setup  # noqa: E402

WORKER = os.path.join(ROOT, "workers", "python", "generate_worker.py")
VOCAB = 32000
PROMPT_WORDS = 64
CONCURRENCY = (1, 8, 32)
#: Where the anchor runs (cpu in a dry run).
DEVICE = ["cuda"]


def smi_used() -> int | None:
    return python_serve.smi_used() if DEVICE[0] == "cuda" else None


def log(msg: str) -> None:
    print(f"[generate-bench] {msg}", flush=True)


def make_model(folder: str, tiny: bool = False) -> None:
    """TinyLlama-1.1B's shape, random bf16 weights, a word-level tokenizer of w0..w31999 (with
    ``tiny``, for a dry run on the CPU: a small Llama in f32)."""
    import tokenizers
    import torch
    import transformers

    os.makedirs(folder, exist_ok=True)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i + 3 for i in range(VOCAB - 3)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.decoder = tokenizers.decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                                eos_token="</s>", pad_token="<unk>")
    fast.save_pretrained(folder)
    shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2) if tiny else \
        dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
             num_key_value_heads=4)
    config = transformers.LlamaConfig(vocab_size=VOCAB, max_position_embeddings=2048, bos_token_id=1,
                                      eos_token_id=2, tie_word_embeddings=False, **shape)
    torch.manual_seed(30)
    with torch.device("cpu" if tiny else "cuda"):
        model = transformers.LlamaForCausalLM(config)
    if not tiny:
        model = model.to(torch.bfloat16)
    model.save_pretrained(folder)
    params = sum(p.numel() for p in model.parameters())
    log(f"model: {params / 1e9:.2f}B parameters, bf16, {folder}")
    del model
    torch.cuda.empty_cache()


def prompt(i: int) -> str:
    return " ".join(f"w{(i * 7919 + j * 104729) % (VOCAB - 3)}" for j in range(PROMPT_WORDS))


# --- the anchor: transformers alone -----------------------------------------------------------

def role_alone(args: argparse.Namespace) -> int:
    """Run as a fresh process: load from the file, first token, then the batches."""
    started = float(args.started)
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(args.model_dir)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.bfloat16)
    except TypeError:  # transformers before 4.56 names it torch_dtype
        model = transformers.AutoModelForCausalLM.from_pretrained(args.model_dir, torch_dtype=torch.bfloat16)
    device = "cpu" if args.dry_run else "cuda"
    model = model.to(device).eval()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    ids = tok([prompt(0)], return_tensors="pt").to(device)
    with torch.inference_mode():
        model.generate(**ids, max_new_tokens=1, do_sample=False)
    sync()
    first = time.time() - started
    rows = {"load_to_first_token_s": first}
    for batch in CONCURRENCY:
        enc = tok([prompt(i) for i in range(batch)], return_tensors="pt", padding=True).to(device)
        with torch.inference_mode():
            model.generate(**enc, max_new_tokens=2, min_new_tokens=2, do_sample=False)  # warm
            sync()
            t0 = time.perf_counter()
            model.generate(**enc, max_new_tokens=1, do_sample=False)
            sync()
            ttft = time.perf_counter() - t0
            t0 = time.perf_counter()
            out = model.generate(**enc, max_new_tokens=args.new, min_new_tokens=args.new, do_sample=False)
            sync()
            took = time.perf_counter() - t0
        new = (out.shape[1] - enc["input_ids"].shape[1]) * batch
        rows[f"b{batch}"] = {"tokens_per_s": new / took, "ttft_ms": ttft * 1000, "seconds": took}
        log(f"alone batch {batch}: {new / took:.0f} tokens/s, TTFT {ttft * 1000:.1f} ms")
    if device == "cuda":
        rows["peak_memory_mib"] = torch.cuda.max_memory_allocated() / 2**20
    print("RESULT " + json.dumps(rows), flush=True)
    return 0


# --- the served side ------------------------------------------------------------------------------

def stream_once(base: str, model: str, text: str, new: int, timeout: float = 300) -> dict:
    """One streamed completion: when each chunk came, from the request's start."""
    host = base.removeprefix("http://")
    conn = http.client.HTTPConnection(host, timeout=timeout)
    body = json.dumps({"model": model, "prompt": text, "max_tokens": new, "temperature": 0, "stream": True})
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body=body, headers={"content-type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"{r.status}: {r.read()[:500]!r}")
    stamps = []
    for line in r:
        if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                stamps.append(time.perf_counter() - t0)
    conn.close()
    return {"stamps": stamps}


def concurrent(base: str, model: str, streams: int, new: int) -> dict:
    results: list[dict] = [{} for _ in range(streams)]

    def run(i: int) -> None:
        try:
            results[i] = stream_once(base, model, prompt(i), new)
        except Exception as e:  # noqa: BLE001
            results[i] = {"error": str(e)}

    threads = [threading.Thread(target=run, args=(i,)) for i in range(streams)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    errors = [r["error"] for r in results if "error" in r]
    ok = [r for r in results if "stamps" in r and r["stamps"]]
    tokens = sum(len(r["stamps"]) for r in ok)
    ttft = sorted(r["stamps"][0] for r in ok)
    gaps = [b - a for r in ok for a, b in zip(r["stamps"], r["stamps"][1:])]
    return {"streams": streams, "tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall if wall else 0,
            "ttft_ms_p50": 1000 * statistics.median(ttft) if ttft else None,
            "ttft_ms_p90": 1000 * ttft[int(0.9 * (len(ttft) - 1))] if ttft else None,
            "itl_ms_p50": 1000 * statistics.median(gaps) if gaps else None, "errors": errors[:3]}


def spawn_worker(server: Server, name: str, args: argparse.Namespace, log_path: str) -> subprocess.Popen:
    env = dict(os.environ, MODELSHARE_SERVER=server.address)
    out = open(log_path, "w")
    return subprocess.Popen([sys.executable, WORKER, "--model", "lm", "--name", name, "--streams",
                             str(args.streams), "--ignore-eos", "--engine", args.engine],
                            stdout=out, stderr=subprocess.STDOUT, env=env)


def worker_memory() -> dict[int, int]:
    if DEVICE[0] != "cuda":
        return {}
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    used = {}
    for line in out.strip().splitlines():
        pid, mib = [x.strip() for x in line.split(",")]
        used[int(pid)] = int(mib)
    return used


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", default="main")
    ap.add_argument("--carry", default="gpu-carry/pyserve")
    ap.add_argument("--bin", help="binaries already there (instead of --carry's .xz)")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/generate-bench"))
    ap.add_argument("--only", default="alone,served,memory")
    ap.add_argument("--new", type=int, default=128, help="tokens generated per stream")
    ap.add_argument("--streams", type=int, default=32, help="the worker's streams")
    ap.add_argument("--workers", type=int, default=2, help="workers of the memory row")
    ap.add_argument("--engine", default="auto", help="the workers' --engine (auto, continuous, steps)")
    ap.add_argument("--model-dir")
    ap.add_argument("--started")
    ap.add_argument("--dry-run", action="store_true",
                    help="on a machine without a GPU: a tiny model on the CPU, the host backend (--bin target/debug)")
    args = ap.parse_args()
    if args.dry_run:
        python_serve.BACKEND[0] = "host"
        DEVICE[0] = "cpu"
    if args.role == "alone":
        return role_alone(args)
    if args.role == "make":
        make_model(args.model_dir, tiny=args.dry_run)
        return 0
    os.makedirs(args.out, exist_ok=True)
    setup(args)
    # Python's bytecode cache where it can be written (the lent machine's site-packages may not
    # be), warmed once: the start-up rows then time a deployment's start, not the compiling of
    # torch's and transformers' modules, for the anchor and the worker alike.
    os.environ.setdefault("PYTHONPYCACHEPREFIX", "/tmp/generate-bench-pycache")
    warm = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch, transformers, tokenizers, modelshare; "
                    "transformers.AutoTokenizer; transformers.LlamaForCausalLM; transformers.GenerationMixin; "
                    "import transformers.generation.candidate_generator"], check=False, timeout=600)
    log(f"bytecode cache warmed in {time.perf_counter() - warm:.1f} s")
    root = "/tmp/generate-bench-models"
    folder = os.path.join(root, "lm")
    if not os.path.exists(os.path.join(folder, "model.safetensors")):
        # In a process of its own: this one holds no CUDA context while memory is measured.
        subprocess.run([sys.executable, __file__, "--role", "make", "--model-dir", folder,
                        *(["--dry-run"] if args.dry_run else [])], check=True, timeout=600)
    only = args.only.split(",")
    results: dict = {"new_tokens": args.new, "prompt_tokens": PROMPT_WORDS, "engine": args.engine}
    if "alone" in only:
        p = subprocess.run([sys.executable, __file__, "--role", "alone", "--model-dir", folder, "--new", str(args.new),
                            "--started", str(time.time()), *(["--dry-run"] if args.dry_run else [])],
                           capture_output=True, text=True, timeout=900)
        line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
        results["alone"] = json.loads(line[7:]) if line else {"error": (p.stdout + p.stderr)[-2000:]}
        log(f"alone: {results['alone']}")
    server = Server(args.bin, root, args.out, "gen")
    try:
        idle = smi_used()
        server.cli("load", "lm", "lm", "--public")
        loaded = smi_used()
        results["weights_mib"] = loaded - idle if idle is not None else None
        if "served" in only:
            started = time.perf_counter()
            worker = spawn_worker(server, "gen-0", args, os.path.join(args.out, "worker-0.log"))
            # The request waits for the worker (the server's no-worker wait is 10 s; retried).
            first = None
            while first is None and time.perf_counter() - started < 300:
                try:
                    r = stream_once(server.http, "lm", prompt(0), 1)
                    first = time.perf_counter() - started if r["stamps"] else None
                except RuntimeError:
                    time.sleep(0.2)
            results["served_start_to_first_token_s"] = first
            results["worker_start_log"] = next((line.strip() for line in open(os.path.join(args.out, "worker-0.log"))
                                                if "since the process started" in line), None)
            log(f"a new worker's first token {first:.2f} s after its start ({results['worker_start_log']})")
            concurrent(server.http, "lm", 4, 4)  # warm
            results["served"] = {f"s{c}": concurrent(server.http, "lm", c, args.new) for c in CONCURRENCY}
            for c in CONCURRENCY:
                log(f"served {c} streams: {results['served'][f's{c}']}")
            results["one_worker_memory_mib"] = worker_memory().get(worker.pid)
        else:
            worker = None
        if "memory" in only:
            workers = [worker] if worker else []
            while len(workers) < args.workers:
                workers.append(spawn_worker(server, f"gen-{len(workers)}", args,
                                            os.path.join(args.out, f"worker-{len(workers)}.log")))
            deadline = time.time() + 300
            while server.serving("gen-0") + sum(server.serving(f"gen-{i}") for i in range(1, args.workers)) < args.workers:
                if time.time() > deadline:
                    raise RuntimeError("the workers did not start")
                time.sleep(0.5)
            concurrent(server.http, "lm", 8, 4)  # every worker warm
            run = concurrent(server.http, "lm", 32, args.new)
            used = worker_memory()
            results["memory"] = {"workers": args.workers, "server_mib": used.get(server.proc.pid),
                                 "worker_mib": [used.get(w.pid) for w in workers], "s32": run,
                                 "gpu_used_mib": smi_used() - idle if idle is not None else None}
            log(f"memory: {results['memory']}")
    finally:
        server.stop()
    with open(os.path.join(args.out, "generate-bench.json"), "w") as f:
        json.dump(results, f, indent=2)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
