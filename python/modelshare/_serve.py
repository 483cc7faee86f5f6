"""Serving requests from Python: the worker SDK's serve loop with a Python handler.

``Session.serve(model, handler)`` offers the model to the server and runs batches of requests
through ``handler`` until the worker is stopped (SIGTERM, SIGINT, ``Stop.stop()``). The loop
itself is the Rust SDK's (``_native.serve``): credits, heartbeats, cancels, drains and
reconnection after a server restart. This module adapts the handler to it:

- ``Batch`` and ``Item``: what the handler receives (inputs as read-only numpy arrays, text as
  ``str``, parameters, deadline, a live ``cancelled`` flag);
- ``Output`` and ``ItemError``: what it answers per item (named arrays or torch tensors, output
  parameters; an exception fails that item only, with a status code);
- the adapter: calls the handler (a plain function, or an ``async def`` run on an event loop of
  its own), turns each answer into the native form (``python/src/outcome.rs``) and each
  exception into that item's failure;
- the loop across versions: after a drain (a new version was loaded), attach the latest version
  again, let ``on_version`` rebuild the handler, serve again;
- streams (``streams=N``): the handler is called per item and yields its answer in parts, each
  sent as it comes within the item's window (``python/src/parts.rs`` waits, without the GIL,
  while the window is closed); the generator's return value (or a yielded ``Final``) is the
  final answer;
- signals: the first SIGTERM or SIGINT drains (the batches held are answered, the stream closes,
  ``serve`` returns), a second exits at once with status 1, as the Rust SDK's workers do.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import signal
import struct
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Union

from . import _native
from ._native import Error, NotFound, SessionEnded, Stop, Timeout, Unauthenticated, Unavailable
from ._native import ConnectError as _ConnectError
from ._numpy import numpy_dtype
from ._retry import retry

if TYPE_CHECKING:
    import numpy

    from ._session import Model, Session

log = logging.getLogger("modelshare")

#: What a handler may answer for one item.
Answer = Union["Output", Mapping[str, Any], BaseException]
#: A handler: a batch in, one answer per item out (or an ``async def`` doing the same).
Handler = Callable[["Batch"], Any]



class ItemError(Error):
    """Raised (or returned) by a handler for one item: that item fails with ``code``.

    ``code`` is a gRPC status code's name: ``"INVALID_ARGUMENT"`` (the default: the request is
    wrong), ``"RESOURCE_EXHAUSTED"``, ``"UNAVAILABLE"``, ``"INTERNAL"``, ... The front doors map
    it as they map the server's own errors (INVALID_ARGUMENT is HTTP 400).
    """

    def __init__(self, message: str, code: str = "INVALID_ARGUMENT") -> None:
        super().__init__(message)
        self.code = code


class Output:
    """One item's answer: named output tensors and output parameters.

    ``tensors``: name -> numpy array, torch tensor (copied to the host if on a GPU), or anything
    ``numpy.asarray`` takes; strings and bytes become a BYTES tensor. ``parameters``: name ->
    bool, int, float or str (``prompt_tokens`` is reported by the OpenAI door as usage).
    A plain ``dict`` of tensors is an ``Output`` without parameters.
    """

    __slots__ = ("parameters", "tensors")

    def __init__(
        self,
        tensors: Mapping[str, Any] | None = None,
        parameters: Mapping[str, bool | int | float | str] | None = None,
    ) -> None:
        self.tensors = dict(tensors or {})
        self.parameters = dict(parameters or {})

    def __repr__(self) -> str:
        return f"Output(tensors={sorted(self.tensors)}, parameters={self.parameters})"


class Final:
    """What a streaming handler yields last to give its final answer (an ``async def``
    generator cannot ``return`` one): ``output`` is an :class:`Output`, a ``dict`` of tensors,
    a ``str`` (the parameter ``text``) or None."""

    __slots__ = ("output",)

    def __init__(self, output: Any = None) -> None:
        self.output = output

    def __repr__(self) -> str:
        return f"Final({self.output!r})"


class BatchOutput:
    """The whole batch's answer at once, instead of one answer per item: each tensor's first
    dimension is the batch's items (row ``i`` is item ``i``'s tensor), each parameter a sequence
    of one value per item; ``errors`` maps item indices to exceptions (those items fail, their
    rows are ignored). The rows are split in Rust without a copy per item: for a batched model
    (an encoder's ``[n, d]`` embeddings) the cheapest answer.
    """

    __slots__ = ("errors", "parameters", "tensors")

    def __init__(
        self,
        tensors: Mapping[str, Any],
        parameters: Mapping[str, Sequence[bool | int | float | str]] | None = None,
        errors: Mapping[int, BaseException] | None = None,
    ) -> None:
        self.tensors = dict(tensors)
        self.parameters = dict(parameters or {})
        self.errors = dict(errors or {})

    def __repr__(self) -> str:
        return f"BatchOutput(tensors={sorted(self.tensors)}, parameters={sorted(self.parameters)}, errors={sorted(self.errors)})"


class Item:
    """One request of a batch."""

    __slots__ = ("_inputs", "_native", "_parameters")

    def __init__(self, native: _native.Item) -> None:
        self._native = native
        self._inputs: dict[str, numpy.ndarray] | None = None
        self._parameters: dict[str, Any] | None = None

    @property
    def id(self) -> int:
        """Identifier of the item, unique within the server."""
        return self._native.id

    @property
    def text(self) -> str | None:
        """The text input (OpenAI ``input``), or None for a tensor input."""
        return self._native.text

    @property
    def inputs(self) -> dict[str, numpy.ndarray]:
        """The named input tensors (KServe v2 ``inputs``) as read-only numpy arrays of their
        dtype and shape; BYTES inputs as arrays of ``bytes`` objects. Empty for a text input."""
        if self._inputs is None:
            self._inputs = {name: _array(dtype, shape, data) for name, dtype, shape, data in self._native.tensors()}
        return self._inputs

    @property
    def parameters(self) -> dict[str, Any]:
        """Request parameters from the front door (``dimensions``, ...): ignore unknown ones."""
        if self._parameters is None:
            self._parameters = self._native.parameters()
        return self._parameters

    @property
    def deadline(self) -> float | None:
        """When the caller stops waiting, as ``time.time()`` counts, or None."""
        return self._native.deadline

    @property
    def request_id(self) -> str:
        """The request's id: the caller's ``x-request-id``, or one the server made; the same on
        every item of a request, and in the server's logs and the caller's answer."""
        return self._native.request_id

    @property
    def traceparent(self) -> str | None:
        """The caller's W3C trace context (``traceparent``), if it sent a well-formed one: a
        worker that traces (OpenTelemetry) continues the caller's trace from it."""
        return self._native.traceparent

    @property
    def cancelled(self) -> bool:
        """Whether the server has cancelled the item (the caller left, or its deadline passed):
        whatever is answered for it now is discarded. Long work may check it and stop early."""
        return self._native.cancelled

    def __repr__(self) -> str:
        return repr(self._native)


class Batch:
    """A batch of items of one model version; the handler answers each item, in order."""

    __slots__ = ("id", "items", "model", "version")

    def __init__(self, batch_id: int, version: int, items: list[Item], model: Model) -> None:
        self.id = batch_id
        self.version = version
        self.items = items
        self.model = model

    @property
    def texts(self) -> list[str | None]:
        """Each item's text (None for a tensor item)."""
        return [item.text for item in self.items]

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[Item]:
        return iter(self.items)

    def __repr__(self) -> str:
        return f"<modelshare.Batch {self.id} of {len(self.items)} item(s), version {self.version}>"


def _array(dtype: str, shape: Sequence[int], data: bytes) -> numpy.ndarray:
    """An input tensor's bytes as a read-only array (no copy: a view of ``data``)."""
    import numpy as np

    if dtype != "BYTES":
        return np.frombuffer(data, dtype=numpy_dtype(dtype)).reshape(shape)
    elements = []
    at = 0
    while at < len(data):
        (length,) = struct.unpack_from("<I", data, at)
        elements.append(data[at + 4 : at + 4 + length])
        at += 4 + length
    array = np.empty(len(elements), dtype=object)
    array[:] = elements
    array = array.reshape(shape)
    array.flags.writeable = False
    return array


# numpy dtype names (as ``dtype.name``) -> modelshare dtype names; ml_dtypes' names included.
_DTYPE_NAMES = {
    "bool": "BOOL",
    "uint8": "U8",
    "int8": "I8",
    "int16": "I16",
    "uint16": "U16",
    "float16": "F16",
    "int32": "I32",
    "uint32": "U32",
    "float32": "F32",
    "float64": "F64",
    "int64": "I64",
    "uint64": "U64",
    "complex64": "C64",
    "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "float8_e8m0fnu": "F8_E8M0",
}

# torch dtypes with no numpy equivalent -> (modelshare name, same-size torch integer type name).
_TORCH_VIEWS = {
    "bfloat16": ("BF16", "int16"),
    "float8_e4m3fn": ("F8_E4M3", "uint8"),
    "float8_e5m2": ("F8_E5M2", "uint8"),
    "float8_e8m0fnu": ("F8_E8M0", "uint8"),
}


def _tensor(name: str, value: Any) -> tuple[str, str, list[int], bytes]:
    """One output tensor in the native form ``(name, dtype, shape, data)``."""
    import numpy as np

    if not isinstance(name, str):
        raise TypeError(f"output names must be str, not {type(name).__name__}")
    if type(value).__module__.startswith("torch"):
        tensor = value.detach().cpu().contiguous()
        kind = str(tensor.dtype).removeprefix("torch.")
        if kind in _TORCH_VIEWS:
            dtype, same_size = _TORCH_VIEWS[kind]
            import torch

            raw = tensor.view(getattr(torch, same_size)).numpy()
            return name, dtype, list(tensor.shape), raw.tobytes()
        value = tensor.numpy()
    array = np.asarray(value)
    if array.dtype.kind in "OSU":
        return name, "BYTES", list(array.shape), _strings(name, array)
    dtype = _DTYPE_NAMES.get(array.dtype.name)
    if dtype is None:
        raise TypeError(f"output {name!r} has dtype {array.dtype}, which modelshare cannot send")
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return name, dtype, list(array.shape), np.ascontiguousarray(array).tobytes()


def _strings(name: str, array: numpy.ndarray) -> bytes:
    """A BYTES tensor's data: each element's 4-byte little-endian length, then its bytes."""
    parts = []
    for element in array.reshape(-1):
        if isinstance(element, str):
            element = element.encode()
        if not isinstance(element, bytes | bytearray):
            raise TypeError(f"output {name!r}: a BYTES element is {type(element).__name__}, not str or bytes")
        parts.append(struct.pack("<I", len(element)))
        parts.append(bytes(element))
    return b"".join(parts)


def _failure(error: BaseException) -> tuple[bool, str, str]:
    """The native form of an item failed with ``error``."""
    code = getattr(error, "code", None) if isinstance(error, Error) else None
    if not isinstance(code, str):
        if isinstance(error, ValueError):
            code = "INVALID_ARGUMENT"
        elif isinstance(error, TimeoutError):
            code = "DEADLINE_EXCEEDED"
        elif isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":
            code = "RESOURCE_EXHAUSTED"
        elif isinstance(error, NotImplementedError):
            code = "UNIMPLEMENTED"
        else:
            code = "INTERNAL"
    message = str(error) if isinstance(error, Error | ValueError) else f"{type(error).__name__}: {error}"
    return False, code, message or type(error).__name__


def _answer(answer: Any) -> tuple[bool, Any, Any]:
    """The native form of one item's answer."""
    if isinstance(answer, BaseException):
        return _failure(answer)
    try:
        if isinstance(answer, Output):
            tensors, parameters = answer.tensors, answer.parameters
        elif isinstance(answer, Mapping):
            tensors, parameters = answer, {}
        else:
            raise TypeError(
                f"the handler answered an item with {type(answer).__name__}; expected a dict of "
                "arrays, a modelshare.Output, or an exception"
            )
        return True, [_tensor(name, value) for name, value in tensors.items()], dict(parameters)
    except Exception as e:
        log.error("bad answer for an item: %s", e)
        return False, "INTERNAL", f"the worker's handler gave a bad answer: {e}"


def _batch_answer(answer: BatchOutput, items: int) -> Any:
    """The native form of a batch-level answer (python/src/outcome.rs checks and splits it)."""
    try:
        tensors = [_tensor(name, value) for name, value in answer.tensors.items()]
        parameters = {name: list(values) for name, values in answer.parameters.items()}
        failures = {}
        for index, error in answer.errors.items():
            if not 0 <= int(index) < items:
                raise ValueError(f"errors names item {index} of a batch of {items}")
            _, code, message = _failure(error)
            failures[int(index)] = (code, message)
    except Exception as e:
        log.error("bad batch answer: %s", e)
        return [(False, "INTERNAL", f"the worker's handler gave a bad answer: {e}")] * items
    return ("batch", tensors, parameters, failures)


class _Loop:
    """An asyncio event loop on a thread of its own, for ``async def`` handlers: each batch's
    coroutine runs there, so that batches held at once interleave on one loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="modelshare-handler-loop", daemon=True)
        self.thread.start()

    def run(self, awaitable: Any) -> Any:
        async def wrapped() -> Any:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(wrapped(), self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


class _Adapter:
    """The callable ``_native.serve`` runs on each batch (on one of the handler's threads)."""

    def __init__(self, handler: Handler, model: Model) -> None:
        if not callable(handler):
            raise TypeError(f"the handler must be callable, not {type(handler).__name__}")
        self.handler = handler
        self.model = model
        self._loop: _Loop | None = None
        self._lock = threading.Lock()

    def __call__(self, batch_id: int, version: int, items: list[_native.Item]) -> Any:
        batch = Batch(batch_id, version, [Item(i) for i in items], self.model)
        try:
            answers = self.handler(batch)
            if inspect.isawaitable(answers):
                answers = self._event_loop().run(answers)
            if isinstance(answers, BatchOutput):
                return _batch_answer(answers, len(items))
            answers = list(answers)
        except Exception as e:
            log.exception("the handler failed on batch %d; its %d item(s) fail", batch_id, len(items))
            return [_failure(e)] * len(items)
        if len(answers) != len(items):
            message = f"the handler returned {len(answers)} answer(s) for a batch of {len(items)} item(s)"
            log.error("%s", message)
            return [(False, "INTERNAL", message)] * len(items)
        return [_answer(a) for a in answers]

    def stream(self, batch_id: int, version: int, native: _native.Item, streamed: bool, parts: Any) -> Any:
        """One item of a streaming worker (on one of the handler's threads): runs the handler,
        sends each part it yields through ``parts`` (which waits while the item's window is
        closed, and says False once the item is cancelled), and returns the final answer.
        When the caller takes the answer whole (``streamed`` False), the parts' ``text`` is
        joined before the final answer's."""
        item = Item(native)
        joined: list[str] = []
        final: Any = None
        try:
            result = self.handler(item)
            if inspect.isasyncgen(result):
                loop = self._event_loop()
                while True:
                    try:
                        part = loop.run(result.__anext__())
                    except StopAsyncIteration:
                        break
                    if isinstance(part, Final):
                        final = part.output
                    elif not _send(part, streamed, parts, joined):
                        loop.run(result.aclose())
                        return _cancelled()
            elif inspect.isgenerator(result):
                while True:
                    try:
                        part = next(result)
                    except StopIteration as done:
                        final = done.value if final is None else final
                        break
                    if isinstance(part, Final):
                        final = part.output
                    elif not _send(part, streamed, parts, joined):
                        result.close()
                        return _cancelled()
            elif inspect.isawaitable(result):
                final = self._event_loop().run(result)
            else:
                final = result
        except Exception as e:
            log.exception("the handler failed on item %d", item.id)
            return _failure(e)
        if final is None or isinstance(final, str):
            final = Output(parameters={"text": final or ""})
        if joined:
            if isinstance(final, Mapping):
                final = Output(final)
            if isinstance(final, Output):
                final = Output(final.tensors, {**final.parameters, "text": "".join(joined) + str(final.parameters.get("text", ""))})
        return _answer(final)

    def _event_loop(self) -> _Loop:
        with self._lock:
            if self._loop is None:
                self._loop = _Loop()
            return self._loop

    def close(self) -> None:
        if self._loop is not None:
            self._loop.close()


def _cancelled() -> tuple[bool, str, str]:
    return False, "CANCELLED", "the server cancelled the item"


def _send(part: Any, streamed: bool, parts: Any, joined: list[str]) -> bool:
    """Sends one part (a ``str`` is the parameter ``text``); False once the item is cancelled
    or its stream has ended. When the caller takes the answer whole, a text part is kept in
    ``joined`` instead, and any other is an error."""
    if isinstance(part, str):
        part = Output(parameters={"text": part})
    if not streamed:
        only_text = isinstance(part, Output) and not part.tensors and set(part.parameters) <= {"text"}
        if not only_text:
            raise ValueError("the caller takes this item's answer whole: only text parts can be joined into it")
        joined.append(str(part.parameters.get("text", "")))
        return True
    native = _answer(part)
    if not native[0]:
        raise ValueError(f"a bad part: {native[2]}")
    return bool(parts(native))


@contextlib.contextmanager
def _signals(stop: Stop) -> Iterator[None]:
    """SIGTERM and SIGINT stop serving (the first drains, a second exits with status 1), while
    inside; only on the main thread, where Python runs signal handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_signal(number: int, _frame: object) -> None:
        if not stop.stopped:
            log.info("signal %s: draining", signal.Signals(number).name)
            stop.stop()
        else:
            print("modelshare: second signal: exiting now", file=sys.stderr, flush=True)
            os._exit(1)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _tensor_specs(what: str, specs: Iterable[Sequence[Any]] | None) -> list[tuple[str, str, list[int]]]:
    out = []
    for spec in specs or ():
        try:
            name, datatype, shape = spec
            out.append((str(name), str(datatype), [int(d) for d in shape]))
        except (TypeError, ValueError):
            raise ValueError(f"{what}: each spec is (name, datatype, shape), e.g. (\"embedding\", \"FP32\", [-1]); got {spec!r}") from None
    return out


def attach_again(session: Session, name: str, stop: Stop) -> Model | None:
    """Attaches the latest version of ``name`` again after a drain, waiting out what may pass
    (the server restarting, the model reloading, a token file being rotated); None if stopped."""
    return retry(
        lambda: session.attach(name),
        (Unavailable, SessionEnded, NotFound, Unauthenticated, Timeout, _ConnectError),
        f"cannot attach {name!r} again",
        stopped=lambda: stop.stopped,
    )


def serve(
    session: Session,
    model: Model | str,
    handler: Handler | None = None,
    *,
    credits: int = 2,
    concurrency: int | None = None,
    max_batch_items: int = 32,
    max_batch_bytes: int = 0,
    accepts: Iterable[str] = ("text", "tensor"),
    inputs: Iterable[Sequence[Any]] | None = None,
    outputs: Iterable[Sequence[Any]] | None = None,
    heartbeat_interval: float | None = None,
    on_version: Callable[[Model], Handler | None] | None = None,
    stop: Stop | None = None,
    handle_signals: bool = True,
    streams: int = 0,
) -> None:
    """``Session.serve``: see its documentation."""
    if isinstance(streams, bool) or int(streams) < 0:
        raise ValueError(f"streams must be 0 (a batch worker) or more, not {streams!r}")
    if concurrency is not None and (isinstance(concurrency, bool) or int(concurrency) < 1):
        raise ValueError(f"concurrency must be at least 1 (batches run at once), not {concurrency!r}")
    if handler is None and on_version is None:
        raise TypeError("serve needs a handler, or on_version to build one for each version")
    stop = stop if stop is not None else Stop()
    current = session.attach(model) if isinstance(model, str) else model
    del model  # after a drain, only the version served now is held here
    if handler is None:
        handler = on_version(current)  # type: ignore[misc]
        if handler is None:
            raise TypeError("on_version returned no handler for the first version")
    options = dict(
        credits=credits,
        max_batch_items=max_batch_items,
        max_batch_bytes=max_batch_bytes,
        accepts_kinds=list(accepts),
        inputs=_tensor_specs("inputs", inputs),
        outputs=_tensor_specs("outputs", outputs),
        heartbeat_interval=heartbeat_interval,
        streams=int(streams),
    )
    signals = _signals(stop) if handle_signals else contextlib.nullcontext()
    with signals:
        while True:
            adapter = _Adapter(handler, current)
            # A streamed item holds its thread while it streams: a thread per stream.
            default = int(streams) if streams else max(1, int(credits))
            running = concurrency if concurrency is not None else default
            try:
                log.info("serving %s v%d", current.name, current.version)
                reason = _native.serve(session._native, current._native, adapter, stop=stop,
                                       concurrency=running, **options)
            finally:
                adapter.close()
            if reason is None:
                return
            log.info("drained (%s); attaching the latest version of %r again", reason, current.name)
            name = current.name
            # The drained version's lease goes with the last reference to it: the handler's, if
            # on_version builds a new one.
            del current, adapter
            attached = attach_again(session, name, stop)
            if attached is None:
                return
            current = attached
            if on_version is not None:
                rebuilt = on_version(current)
                if rebuilt is not None:
                    handler = rebuilt
