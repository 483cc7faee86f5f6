#!/usr/bin/env python3
"""Serves any Hugging Face ``transformers`` text encoder the server holds as embeddings, on the
``modelshare`` package: the weights are the server's shared memory (no copy: a module built on
the meta device and assigned the shared tensors), the model code is transformers', the answers go
through the server's OpenAI (``/v1/embeddings``) and KServe v2 doors.

Families: whatever ``transformers.AutoModel`` builds from the model's ``config.json`` as an
encoder (BERT, RoBERTa, XLM-RoBERTa, DistilBERT, ELECTRA, MPNet, ...); never remote code, never a
pickle: configuration, tokenizer and pooling come from the JSON files the server publishes with
the weights (``config.json``, ``tokenizer.json``, ``tokenizer_config.json``,
``special_tokens_map.json``, and sentence-transformers' ``modules.json``,
``sentence_bert_config.json``, ``1_Pooling/config.json``).

The embedding of a text is what sentence-transformers computes for the same folder:
- tokens: the fast tokenizer of ``tokenizer.json`` (AutoTokenizer over the JSON files), cut at
  ``max_seq_length`` (``sentence_bert_config.json``), else the tokenizer's ``model_max_length``,
  else what the position embeddings hold; with item parameter ``truncate=false`` a longer input
  fails instead;
- pooling: ``1_Pooling/config.json`` (cls, mean, max, mean-sqrt-len, last token), else mean;
  ``--pooling`` overrides;
- normalised to unit length when ``modules.json`` has a Normalize module (or ``--normalize``).
Checkpoints saved from a task model (``bert.``-prefixed names, an MLM head) are taken too: the
base model's prefix is stripped and heads are left out.

Inputs: text (OpenAI ``input``; KServe BYTES ``text``), or token ids (KServe ``input_ids``,
INT32/INT64 ``[n]``). Output: ``embedding`` FP32 ``[hidden]`` and ``prompt_tokens``. Parameter
``dimensions`` (OpenAI's) is accepted only as the model's own size.

On CUDA the forward pass, pooling included, runs as CUDA graphs, one per shape bucket (rows to
the next of 8, 16, 32, ...; tokens to the next multiple of 32), each captured on first use and
checked against the eager pass on the inputs it was captured with; a family whose forward pass
cannot be captured (a host sync inside it), or whose graph disagrees, runs eagerly
(``--no-cuda-graphs`` always does). Eager PyTorch launches each of a BERT's ~10 kernels per
layer from Python: for a small model the GPU waits on those launches, which a graph replays in
one call.

Usage: encoder_worker.py --model NAME [--server ADDR] [--credits 2] [--concurrency 1] [--max-batch-items 64]
                         [--pooling mean] [--normalize | --no-normalize] [--device cuda:0]
                         [--no-cuda-graphs]
``Encoder`` (model files + tensors -> embeddings) is importable, so that a benchmark can run the
same code in one process, without the server.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

import modelshare
from hf_files import json_file, tokenizer_of

log = logging.getLogger("encoder_worker")

POOLING = ("cls", "mean", "max", "mean_sqrt_len", "lasttoken")


def pooling_of(files: Mapping[str, bytes]) -> tuple[str, bool]:
    """(pooling, normalize) as sentence-transformers reads them from the model's folder."""
    modules = json_file(files, "modules.json") or []
    normalize = any(str(m.get("type", "")).endswith("Normalize") for m in modules)
    pooling_dir = next((m["path"] for m in modules if str(m.get("type", "")).endswith("Pooling")), None)
    config = json_file(files, f"{pooling_dir}/config.json") if pooling_dir else None
    if not config:
        return "mean", normalize
    for mode in ("cls_token", "max_tokens", "mean_sqrt_len_tokens", "lasttoken", "mean_tokens"):
        if config.get(f"pooling_mode_{mode}"):
            return {"cls_token": "cls", "max_tokens": "max", "mean_sqrt_len_tokens": "mean_sqrt_len",
                    "lasttoken": "lasttoken", "mean_tokens": "mean"}[mode], normalize
    return "mean", normalize


