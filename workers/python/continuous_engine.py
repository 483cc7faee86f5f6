"""Continuous batching, the generation worker's engine where the installed transformers provides
it (``model.init_continuous_batching``, transformers 5): transformers' manager runs the model
over a paged cache on a thread of its own. A request joins the running batch at the next step
(its prompt prefilled in chunks beside the others' decode steps) and leaves it when it ends, so
no running sequence is computed again when one joins.

The cache is sized here, never from the GPU's free memory (several workers share a GPU):
``cache_tokens`` tokens of keys and values, and ``batch_tokens`` tokens per step at most. A
request whose tokens do not fit waits in transformers' queue (or is evicted and computed again).

Sampling is transformers': greedy rows keep only their most likely token (top-p of nearly 0);
temperature and top-p are per request. A request's ``seed`` is best effort here, as in OpenAI's
API: the manager has one random generator for every row (``--engine steps`` keeps seeds
exactly). Tokens go through ``Sequence.accept`` (stop strings, EOS, ``max_tokens``); a sequence
that ends there, or whose reader goes away, is cancelled in the manager.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import threading
from typing import Any

import torch

from sequence import Sequence

log = logging.getLogger("generate_worker")

#: Keeps only the most likely token: 1 - top_p rounds to 1 in float32.
GREEDY_TOP_P = 1e-9


def available() -> bool:
    """Whether the installed transformers has continuous batching."""
    try:
        from transformers import ContinuousBatchingConfig  # noqa: F401
        from transformers.generation.continuous_batching import ContinuousBatchingManager  # noqa: F401
    except ImportError:
        return False
    return True


class ContinuousEngine:
    """See the module's docs. ``generator``: the worker's ``Generator``; ``max_batch``: sequences
    at once; ``cache_tokens``, ``batch_tokens``: the cache's size and a step's tokens;
    ``cuda_graphs``: replay each step's launches as CUDA graphs (on a CUDA device)."""

    def __init__(self, generator: Any, max_batch: int, *, cache_tokens: int, batch_tokens: int,
                 cuda_graphs: bool = True) -> None:
        from transformers import ContinuousBatchingConfig, GenerationConfig

        self.g = generator
        #: The most tokens one sequence may have: the cache's (a longer one could never run).
        self.longest = min(self.g.max_positions, cache_tokens)
        fields = inspect.signature(ContinuousBatchingConfig).parameters
        page = 256
        # Every running sequence may leave a page partly used.
        pages = -(-cache_tokens // page) + max_batch
        # CUDA graphs: transformers turns them on by itself only for flash attention; with SDPA's
        # mask they pad each step to a bucket, which costs less than the launches they save.
        graphs = True if cuda_graphs and self.g.device.type == "cuda" else None
        cb = ContinuousBatchingConfig(**{"page_size" if "page_size" in fields else "block_size": page},
                                      num_blocks=pages, max_batch_tokens=batch_tokens, use_cuda_graph=graphs,
                                      max_requests_per_batch=max_batch, per_request_processors=True,
                                      drop_unsupported_processors=True)
        # Sampling for every row, so that each request's temperature and top-p apply (a
        # processor exists only for values other than the neutral ones; each request sets both).
        config = GenerationConfig(do_sample=True, temperature=0.5, top_p=0.5, top_k=0,
                                  eos_token_id=sorted(self.g.eos) or -1, pad_token_id=self.g.pad)
        self.manager = self.g.net.init_continuous_batching(generation_config=config, continuous_batching_config=cb)
        self.lock = threading.Lock()
        self.running: dict[str, tuple[Sequence, list[int]]] = {}  # request id -> (sequence, tokens seen)
        self.ids = itertools.count()
        self.stopped = threading.Event()
        with torch.inference_mode():  # the manager's thread takes the caller's mode
            self.manager.start()
        self.thread = threading.Thread(target=self._route, name="generate-results", daemon=True)
        self.thread.start()

    def submit(self, seq: Sequence) -> None:
        rid = seq.request_id = f"s{next(self.ids)}"
        with self.lock:
            self.running[rid] = (seq, [0])
        eos = -1 if seq.ignore_eos or not self.g.eos else sorted(self.g.eos)
        sampled = {"temperature": 1.0, "top_p": GREEDY_TOP_P} if seq.greedy else \
            {"temperature": float(seq.temperature), "top_p": float(seq.top_p)}
        try:
            added = self.manager.add_request(list(seq.ids), request_id=rid, max_new_tokens=seq.max_tokens,
                                             streaming=True, eos_token_id=eos, **sampled)
        except BaseException:
            self._forget(rid)
            raise
        if added is None:
            self._forget(rid)
            seq.fail(RuntimeError("the generation engine is stopping"))

    def drop(self, seq: Sequence) -> None:
        """The sequence's reader is gone: the manager stops generating it."""
        seq.cancelled = True
        rid = seq.request_id
        if rid is not None and self._forget(rid):
            self.manager.cancel_request(rid)
            seq.end("cancelled")

    def alive(self) -> bool:
        return self.thread.is_alive() and self.manager.is_running()

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=10)
        try:
            self.manager.stop(block=True, timeout=10)
        except Exception:  # noqa: BLE001 - stopping a failed manager
            log.exception("stopping the continuous batching manager")
        self._fail_all(RuntimeError("the generation engine stopped"))

    def _forget(self, rid: str) -> bool:
        with self.lock:
            return self.running.pop(rid, None) is not None

    def _fail_all(self, error: BaseException) -> None:
        with self.lock:
            running, self.running = self.running, {}
        for seq, _ in running.values():
            seq.fail(error)

    def _route(self) -> None:
        """Hands each result to its sequence (the manager's output queue is one for all)."""
        while not self.stopped.is_set():
            if not self.manager.is_running():
                log.error("the continuous batching manager stopped")
                self._fail_all(RuntimeError("the generation engine stopped"))
                return
            result = self.manager.get_result(timeout=0.05)
            if result is None:
                continue
            with self.lock:
                entry = self.running.get(result.request_id)
            if entry is None:  # ended or dropped meanwhile
                continue
            seq, seen = entry
            try:
                self._take(result, seq, seen)
            except Exception as e:  # noqa: BLE001 - that sequence fails, the others go on
                log.exception("a sequence failed")
                seq.fail(e)
            if seq.done and self._forget(result.request_id) and not result.is_finished():
                self.manager.cancel_request(result.request_id)

    def _take(self, result: Any, seq: Sequence, seen: list[int]) -> None:
        if result.error is not None:
            seq.fail(RuntimeError(f"generation failed: {result.error}"))
            return
        tokens = result.generated_tokens
        for token in tokens[seen[0]:]:
            if seq.accept(int(token), self.g):
                break
        seen[0] = len(tokens)
        if result.is_finished():
            seq.end("length")
