#!/usr/bin/env python3
"""Serves any Hugging Face ``transformers`` causal language model the server holds as text
generation, on the ``modelshare`` package: the weights are the server's shared memory (a module
built on the meta device and assigned the shared tensors: never a private copy), the model code
is transformers', and the tokens stream through the server's OpenAI doors
(``/v1/completions``, ``/v1/chat/completions``) as they are sampled.

Families: whatever ``transformers.AutoModelForCausalLM`` builds from the model's ``config.json``
(Llama, Qwen2, Mistral, GPT-2, ...); never remote code, never a pickle: the configuration,
tokenizer, chat template and generation defaults come from the JSON files the server publishes
with the weights (``config.json``, ``generation_config.json``, ``tokenizer.json``,
``tokenizer_config.json``, ``special_tokens_map.json``, ``chat_template.jinja``).

Requests (the server's generation items, docs/ARCHITECTURE.md "Generation items"; the
parameter ``task`` is required): a prompt, or chat messages rendered with the model's chat
template (transformers' sandboxed renderer, ``add_generation_prompt``); ``max_tokens``
(OpenAI's defaults: 16 for a completion, the rest of the context for a chat), ``temperature``
(default 1, OpenAI's; below 1e-4 greedy), ``top_p``, ``seed``, ``stop`` strings,
``max_prompt_tokens`` (the tenant's cap: a longer prompt is refused). A sequence that fails
(its sampling, its text) fails alone. A stalled reader does not pause its sequence: its text
waits in the worker, at most ``max_tokens`` of it. Generation stops at an end-of-sequence
token (unless ``--ignore-eos``), after ``max_tokens``, or at a stop string (the text is cut
before it; text that may be the start of a stop string is held back until it is not).

Batching: one engine thread steps every running sequence together (step-level batching). Each
step is one forward pass of the whole batch: a decode step over the batch's cache, or, when
sequences joined (or more than half the rows have finished), a prefill of every running
sequence, left-padded, which rebuilds the cache. A new request so waits at most one step.
Up to ``--streams`` sequences run at once; the server queues the rest.

Usage: generate_worker.py --model NAME [--server ADDR] [--streams 32] [--device cuda:0]
                          [--ignore-eos]
``Generator`` (model files + tensors -> tokens) is importable, so that a benchmark can run the
same code in one process, without the server.
"""

from __future__ import annotations

import argparse
import json
import logging
import queue
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

#: When the process started, as near as Python can tell (before torch's import).
STARTED = time.time()

import torch  # noqa: E402

import modelshare  # noqa: E402
from hf_files import json_file, tokenizer_of  # noqa: E402

log = logging.getLogger("generate_worker")

#: Tokens generated when the request names no ``max_tokens``.
DEFAULT_MAX_TOKENS = 16


