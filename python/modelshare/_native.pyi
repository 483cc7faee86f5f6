"""Types of the native module (python/src/, the worker SDK bound with pyo3).

Use the ``modelshare`` package: its ``Session`` and ``Model`` wrap these classes.
"""

from collections.abc import Callable, Sequence
from typing import Any, final

__all__ = [
    "Arena",
    "Attaching",
    "ChecksumError",
    "ConnectError",
    "CredentialsError",
    "DeviceError",
    "DtypeError",
    "Error",
    "Item",
    "Model",
    "NotFound",
    "PROTOCOL_VERSION",
    "PermissionDenied",
    "ProtocolError",
    "ReservedArena",
    "Session",
    "SessionEnded",
    "Stop",
    "Tensor",
    "Timeout",
    "Unauthenticated",
    "Unavailable",
    "__version__",
    "serve",
]

__version__: str
PROTOCOL_VERSION: int

class Error(Exception):
    """Base class of every modelshare error."""

    code: str | None
    """The gRPC status code's name (``"NOT_FOUND"``, ...) when the server refused the call."""

class ConnectError(Error): ...
class CredentialsError(Error): ...
class Unauthenticated(Error): ...
class PermissionDenied(Error): ...
class NotFound(Error): ...
class Unavailable(Error): ...
class SessionEnded(Error): ...
class ProtocolError(Error): ...
class DeviceError(Error): ...
class DtypeError(Error): ...
class ChecksumError(Error): ...
class Timeout(Error): ...

@final
class Session:
    @staticmethod
    def open(
        server: str | None = None,
        *,
        name: str,
        token: str | None = None,
        token_file: str | None = None,
        labels: dict[str, str] | None = None,
        reconnect: bool = True,
        timeout: float | None = None,
    ) -> Session: ...
    @property
    def server(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def id(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    @property
    def devices(self) -> list[dict[str, Any]]: ...
    def attach(self, model: str, version: int | None = None, *, timeout: float | None = None) -> Model: ...
    def attach_early(
        self, model: str, version: int | None = None, *, timeout: float | None = None
    ) -> Attaching: ...
    def close(self) -> None: ...

@final
class Model:
    @property
    def name(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def lease_id(self) -> str: ...
    @property
    def read_only(self) -> bool: ...
    @property
    def device(self) -> str: ...
    @property
    def on_device(self) -> bool: ...
    @property
    def attached_while_loading(self) -> bool: ...
    def manifest(self) -> list[dict[str, Any]]: ...
    def metadata(self) -> dict[str, bytes]: ...
    def header_metadata(self) -> dict[str, str]: ...
    def arena(self) -> Arena: ...
    def runs(
        self, names: list[str] | None = None
    ) -> tuple[list[tuple[str, tuple[int, ...], tuple[int, ...], int, int, list[str]]], list[str]]: ...
    def tensors(self) -> list[Tensor]: ...
    def tensor(self, name: str) -> Tensor: ...
    def verify(self) -> list[str]: ...
    def wait_ready(self, timeout: float | None = None) -> None: ...

@final
class Arena:
    """A model's whole mapping as one ``uint8`` DLPack tensor; holds the lease while it lives."""

    @property
    def byte_length(self) -> int: ...
    @property
    def data_ptr(self) -> int: ...
    @property
    def ready(self) -> bool:
        """Whether every byte has landed (a version attached while loading: once loaded)."""
    def __dlpack_device__(self) -> tuple[int, int]: ...
    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any: ...

@final
class Attaching:
    """An attach the server granted, its arena being mapped in the background."""

    def arena(self) -> ReservedArena | None:
        """Where the arena is being mapped, for a loaded version over CUDA VMM; else None."""
    def runs(
        self, names: list[str] | None = None
    ) -> tuple[list[tuple[str, tuple[int, ...], tuple[int, ...], int, int, list[str]]], list[str]]: ...
    def finish(self, *, timeout: float | None = None) -> Model: ...

@final
class ReservedArena:
    """The address space an early attach's arena is being mapped at, as one ``uint8`` tensor."""

    @property
    def byte_length(self) -> int: ...
    @property
    def data_ptr(self) -> int: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...
    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any: ...

@final
class Tensor:
    """One tensor of an attached model; holds the model's lease while it lives."""

    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> str:
        """The safetensors name: ``"F32"``, ``"F16"``, ``"BF16"``, ``"I64"``, ``"BOOL"``, ..."""
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def offset(self) -> int: ...
    @property
    def byte_length(self) -> int: ...
    @property
    def on_device(self) -> bool: ...
    @property
    def read_only(self) -> bool: ...
    @property
    def data_ptr(self) -> int:
        """Address of the first byte in this process (host, or device memory)."""
    @property
    def __array_interface__(self) -> dict[str, Any]: ...
    def to_bytes(self) -> bytes: ...
    def verify(self) -> bool: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...
    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any: ...

@final
class Item:
    """One request of a batch (``modelshare.Item`` wraps it)."""

    @property
    def id(self) -> int: ...
    @property
    def text(self) -> str | None: ...
    def tensors(self) -> list[tuple[str, str, tuple[int, ...], bytes]]:
        """``(name, dtype, shape, data)`` of each input tensor, in the request's order."""
    def parameters(self) -> dict[str, bool | int | float | str]: ...
    @property
    def deadline(self) -> float | None: ...
    @property
    def request_id(self) -> str: ...
    @property
    def traceparent(self) -> str | None: ...
    @property
    def cancelled(self) -> bool: ...

@final
class Stop:
    """Stops a ``serve`` call from any thread: the batches held are answered, then it returns."""

    def __init__(self) -> None: ...
    def stop(self) -> None: ...
    @property
    def stopped(self) -> bool: ...

#: One item's answer in the native form: ``(True, [(name, dtype, shape, data)], parameters)``
#: or ``(False, status_code_name, message)``.
NativeAnswer = tuple[bool, Any, Any]

def serve(
    session: Session,
    model: Model,
    handler: Callable[[int, int, list[Item]], list[NativeAnswer]],
    *,
    stop: Stop,
    credits: int = 2,
    concurrency: int = 1,
    max_batch_items: int = 32,
    max_batch_bytes: int = 0,
    accepts_kinds: Sequence[str] = ("text", "tensor"),
    inputs: Sequence[tuple[str, str, Sequence[int]]] = (),
    outputs: Sequence[tuple[str, str, Sequence[int]]] = (),
    heartbeat_interval: float | None = None,
    streams: int = 0,
) -> str | None:
    """Serves ``model`` until drained (returns the server's reason) or stopped (None). With
    ``streams`` above 0, each item goes to ``handler.stream(batch_id, version, item, streamed,
    parts)`` instead, which sends its parts through ``parts`` and returns the final answer."""

class Parts:
    """Sends one streamed item's parts: ``parts(answer)`` waits (without the GIL) until the
    serve loop takes it; False once the item is cancelled or its stream ended."""

    def __call__(self, part: NativeAnswer) -> bool: ...
