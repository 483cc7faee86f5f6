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

Batching (``--engine``): by default transformers' continuous batching where the installed
transformers has it (continuous_engine.py: a paged cache of ``--cache-tokens`` tokens; a request
joins the running batch at the next step), else step-level batching (step_engine.py: every
running sequence stepped together; a joining request rebuilds the batch's cache). Up to
``--streams`` sequences run at once; the server queues the rest. A request's ``seed`` is kept
exactly by the step engine only (continuous batching: best effort, as in OpenAI's API).

Usage: generate_worker.py --model NAME [--server ADDR] [--streams 32] [--device cuda:0]
                          [--engine auto|continuous|steps] [--cache-tokens N] [--ignore-eos]
``Generator`` (model files + tensors -> tokens) is importable, so that a benchmark can run the
same code in one process, without the server.
"""

from __future__ import annotations

import argparse
import json
import logging
import queue
import sys
import time
from collections.abc import Iterator, Mapping

#: When the process started, as near as Python can tell (before torch's import).
STARTED = time.time()

import torch  # noqa: E402

import modelshare  # noqa: E402
import continuous_engine  # noqa: E402
from continuous_engine import ContinuousEngine  # noqa: E402
from hf_files import json_file, tokenizer_of  # noqa: E402
from sequence import Sequence  # noqa: E402
from step_engine import StepEngine  # noqa: E402

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


def request_of(item: modelshare.Item, g: Generator, ignore_eos: bool, longest: int | None = None) -> Sequence:
    """The sequence an item asks for; ``ValueError`` (INVALID_ARGUMENT) says what is wrong.
    ``longest``: the most tokens, prompt and generated, one sequence may have (the engine's;
    at most the model's positions)."""
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
    longest = min(g.max_positions, longest or g.max_positions)
    what = (f"the model's {g.max_positions} positions" if longest == g.max_positions
            else f"this worker's {longest} tokens a sequence (its cache)")
    if len(ids) >= longest:
        raise ValueError(f"the prompt's {len(ids)} tokens leave no room within {what}")
    # OpenAI's defaults: a completion generates 16 tokens, a chat until the context is full.
    default = DEFAULT_MAX_TOKENS if task == "completion" else longest - len(ids)
    max_tokens = int(p.get("max_tokens", default))
    if max_tokens < 1:
        raise ValueError("'max_tokens' must be at least 1")
    if len(ids) + max_tokens > longest:
        raise ValueError(f"the prompt's {len(ids)} tokens and max_tokens {max_tokens} exceed {what}")
    stop = json.loads(p["stop"]) if "stop" in p else []
    return Sequence(ids, max_tokens=max_tokens, temperature=float(p.get("temperature", 1.0)),
                    top_p=float(p.get("top_p", 1.0)), seed=int(p["seed"]) if "seed" in p else None,
                    stop=[str(s) for s in stop if s], ignore_eos=ignore_eos)


def handler_for(engine: ContinuousEngine | StepEngine, ignore_eos: bool = False):
    """A streaming handler: each item's text as the engine makes it, then its usage."""

    def handle(item: modelshare.Item) -> Iterator[str]:
        seq = request_of(item, engine.g, ignore_eos, engine.longest)
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
                    if not engine.alive():
                        raise RuntimeError("the generation engine stopped") from None
                    continue
                if kind == "text":
                    yield value
                elif kind == "error":
                    raise value
                else:
                    break
        finally:
            # Closed early (the item was cancelled): the engine stops generating it.
            if not seq.done:
                engine.drop(seq)
        return modelshare.Output(parameters={"finish_reason": value, "prompt_tokens": seq.prompt_tokens,
                                             "completion_tokens": seq.completion_tokens})

    return handle


def engine_for(g: Generator, args: argparse.Namespace) -> ContinuousEngine | StepEngine:
    """The engine ``--engine`` names (``auto``: continuous batching where transformers has it)."""
    if args.engine == "steps" or not continuous_engine.available():
        return StepEngine(g, args.streams)
    cache = args.cache_tokens or args.streams * min(g.max_positions, 2048)
    try:
        return ContinuousEngine(g, args.streams, cache_tokens=cache,
                                batch_tokens=args.batch_tokens, cuda_graphs=not args.no_cuda_graphs)
    except (ValueError, NotImplementedError, RuntimeError) as e:
        if args.engine == "continuous":
            raise
        log.warning("continuous batching does not take this model (%s): step-level batching", e)
        return StepEngine(g, args.streams)


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
    ap.add_argument("--engine", choices=("auto", "continuous", "steps"), default="auto",
                    help="continuous batching (transformers'), step-level batching, or the first the installed "
                         "transformers has (default)")
    ap.add_argument("--cache-tokens", type=int,
                    help="continuous batching: tokens of keys and values in the paged cache (default: --streams x "
                         "the model's context, at most 2048 a stream)")
    ap.add_argument("--batch-tokens", type=int, default=2048,
                    help="continuous batching: tokens computed per step at most (prefill chunks and decodes)")
    ap.add_argument("--no-cuda-graphs", action="store_true",
                    help="continuous batching on CUDA: launch each step's kernels one by one, not as CUDA graphs")
    args = ap.parse_args()
    if args.streams < 1 or (args.cache_tokens is not None and args.cache_tokens < 1) or args.batch_tokens < 1:
        ap.error("--streams, --cache-tokens and --batch-tokens are at least 1")
    if args.engine == "continuous" and not continuous_engine.available():
        ap.error("--engine continuous: the installed transformers has no continuous batching")
    logging.basicConfig(level=logging.INFO, format="generate_worker: %(message)s")
    engines: list[ContinuousEngine | StepEngine] = []

    def on_version(model: modelshare.Model):
        t0 = time.perf_counter()
        tensors = model.torch()
        t1 = time.perf_counter()
        g = Generator(model.metadata, tensors, device=args.device)
        t2 = time.perf_counter()
        for old in engines:
            old.close()
        engines[:] = [engine_for(g, args)]
        log.info("%s v%d: %s on %s, %s, %d streams; views %.2f s, module and tokenizer %.2f s, ready %.2f s "
                 "since the process started", model.name, model.version, type(g.net).__name__, g.device,
                 type(engines[0]).__name__, args.streams, t1 - t0, t2 - t1, time.time() - STARTED)
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