class Generator:
    """A transformers causal LM over given tensors, with its tokenizer. ``files``: the model's
    metadata files (name -> bytes); ``tensors``: name -> torch tensor (``Model.torch()``, or a
    safetensors file's); ``device``: where to run (default: the tensors')."""

    def __init__(self, files: Mapping[str, bytes], tensors: Mapping[str, torch.Tensor], *,
                 device: str | None = None) -> None:
        import transformers

        config_json = json_file(files, "config.json")
        if not config_json or "model_type" not in config_json:
            raise modelshare.Error("the model has no config.json with a model_type")
        config = transformers.AutoConfig.for_model(**config_json)
        model_class = transformers.MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
        floats = {t.dtype for t in tensors.values() if t.is_floating_point()}
        dtype = floats.pop() if len(floats) == 1 else None
        if device is not None:
            tensors = {k: v.to(device) for k, v in tensors.items()}
        # Tied output embeddings are the input embeddings' tensor (the checkpoint holds it once).
        self.net = modelshare.module_from(dict(tensors), lambda: model_class(config), strict=False, dtype=dtype)
        self.net.eval()
        self.device = next(self.net.parameters()).device
        self.tokenizer = tokenizer_of(files)
        generation = json_file(files, "generation_config.json") or {}
        eos = generation.get("eos_token_id", config_json.get("eos_token_id"))
        self.eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        self.max_positions = int(getattr(config, "max_position_embeddings", 0) or
                                 getattr(config, "n_positions", 0) or 1 << 30)
        pad = self.tokenizer.pad_token_id
        self.pad = int(pad if pad is not None else next(iter(self.eos), 0))

    def prompt_ids(self, item_text: str, task: str) -> list[int]:
        """The prompt's token ids: a completion's text as is (with the tokenizer's special
        tokens), a chat's messages through the model's chat template (``ValueError`` when they
        cannot be rendered with it)."""
        if task == "chat":
            messages = json.loads(item_text)
            if not isinstance(messages, list):
                raise ValueError("a chat request's input is a JSON array of messages")
            try:
                text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            except Exception as e:  # noqa: BLE001 - the template's own errors (jinja, missing keys)
                raise ValueError(f"the messages cannot be rendered with the model's chat template: {e}") from None
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return list(self.tokenizer(item_text)["input_ids"])


class Sequence:
    """One request being generated: its tokens, its sampler, and the events its handler
    reads (``("text", str)`` as text is ready, then ``("end", finish_reason)``)."""

    def __init__(self, ids: list[int], *, max_tokens: int, temperature: float, top_p: float,
                 seed: int | None, stop: list[str], ignore_eos: bool) -> None:
        self.ids = list(ids)
        self.prompt_tokens = len(ids)
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.rng = torch.Generator()
        if seed is not None:
            self.rng.manual_seed(seed)
        else:
            self.rng.seed()
        self.stop = stop
        self.ignore_eos = ignore_eos
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.generated: list[int] = []
        self.sent = 0  # characters of the decoded text already sent
        self.done = False
        self.cancelled = False

    @property
    def completion_tokens(self) -> int:
        return len(self.generated)


