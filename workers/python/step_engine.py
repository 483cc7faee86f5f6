"""Step-level batching, the generation worker's engine where transformers has no continuous
batching (``--engine steps``), and the one that keeps a request's ``seed`` exactly: one thread
steps every running sequence together. Each step is one forward pass of the whole batch: a
decode step over the batch's cache (transformers' ``DynamicCache``), or, when sequences joined
(or more than half the rows have finished), a prefill of every running sequence, left-padded,
which rebuilds the cache. A new request so waits at most one step. Sampling is the engine's own:
greedy, or temperature and top-p with the request's seeded generator.
"""

from __future__ import annotations

import inspect
import logging
import queue
import threading
from typing import Any

import torch

from sequence import Sequence

log = logging.getLogger("generate_worker")


class StepEngine:
    """See the module's docs. ``generator``: the worker's ``Generator`` (its ``net``, tokenizer,
    ``eos``, ``pad``, ``device`` and ``max_positions``)."""

    def __init__(self, generator: Any, max_batch: int) -> None:
        self.g = generator
        #: The most tokens one sequence may have: the model's positions.
        self.longest = generator.max_positions
        self.max_batch = max(1, max_batch)
        self.pending: queue.Queue[Sequence] = queue.Queue()
        self.stopped = threading.Event()
        self.rngs: dict[Sequence, torch.Generator] = {}  # each row's sampler
        # The cache's argument: ``cache`` from transformers 5.24, ``past_key_values`` before.
        self.cache_arg = "cache" if "cache" in inspect.signature(generator.net.forward).parameters \
            else "past_key_values"
        self.thread = threading.Thread(target=self._run, name="generate-engine", daemon=True)
        self.thread.start()

    def submit(self, seq: Sequence) -> None:
        self.pending.put(seq)

    def drop(self, seq: Sequence) -> None:
        """The sequence's reader is gone: the engine drops it at its next step."""
        seq.cancelled = True

    def alive(self) -> bool:
        return self.thread.is_alive()

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
                self.rngs = {s: self.rngs.get(s) or _rng(s.seed) for s in rows}
            try:
                logits, cache, mask = self._step(rows, cache, mask, rebuild)
            except Exception as e:  # noqa: BLE001 - every running sequence fails with it
                log.exception("a generation step failed")
                for s in rows:
                    s.fail(e)
                rows, cache, mask, rebuild = [], None, None, True
                continue
            rebuild = False
            for i, s in enumerate(rows):
                if s.done:
                    continue
                if s.cancelled:
                    s.end("cancelled")
                    continue
                try:
                    s.accept(_sample(logits[i], s, self.rngs[s]), self.g)
                except Exception as e:  # noqa: BLE001 - that sequence fails, the others go on
                    log.exception("a sequence failed")
                    s.fail(e)

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
            out = self.g.net(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                             **{self.cache_arg: cache})
        cache = out.cache if self.cache_arg == "cache" else out.past_key_values
        return out.logits[:, -1, :].float().cpu(), cache, mask


def _rng(seed: int | None) -> torch.Generator:
    rng = torch.Generator()
    if seed is not None:
        rng.manual_seed(seed)
    else:
        rng.seed()
    return rng


def _sample(logits: torch.Tensor, s: Sequence, rng: torch.Generator) -> int:
    if s.greedy:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / s.temperature, dim=-1)
    if s.top_p < 1.0:
        ordered, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(ordered, dim=-1) - ordered < s.top_p
        ordered = ordered * keep
        return int(order[torch.multinomial(ordered / ordered.sum(), 1, generator=rng)])
    return int(torch.multinomial(probs, 1, generator=rng))
