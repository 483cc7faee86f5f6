#!/usr/bin/env python3
"""The modelshare echo worker in Python, on the ``modelshare`` package: the same computation as
the Rust modelshare-echo-worker (workers/echo), so that the server's tests can run either. The
package runs the protocol (the Rust SDK's serve loop: credits, heartbeats, cancels, drains,
reconnection); this file is only the computation.

Computation (see workers/echo/src/echo.rs, the reference):
- w: the model's first tensor in name order whose dtype is F32, F16 or BF16, flattened, as
  f32 values; [0.0] if there is none (or it has no elements). Read in place from the shared
  arena.
- Text item s: "fail:MSG" fails with INVALID_ARGUMENT, message MSG. "sleep:N ..." (N: the
  characters after "sleep:" up to the first space or the end, ASCII digits, else
  INVALID_ARGUMENT) sleeps N ms first (a batch sleeps once, for its longest item, and stops
  early once all its items are cancelled). Output "embedding", FP32, [D]:
  w[j] + (UTF-8 byte length of s), rounded to f32 as an f32 addition; output parameter
  "prompt_tokens" (int64): the words of s split on Unicode white space (Rust's
  char::is_whitespace set).
- D: item parameter "dimensions" (an integer) if given, else min(len(w), 64); anything else,
  or outside 1..len(w), fails with INVALID_ARGUMENT
  "parameter 'dimensions' must be an integer from 1 to {len(w)}".
- Tensor item whose only input is "input_ids", INT32 or INT64, shape [n]: as text with the
  byte length replaced by n; prompt_tokens = n.
- Other tensor items: output "echo" = the first input tensor unchanged (dtype, shape, bytes);
  if it is FP32 also "plus_weights", FP32, same shape, x[k] + w[k % len(w)]. No tensors:
  INVALID_ARGUMENT.

After a drain (a new version loaded) it serves the latest version; on SIGTERM/SIGINT it
answers what it holds, closes and exits 0 (a second signal exits 1 at once). A wrong token or
an unknown model ends it with status 1 and the server's reason.

Usage: echo_worker.py [--server unix:/path] --model NAME [--credits 2] [--token T]
       echo_worker.py --self-test
The server: --server, else the package's discovery rule (MODELSHARE_SERVER, this user's socket,
/run/modelshare/grpc.sock, 127.0.0.1:50051). The token: --token, --token-file, else
MODELSHARE_TOKEN / MODELSHARE_TOKEN_FILE.
"""

import argparse
import logging
import re
import sys
import time

import numpy as np

import modelshare

DEFAULT_DIMENSIONS = 64
FLOATS = ("F32", "F16", "BF16")

# Rust's char::is_whitespace (Unicode White_Space); Python's str.split() uses another set.
WHITESPACE = re.compile("[\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+")


def weights(model):
    """w: the first float tensor in name order with elements, as f32 (a view where it is F32)."""
    for entry in sorted(model.manifest, key=lambda t: t["name"]):
        if entry["dtype"] in FLOATS:
            if int(np.prod(entry["shape"], dtype=np.int64)) == 0:
                break
            return model.numpy([entry["name"]])[entry["name"]].reshape(-1).astype(np.float32, copy=False)
    return np.zeros(1, dtype=np.float32)


def sleep_ms(text):
    """Milliseconds a text item asks to sleep (0: none); raises INVALID_ARGUMENT if malformed."""
    if not text.startswith("sleep:"):
        return 0
    digits = text[len("sleep:"):].split(" ", 1)[0]
    if not digits or not all("0" <= c <= "9" for c in digits) or int(digits) > (1 << 64) - 1:
        raise modelshare.ItemError(f"sleep:N needs N in milliseconds, got '{digits}'")
    return int(digits)


def dimensions(w, parameters):
    d = parameters.get("dimensions")
    if d is None:
        return min(len(w), DEFAULT_DIMENSIONS)
    if isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= len(w):
        raise modelshare.ItemError(f"parameter 'dimensions' must be an integer from 1 to {len(w)}")
    return d


def embed(w, parameters, add, prompt_tokens):
    d = dimensions(w, parameters)
    with np.errstate(over="ignore"):
        values = w[:d] + np.float32(add)
    return modelshare.Output({"embedding": values}, {"prompt_tokens": prompt_tokens})


def compute(w, item):
    """One item's answer (an Output, or raises ItemError)."""
    text = item.text
    if text is not None:
        if text.startswith("fail:"):
            raise modelshare.ItemError(text[len("fail:"):])
        words = len([x for x in WHITESPACE.split(text) if x])
        return embed(w, item.parameters, len(text.encode("utf-8")), words)
    inputs = item.inputs
    if not inputs:
        raise modelshare.ItemError("the item has no input tensors")
    name, first = next(iter(inputs.items()))
    if len(inputs) == 1 and name == "input_ids" and first.dtype in (np.int32, np.int64) and first.ndim == 1:
        n = first.shape[0]
        return embed(w, item.parameters, n, n)
    out = {"echo": first}
    if first.dtype == np.float32:
        flat = first.reshape(-1)
        with np.errstate(over="ignore"):
            out["plus_weights"] = (flat + w[np.arange(flat.size) % len(w)]).reshape(first.shape)
    return out