class Engine:
    """Steps every running sequence together on a thread of its own (see the module's docs)."""

    def __init__(self, generator: Generator, max_batch: int) -> None:
        self.g = generator
        self.max_batch = max(1, max_batch)
        self.pending: queue.Queue[Sequence] = queue.Queue()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="generate-engine", daemon=True)
        self.thread.start()

    def submit(self, seq: Sequence) -> None:
        self.pending.put(seq)

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=10)

    def _run(self) -> None:
        rows: list[Sequence] = []  # the batch's rows, finished ones included until a rebuild
        cache = None
        mask = None
        rebuild = True
        while not self.stopped.is_set():
            live = [s for s in rows if not s.done]
            joined = False
            while len(live) < self.max_batch:
                try:
                    seq = self.pending.get(timeout=0.05 if not live else 0)
                except queue.Empty:
                    break
                live.append(seq)
                joined = True
            if not live:
                rows, cache, mask = [], None, None
                continue
            if joined or len(live) * 2 < len(rows):
                rows, rebuild = live, True
            try:
                logits, cache, mask = self._step(rows, cache, mask, rebuild)
            except Exception as e:  # noqa: BLE001 - every running sequence fails with it
                log.exception("a generation step failed")
                for s in rows:
                    if not s.done:
                        s.done = True
                        s.events.put(("error", e))
                rows, cache, mask, rebuild = [], None, None, True
                continue
            rebuild = False
            for i, s in enumerate(rows):
                if not s.done:
                    try:
                        self._advance(s, logits[i])
                    except Exception as e:  # noqa: BLE001 - that sequence fails, the others go on
                        log.exception("a sequence failed")
                        s.done = True
                        s.events.put(("error", e))

    @torch.inference_mode()
    def _step(self, rows: list[Sequence], cache: Any, mask: torch.Tensor | None, rebuild: bool):
        device = self.g.device
        if rebuild:
            longest = max(len(s.ids) for s in rows)
            ids = torch.tensor([[self.g.pad] * (longest - len(s.ids)) + s.ids for s in rows], device=device)
            mask = torch.tensor([[0] * (longest - len(s.ids)) + [1] * len(s.ids) for s in rows], device=device)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            out = self.g.net(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
        else:
            ids = torch.tensor([[s.ids[-1]] for s in rows], device=device)
            mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=mask.dtype, device=device)], dim=1)
            positions = mask.sum(-1, keepdim=True) - 1
            out = self.g.net(input_ids=ids, attention_mask=mask, position_ids=positions,
                             past_key_values=cache, use_cache=True)
        return out.logits[:, -1, :].float().cpu(), out.past_key_values, mask

    def _advance(self, s: Sequence, logits: torch.Tensor) -> None:
        if s.cancelled:
            s.done = True
            s.events.put(("end", "cancelled"))
            return
        token = _sample(logits, s)
        s.ids.append(token)
        s.generated.append(token)
        if token in self.g.eos and not s.ignore_eos:
            s.generated.pop()
            text = self.g.tokenizer.decode(s.generated, skip_special_tokens=True)
            cut = _first_stop(text, s.stop, s.sent)
            self._emit(s, text if cut is None else text[:cut])
            return self._end(s, "stop")
        text = self.g.tokenizer.decode(s.generated, skip_special_tokens=True)
        cut = _first_stop(text, s.stop, s.sent)
        if cut is not None:
            self._emit(s, text[:cut])
            return self._end(s, "stop")
        if len(s.generated) >= s.max_tokens or len(s.ids) >= self.g.max_positions:
            self._emit(s, text)
            return self._end(s, "length")
        # Hold back an incomplete character and what may begin a stop string.
        ready = len(text.rstrip("\ufffd"))
        ready -= _stop_prefix(text[:ready], s.stop)
        self._emit(s, text[:ready])

    @staticmethod
    def _emit(s: Sequence, text: str) -> None:
        if len(text) > s.sent:
            s.events.put(("text", text[s.sent:]))
            s.sent = len(text)

    @staticmethod
    def _end(s: Sequence, reason: str) -> None:
        s.done = True
        s.events.put(("end", reason))


#: Temperatures below this sample greedily (dividing by them overflows the logits).
MIN_TEMPERATURE = 1e-4


def _sample(logits: torch.Tensor, s: Sequence) -> int:
    if s.temperature < MIN_TEMPERATURE:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / s.temperature, dim=-1)
    if s.top_p < 1.0:
        ordered, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(ordered, dim=-1) - ordered < s.top_p
        ordered = ordered * keep
        return int(order[torch.multinomial(ordered / ordered.sum(), 1, generator=s.rng)])
    return int(torch.multinomial(probs, 1, generator=s.rng))


def _first_stop(text: str, stops: list[str], sent: int) -> int | None:
    """Where the first stop string begins in ``text`` (searching from what may still hold one
    that was not sent), or None."""
    found = [i for i in (text.find(stop, max(0, sent - len(stop) + 1)) for stop in stops) if i >= 0]
    return min(found) if found else None


