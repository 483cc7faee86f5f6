"""Streaming workers in Python (issue 30): a generator handler (``Session.serve(...,
streams=N)``) streams its parts through the server's OpenAI completion doors to the official
openai client, as it yields them.

- sync and ``async`` generators stream a completion and a chat, the final answer's usage read;
- an answer taken whole joins the parts' text; under load, every part reaches its answer;
- a client that goes away closes the generator at its next part (the worker prints it), and the
  stream's slot is free again;
- a handler that raises before its first part is a plain error, not an event.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import TOKEN_B
from stack import Stack, started, stop_workers

WORDS = " ".join(f"w{i}" for i in range(100))


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from started(request, tmp_path_factory, "stream")


@pytest.fixture(autouse=True)
def no_worker_left(stack: Stack) -> Iterator[None]:
    yield
    stop_workers(stack)


def client(stack: Stack):
    import openai

    return openai.OpenAI(base_url=f"{stack.http}/v1", api_key=TOKEN_B, max_retries=0, timeout=30)


def in_flight(stack: Stack) -> int:
    return sum(w.get("items_in_flight", 0) for s in stack.sessions() for w in s.get("serving", []))


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_generator_streams_through_the_openai_client(stack: Stack, flavour: str) -> None:
    extra = ["--async"] if flavour == "async" else []
    stack.worker(f"gen-{flavour}", "--streams", "4", *extra)
    stack.wait_serving(f"gen-{flavour}")
    c = client(stack)
    chunks = list(c.completions.create(model="enc", prompt="one two three four", max_tokens=3, stream=True,
                                       stream_options={"include_usage": True}))
    texts = [ch.choices[0].text for ch in chunks if ch.choices]
    assert texts == ["one", " two", " three", ""], texts
    assert chunks[-2].choices[0].finish_reason == "length"
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (4, 3), chunks[-1]
    messages = [{"role": "user", "content": "hello streaming world"}]
    chat = list(c.chat.completions.create(model="enc", messages=messages, stream=True))
    assert "".join(ch.choices[0].delta.content or "" for ch in chat) == "hello streaming world"
    assert chat[-1].choices[0].finish_reason == "stop"
    whole = c.completions.create(model="enc", prompt="a b c")
    assert whole.choices[0].text == "a b c" and whole.usage.completion_tokens == 3, whole


def test_every_part_reaches_the_answer_under_load(stack: Stack) -> None:
    """The last part and the final answer leave the handler's thread one after the other; the
    serve loop once took the answer first when both came between its polls, and the part was
    lost (1 in ~25 runs of the test above on a loaded machine). Many short answers at once,
    streamed and whole, each must carry every word."""
    from concurrent.futures import ThreadPoolExecutor

    stack.worker("gen-many", "--streams", "8")
    stack.wait_serving("gen-many")
    c = client(stack)

    def ask(i: int) -> tuple[str, str]:
        words = " ".join(f"x{i}y{k}" for k in range(1 + i % 3))
        if i % 2:
            return words, c.completions.create(model="enc", prompt=words).choices[0].text
        chunks = c.completions.create(model="enc", prompt=words, stream=True)
        return words, "".join(ch.choices[0].text for ch in chunks if ch.choices)

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(ask, range(1000)))
    wrong = [(want, got) for want, got in answers if want != got]
    assert not wrong, f"{len(wrong)} of {len(answers)} answers lost words: {wrong[:5]}"


def test_a_disconnect_closes_the_generator(stack: Stack) -> None:
    p = stack.worker("gen-cancel", "--streams", "2")
    stack.wait_serving("gen-cancel")
    stream = client(stack).completions.create(model="enc", prompt="sleep:100 " + WORDS, max_tokens=100, stream=True)
    first = [next(stream).choices[0].text for _ in range(2)]
    assert first == ["sleep:100", " w0"], first
    t0 = time.monotonic()
    stream.close()
    log = Path(p.log_path)  # type: ignore[attr-defined]
    while "generator closed after" not in log.read_text(errors="replace") or in_flight(stack):
        assert time.monotonic() - t0 < 5, log.read_text(errors="replace")[-2000:]
        time.sleep(0.02)
    print(f"disconnect to the generator closed and the slot free: {1000 * (time.monotonic() - t0):.0f} ms")
    # The slot serves the next stream.
    again = client(stack).completions.create(model="enc", prompt="x y", stream=False)
    assert again.choices[0].text == "x y"


def test_a_handler_failing_before_its_first_part_is_a_plain_error(stack: Stack) -> None:
    import openai

    stack.worker("gen-fail", "--streams", "1")
    stack.wait_serving("gen-fail")
    # The chat's last message has no string content: json/KeyError in the handler, INTERNAL.
    with pytest.raises(openai.InternalServerError):
        client(stack).chat.completions.create(model="enc", messages=[{"role": "user"}], stream=True)