def handler_for(model):
    w = weights(model)

    def handle(batch):
        answers, sleeps = [], []
        for item in batch.items:
            try:
                sleeps.append(sleep_ms(item.text) if item.text is not None else 0)
                answers.append(None)
            except modelshare.ItemError as e:
                sleeps.append(0)
                answers.append(e)
        end = time.monotonic() + max(sleeps, default=0) / 1000
        while time.monotonic() < end and not all(item.cancelled for item in batch.items):
            time.sleep(min(0.005, max(0.0, end - time.monotonic())))
        for i, item in enumerate(batch.items):
            if answers[i] is None:
                try:
                    answers[i] = compute(w, item)
                except modelshare.ItemError as e:
                    answers[i] = e
        return answers

    return handle


def self_test():
    class FakeItem:
        def __init__(self, text=None, inputs=None, parameters=None):
            self.text, self.inputs, self.parameters = text, inputs or {}, parameters or {}

    def fails(fn, message=None):
        try:
            fn()
        except modelshare.ItemError as e:
            assert e.code == "INVALID_ARGUMENT", e.code
            assert message is None or str(e) == message, str(e)
            return
        raise AssertionError("expected INVALID_ARGUMENT")

    w = np.arange(100, dtype=np.float32) * np.float32(0.5)
    out = compute(w, FakeItem("héllo  wörld"))
    assert out.parameters == {"prompt_tokens": 2}
    assert np.array_equal(out.tensors["embedding"], w[:64] + np.float32(14))
    assert compute(w, FakeItem("a", parameters={"dimensions": 3})).tensors["embedding"].shape == (3,)
    for bad in (0, 101, True, 2.0, "3"):
        fails(lambda bad=bad: compute(w, FakeItem("a", parameters={"dimensions": bad})),
              "parameter 'dimensions' must be an integer from 1 to 100")
    fails(lambda: compute(w, FakeItem("fail:boom")), "boom")
    assert sleep_ms("sleep:250 hello") == 250 and sleep_ms("sleep:7") == 7 and sleep_ms("hi sleep:7") == 0
    for bad in ("sleep:x", "sleep: 5", "sleep:\u0663"):
        fails(lambda bad=bad: sleep_ms(bad))
    ids = np.array([5, 6, 7], dtype=np.int64)
    out = compute(w, FakeItem(inputs={"input_ids": ids}))
    assert out.parameters == {"prompt_tokens": 3} and out.tensors["embedding"][0] == np.float32(3)
    x = np.array([[1.0, 2.0]], dtype=np.float32)
    out = compute(w, FakeItem(inputs={"x": x}))
    assert out["echo"] is x and np.array_equal(out["plus_weights"], x + w[:2])
    fails(lambda: compute(w, FakeItem(inputs={})))
    big = np.array([3.0e38], dtype=np.float32)
    assert np.isinf(compute(big, FakeItem(inputs={"x": big}))["plus_weights"][0])
    assert compute(np.array([0.1], dtype=np.float32), FakeItem("abc")).tensors["embedding"][0] == np.float32(0.1) + np.float32(3)
    print("self-test ok")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", help="unix:/path/to/grpc.sock or http://host:port (default: the discovery rule)")
    ap.add_argument("--model", help="the model to serve (its latest ready version)")
    ap.add_argument("--name", default="python-echo-worker", help="worker name shown by `modelshare ps`")
    ap.add_argument("--credits", type=int, default=2, help="batches taken at once")
    ap.add_argument("--max-batch-items", type=int, default=32, help="most items in one batch")
    ap.add_argument("--max-batch-bytes", type=int, default=4 << 20, help="most input bytes in one batch")
    ap.add_argument("--token", help="bearer token (else MODELSHARE_TOKEN)")
    ap.add_argument("--token-file", help="file holding the bearer token (else MODELSHARE_TOKEN_FILE)")
    ap.add_argument("--self-test", action="store_true", help="check the computation on a fake w and exit")
    args = ap.parse_args()
    if args.self_test:
        self_test()
        return 0
    if not args.model:
        ap.error("--model is required")
    logging.basicConfig(level=logging.INFO, format="echo_worker: %(message)s")
    try:
        with modelshare.Session.open(args.server, name=args.name, token=args.token, token_file=args.token_file,
                                     wait=None) as session:
            session.serve(
                args.model,
                on_version=handler_for,
                credits=args.credits,
                max_batch_items=args.max_batch_items,
                max_batch_bytes=args.max_batch_bytes,
                # The server refuses any other input name (a KServe request's texts come as "text").
                inputs=[("text", "BYTES", [-1]), ("input_ids", "INT64", [-1]), ("input", "FP32", [-1])],
                outputs=[("embedding", "FP32", [-1]), ("echo", "FP32", [-1]), ("plus_weights", "FP32", [-1])],
            )
    except modelshare.Error as e:
        print(f"echo_worker: error: {e}", file=sys.stderr, flush=True)
        return 1
    print("echo_worker: stopped", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
