"""``Session`` and ``Model``: the package's API over the native binding of the worker SDK."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from . import _native
from ._native import ChecksumError, ConnectError, Tensor, Timeout, Unavailable
from ._numpy import to_numpy
from ._retry import retry
from ._torch import arena_views, early_views

if TYPE_CHECKING:
    import numpy
    import torch

    from ._serve import Handler


class Session:
    """A worker's session with a modelshare server.

    Open one with :meth:`Session.open`. Heartbeats run in the background (on the package's own
    runtime, not on a Python thread); after a server restart the session reconnects and attaches
    its models again. The session ends when :meth:`close` is called, or when this object and
    every model, tensor and array taken through it are gone.
    """

    __slots__ = ("_native",)

    def __init__(self, native: _native.Session) -> None:
        self._native = native

    @classmethod
    def open(
        cls,
        server: str | None = None,
        *,
        name: str = "python-worker",
        token: str | None = None,
        token_file: str | os.PathLike[str] | None = None,
        labels: Mapping[str, str] | None = None,
        reconnect: bool = True,
        timeout: float | None = 30.0,
        wait: float | None = 0.0,
    ) -> Session:
        """Connects to ``server`` and opens a session.

        Args:
            server: ``"unix:/path/to/socket"``, ``"http://host:port"`` or ``"https://host:port"``;
                ``None``: the rule the CLI and every worker follow: ``MODELSHARE_SERVER``, else
                this user's socket (where ``modelshare serve`` listens by default), else the
                container socket ``/run/modelshare/grpc.sock``, else ``127.0.0.1:50051``; if
                none answers, ``ConnectError`` names every place it looked.
            name: the worker's name, shown by ``modelshare ps``.
            token: the bearer token; else ``token_file`` (read again at every reconnection);
                else ``MODELSHARE_TOKEN`` or ``MODELSHARE_TOKEN_FILE``, as the Rust SDK and the
                CLI read them. TLS settings come from ``MODELSHARE_TLS_*``.
            labels: labels shown by ``modelshare ps``.
            reconnect: reconnect (and attach again) when the connection breaks.
            timeout: seconds the connection and handshake may take (``None``: no limit).
            wait: seconds to keep trying, with backoff (0.1 s doubling to 2 s), while no server
                answers (``ConnectError``, ``Unavailable``, ``Timeout``): a worker started before
                its server passes ``None``, waiting as long as it takes, as the Rust workers do.
                A refusal (a wrong token, ...) is raised at once.

        Raises:
            ConnectError: the server cannot be reached (within ``wait``).
            Unauthenticated: the server refused the token.
            CredentialsError: the token or a TLS setting is unusable.
            Timeout: the server did not answer in time.
        """
        native = retry(
            lambda: _native.Session.open(
                server,
                name=name,
                token=token,
                token_file=os.fspath(token_file) if token_file is not None else None,
                labels=dict(labels) if labels is not None else None,
                reconnect=reconnect,
                timeout=timeout,
            ),
            (ConnectError, Unavailable, Timeout),
            "no server yet",
            deadline=None if wait is None else time.monotonic() + wait,
        )
        return cls(native)

    @property
    def id(self) -> str:
        """The current session id (it changes after a reconnection)."""
        return self._native.id

    @property
    def server(self) -> str:
        """The server address."""
        return self._native.server

    @property
    def name(self) -> str:
        """The worker name."""
        return self._native.name

    @property
    def devices(self) -> list[dict[str, Any]]:
        """The server's devices: dicts with ``backend``, ``uuid``, ``name``, ``total_bytes``."""
        return self._native.devices

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._native.closed

    def attach(self, model: str, version: int | None = None, *, timeout: float | None = None) -> Model:
        """Attaches to ``version`` of ``model`` (``None``: the latest ready one) and maps it.

        In a process already using CUDA through torch, a loaded version over CUDA VMM is
        attached in two steps: the views :meth:`Model.torch` gives are made of the address
        range the arena is being mapped at while the mapping goes on (without the GIL), and the
        first ``torch()`` call returns them at once.

        Raises:
            NotFound: no such model or version (or not visible to this token).
            Unavailable: the server cannot attach now (retried for 5 s first).
            SessionEnded: the session was closed, or is reconnecting.
            Timeout: ``timeout`` seconds passed.
        """
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_initialized():
            return Model(self._native.attach(model, version, timeout=timeout))
        # A process using CUDA through torch: where the arena is mapped at an address known
        # in advance (CUDA VMM), make Model.torch()'s views while the mapping goes on.
        started = time.monotonic()
        attaching = self._native.attach_early(model, version, timeout=timeout)
        try:
            early = early_views(attaching)
        except Exception:  # noqa: BLE001 - e.g. a tensor torch cannot view: torch() will say so
            early = None
        left = None if timeout is None else max(0.0, timeout - (time.monotonic() - started))
        try:
            native = attaching.finish(timeout=left)
        except Timeout:
            raise Timeout(f"attaching to model {model!r} did not finish within {timeout:.3f} s") from None
        return Model(native, early)

    def serve(
        self,
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
        stop: _native.Stop | None = None,
        handle_signals: bool = True,
        streams: int = 0,
    ) -> None:
        """Serves requests for ``model`` with ``handler`` until stopped.

        The server sends batches of requests (from its OpenAI and KServe v2 doors) for the model;
        ``handler(batch)`` answers each item of a :class:`Batch`, in order, with a ``dict`` of
        named arrays or torch tensors, an :class:`Output` (tensors and parameters), or an
        exception instance (that item fails: :class:`ItemError` names the status code,
        ``ValueError`` is INVALID_ARGUMENT, anything else INTERNAL). A handler that raises fails
        every item of its batch. It may be an ``async def``: its coroutines run on an event loop
        of their own. Batches run on threads of the package (never on the caller's), up to
        ``concurrency`` at once (default: ``credits``), each holding the GIL only while in
        Python; any others held wait, ready, so the next starts as soon as one returns.
        Heartbeats never wait for a handler.

        With ``streams`` above 0 the worker streams its answers (text generation): the server
        sends items one at a time, up to ``streams`` at once, and ``handler(item)`` (an
        :class:`Item`, not a batch) is a generator, sync or ``async``, yielding the answer in
        parts as they are ready: each a ``str`` (new text: the parameter ``text``, as the
        OpenAI completion doors read it) or an :class:`Output`. Each part is sent at once,
        within the item's window: a slow reader pauses its own generator at its next part,
        never the others. The generator's ``return`` value (or a yielded :class:`Final`) is the
        final answer: an :class:`Output` whose parameters end a generation (``finish_reason``,
        ``prompt_tokens``, ``completion_tokens``). When the item is cancelled (the caller went
        away) the generator is closed at its next part. A plain function answering one item is
        also a streaming handler (no parts). Each stream holds one of the handler's threads.

        After a server restart the session reconnects, attaches the model again and serving
        resumes. When the server drains the stream (a new version was loaded, or it shuts down)
        the batches held are answered, the latest version is attached and ``on_version(model)``
        builds the handler for it (a new module over the new weights; ``None`` keeps the
        handler), then serving resumes. Returns once stopped: on the first SIGTERM or SIGINT
        (with ``handle_signals``, on the main thread; a second exits at once with status 1), or
        when ``stop.stop()`` is called; the batches held are answered first.

        Args:
            model: a :class:`Model` attached by this session, or a model's name (its latest
                version is attached).
            handler: the handler; ``None``: ``on_version`` builds it, for the first version too.
            credits: batches held at once (at most 1024): those running and those waiting.
            concurrency: batches run at once, on threads of the handler's own (default:
                ``credits``). Two at once let one batch's GPU wait and tokenization (outside the
                GIL) overlap the other's Python; 1 runs them one after the other, the next one
                held ready.
            max_batch_items: most items in one batch (at most 65536).
            max_batch_bytes: most input bytes in one batch (0: the server's most, 120 MiB).
            accepts: the input kinds taken: ``"text"`` (OpenAI ``input``), ``"tensor"``
                (KServe v2 ``inputs``).
            inputs, outputs: ``(name, datatype, shape)`` of the model's tensors as this worker
                runs it (``("input_ids", "INT64", [-1])``), for KServe's model metadata.
            heartbeat_interval: seconds between heartbeats (default: the server's).
            on_version: builds the handler for a newly attached version.
            stop: a :class:`Stop` to stop serving from another thread.
            handle_signals: install SIGTERM and SIGINT handlers while serving.
            streams: items answered at once by a streaming worker (at most 1024); 0 (the
                default): a batch worker. ``credits`` and ``max_batch_items`` are then ignored,
                and ``concurrency`` defaults to ``streams``.

        Raises:
            NotFound: no such model (or not visible to this token).
            PermissionDenied: the token's tenant may not serve it.
            Error: options over the server's limits, the model gone after a reconnection, a
                refusal retrying cannot fix.
        """
        from ._serve import serve

        serve(
            self,
            model,
            handler,
            credits=credits,
            concurrency=concurrency,
            max_batch_items=max_batch_items,
            max_batch_bytes=max_batch_bytes,
            accepts=accepts,
            inputs=inputs,
            outputs=outputs,
            heartbeat_interval=heartbeat_interval,
            on_version=on_version,
            stop=stop,
            handle_signals=handle_signals,
            streams=streams,
        )

    def close(self) -> None:
        """Ends the session now; the server releases every lease it holds.

        Arrays and tensors still alive stay readable on the host backend (the mapping holds the
        memory); on CUDA do not use them after ``close``. Waits for the server's
        acknowledgement (about a second at most).
        """
        self._native.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return repr(self._native)


