"""Serving from Python: handlers behind the server's real front doors, called by clients no one
here wrote (the openai client, tritonclient), and the failure paths of a worker's life: an item
that fails, a handler that raises, a cancelled request, kill -9, SIGTERM, a hot swap, a server
restart, a wrong token, an unknown model, a write into the read-only weights.

Handlers run either in this process (``serving``: ``Session.serve`` on a thread, stopped with a
``Stop``) or as worker processes (python/tests/worker.py). One module-wide server (stack.py);
each test leaves no worker serving behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import modelshare
from conftest import ADMIN, TOKEN_B
from stack import W1, W2, Stack, embeddings, started, stop_workers


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from started(request, tmp_path_factory, "serve")


@pytest.fixture(autouse=True)
def no_worker_left(stack: Stack) -> Iterator[None]:
    yield
    stop_workers(stack)


@contextlib.contextmanager
def serving(stack: Stack, handler, name: str = "in-process", **options) -> Iterator[modelshare.Stop]:
    """``handler`` serving model ``enc`` from this process until the block ends."""
    stop = modelshare.Stop()
    errors: list[BaseException] = []
    with modelshare.Session.open(stack.address, name=name, token=ADMIN) as session:
        def run() -> None:
            try:
                session.serve("enc", handler, stop=stop, handle_signals=False, **options)
            except BaseException as e:  # noqa: BLE001 - reported by the test below
                errors.append(e)

        thread = threading.Thread(target=run)
        thread.start()
        try:
            deadline = time.monotonic() + 20
            while stack.serving(name) != 1:
                assert not errors, errors
                assert time.monotonic() < deadline, "the in-process handler is not serving"
                time.sleep(0.05)
            yield stop
        finally:
            stop.stop()
            thread.join(timeout=30)
    assert not thread.is_alive(), "serve did not return after stop()"
    assert not errors, errors


def f32(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


def test_openai_embeddings_from_a_python_handler(stack: Stack) -> None:
    def handle(batch: modelshare.Batch):
        w = batch.model.numpy(["w"])["w"]
        return [modelshare.Output({"embedding": w + np.float32(len(t))}, {"prompt_tokens": len(t.split())})
                for t in batch.texts]

    with serving(stack, handle):
        r = embeddings(stack, ["hello world", "abc"])
    assert [d.index for d in r.data] == [0, 1]
    assert np.array_equal(f32(r.data[0].embedding), f32(W1) + np.float32(11))
    assert np.array_equal(f32(r.data[1].embedding), f32(W1) + np.float32(3))
    assert r.usage.prompt_tokens == 3


def test_items_carry_the_request_id_and_the_trace_context(stack: Stack) -> None:
    """The caller's x-request-id and traceparent reach the handler's items, and the id comes
    back on the answer (the openai client reads it as ``_request_id``)."""
    import openai

    seen: list[tuple[str, str | None]] = []
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

    def handle(batch: modelshare.Batch):
        seen.extend((item.request_id, item.traceparent) for item in batch.items)
        return [{"embedding": np.zeros(4, dtype=np.float32)} for _ in batch.items]

    client = openai.OpenAI(base_url=f"{stack.http}/v1", api_key=TOKEN_B, max_retries=0, timeout=30)
    with serving(stack, handle):
        r = client.embeddings.with_raw_response.create(
            model="enc", input=["a", "b"], extra_headers={"x-request-id": "py-req-1", "traceparent": traceparent})
        plain = client.embeddings.create(model="enc", input="c")
    assert r.headers["x-request-id"] == "py-req-1"
    assert seen[:2] == [("py-req-1", traceparent)] * 2
    # None sent: the server made one, the same on the answer and on the item.
    assert plain._request_id and seen[2] == (plain._request_id, None), (plain._request_id, seen)


def test_kserve_tensors_from_a_python_handler(stack: Stack) -> None:
    torch = pytest.importorskip("torch")
    import tritonclient.http as th

    seen: list[dict] = []

    def handle(batch: modelshare.Batch):
        answers = []
        for item in batch.items:
            x, ids, names = item.inputs["x"], item.inputs["ids"], item.inputs["names"]
            seen.append({"writeable": x.flags.writeable, "dtypes": (x.dtype, ids.dtype, names.dtype),
                         "shapes": (x.shape, ids.shape, names.shape)})
            answers.append({
                "y": x * 2,
                "ids": ids,
                "names": np.array([n.upper() for n in names.reshape(-1)], dtype=object).reshape(names.shape),
                "half": torch.from_numpy(x.copy()).to(torch.float16),
            })
        return answers

    client = th.InferenceServerClient(stack.http.removeprefix("http://"))
    x = np.arange(6, dtype=np.float32).reshape(2, 3) / 4
    ids = np.array([[5, -6], [7, 2**40]], dtype=np.int64)
    inputs = [th.InferInput("x", [2, 3], "FP32"), th.InferInput("ids", [2, 2], "INT64"),
              th.InferInput("names", [2], "BYTES")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(ids)
    inputs[2].set_data_from_numpy(np.array([b"ab", b"c\x00d"], dtype=object))
    with serving(stack, handle, accepts=["tensor"]):
        r = client.infer("enc", inputs, headers={"authorization": f"Bearer {TOKEN_B}"})
    assert np.array_equal(r.as_numpy("y"), x * 2) and r.as_numpy("y").dtype == np.float32
    assert np.array_equal(r.as_numpy("ids"), ids)
    assert list(r.as_numpy("names")) == [b"AB", b"C\x00D"]
    assert np.array_equal(r.as_numpy("half"), x.astype(np.float16))
    # The door splits a request along its first (batch) dimension: one item per row.
    assert seen == [{"writeable": False, "dtypes": (np.float32, np.int64, object),
                     "shapes": ((3,), (2,), ())}] * 2


def test_errors_are_per_item_in_one_batch(stack: Stack) -> None:
    import openai

    release = threading.Event()
    batches: list[list[str | None]] = []

    def handle(batch: modelshare.Batch):
        batches.append(batch.texts)
        if batch.texts == ["hold"]:
            release.wait(20)
        answers = []
        for t in batch.texts:
            if t == "boom":
                answers.append(RuntimeError("the model broke"))
            elif t.startswith("fail:"):
                answers.append(modelshare.ItemError(t[5:]))
            elif t == "full":
                answers.append(modelshare.ItemError("no room", code="RESOURCE_EXHAUSTED"))
            else:
                answers.append({"embedding": np.ones(4, dtype=np.float32) * len(t)})
        return answers

    results: dict[str, object] = {}

    def call(text: str) -> None:
        try:
            results[text] = embeddings(stack, [text]).data[0].embedding
        except Exception as e:  # noqa: BLE001
            results[text] = e

    with serving(stack, handle, credits=1, max_batch_items=8):
        first = threading.Thread(target=call, args=("hold",))
        first.start()
        deadline = time.monotonic() + 10
        while not batches:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        rest = [threading.Thread(target=call, args=(t,)) for t in ("ok", "fail:bad input", "boom", "full")]
        for t in rest:
            t.start()
        time.sleep(0.5)  # all four queued behind the held batch
        release.set()
        for t in [first, *rest]:
            t.join(30)
    assert sorted(batches[1]) == sorted(["ok", "fail:bad input", "boom", "full"]), batches
    assert results["hold"] == [4.0] * 4 and results["ok"] == [2.0] * 4
    assert isinstance(results["fail:bad input"], openai.BadRequestError), results
    assert "bad input" in str(results["fail:bad input"])
    assert isinstance(results["boom"], openai.InternalServerError), results
    assert "RuntimeError: the model broke" in str(results["boom"])
    assert isinstance(results["full"], openai.APIStatusError) and results["full"].status_code == 429, results["full"]


def test_a_handler_that_raises_fails_its_batch_only(stack: Stack) -> None:
    import openai

    def handle(batch: modelshare.Batch):
        if "crash" in batch.texts:
            raise ValueError("cannot run this batch")
        if "short" in batch.texts:
            return []
        return [{"embedding": np.zeros(2, dtype=np.float32)} for _ in batch.items]

    with serving(stack, handle):
        with pytest.raises(openai.BadRequestError, match="cannot run this batch"):
            embeddings(stack, ["crash"])
        with pytest.raises(openai.InternalServerError, match="0 answer"):
            embeddings(stack, ["short"])
        assert embeddings(stack, ["fine"]).data[0].embedding == [0.0, 0.0]


def two_at_once(stack: Stack) -> dict[str, list[float]]:
    """Embeddings of "a" and "bb", asked at the same time by two clients."""
    out: dict[str, list[float]] = {}
    threads = [threading.Thread(target=lambda t=t: out.__setitem__(t, embeddings(stack, [t]).data[0].embedding))
               for t in ("a", "bb")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_async_handler(stack: Stack) -> None:
    running = 0
    most = 0

    async def handle(batch: modelshare.Batch):
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.2)
        running -= 1
        return [{"embedding": np.full(3, len(t), dtype=np.float32)} for t in batch.texts]

    with serving(stack, handle, credits=2, max_batch_items=1):
        out = two_at_once(stack)
    assert out == {"a": [1.0] * 3, "bb": [2.0] * 3}
    assert most == 2, "two batches held at once run at once on the handler's event loop"


@pytest.mark.parametrize("concurrency", [None, 1])
def test_concurrency_bounds_the_batches_run_at_once(stack: Stack, concurrency: int | None) -> None:
    """Two batches held (credits 2): by default both run at once; with concurrency 1 the second
    waits, held, for the first to return."""
    lock = threading.Lock()
    running = 0
    most = 0
    spans: list[tuple[float, float]] = []

    def handle(batch: modelshare.Batch):
        nonlocal running, most
        start = time.monotonic()
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.3)
        with lock:
            running -= 1
        spans.append((start, time.monotonic()))
        return [{"embedding": np.full(2, len(t), dtype=np.float32)} for t in batch.texts]

    with serving(stack, handle, credits=2, concurrency=concurrency, max_batch_items=1):
        out = two_at_once(stack)
    assert out == {"a": [1.0] * 2, "bb": [2.0] * 2}
    assert most == (concurrency or 2), spans
    if concurrency == 1:
        (_, first_end), (second_start, _) = sorted(spans)
        assert second_start >= first_end, spans


def handler_threads() -> list[str]:
    """The names of this process's threads that are the handler's (``modelshare-handler-N``;
    the kernel keeps 15 characters of a name)."""
    names = []
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError), open(f"/proc/self/task/{tid}/comm") as f:
            name = f.read().strip()
            if name.startswith("modelshare-hand"):
                names.append(name)
    return names


def test_the_handler_threads_end_before_serve_returns(stack: Stack) -> None:
    """The batches run on the handler's own threads (the same ones for every batch), and none
    outlives ``serve``: one left would need the GIL of an interpreter that may be exiting."""
    seen: set[int] = set()

    def handle(batch: modelshare.Batch):
        seen.add(threading.get_ident())
        return [{"embedding": np.zeros(1, dtype=np.float32)} for _ in batch.items]

    with serving(stack, handle, credits=2, concurrency=2, max_batch_items=1):
        assert len(handler_threads()) == 2
        for _ in range(4):
            embeddings(stack, ["x"])
    assert 1 <= len(seen) <= 2, seen
    assert handler_threads() == []


def test_concurrency_below_one_is_refused(stack: Stack) -> None:
    with modelshare.Session.open(stack.address, name="bad-concurrency", token=ADMIN) as session:
        with pytest.raises(ValueError, match="concurrency"):
            session.serve("enc", lambda batch: [], concurrency=0, handle_signals=False)


def test_the_handler_sees_a_cancelled_item(stack: Stack) -> None:
    import openai

    seen = threading.Event()

    def handle(batch: modelshare.Batch):
        item = batch.items[0]
        deadline = time.monotonic() + 15
        while not item.cancelled and time.monotonic() < deadline:
            time.sleep(0.01)
        if item.cancelled:
            seen.set()
        return [{"embedding": np.zeros(1, dtype=np.float32)}]

    with serving(stack, handle):
        # The client gives up after 1 s, and tells the server so (x-stainless-read-timeout):
        # whichever comes first, its own timeout or the server's 504 at that deadline, the item
        # is cancelled.
        with pytest.raises((openai.APITimeoutError, openai.APIStatusError)) as raised:
            embeddings(stack, ["slow"], timeout=1.0)
        if isinstance(raised.value, openai.APIStatusError):
            assert raised.value.status_code == 504, raised.value
        assert seen.wait(10), "the client left, yet the item never showed cancelled"


def test_kill_9_loses_no_request(stack: Stack) -> None:
    for _ in range(2):
        stack.worker("k9")
    stack.wait_serving("k9", 2)
    out: dict[str, object] = {}

    def call() -> None:
        try:
            out["r"] = embeddings(stack, ["sleep:1500 abc"])
        except Exception as e:  # noqa: BLE001
            out["e"] = e

    thread = threading.Thread(target=call)
    thread.start()
    deadline = time.monotonic() + 10
    holder = None
    while holder is None:
        assert time.monotonic() < deadline, "no worker took the item"
        holder = next((s["pid"] for s in stack.sessions() for w in s["serving"] if w["items_in_flight"]), None)
        time.sleep(0.02)
    victim = next(p for p in stack.workers if p.pid == holder)
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(10) == -signal.SIGKILL
    thread.join(30)
    assert "r" in out, f"{out} at {time.time()}"
    r = out["r"]
    assert np.array_equal(f32(r.data[0].embedding), f32(W1) + np.float32(len("sleep:1500 abc")))


def test_sigterm_answers_what_it_holds_then_exits_0(stack: Stack) -> None:
    worker = stack.worker("term")
    stack.wait_serving("term")
    out: dict[str, object] = {}
    thread = threading.Thread(target=lambda: out.__setitem__("r", embeddings(stack, ["sleep:800 held"])))
    thread.start()
    deadline = time.monotonic() + 10
    while not any(w["items_in_flight"] for s in stack.sessions() for w in s["serving"]):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(20) == 0, Path(worker.log_path).read_text()
    thread.join(30)
    assert np.array_equal(f32(out["r"].data[0].embedding), f32(W1) + np.float32(len("sleep:800 held")))
    assert not [s for s in stack.sessions() if s["worker_name"] == "term"], "the session ended with the worker"


def test_hot_swap_rebuilds_the_handler_on_the_new_version(stack: Stack) -> None:
    stack.worker("swap", "--async")
    stack.wait_serving("swap")
    before = embeddings(stack, ["x"])
    assert np.array_equal(f32(before.data[0].embedding), f32(W1) + 1)
    stack.cli("load", "enc", "enc2", "--public")
    try:
        deadline = time.monotonic() + 20
        while True:
            mine = [s for s in stack.sessions() if s["worker_name"] == "swap"]
            versions = {w["version"] for s in mine for w in s["serving"]}
            leases = {lease["version"] for s in mine for lease in s["leases"]}
            if versions == {2} and leases == {2}:
                break
            assert time.monotonic() < deadline, f"not serving v2 alone: {mine}"
            time.sleep(0.05)
        after = embeddings(stack, ["x"])
        assert np.array_equal(f32(after.data[0].embedding), f32(W2) + 1)
    finally:
        stack.cli("load", "enc", "enc", "--public")


def test_a_torch_write_into_the_weights_kills_that_worker_only(stack: Stack) -> None:
    pytest.importorskip("torch")
    stack.worker("bystander")
    stack.wait_serving("bystander")
    writer = stack.worker("writer", "--write-on-attach")
    code = writer.wait(30)
    log = Path(writer.log_path).read_text()
    assert code == -signal.SIGSEGV, f"exit {code}\n{log}"
    assert "attached" in log and "wrote" not in log
    deadline = time.monotonic() + 10
    while [s for s in stack.sessions() if s["worker_name"] == "writer"]:
        assert time.monotonic() < deadline, "the dead writer's session and lease outlived it"
        time.sleep(0.05)
    r = embeddings(stack, ["still here"])
    assert np.array_equal(f32(r.data[0].embedding), f32(W1) + np.float32(10))
    with modelshare.Session.open(stack.address, name="reader", token=ADMIN) as session:
        model = session.attach("enc")
        model.verify()
        assert model.numpy()["w"].tobytes() == struct.pack("<16f", *W1)


@pytest.mark.parametrize(("token", "model", "expect"), [
    ("ms_wrong_token", "enc", "UNAUTHENTICATED"),
    (TOKEN_B, "no-such-model", "NOT_FOUND"),
])
def test_a_refused_worker_exits_with_the_reason(stack: Stack, token: str, model: str, expect: str) -> None:
    worker = stack.worker("refused", "--model", model, token=token)
    assert worker.wait(15) == 1
    log = Path(worker.log_path).read_text()
    assert "error: " in log and expect in log, log


def test_serving_resumes_after_a_server_restart(stack: Stack) -> None:
    stack.worker("survivor")
    stack.wait_serving("survivor")
    stack.stop()
    # A worker started while no server runs waits for one (Session.open(wait=None)).
    early = stack.worker("early")
    time.sleep(1.5)
    assert early.poll() is None, Path(early.log_path).read_text()
    stack.start()
    stack.wait_serving("survivor", timeout=30)
    stack.wait_serving("early", timeout=30)
    r = embeddings(stack, ["back"])
    assert np.array_equal(f32(r.data[0].embedding), f32(W1) + np.float32(4))
    assert all(p.poll() is None for p in stack.workers), "the workers outlived the restart"


def test_overload_is_refused_at_once_with_429_not_a_late_504(stack: Stack) -> None:
    """A model that cannot serve a request before the client's own timeout (openai-python sends
    it as x-stainless-read-timeout) answers 429 with Retry-After at once, instead of queueing it
    to answer 504 when the timeout has passed (the client then retries each, tripling the load)."""
    import openai

    def handle(batch: modelshare.Batch):
        time.sleep(0.02)  # 50 items a second, one at a time
        return [{"embedding": np.zeros(2, dtype=np.float32)} for _ in batch.items]

    client = openai.OpenAI(base_url=f"{stack.http}/v1", api_key=TOKEN_B, max_retries=0, timeout=1.0)
    outcomes: list[tuple[str, float, object]] = []
    lock = threading.Lock()

    def call() -> None:
        started = time.monotonic()
        try:
            client.embeddings.create(model="enc", input=["x"])
            kind, detail = "ok", None
        except openai.APIStatusError as e:
            kind, detail = str(e.status_code), e.response.headers.get("retry-after")
        except openai.APITimeoutError:
            kind, detail = "timeout", None
        with lock:
            outcomes.append((kind, time.monotonic() - started, detail))

    with serving(stack, handle, credits=1, max_batch_items=1):
        # Warm-up: a backlog that the model works through, so that its rate is measured.
        warm = [threading.Thread(target=call) for _ in range(30)]
        for t in warm:
            t.start()
        for t in warm:
            t.join(30)
        outcomes.clear()
        # Then 90 at once (under httpx's 100 connections): about 50 fit in the second each
        # client gives.
        burst = [threading.Thread(target=call) for _ in range(90)]
        for t in burst:
            t.start()
        for t in burst:
            t.join(30)
    kinds = [k for k, _, _ in outcomes]
    refused = [(elapsed, after) for k, elapsed, after in outcomes if k == "429"]
    assert kinds.count("ok") >= 20, kinds
    assert len(refused) >= 25, f"only {len(refused)} refused: {sorted(set(kinds))}"
    assert all(elapsed < 0.5 for elapsed, _ in refused), "a refusal must come at once"
    assert all(after is not None and int(after) >= 1 for _, after in refused), refused[:3]
    assert kinds.count("504") + kinds.count("timeout") <= 15, kinds


def test_a_batch_level_answer_is_split_into_the_items(stack: Stack) -> None:
    """BatchOutput: one [n, d] array and per-item parameter lists for the whole batch, split into
    the items in Rust; an item named in ``errors`` fails alone; a row count other than the
    batch's fails the batch."""
    import openai

    def handle(batch: modelshare.Batch):
        texts = batch.texts
        if "rows" in texts:
            return modelshare.BatchOutput({"embedding": np.zeros((len(texts) + 1, 2), dtype=np.float32)})
        rows = np.array([[len(t), i] for i, t in enumerate(texts)], dtype=np.float32)
        errors = {i: modelshare.ItemError("no such word") for i, t in enumerate(texts) if t == "bad"}
        return modelshare.BatchOutput({"embedding": rows}, {"prompt_tokens": [len(t) for t in texts]}, errors)

    with serving(stack, handle, max_batch_items=8):
        r = embeddings(stack, ["a", "bbb", "cc"])
        assert [d.embedding[0] for d in r.data] == [1.0, 3.0, 2.0]
        assert r.usage.prompt_tokens == 6
        with pytest.raises(openai.BadRequestError, match="no such word"):
            embeddings(stack, ["bad"])
        with pytest.raises(openai.InternalServerError, match="rows for a batch of 1"):
            embeddings(stack, ["rows"])
