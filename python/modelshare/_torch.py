"""A modelshare ``Tensor`` as a ``torch.Tensor``, through DLPack, with no copy.

``to_torch`` exports one tensor; ``arena_views`` (what ``Model.torch()`` uses, after the plan ``_native.Model.runs()`` makes) exports the model's
whole mapping once and makes every tensor a view of it (``as_strided`` on the mapping seen as the
tensor's dtype): one DLPack export and one cheap view per tensor instead of an export each, so
that a model of hundreds of tensors is ready in well under a millisecond after its attach. The
views share the export's storage, whose deleter holds the lease. ``early_views`` makes the same
views during the attach itself, of where a loaded CUDA VMM arena is being mapped, while the
mapping goes on without the GIL (``Session.attach`` does when torch is imported).

``torch.from_dlpack`` takes the tensor's ``__dlpack__`` capsule: a CPU tensor over the shared
mapping for host memory, a CUDA tensor on the arena's device for device memory. The capsule's
managed tensor holds the model's lease until torch frees the tensor's storage.

torch has no read-only tensors: the memory of a host arena is mapped read-only, so an in-place
write to such a tensor kills the process with SIGSEGV instead of changing the shared weights.
Clone a tensor before changing it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._native import Arena, Attaching, DtypeError, Tensor

if TYPE_CHECKING:
    import torch

# safetensors dtype names -> torch dtype attribute names.
_TORCH = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "I16": "int16",
    "U16": "uint16",
    "F16": "float16",
    "BF16": "bfloat16",
    "I32": "int32",
    "U32": "uint32",
    "F32": "float32",
    "F64": "float64",
    "I64": "int64",
    "U64": "uint64",
    "C64": "complex64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
}


def torch_dtype(dtype: str) -> torch.dtype:
    """The torch dtype of a modelshare dtype name; ``DtypeError`` if this torch lacks it."""
    import torch

    kind = getattr(torch, _TORCH.get(dtype, ""), None)
    if not isinstance(kind, torch.dtype):
        raise DtypeError(f"dtype {dtype} has no equivalent in torch {torch.__version__}")
    return kind


def to_torch(tensor: Tensor) -> torch.Tensor:
    """``tensor`` as a ``torch.Tensor`` sharing its memory (CPU or CUDA), with no copy.

    The torch tensor holds the model's lease while its storage lives. Do not write to it (see the
    module's notes).
    """
    import torch

    expected = torch_dtype(tensor.dtype)
    result = torch.from_dlpack(tensor)
    if result.dtype != expected:  # pragma: no cover - a consumer that misread the DLPack type
        raise DtypeError(f"tensor {tensor.name!r}: torch made {result.dtype}, expected {expected}")
    return result


#: One run of ``_native.Model.runs()``: dtype name, shape, strides, first and step (elements of
#: the dtype), and the names of the tensors it makes.
Run = tuple[str, tuple[int, ...], tuple[int, ...], int, int, list[str]]


def arena_views(arena: Arena, runs: list[Run], order: list[str]) -> dict[str, torch.Tensor]:
    """The tensors ``runs`` plans (the model's whose mapping ``arena`` is) as views of the one
    DLPack export of ``arena``, keyed in ``order``: same memory, same data pointers as
    ``to_torch`` gives."""
    import torch

    if arena.ready:
        # Loaded: nothing to order after, so no consumer stream to look up (torch.from_dlpack
        # asks torch for the current CUDA stream, a tenth of the views' time).
        base = torch.utils.dlpack.from_dlpack(arena.__dlpack__())  # uint8, the whole mapping
    else:
        base = torch.from_dlpack(arena)  # the current stream waits on the device for the load
    return views_of(base, runs, order)


def early_views(attaching: Attaching) -> tuple[int, dict[str, torch.Tensor]] | None:
    """The address of where an attach's arena is being mapped (a loaded version over CUDA
    VMM), and the views ``Model.torch()`` gives, made of it while the mapping goes on without
    the GIL; ``None`` where that cannot be (other handle kinds, a version still loading). Use
    them only once ``attaching.finish()`` has returned: until then the memory is not mapped."""
    import torch

    arena = attaching.arena()
    if arena is None:
        return None
    base = torch.utils.dlpack.from_dlpack(arena.__dlpack__())
    return arena.data_ptr, views_of(base, *attaching.runs())


def views_of(base: torch.Tensor, runs: list[Run], order: list[str]) -> dict[str, torch.Tensor]:
    """The tensors ``runs`` plans as views of ``base`` (the whole arena as ``uint8``), keyed in
    ``order``.

    Each run (tensors of one dtype and shape at one spacing: a transformer's layers) is one
    ``as_strided`` over all of them and one ``unbind``: torch's own cost of making a CUDA tensor
    (a microsecond or two) is then most of the time. ``as_strided`` checks every view against
    the export's bounds."""
    import torch

    typed: dict[str, torch.Tensor] = {}
    views: dict[str, torch.Tensor] = {}
    for dtype, shape, strides, first, step, names in runs:
        whole = typed.get(dtype)
        if whole is None:
            kind = torch_dtype(dtype)
            size = kind.itemsize
            whole = typed[dtype] = base[: base.numel() // size * size].view(kind)
        if len(names) == 1:
            views[names[0]] = whole.as_strided(shape, strides, first)
        else:
            views.update(zip(names, whole.as_strided((len(names), *shape), (step, *strides), first).unbind(0)))
    if list(views) == order:
        return views
    return {name: views[name] for name in order}