class Model:
    """An attached model version: its manifest, metadata files and tensors.

    The weights are mapped read-only in this process. The lease on the version is held while this
    object, or any tensor or array taken from it, lives: the server does not free the version
    under them, and releases it when the last one goes.
    """

    __slots__ = ("_early", "_native")

    def __init__(
        self, native: _native.Model, early: tuple[int, dict[str, torch.Tensor]] | None = None
    ) -> None:
        self._native = native
        # Every tensor's torch view, made during the attach, and the address they view; given
        # by the first torch() if the model is still mapped there (a reconnection re-attaches
        # it elsewhere: the views stay valid, of the old mapping, but are no longer the model's).
        self._early = early

    @property
    def name(self) -> str:
        """Model name."""
        return self._native.name

    @property
    def version(self) -> int:
        """Version attached now."""
        return self._native.version

    @property
    def lease_id(self) -> str:
        """The lease held now."""
        return self._native.lease_id

    @property
    def device(self) -> str:
        """Where the arena lives: ``"host"``, or a CUDA device's UUID."""
        return self._native.device

    @property
    def on_device(self) -> bool:
        """Whether the arena is in device (CUDA) memory."""
        return self._native.on_device

    @property
    def read_only(self) -> bool:
        """Whether the arena is mapped read-only in this process (false for legacy CUDA IPC)."""
        return self._native.read_only

    @property
    def manifest(self) -> list[dict[str, Any]]:
        """One dict per tensor, in arena order: ``name``, ``dtype`` (``"F32"``, ``"BF16"``, ...),
        ``shape`` (list), ``offset`` and ``byte_length`` (bytes)."""
        return self._native.manifest()

    @property
    def metadata(self) -> dict[str, bytes]:
        """The metadata files the server publishes with the version (``config.json``, ...)."""
        return self._native.metadata()

    @property
    def header_metadata(self) -> dict[str, str]:
        """The ``__metadata__`` map of the safetensors header(s)."""
        return self._native.header_metadata()

    def keys(self) -> list[str]:
        """Tensor names, in arena order."""
        return [t["name"] for t in self._native.manifest()]

    def tensor(self, name: str) -> Tensor:
        """The tensor ``name`` (``NotFound`` if there is none)."""
        return self._native.tensor(name)

    def tensors(self) -> list[Tensor]:
        """Every tensor, in arena order."""
        return self._native.tensors()

    def verify(self) -> None:
        """Checks every tensor's bytes against the manifest's checksum.

        Raises ``ChecksumError`` naming the tensors that differ. Hashes with the GIL released.
        """
        bad = self._native.verify()
        if bad:
            shown = ", ".join(repr(n) for n in bad[:10])
            more = f" and {len(bad) - 10} more" if len(bad) > 10 else ""
            raise ChecksumError(
                f"model {self.name!r} version {self.version}: {len(bad)} tensor(s) do not match "
                f"the manifest's checksum: {shown}{more}"
            )

    def wait_ready(self, timeout: float | None = None) -> None:
        """Waits until the version is fully loaded (CUDA, attached while loading; else no-op)."""
        self._native.wait_ready(timeout)

    def numpy(self, names: Iterable[str] | None = None) -> dict[str, numpy.ndarray]:
        """Tensors as read-only numpy arrays over the shared memory, with no copy.

        ``names``: the tensors to give (default: all). Writing to an array raises ``ValueError``.
        bf16 and float8 tensors need ``ml_dtypes`` (else ``DtypeError``). Host memory only.
        """
        return {t.name: to_numpy(t) for t in self._select(names)}

    def torch(self, names: Iterable[str] | None = None) -> dict[str, torch.Tensor]:
        """Tensors as ``torch.Tensor`` through DLPack, with no copy: CPU tensors for host memory,
        CUDA tensors on the arena's device for device memory.

        ``names``: the tensors to give (default: all). torch has no read-only tensors: writing to
        one of host memory kills the process (SIGSEGV: the mapping is read-only); clone first.
        """
        if names is None and self._early is not None:
            (address, views), self._early = self._early, None
            if address == self._native.arena().data_ptr:
                return views
        if names is not None:
            names = [names] if isinstance(names, str) else list(names)
        runs, order = self._native.runs(names)
        return arena_views(self._native.arena(), runs, order)

    def _select(self, names: Iterable[str] | None) -> list[Tensor]:
        if names is None:
            return self._native.tensors()
        if isinstance(names, str):
            names = [names]
        return [self._native.tensor(n) for n in names]

    def __repr__(self) -> str:
        return repr(self._native)
