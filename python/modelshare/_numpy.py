"""A modelshare ``Tensor`` as a numpy array: read-only, over the shared mapping, no copy.

``Tensor.__array_interface__`` describes the tensor's bytes as a read-only ``uint8`` array whose
base is the ``Tensor`` (which holds the model's lease); the array is that, viewed as the tensor's
dtype and reshaped, both views without a copy. numpy has no bfloat16 or float8 dtypes: those come
from ``ml_dtypes`` when it is installed, else ``DtypeError`` says so (never raw bytes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._native import DeviceError, DtypeError, Tensor

if TYPE_CHECKING:
    import numpy

# safetensors dtype names -> numpy type strings (little-endian, as the files and the arena).
_NUMPY = {
    "BOOL": "|b1",
    "U8": "|u1",
    "I8": "|i1",
    "I16": "<i2",
    "U16": "<u2",
    "F16": "<f2",
    "I32": "<i4",
    "U32": "<u4",
    "F32": "<f4",
    "F64": "<f8",
    "I64": "<i8",
    "U64": "<u8",
    "C64": "<c8",
}

# safetensors dtype names -> ml_dtypes type names.
_ML_DTYPES = {
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
}


def numpy_dtype(dtype: str) -> numpy.dtype[Any]:
    """The numpy dtype of a modelshare dtype name (``"F32"``, ``"BF16"``, ...).

    bf16 and float8 need ``ml_dtypes``; without it, or for a dtype numpy cannot hold, raises
    ``DtypeError``.
    """
    import numpy as np

    if dtype in _NUMPY:
        return np.dtype(_NUMPY[dtype])
    if dtype in _ML_DTYPES:
        try:
            import ml_dtypes
        except ImportError:
            raise DtypeError(
                f"dtype {dtype} has no numpy equivalent without ml_dtypes: pip install ml_dtypes "
                "(or read the model with Model.torch())"
            ) from None
        kind = getattr(ml_dtypes, _ML_DTYPES[dtype], None)
        if kind is None:
            raise DtypeError(
                f"dtype {dtype} needs ml_dtypes.{_ML_DTYPES[dtype]}, which ml_dtypes "
                f"{getattr(ml_dtypes, '__version__', '?')} lacks: upgrade ml_dtypes"
            )
        return np.dtype(kind)
    raise DtypeError(f"dtype {dtype} has no numpy equivalent")


def to_numpy(tensor: Tensor) -> numpy.ndarray:
    """``tensor`` as a read-only numpy array of its dtype and shape, with no copy.

    The array keeps the tensor (and so the model's lease) alive. Only for host memory: a tensor
    in device memory raises ``DeviceError`` (use ``to_torch``, or ``tensor.to_bytes()`` for a
    copy).
    """
    import numpy as np

    if tensor.on_device:
        raise DeviceError(
            f"tensor {tensor.name!r} is in device memory: read it with to_torch() (DLPack), "
            "or copy it with tensor.to_bytes()"
        )
    dtype = numpy_dtype(tensor.dtype)
    raw = np.asarray(tensor)  # uint8, read-only, base: the Tensor
    array = raw.view(dtype).reshape(tensor.shape)
    if array.flags.writeable:  # pragma: no cover - the array interface says read-only
        raise AssertionError("a modelshare array must not be writeable")
    return array
