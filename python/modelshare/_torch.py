"""A modelshare ``Tensor`` as a ``torch.Tensor``, through DLPack, with no copy.

``to_torch`` exports one tensor; ``arena_views`` (what ``Model.torch()`` uses) exports the model's
whole mapping once and makes every tensor a view of it (``as_strided`` on the mapping seen as the
tensor's dtype): one DLPack export and one cheap view per tensor instead of an export each, so
that a model of hundreds of tensors is ready in well under a millisecond after its attach. The
views share the export's storage, whose deleter holds the lease.

``torch.from_dlpack`` takes the tensor's ``__dlpack__`` capsule: a CPU tensor over the shared
mapping for host memory, a CUDA tensor on the arena's device for device memory. The capsule's
managed tensor holds the model's lease until torch frees the tensor's storage.

torch has no read-only tensors: the memory of a host arena is mapped read-only, so an in-place
write to such a tensor kills the process with SIGSEGV instead of changing the shared weights.
Clone a tensor before changing it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._native import Arena, DtypeError, Tensor

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


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return tuple(reversed(strides))


#: One layout entry of ``_native.Model.layout()``: name, dtype name, shape, offset in the arena.
Layout = tuple[str, str, tuple[int, ...], int]


def arena_views(arena: Arena, layout: list[Layout]) -> dict[str, torch.Tensor]:
    """Every tensor of ``layout`` (the model's whose mapping ``arena`` is) as a view of the one
    DLPack export of ``arena``: same memory, same data pointers as ``to_torch`` gives.

    Tensors of one dtype and shape laid out at equal spacing (a transformer's layers: every
    layer's ``q_proj`` one layer apart) are made by one ``as_strided`` over all of them and one
    ``unbind``: a CUDA tensor costs torch a microsecond or two to make, and a view per tensor
    from Python twice that. The dict keeps the layout's order."""
    import torch

    base = torch.from_dlpack(arena)  # uint8, the whole mapping
    kinds: dict[str, torch.dtype] = {}
    typed: dict[torch.dtype, torch.Tensor] = {}
    groups: dict[tuple[str, tuple[int, ...]], list[tuple[str, int]]] = {}
    for name, dtype, shape, offset in layout:
        groups.setdefault((dtype, shape), []).append((name, offset))
    views: dict[str, torch.Tensor] = {}
    for (dtype, shape), members in groups.items():
        kind = kinds.get(dtype)
        if kind is None:
            kind = kinds[dtype] = torch_dtype(dtype)
        size = kind.itemsize
        whole = typed.get(kind)
        if whole is None:
            whole = typed[kind] = base[: base.numel() // size * size].view(kind)
        stride = _contiguous_strides(shape)
        elements = 1
        for dim in shape:
            elements *= dim
        for name, offset in members:
            # The server aligns every tensor (256 bytes at least): its offset is a whole number
            # of elements. as_strided checks every view against the storage's bounds.
            if offset % size:
                raise DtypeError(f"tensor {name!r} starts at byte {offset}, not at a {dtype} element")
        for run in _runs(members, elements * size):
            first = run[0][1] // size
            if len(run) == 1:
                views[run[0][0]] = whole.as_strided(shape, stride, first)
                continue
            step = (run[1][1] - run[0][1]) // size
            stacked = whole.as_strided((len(run), *shape), (step, *stride), first)
            views.update(zip((name for name, _ in run), stacked.unbind(0)))
    return {name: views[name] for name, _, _, _ in layout}


def _runs(members: list[tuple[str, int]], nbytes: int) -> list[list[tuple[str, int]]]:
    """``members`` (name, offset), in arena order, cut into runs at one spacing, at least the
    tensor's size (views of a run never overlap); a tensor of no bytes runs alone."""
    runs: list[list[tuple[str, int]]] = []
    for member in members:
        if runs and nbytes:
            run = runs[-1]
            gap = member[1] - run[-1][1]
            if gap >= nbytes and (len(run) == 1 or gap == run[1][1] - run[0][1]):
                run.append(member)
                continue
        runs.append([member])
    return runs
