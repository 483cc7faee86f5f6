"""Python workers for modelshare.

A modelshare server loads model weights into memory once (host memory, or GPU memory) and hands
out handles to it; a worker attaches to a model and reads its weights in place, with no copy::

    import modelshare

    with modelshare.Session.open("unix:/run/modelshare/grpc.sock", name="my-worker") as session:
        model = session.attach("tiny-llama")
        arrays = model.numpy()     # name -> read-only numpy array over the shared memory
        tensors = model.torch()    # name -> torch.Tensor (CPU for host memory, CUDA on a GPU server)
        net = modelshare.module_from(model, lambda: Net(config))  # an nn.Module over them

The package binds the Rust worker SDK (crate ``modelshare-worker``): sessions keep themselves
alive with heartbeats on a background runtime, reconnect after a server restart and attach their
models again. Every array and tensor holds the model's lease: the server keeps the version for
this worker until the last of them (and the ``Model``) is gone.

Layout: ``_native`` (the compiled SDK binding: ``Session``, ``Model``, ``Tensor``, the
exceptions), ``_session`` (the ``Session`` and ``Model`` classes of this API, over ``_native``),
``_numpy`` and ``_torch`` (a ``Tensor`` as a numpy array, as a torch tensor), ``_module``
(``module_from``: a ``torch.nn.Module`` built on the meta device, the shared tensors assigned to
its parameters and buffers), ``_serve`` (serving: the handler's ``Batch``, ``Item``, ``Output``,
``ItemError``, and the loop across versions and signals over ``_native.serve``), ``_retry``
(a call tried again with backoff while it fails with what may pass).

Serving requests: ``session.serve(model, handler)`` runs the SDK's serve loop with a Python
handler (``_serve``: ``Batch``, ``Item``, ``Output``, ``ItemError``, ``Stop``)::

    def handle(batch):
        return [{"embedding": embed(item.text)} for item in batch.items]

    session.serve("my-encoder", handle, credits=2)
"""

from ._native import (
    PROTOCOL_VERSION,
    ChecksumError,
    ConnectError,
    CredentialsError,
    DeviceError,
    DtypeError,
    Error,
    NotFound,
    PermissionDenied,
    ProtocolError,
    SessionEnded,
    Stop,
    Tensor,
    Timeout,
    Unauthenticated,
    Unavailable,
    __version__,
)
from ._module import ModuleMismatch, module_from
from ._numpy import numpy_dtype, to_numpy
from ._serve import Batch, BatchOutput, Final, Item, ItemError, Output
from ._session import Model, Session
from ._torch import to_torch, torch_dtype

__all__ = [
    "PROTOCOL_VERSION",
    "Batch",
    "BatchOutput",
    "ChecksumError",
    "ConnectError",
    "CredentialsError",
    "DeviceError",
    "DtypeError",
    "Error",
    "Final",
    "Item",
    "ItemError",
    "Model",
    "ModuleMismatch",
    "NotFound",
    "Output",
    "PermissionDenied",
    "ProtocolError",
    "Session",
    "SessionEnded",
    "Stop",
    "Tensor",
    "Timeout",
    "Unauthenticated",
    "Unavailable",
    "__version__",
    "module_from",
    "numpy_dtype",
    "to_numpy",
    "to_torch",
    "torch_dtype",
]
