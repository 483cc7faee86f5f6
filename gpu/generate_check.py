#!/usr/bin/env python3
"""The generation worker's engines on a GPU against transformers' greedy ``generate`` at batch
1 (issue 30): a small random Llama in float32 on CUDA (TF32 off), eight prompts of 3 to 200
tokens submitted at once, 48 new tokens each. Each engine's tokens must equal ``generate``'s,
prompt by prompt: continuous batching with CUDA graphs (the worker's default on CUDA), without
them, and step-level batching. Prints a table; exits 1 on any difference.

    python3 gpu/generate_check.py [--device cuda:0] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "workers", "python"))

import torch  # noqa: E402
import transformers  # noqa: E402

import continuous_engine  # noqa: E402
from sequence import Sequence  # noqa: E402
from step_engine import StepEngine  # noqa: E402

NEW = 48


class Words:
    """A tokenizer stand-in: the ids as words (the check compares ids)."""

    @staticmethod
    def decode(ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


class Model:
    """What the engines take of the worker's ``Generator``."""

    def __init__(self, net, device):
        self.net, self.device = net, torch.device(device)
        self.tokenizer, self.eos, self.pad, self.max_positions = Words(), {1}, 2, 1024


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(30)
    config = transformers.LlamaConfig(vocab_size=2000, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024,
                                      bos_token_id=0, eos_token_id=1, pad_token_id=2, initializer_range=0.2)
    net = transformers.LlamaForCausalLM(config).to(args.device).eval()
    net.config._attn_implementation = "sdpa"
    g = torch.Generator().manual_seed(1)
    prompts = [[0] + torch.randint(3, 2000, (n,), generator=g).tolist() for n in (3, 17, 64, 5, 200, 33, 128, 9)]
    with torch.inference_mode():
        want = []
        for p in prompts:
            out = net.generate(torch.tensor([p], device=args.device), max_new_tokens=NEW, do_sample=False,
                               attention_mask=torch.ones(1, len(p), dtype=torch.long, device=args.device),
                               eos_token_id=None, pad_token_id=2)
            want.append(out[0, len(p):].tolist())
    model = Model(net, args.device)
    engines = {
        "continuous, CUDA graphs": lambda: continuous_engine.ContinuousEngine(model, 8, cache_tokens=8192,
                                                                              batch_tokens=512, cuda_graphs=True),
        "continuous, no graphs": lambda: continuous_engine.ContinuousEngine(model, 8, cache_tokens=8192,
                                                                            batch_tokens=512, cuda_graphs=False),
        "steps": lambda: StepEngine(model, 8),
    }
    rows, failed = [], False
    for name, make in engines.items():
        engine = make()
        try:
            for rnd in range(2):  # the second round replays what the first captured
                seqs = [Sequence(p, max_tokens=NEW, temperature=0.0, top_p=1.0, seed=None, stop=[], ignore_eos=True)
                        for p in prompts]
                t0 = time.perf_counter()
                for s in seqs:
                    engine.submit(s)
                deadline = time.monotonic() + 120
                while not all(s.done for s in seqs) and time.monotonic() < deadline:
                    time.sleep(0.01)
                wall = time.perf_counter() - t0
                same = [s.generated == w for s, w in zip(seqs, want)]
                first = [next((i for i, (a, b) in enumerate(zip(s.generated, w)) if a != b), None)
                         for s, w in zip(seqs, want)]
                rows.append({"engine": name, "round": rnd + 1, "equal": sum(same), "of": len(seqs),
                             "first_difference": first, "tokens_per_s": len(seqs) * NEW / wall})
                failed |= not all(same)
        finally:
            engine.close()
    lines = ["| engine | round | prompts equal to generate | first differing token | tokens/s |",
             "| --- | ---: | ---: | --- | ---: |"]
    for r in rows:
        lines.append(f"| {r['engine']} | {r['round']} | {r['equal']}/{r['of']} | {r['first_difference']} | "
                     f"{r['tokens_per_s']:.0f} |")
    text = "\n".join(lines)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "generate-check.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
                   "transformers": transformers.__version__, "torch": torch.__version__, "rows": rows}, f, indent=2)
    print("FAIL" if failed else "PASS")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
