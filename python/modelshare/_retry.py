"""``retry``: a call tried again with backoff (0.1 s doubling to 2 s) while it fails with what may
pass, until it succeeds, a deadline passes (the last error is raised) or the caller stops."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

MIN_BACKOFF, MAX_BACKOFF = 0.1, 2.0
log = logging.getLogger("modelshare")


def retry(
    call: Callable[[], T],
    passing: tuple[type[BaseException], ...],
    what: str,
    *,
    deadline: float | None = None,
    stopped: Callable[[], bool] = lambda: False,
) -> T | None:
    """``call()``, tried again while it raises one of ``passing``: until it returns, until
    ``deadline`` (``time.monotonic()``; ``None``: none) passes, raising its last error, or until
    ``stopped()`` (then ``None``). Waits in steps of 50 ms at most, so that a stop is seen soon.
    """
    backoff = MIN_BACKOFF
    while not stopped():
        try:
            return call()
        except passing as e:
            if deadline is not None and time.monotonic() >= deadline:
                raise
            log.warning("%s (%s); trying again in %.1f s", what, e, backoff)
        end = time.monotonic() + backoff
        if deadline is not None:
            end = min(end, deadline)
        while not stopped() and time.monotonic() < end:
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))
        backoff = min(backoff * 2, MAX_BACKOFF)
    return None
