"""One generation request on its way to text, whatever engine samples its tokens: the tokens
it has, and what the next one does to it (the decoded text grows; it ends at an end-of-sequence
token, at ``max_tokens``, at the model's last position or at a stop string). Its handler reads
its events: ``("text", str)`` as text is ready, then ``("end", finish_reason)`` or
``("error", exception)``.

Text that may be the start of a stop string, or an incomplete character, is held back until it
is not; the text is cut before a stop string.
"""

from __future__ import annotations

import queue
from collections.abc import Collection
from typing import Any, Protocol

#: Temperatures below this sample greedily (dividing by them overflows the logits).
MIN_TEMPERATURE = 1e-4


class Model(Protocol):
    """What a sequence needs of its model: its tokenizer, end-of-sequence tokens and positions."""

    tokenizer: Any
    eos: Collection[int]
    max_positions: int


class Sequence:
    """One request being generated (see the module's docs)."""

    def __init__(self, ids: list[int], *, max_tokens: int, temperature: float, top_p: float,
                 seed: int | None, stop: list[str], ignore_eos: bool) -> None:
        self.ids = list(ids)
        self.prompt_tokens = len(ids)
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.seed = seed
        self.stop = stop
        self.ignore_eos = ignore_eos
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.generated: list[int] = []
        self.sent = 0  # characters of the decoded text already sent
        self.done = False
        self.cancelled = False
        self.request_id: str | None = None  # the engine's name for it, where it has one

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_TEMPERATURE

    @property
    def completion_tokens(self) -> int:
        return len(self.generated)

    def accept(self, token: int, model: Model) -> bool:
        """Takes the next token; True when the sequence has ended (its end event is sent)."""
        self.ids.append(token)
        eos = token in model.eos and not self.ignore_eos
        if not eos:
            self.generated.append(token)
        text = model.tokenizer.decode(self.generated, skip_special_tokens=True)
        cut = first_stop(text, self.stop, self.sent)
        if eos or cut is not None:
            self._emit(text if cut is None else text[:cut])
            return self.end("stop")
        if len(self.generated) >= self.max_tokens or len(self.ids) >= model.max_positions:
            self._emit(text)
            return self.end("length")
        # Hold back an incomplete character and what may begin a stop string.
        ready = len(text.rstrip("\ufffd"))
        ready -= stop_prefix(text[:ready], self.stop)
        self._emit(text[:ready])
        return False

    def end(self, reason: str) -> bool:
        if not self.done:
            self.done = True
            self.events.put(("end", reason))
        return True

    def fail(self, error: BaseException) -> None:
        if not self.done:
            self.done = True
            self.events.put(("error", error))

    def _emit(self, text: str) -> None:
        if len(text) > self.sent:
            self.events.put(("text", text[self.sent:]))
            self.sent = len(text)


def first_stop(text: str, stops: list[str], sent: int) -> int | None:
    """Where the first stop string begins in ``text`` (searching from what may still hold one
    that was not sent), or None."""
    found = [i for i in (text.find(stop, max(0, sent - len(stop) + 1)) for stop in stops) if i >= 0]
    return min(found) if found else None


def stop_prefix(text: str, stops: list[str]) -> int:
    """The length of the longest end of ``text`` that begins a stop string."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest
