#!/usr/bin/env python3
"""Smoke test of modelshare-embed on the GPU without sentence-transformers: a BERT with
MiniLM's shape and random weights (f16 safetensors, MiniLM's tokenizer and
sentence-transformers files), served with `--backend cuda` by one worker, against the same
weights upcast to f32 in transformers' BertModel with mean pooling and normalization.

Usage: embed_smoke.py --bin gpu-carry/bin --files gpu-carry/minilm-files --out $OUT [--worker-args ARGS]
Sends the sentences several times, whole and in parts (a worker's first pass at a shape runs each
kernel, later ones replay a CUDA graph captured for the shape, at a padded launch shape), and
compares every answer. Prints the worst cosines and one JSON line; exits 1 below --min-cosine
(default 0.999).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check import lib_path  # noqa: E402

SENTENCES = ["hello world", "", "日本語のテキスト 🎉", "word " * 400, "Ünïcödé façade — naïve café",
             "👨‍👩‍👧‍👦 🇯🇵", "مرحبا بالعالم", "Привет мир", "a", "The quick brown fox jumps over the lazy dog. " * 5]


def make_model(files, out):
    import torch
    from transformers import BertConfig, BertModel
    cfg = json.load(open(os.path.join(files, "config.json")))
    torch.manual_seed(0)
    model = BertModel(BertConfig(**{k: v for k, v in cfg.items() if not k.startswith("_")}), add_pooling_layer=False)
    model = model.half()
    model.save_pretrained(out, safe_serialization=True)
    for name in ["tokenizer.json", "modules.json", "sentence_bert_config.json", "tokenizer_config.json"]:
        shutil.copy(os.path.join(files, name), out)
    os.makedirs(os.path.join(out, "1_Pooling"), exist_ok=True)
    shutil.copy(os.path.join(files, "1_Pooling", "config.json"), os.path.join(out, "1_Pooling"))
    return model


def reference(model, files, sentences):
    import torch
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(files, "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(256)
    m = model.float().cuda().eval()
    out = []
    with torch.no_grad():
        for s in sentences:
            e = tok.encode(s)
            ids = torch.tensor([e.ids], device="cuda")
            h = m(input_ids=ids, token_type_ids=torch.zeros_like(ids)).last_hidden_state[0]
            v = h.mean(0)
            out.append((v / v.norm().clamp(min=1e-12)).cpu().numpy())
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="gpu-carry/bin")
    ap.add_argument("--files", default="gpu-carry/minilm-files")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/embed-smoke"))
    ap.add_argument("--min-cosine", type=float, default=0.999)
    ap.add_argument("--worker-args", default="",
                    help="more flags for the worker, e.g. --max-batch-tokens 512: with the fused attention the "
                         "ten sentences (~360 real tokens, 10 × 256 padded) are then one group of mixed lengths")
    a = ap.parse_args()
    import numpy as np
    os.makedirs(a.out, exist_ok=True)
    tmp = tempfile.mkdtemp()
    root = os.path.join(tmp, "models")
    model = make_model(a.files, os.path.join(root, "rand"))
    env = dict(os.environ, LD_LIBRARY_PATH=lib_path() + ":" + os.environ.get("LD_LIBRARY_PATH", ""),
               RUST_LOG="info,modelshare_embed::cuda=debug")
    sock = os.path.join(tmp, "grpc.sock")
    server = subprocess.Popen([f"{a.bin}/modelshare", "serve", "--backend", "cuda", "--model-root", root,
                               "--unix-socket", sock, "--handle-socket", os.path.join(tmp, "h.sock"),
                               "--listen", "127.0.0.1:0", "--unauthenticated-tcp", "--http-listen", "127.0.0.1:18080", "--model", "rand=rand"],
                              env=env, stdout=open(os.path.join(a.out, "smoke-server.log"), "w"), stderr=subprocess.STDOUT)
    worker = subprocess.Popen([f"{a.bin}/modelshare-embed", "--server", f"unix:{sock}", "--model", "rand",
                               *a.worker_args.split()],
                              env=env, stdout=open(os.path.join(a.out, "smoke-worker.log"), "w"), stderr=subprocess.STDOUT)
    result = {"ok": False}
    try:
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen("http://127.0.0.1:18080/v2/models/rand/ready", timeout=2)
                break
            except Exception:  # noqa: BLE001
                if time.time() > deadline or worker.poll() is not None or server.poll() is not None:
                    raise RuntimeError("not ready: " + open(os.path.join(a.out, "smoke-worker.log")).read()[-2000:])
                time.sleep(0.2)
        want = reference(model, a.files, SENTENCES)
        # Whole, then parts of 3 and 7 (other launch shapes), each more than once.
        parts = [range(10), range(10), range(3), range(3), range(3, 10), range(3, 10), range(10)]
        cos = [1.0] * len(SENTENCES)
        for part in parts:
            req = urllib.request.Request("http://127.0.0.1:18080/v1/embeddings",
                                         data=json.dumps({"model": "rand", "input": [SENTENCES[i] for i in part]}).encode(),
                                         headers={"content-type": "application/json"})
            got = [np.array(d["embedding"]) for d in json.load(urllib.request.urlopen(req, timeout=60))["data"]]
            if len(got) != len(part):
                raise RuntimeError(f"{len(got)} vectors for {len(part)} sentences")
            for i, g in zip(part, got):
                w = want[i]
                cos[i] = min(cos[i], float(g @ w / (np.linalg.norm(g) * np.linalg.norm(w))))
        # Graphs the worker's slots captured (its debug lines; 0 with --cuda-graphs false).
        log = open(os.path.join(a.out, "smoke-worker.log"), errors="replace").read()
        graphs = log.count("captured a CUDA graph")
        result = {"ok": min(cos) >= a.min_cosine, "min_cosine": min(cos), "cosines": cos, "requests": len(parts),
                  "graphs_captured": graphs}
        print("cosines (worst of each sentence's answers):", " ".join(f"{c:.6f}" for c in cos))
    except Exception as e:  # noqa: BLE001
        result["error"] = f"{type(e).__name__}: {e}"
        print(result["error"])
    finally:
        for p in (worker, server):
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
