"""A Python worker on the modelshare package, for the serving tests (python/tests/test_serve.py).

Serves ``--model`` (default ``enc``): a text item ``s`` answers ``embedding = w + len(s)`` (the
model's tensor ``w``, read in place through ``Model.numpy()``, the handler rebuilt by
``on_version`` for each version) with ``prompt_tokens`` = the words of ``s``. Text commands:
``fail:MSG`` fails the item with INVALID_ARGUMENT (``ItemError``), ``boom`` raises a
``RuntimeError`` (INTERNAL), ``sleep:N ...`` sleeps N ms first, ``write`` writes into the shared
weights through torch (the mapping is read-only: the process dies of SIGSEGV).

``--streams N``: a streaming worker (text generation's shape): each item's words are its tokens,
yielded one part each (``sleep:N`` first: N ms before each), up to ``max_tokens`` (default 16);
the final answer carries ``finish_reason``, ``prompt_tokens`` and ``completion_tokens``. A chat
item generates from its last message's content. With ``--async`` the generator is ``async``
(its final answer a yielded ``modelshare.Final``). A generator closed early (the item cancelled)
prints ``generator closed after K parts``.

``--write-on-attach``: attach, then write into the weights through torch at once, without serving.
The server and token come from the environment (MODELSHARE_SERVER, MODELSHARE_TOKEN), as in a
deployment. Prints nothing but errors; exits 1 with ``error: ...`` on a refusal.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time

import numpy as np

import modelshare


def handler_for(model: modelshare.Model, use_async: bool):
    w = model.numpy(["w"])["w"]
    version = model.version

    def answer(item: modelshare.Item):
        text = item.text or ""
        if text.startswith("fail:"):
            return modelshare.ItemError(text[len("fail:"):])
        if text == "write":
            tensor = model.torch(["w"])["w"]
            tensor.add_(1.0)  # SIGSEGV: the mapping is read-only
        if text == "boom":
            raise RuntimeError("boom")
        return modelshare.Output({"embedding": w + np.float32(len(text.encode()))},
                                 {"prompt_tokens": len(text.split()), "version": version})

    def sleep_for(batch: modelshare.Batch) -> float:
        ms = [int(t.split(":", 1)[1].split(" ", 1)[0]) for t in batch.texts if t and t.startswith("sleep:")]
        return max(ms, default=0) / 1000

    if use_async:
        async def handle(batch: modelshare.Batch):
            await asyncio.sleep(sleep_for(batch))
            return [answer(item) for item in batch.items]
    else:
        def handle(batch: modelshare.Batch):
            end = time.monotonic() + sleep_for(batch)
            while time.monotonic() < end and not all(i.cancelled for i in batch.items):
                time.sleep(0.005)
            return [answer(item) for item in batch.items]

    return handle


def stream_handler(use_async: bool):
    def plan(item: modelshare.Item):
        text = item.text or ""
        if item.parameters.get("task") == "chat":
            text = json.loads(text)[-1]["content"]
        words = text.split()
        count = min(len(words), int(item.parameters.get("max_tokens", 16)))
        delay = 0.0
        if words and words[0].startswith("sleep:"):
            delay = int(words[0][len("sleep:"):]) / 1000
        end = {"finish_reason": "length" if count < len(words) else "stop",
               "prompt_tokens": len(words), "completion_tokens": count}
        return [w if i == 0 else " " + w for i, w in enumerate(words[:count])], delay, end

    if use_async:
        async def handle(item: modelshare.Item):
            tokens, delay, end = plan(item)
            sent = 0
            try:
                for token in tokens:
                    await asyncio.sleep(delay)
                    yield token
                    sent += 1
            except GeneratorExit:
                print(f"generator closed after {sent} parts", flush=True)
                raise
            yield modelshare.Final(modelshare.Output(parameters=end))
    else:
        def handle(item: modelshare.Item):
            tokens, delay, end = plan(item)
            sent = 0
            try:
                for token in tokens:
                    time.sleep(delay)
                    yield token
                    sent += 1
            except GeneratorExit:
                print(f"generator closed after {sent} parts", flush=True)
                raise
            return modelshare.Output(parameters=end)

    return handle


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--model", default="enc")
    ap.add_argument("--credits", type=int, default=2)
    ap.add_argument("--async", dest="use_async", action="store_true")
    ap.add_argument("--write-on-attach", action="store_true")
    ap.add_argument("--streams", type=int, default=0)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format=f"{args.name}: %(message)s")
    try:
        with modelshare.Session.open(name=args.name, wait=None) as session:
            if args.write_on_attach:
                model = session.attach(args.model)
                tensor = model.torch(["w"])["w"]
                print("attached", flush=True)
                time.sleep(0.5)
                tensor.add_(1.0)
                print("wrote into a read-only mapping", flush=True)
                return 3
            if args.streams:
                session.serve(args.model, stream_handler(args.use_async), streams=args.streams)
                return 0
            session.serve(args.model, on_version=lambda m: handler_for(m, args.use_async),
                          credits=args.credits, max_batch_items=8)
    except modelshare.Error as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
