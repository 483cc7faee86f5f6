"""The generation worker's two engines in-process, without a server (workers/python/
continuous_engine.py and step_engine.py over a tiny random Llama on the CPU): a sequence whose
reader goes away is cancelled in the engine, so its batch slot frees; a sequence ended by a stop
string leaves transformers' manager too; a forward pass that fails fails its sequences with an
error, never a hang; both engines give transformers' greedy ``generate`` token for token.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")
pytest.importorskip("tokenizers")

sys.path.insert(0, str(ROOT / "workers" / "python"))
import continuous_engine  # noqa: E402
from generate_worker import Generator, request_of  # noqa: E402
from sequence import Sequence  # noqa: E402
from step_engine import StepEngine  # noqa: E402
from test_generate_worker import llama  # noqa: E402

pytestmark = pytest.mark.skipif(not continuous_engine.available(), reason="transformers has no continuous batching")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Generator, Path]:
    folder = tmp_path_factory.mktemp("engines")
    torch.manual_seed(30)
    llama(folder)
    files = {p.name: p.read_bytes() for p in folder.iterdir() if p.suffix in (".json", ".jinja")}
    return Generator(files, safetensors_torch.load_file(str(folder / "model.safetensors"))), folder


def engines(g: Generator, streams: int = 4):
    return {"continuous": lambda: continuous_engine.ContinuousEngine(g, streams, cache_tokens=1024, batch_tokens=256),
            "steps": lambda: StepEngine(g, streams)}


def sequence(ids: list[int], max_tokens: int, *, stop: list[str] | None = None, ignore_eos: bool = True) -> Sequence:
    return Sequence(ids, max_tokens=max_tokens, temperature=0.0, top_p=1.0, seed=None, stop=stop or [],
                    ignore_eos=ignore_eos)


def events(seq: Sequence, timeout: float = 30.0) -> tuple[str, str, object]:
    """Reads the sequence's events to its end: (text, kind, value)."""
    text = ""
    deadline = time.monotonic() + timeout
    while True:
        kind, value = seq.events.get(timeout=max(0.01, deadline - time.monotonic()))
        if kind == "text":
            text += value
        else:
            return text, kind, value


def idle(engine, timeout: float = 5.0) -> bool:
    """Whether the engine holds no request within ``timeout`` (for continuous batching: neither
    transformers' scheduler)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if isinstance(engine, continuous_engine.ContinuousEngine):
            processor = engine.manager.batch_processor
            scheduler = getattr(processor, "scheduler", None)
            busy = engine.running or (scheduler is not None and (scheduler.active_requests or scheduler.waiting_requests))
        else:
            busy = not engine.pending.empty()
        if not busy:
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize("kind", ["continuous", "steps"])
def test_greedy_equals_generate_at_once(model, kind: str) -> None:
    g, folder = model
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    prompts = [[0, 5, 6, 7, 8], [0, 9, 10], [0, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]]
    engine = engines(g)[kind]()
    try:
        seqs = [sequence(p, 24) for p in prompts]
        for s in seqs:
            engine.submit(s)
        for p, s in zip(prompts, seqs):
            _, kind_, reason = events(s)
            assert (kind_, reason) == ("end", "length")
            with torch.inference_mode():
                want = ref.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                    max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=2)
            assert s.generated == want[0, len(p):].tolist(), p
    finally:
        engine.close()


@pytest.mark.parametrize("kind", ["continuous", "steps"])
def test_a_dropped_sequence_leaves_the_engine(model, kind: str) -> None:
    g, _ = model
    engine = engines(g, streams=1)[kind]()
    try:
        long = sequence([0, 5, 6, 7], 200)
        engine.submit(long)
        while len(long.generated) < 3:
            time.sleep(0.005)
        t0 = time.perf_counter()
        engine.drop(long)
        _, kind_, reason = events(long)
        assert (kind_, reason) == ("end", "cancelled")
        assert idle(engine), "the dropped sequence is still in the engine"
        print(f"{kind}: dropped after {len(long.generated)} tokens, engine idle {1e3 * (time.perf_counter() - t0):.1f} ms later")
        assert len(long.generated) < 200
        # Its slot (the only one) serves the next request.
        short = sequence([0, 9, 10], 5)
        engine.submit(short)
        assert events(short)[1:] == ("end", "length")
    finally:
        engine.close()


def test_a_stop_string_ends_the_request_in_the_manager(model) -> None:
    g, _ = model
    engine = engines(g)["continuous"]()
    try:
        full = sequence([0, 5, 6, 7], 30)
        engine.submit(full)
        text, _, _ = events(full)
        assert len(text) >= 6, text
        stop = text[3:6]
        cut = sequence([0, 5, 6, 7], 30, stop=[stop])
        engine.submit(cut)
        got, kind, reason = events(cut)
        assert (got, kind, reason) == (text[:text.find(stop)], "end", "stop")
        assert idle(engine), "the stopped request still runs in transformers' manager"
    finally:
        engine.close()


def test_a_request_longer_than_the_cache_is_refused_at_once(model) -> None:
    """Continuous batching could never run a sequence longer than its cache (it would wait in
    transformers' queue for ever): such a request is refused before it starts, and a chat's
    default max_tokens fills the cache, not the model's positions."""
    from types import SimpleNamespace

    g, _ = model
    engine = continuous_engine.ContinuousEngine(g, 2, cache_tokens=40, batch_tokens=64)
    try:
        assert engine.longest == 40 < g.max_positions
        item = lambda text, **p: SimpleNamespace(text=text, parameters={"task": "completion", **p})  # noqa: E731
        ids = g.prompt_ids("hello world", "completion")
        with pytest.raises(ValueError, match="this worker's 40 tokens a sequence"):
            request_of(item("hello world", max_tokens=41 - len(ids)), g, False, engine.longest)
        seq = request_of(item("hello world", max_tokens=40 - len(ids)), g, True, engine.longest)
        engine.submit(seq)
        assert events(seq)[1:] == ("end", "length")
        assert len(seq.ids) == 40
        with pytest.raises(ValueError, match="leave no room"):
            request_of(item("hello " * 60), g, False, engine.longest)
        chat = SimpleNamespace(text='[{"role": "user", "content": "hello"}]', parameters={"task": "chat"})
        assert len(request_of(chat, g, False, engine.longest).ids) + \
            request_of(chat, g, False, engine.longest).max_tokens == 40
    finally:
        engine.close()


@pytest.mark.parametrize("kind", ["continuous", "steps"])
def test_a_failing_forward_fails_its_sequences(model, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    g, _ = model
    engine = engines(g)[kind]()
    try:
        def broken(*args, **kwargs):
            raise RuntimeError("device lost")

        monkeypatch.setattr(g.net.model, "forward", broken)
        seq = sequence([0, 5, 6], 10)
        engine.submit(seq)
        _, kind_, value = events(seq, timeout=20)
        assert kind_ == "error", (kind_, value)
        assert "device lost" in str(value) or "stopped" in str(value), value
    finally:
        monkeypatch.undo()
        engine.close()