def _stop_prefix(text: str, stops: list[str]) -> int:
    """The length of the longest end of ``text`` that begins a stop string."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest


def request_of(item: modelshare.Item, g: Generator, ignore_eos: bool) -> Sequence:
    """The sequence an item asks for; ``ValueError`` (INVALID_ARGUMENT) says what is wrong."""
    p = item.parameters
    task = p.get("task")
    if task not in ("completion", "chat"):
        raise ValueError("a generation request has the parameter 'task', 'completion' or 'chat' "
                         "(the server's generation doors set it)")
    if item.text is None:
        raise ValueError("a generation request's input is text")
    try:
        ids = g.prompt_ids(item.text, task)
    except (KeyError, TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"the messages cannot be rendered with the model's chat template: {e}") from None
    cap = p.get("max_prompt_tokens")
    if cap is not None and len(ids) > int(cap):
        raise ValueError(f"the prompt has {len(ids)} tokens; at most {int(cap)}")
    # OpenAI's defaults: a completion generates 16 tokens, a chat until the context is full.
    default = DEFAULT_MAX_TOKENS if task == "completion" else g.max_positions - len(ids)
    max_tokens = int(p.get("max_tokens", default))
    if max_tokens < 1:
        raise ValueError("'max_tokens' must be at least 1")
    if len(ids) + max_tokens > g.max_positions:
        raise ValueError(f"the prompt's {len(ids)} tokens and max_tokens {max_tokens} exceed the model's "
                         f"{g.max_positions} positions")
    stop = json.loads(p["stop"]) if "stop" in p else []
    return Sequence(ids, max_tokens=max_tokens, temperature=float(p.get("temperature", 1.0)),
                    top_p=float(p.get("top_p", 1.0)), seed=int(p["seed"]) if "seed" in p else None,
                    stop=[str(s) for s in stop if s], ignore_eos=ignore_eos)


def handler_for(engine: Engine, ignore_eos: bool = False):
    """A streaming handler: each item's text as the engine makes it, then its usage."""

    def handle(item: modelshare.Item) -> Iterator[str]:
        seq = request_of(item, engine.g, ignore_eos)
        engine.submit(seq)
        value = "cancelled"
        try:
            while True:
                try:
                    kind, value = seq.events.get(timeout=1.0)
                except queue.Empty:
                    # No token for a second: the item may have been cancelled meanwhile, or
                    # the engine may have stopped.
                    if item.cancelled:
                        value = "cancelled"
                        break
                    if not engine.thread.is_alive():
                        raise RuntimeError("the generation engine stopped") from None
                    continue
                if kind == "text":
                    yield value
                elif kind == "error":
                    raise value
                else:
                    break
        finally:
            # Closed early (the item was cancelled): the engine drops it at its next step.
            seq.cancelled = True
        return modelshare.Output(parameters={"finish_reason": value, "prompt_tokens": seq.prompt_tokens,
                                             "completion_tokens": seq.completion_tokens})

    return handle


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the model to serve (its latest ready version)")
    ap.add_argument("--server", help="server address (default: the discovery rule: MODELSHARE_SERVER, ...)")
    ap.add_argument("--name", default="python-generate-worker", help="worker name shown by `modelshare ps`")
    ap.add_argument("--token", help="bearer token (else MODELSHARE_TOKEN)")
    ap.add_argument("--token-file", help="file holding the bearer token (else MODELSHARE_TOKEN_FILE)")
    ap.add_argument("--streams", type=int, default=32, help="sequences generated at once")
    ap.add_argument("--device", help="run on this torch device (default: where the weights are)")
    ap.add_argument("--ignore-eos", action="store_true", help="generate max_tokens whatever the model says")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="generate_worker: %(message)s")
    engines: list[Engine] = []

    def on_version(model: modelshare.Model):
        t0 = time.perf_counter()
        tensors = model.torch()
        t1 = time.perf_counter()
        g = Generator(model.metadata, tensors, device=args.device)
        t2 = time.perf_counter()
        log.info("%s v%d: %s on %s, %d streams; views %.2f s, module and tokenizer %.2f s (%.2f s since the "
                 "process started)", model.name, model.version, type(g.net).__name__, g.device, args.streams,
                 t1 - t0, t2 - t1, time.time() - STARTED)
        for old in engines:
            old.close()
        engines[:] = [Engine(g, args.streams)]
        return handler_for(engines[0], args.ignore_eos)

    try:
        with modelshare.Session.open(args.server, name=args.name, token=args.token, token_file=args.token_file,
                                     wait=None) as session:
            session.serve(args.model, on_version=on_version, streams=args.streams, accepts=("text",))
    except modelshare.Error as e:
        print(f"generate_worker: error: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        for engine in engines:
            engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
