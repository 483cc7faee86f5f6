"""What the Python workers read from a model's JSON files, as the server publishes them with the
weights (``Model.metadata``: name -> bytes): a JSON file, and the fast tokenizer with its chat
template. Never remote code, never a pickle."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from typing import Any

import modelshare

# The files a fast tokenizer and its chat template are read from (no vocab.txt or
# sentencepiece model: the tokenizer.json holds them).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "chat_template.json")


def json_file(files: Mapping[str, bytes], name: str) -> Any:
    """The JSON file ``name`` of the model, or None."""
    raw = files.get(name)
    return json.loads(raw) if raw is not None else None


def tokenizer_of(files: Mapping[str, bytes]):
    """The fast tokenizer (and chat template) of the model's JSON files, written to a private
    temporary folder for ``AutoTokenizer``, which reads files; no remote code."""
    import transformers

    if "tokenizer.json" not in files:
        raise modelshare.Error("the model has no tokenizer.json: this worker needs a fast tokenizer")
    with tempfile.TemporaryDirectory(prefix="modelshare-tok-") as folder:
        for name in TOKENIZER_FILES:
            if name in files:
                with open(os.path.join(folder, name), "wb") as f:
                    f.write(files[name])
        return transformers.AutoTokenizer.from_pretrained(folder, use_fast=True, trust_remote_code=False)