class Encoder:
    """A transformers encoder over given tensors, with sentence-transformers' tokenization and
    pooling. ``files``: the model's metadata files (name -> bytes); ``tensors``: name -> torch
    tensor (``Model.torch()``, or a safetensors file's); ``device``: where to run (default: the
    tensors')."""

    def __init__(self, files: Mapping[str, bytes], tensors: Mapping[str, torch.Tensor], *,
                 pooling: str | None = None, normalize: bool | None = None, device: str | None = None,
                 cuda_graphs: bool = True) -> None:
        import transformers

        config_json = json_file(files, "config.json")
        if not config_json or "model_type" not in config_json:
            raise modelshare.Error("the model has no config.json with a model_type")
        config = transformers.AutoConfig.for_model(**config_json)
        model_class = transformers.MODEL_MAPPING[type(config)]
        prefix = getattr(model_class, "base_model_prefix", "")
        floats = {t.dtype for t in tensors.values() if t.is_floating_point()}
        dtype = torch.float16 if floats == {torch.float16} else torch.bfloat16 if floats == {torch.bfloat16} else None

        def build():
            try:
                return model_class(config, add_pooling_layer=False)
            except TypeError:  # a family without a pooler (DistilBERT, MPNet's is optional)
                return model_class(config)

        if device is not None:
            tensors = {k: v.to(device) for k, v in tensors.items()}
        self.net = modelshare.module_from(dict(tensors), build, rename={f"{prefix}.": ""} if prefix else None,
                                          strict=False, dtype=dtype)
        self.device = next(self.net.parameters()).device
        self.hidden = int(config.hidden_size if hasattr(config, "hidden_size") else config.dim)
        self.tokenizer = tokenizer_of(files)
        found_pooling, found_normalize = pooling_of(files)
        self.pooling = pooling or found_pooling
        if self.pooling not in POOLING:
            raise ValueError(f"pooling must be one of {POOLING}, not {self.pooling!r}")
        self.normalize = found_normalize if normalize is None else normalize
        self.max_tokens = self._max_tokens(files, config)
        #: The GPU time of each batch's forward pass, in ms, when a list (``--stats``).
        self.gpu_ms: list[float] | None = None
        self.graphs = Graphs(self) if cuda_graphs and self.device.type == "cuda" else None

    def _max_tokens(self, files: Mapping[str, bytes], config: Any) -> int:
        st = json_file(files, "sentence_bert_config.json") or {}
        if st.get("max_seq_length"):
            return int(st["max_seq_length"])
        positions = int(getattr(config, "max_position_embeddings", 512))
        if config.model_type in ("roberta", "xlm-roberta", "camembert", "longformer"):
            positions -= int(config.pad_token_id or 0) + 1  # positions count from pad_token_id + 1
        model_max = getattr(self.tokenizer, "model_max_length", None) or positions
        return min(positions, int(model_max))

    def tokenize(self, texts: list[str], truncate: bool = True) -> list[list[int]]:
        """Each text's token ids, special tokens included, cut at ``max_tokens`` if ``truncate``
        (else ``ValueError`` names the first that is too long)."""
        ids = self.tokenizer(texts, add_special_tokens=True, truncation=truncate, max_length=self.max_tokens)["input_ids"]
        if not truncate:
            for i, seq in enumerate(ids):
                if len(seq) > self.max_tokens:
                    raise ValueError(f"input {i} is {len(seq)} tokens; this model takes {self.max_tokens}")
        return ids

    @torch.inference_mode()
    def embed_ids(self, sequences: list[list[int]]) -> np.ndarray:
        """Embeddings [n, hidden] (FP32) of token id sequences, padded to the longest."""
        if not sequences:
            return np.zeros((0, self.hidden), dtype=np.float32)
        if self.graphs is not None:
            out = self.graphs.embed_ids(sequences)
            if out is not None:
                return out
        ids, mask = (torch.from_numpy(a).to(self.device) for a in self.padded(sequences))
        timed = self.gpu_ms is not None and self.device.type == "cuda"
        if timed:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        pooled = self.forward(ids, mask)
        if timed:
            end.record()
        out = pooled.cpu().numpy()
        if timed:
            self.gpu_ms.append(start.elapsed_time(end))
        return out

    def padded(self, sequences: list[list[int]], rows: int | None = None,
               tokens: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Ids and attention mask (int64) of ``sequences`` padded to ``tokens`` (default: the
        longest); ``rows`` past theirs (a graph's bucket) hold one padding token each."""
        rows = rows or len(sequences)
        tokens = tokens or max(len(s) for s in sequences)
        ids = np.full((rows, tokens), self.tokenizer.pad_token_id or 0, dtype=np.int64)
        mask = np.zeros((rows, tokens), dtype=np.int64)
        for i, seq in enumerate(sequences):
            ids[i, : len(seq)] = seq
            mask[i, : len(seq)] = 1
        mask[len(sequences):, 0] = 1
        return ids, mask

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Pooled (and normalised) FP32 vectors of padded ``ids`` under ``mask``, on the device."""
        hidden = self.net(input_ids=ids, attention_mask=mask).last_hidden_state.float()
        pooled = self._pool(hidden, mask)
        if self.normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return pooled

    def _pool(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = mask.unsqueeze(-1).to(hidden.dtype)
        if self.pooling == "cls":
            return hidden[:, 0]
        if self.pooling == "lasttoken":
            return hidden[torch.arange(hidden.shape[0], device=hidden.device), mask.sum(1) - 1]
        if self.pooling == "max":
            return hidden.masked_fill(m == 0, -1e9).max(1).values
        summed = (hidden * m).sum(1)
        counts = m.sum(1).clamp(min=1e-9)
        return summed / (counts.sqrt() if self.pooling == "mean_sqrt_len" else counts)

    def embed(self, texts: list[str]) -> np.ndarray:
        return self.embed_ids(self.tokenize(texts))


class Graphs:
    """The encoder's forward pass as CUDA graphs, one per shape bucket, captured on first use
    into one memory pool. Replays are serialised (one lock: a graph's static inputs and output
    are shared); tokenization and the answers of other batches go on beside them."""

    ROWS = 8  # the smallest row bucket; then doubling
    TOKENS = 32  # token buckets are multiples of this

    def __init__(self, encoder: Encoder) -> None:
        self.encoder = encoder
        self.lock = threading.Lock()
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self.failed: str | None = None

    def bucket(self, rows: int, tokens: int) -> tuple[int, int]:
        b = self.ROWS
        while b < rows:
            b *= 2
        t = -(-tokens // self.TOKENS) * self.TOKENS
        return b, min(t, max(tokens, self.encoder.max_tokens))

    def capture(self, rows: int, tokens: int):
        """The bucket's graph, captured and checked against the eager pass; raises if either fails."""
        enc = self.encoder
        gen = np.random.default_rng(rows * 100003 + tokens)
        # Inputs with padding in every row but one, so that the capture takes the masked path.
        lengths = gen.integers(1, tokens + 1, size=rows)
        lengths[0] = tokens
        vocab = int(getattr(enc.net.config, "vocab_size", 1000))
        seqs = [gen.integers(0, vocab, size=int(n)).tolist() for n in lengths]
        ids_np, mask_np = enc.padded(seqs, rows, tokens)
        ids = torch.from_numpy(ids_np).to(enc.device)
        mask = torch.from_numpy(mask_np).to(enc.device)
        side = torch.cuda.Stream(enc.device)
        side.wait_stream(torch.cuda.current_stream(enc.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                want = enc.forward(ids, mask)
        torch.cuda.current_stream(enc.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: a CUDA call of another thread meanwhile (the SDK importing a new
        # version, another handler thread) neither fails this capture nor is captured.
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            out = enc.forward(ids, mask)
        graph.replay()
        got = out.clone()
        cos = torch.nn.functional.cosine_similarity(got, want.float(), dim=1)
        if not bool(torch.isfinite(got).all()) or float(cos.min()) < 0.9999:
            raise RuntimeError(f"the graph's output differs from the eager pass (min cosine {float(cos.min()):.6f})")
        return graph, ids, mask, out

    def embed_ids(self, sequences: list[list[int]]) -> np.ndarray | None:
        """The vectors through the bucket's graph, or None where graphs are off (then the caller
        runs eagerly)."""
        if self.failed is not None:
            return None
        enc = self.encoder
        rows, tokens = self.bucket(len(sequences), max(len(s) for s in sequences))
        ids_np, mask_np = enc.padded(sequences, rows, tokens)
        ids_host, mask_host = torch.from_numpy(ids_np), torch.from_numpy(mask_np)
        with self.lock:
            entry = self.graphs.get((rows, tokens))
            if entry is None:
                try:
                    entry = self.capture(rows, tokens)
                except Exception as e:  # noqa: BLE001 - any failure means: run eagerly
                    self.failed = f"{type(e).__name__}: {e}"
                    log.warning("CUDA graphs off for this model (the eager pass runs instead): %s", self.failed)
                    return None
                self.graphs[(rows, tokens)] = entry
            graph, ids, mask, out = entry
            timed = enc.gpu_ms is not None
            if timed:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            ids.copy_(ids_host, non_blocking=True)
            mask.copy_(mask_host, non_blocking=True)
            graph.replay()
            if timed:
                end.record()
            vectors = out[: len(sequences)].cpu().numpy()
            if timed:
                enc.gpu_ms.append(start.elapsed_time(end))
        return vectors


class Stats:
    """Per-batch timings, logged when serving ends (``--stats``): where a batch's time goes."""

    def __init__(self) -> None:
        self.batches = self.items = 0
        self.handler = self.model = 0.0
        self.first = self.last = None
        self.gpu_ms: list[float] = []

    def add(self, items: int, start: float, model_start: float, end: float) -> None:
        self.batches += 1
        self.items += items
        self.handler += end - start
        self.model += end - model_start
        self.first = start if self.first is None else self.first
        self.last = end

    def summary(self) -> str:
        if not self.batches:
            return "no batch"
        wall = (self.last - self.first) or 1e-9
        return (f"{self.batches} batches, {self.items / self.batches:.1f} items each; per batch: handler "
                f"{self.handler / self.batches * 1e3:.2f} ms, of which the model {self.model / self.batches * 1e3:.2f} ms"
                + (f" ({sum(self.gpu_ms) / len(self.gpu_ms):.2f} ms on the GPU)" if self.gpu_ms else "")
                + f"; handlers busy {self.handler / wall:.0%} of {wall:.1f} s")


def handler_for(encoder: Encoder, stats: Stats | None = None):
    """The serve handler: tokenizes the batch's items, runs them as one padded batch (sorted by
    length, as sentence-transformers does), answers each."""

    def check(item: modelshare.Item) -> bool:
        """The item's parameters; returns its ``truncate``."""
        truncate = item.parameters.get("truncate", True)
        if not isinstance(truncate, bool):
            raise modelshare.ItemError("parameter 'truncate' must be a boolean")
        dims = item.parameters.get("dimensions")
        if dims is not None and (isinstance(dims, bool) or dims != encoder.hidden):
            raise modelshare.ItemError(
                f"this model's embeddings have {encoder.hidden} dimensions; 'dimensions' may only be {encoder.hidden}")
        return truncate

    def token_ids(item: modelshare.Item) -> list[int]:
        """A tensor item's tokens: one INT32/INT64 ``input_ids`` of shape [n]."""
        inputs = item.inputs
        ids = inputs.get("input_ids")
        if len(inputs) != 1 or ids is None or ids.dtype not in (np.int32, np.int64) or ids.ndim != 1:
            raise modelshare.ItemError("a tensor item is one input_ids tensor, INT32 or INT64, of shape [n]")
        if len(ids) == 0:
            raise modelshare.ItemError("input_ids is empty")
        if len(ids) > encoder.max_tokens:
            raise modelshare.ItemError(f"input_ids holds {len(ids)} tokens; this model takes {encoder.max_tokens}")
        return ids.astype(np.int64).tolist()

    def handle(batch: modelshare.Batch):
        start = time.perf_counter()
        answers: list[Any] = [None] * len(batch.items)
        sequences: dict[int, list[int]] = {}
        texts: list[tuple[int, str]] = []  # truncated, tokenized together
        for i, item in enumerate(batch.items):
            try:
                truncate = check(item)
                if item.text is None:
                    sequences[i] = token_ids(item)
                elif truncate:
                    texts.append((i, item.text))
                else:
                    sequences[i] = encoder.tokenize([item.text], truncate=False)[0]
            except (modelshare.ItemError, ValueError) as e:
                answers[i] = e
        if texts:
            sequences.update(zip((i for i, _ in texts), encoder.tokenize([t for _, t in texts])))
        order = sorted(sequences, key=lambda i: len(sequences[i]))
        model_start = time.perf_counter()
        vectors = encoder.embed_ids([sequences[i] for i in order])
        # One [n, hidden] answer for the batch (rows split in Rust); failed items' rows unused.
        embeddings = np.zeros((len(batch.items), encoder.hidden), dtype=np.float32)
        embeddings[order] = vectors
        tokens = [len(sequences.get(i, ())) for i in range(len(batch.items))]
        errors = {i: e for i, e in enumerate(answers) if e is not None}
        if stats is not None:
            stats.add(len(batch.items), start, model_start, time.perf_counter())
        return modelshare.BatchOutput({"embedding": embeddings}, {"prompt_tokens": tokens}, errors)

    return handle


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the model to serve (its latest ready version)")
    ap.add_argument("--server", help="server address (default: the discovery rule: MODELSHARE_SERVER, ...)")
    ap.add_argument("--name", default="python-encoder-worker", help="worker name shown by `modelshare ps`")
    ap.add_argument("--token", help="bearer token (else MODELSHARE_TOKEN)")
    ap.add_argument("--token-file", help="file holding the bearer token (else MODELSHARE_TOKEN_FILE)")
    ap.add_argument("--credits", type=int, default=2, help="batches taken at once (running and waiting)")
    ap.add_argument("--concurrency", type=int, help="batches run at once (default: the package's, one)")
    ap.add_argument("--max-batch-items", type=int, default=64, help="most items in one batch")
    ap.add_argument("--pooling", choices=POOLING, help="override the model's pooling")
    ap.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None,
                    help="normalise embeddings to unit length (default: as the model's modules.json says)")
    ap.add_argument("--device", help="run on this torch device (default: where the weights are)")
    ap.add_argument("--stats", action="store_true", help="log where the batches' time went when serving ends")
    ap.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True,
                    help="run the forward pass as CUDA graphs per shape bucket (default: on CUDA)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="encoder_worker: %(message)s")
    stats = Stats() if args.stats else None

    def on_version(model: modelshare.Model):
        encoder = Encoder(model.metadata, model.torch(), pooling=args.pooling, normalize=args.normalize,
                          device=args.device, cuda_graphs=args.cuda_graphs)
        log.info("%s v%d: %s on %s, %s pooling%s, %d tokens at most", model.name, model.version,
                 type(encoder.net).__name__, encoder.device, encoder.pooling,
                 ", normalised" if encoder.normalize else "", encoder.max_tokens)
        if stats is not None:
            encoder.gpu_ms = stats.gpu_ms
        return handler_for(encoder, stats)

    try:
        with modelshare.Session.open(args.server, name=args.name, token=args.token, token_file=args.token_file,
                                     wait=None) as session:
            session.serve(
                args.model, on_version=on_version, credits=args.credits, concurrency=args.concurrency,
                max_batch_items=args.max_batch_items,
                inputs=[("text", "BYTES", [-1]), ("input_ids", "INT64", [-1])],
                outputs=[("embedding", "FP32", [-1])],
            )
    except modelshare.Error as e:
        print(f"encoder_worker: error: {e}", file=sys.stderr, flush=True)
        return 1
    if stats is not None:
        log.info("stats: %s", stats.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
