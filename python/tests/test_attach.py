"""Attach and read through the package against a real server (host backend): the manifest and
metadata, numpy arrays bit-exact, without a copy and read-only, and the lease's lifetime."""

from __future__ import annotations

import gc
import sys
import uuid

import numpy as np
import pytest

import modelshare
from conftest import TOKEN_A, Server

NUMPY_DTYPES = {
    "F32": "<f4", "F16": "<f2", "F64": "<f8", "I8": "|i1", "I16": "<i2", "I32": "<i4", "I64": "<i8",
    "U8": "|u1", "U16": "<u2", "U32": "<u4", "U64": "<u8", "BOOL": "|b1", "C64": "<c8",
}


def worker_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def session(server: Server):
    s = modelshare.Session.open(server.address, name=worker_name("pytest"), token=TOKEN_A)
    yield s
    s.close()


def test_manifest_and_metadata(server: Server, session: modelshare.Session):
    """The manifest, metadata files and header metadata are the server's, as the SDK gives them."""
    model = session.attach("mixed")
    assert model.name == "mixed" and model.version == 1
    assert model.device == "host" and not model.on_device and model.read_only
    assert session.devices[0]["backend"] == "host"
    manifest = model.manifest
    assert [t["name"] for t in manifest] == list(server.expected)
    for entry in manifest:
        dtype, shape, data = server.expected[entry["name"]]
        assert entry["dtype"] == dtype
        assert entry["shape"] == shape
        assert entry["byte_length"] == len(data)
        assert entry["offset"] % 256 == 0
    assert model.metadata == {"config.json": b'{"hidden_size": 16}', "tokenizer.json": b'{"version": "1.0"}'}
    assert model.header_metadata == {"format": "pt"}
    assert model.keys() == list(server.expected)
    model.verify()
    assert all(t.verify() for t in model.tensors())


def test_numpy_is_bit_exact(server: Server, session: modelshare.Session):
    """Every dtype numpy has reads back exactly as the file holds it, shape and dtype included."""
    arrays = session.attach("mixed").numpy(n for n, (d, _, _) in server.expected.items() if d in NUMPY_DTYPES)
    assert len(arrays) == 15
    for name, array in arrays.items():
        dtype, shape, data = server.expected[name]
        assert array.dtype == np.dtype(NUMPY_DTYPES[dtype]), name
        assert array.shape == tuple(shape), name
        assert array.tobytes() == data, name


def test_numpy_bf16_and_f8_through_ml_dtypes(server: Server, session: modelshare.Session):
    """bf16 and float8 arrays use ml_dtypes' types, bit-exact."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    arrays = session.attach("mixed").numpy(["brain", "f8", "f8e5"])
    assert arrays["brain"].dtype == np.dtype(ml_dtypes.bfloat16)
    assert arrays["f8"].dtype == np.dtype(ml_dtypes.float8_e4m3fn)
    assert arrays["f8e5"].dtype == np.dtype(ml_dtypes.float8_e5m2)
    for name, array in arrays.items():
        _, shape, data = server.expected[name]
        assert array.shape == tuple(shape)
        assert array.tobytes() == data


def test_bf16_without_ml_dtypes_is_a_clear_error(session: modelshare.Session, monkeypatch: pytest.MonkeyPatch):
    """Without ml_dtypes a bf16 tensor raises DtypeError naming the fix, never bytes."""
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # `import ml_dtypes` raises ImportError
    model = session.attach("mixed")
    with pytest.raises(modelshare.DtypeError, match="ml_dtypes"):
        model.numpy(["brain"])
    assert model.numpy(["half"])["half"].dtype == np.float16


def test_numpy_arrays_share_the_mapping(session: modelshare.Session):
    """Arrays point into the arena's mapping: no copy, and two reads share their memory."""
    model = session.attach("mixed")
    tensor = model.tensor("embed.weight")
    first = model.numpy(["embed.weight"])["embed.weight"]
    second = modelshare.to_numpy(tensor)
    assert first.__array_interface__["data"][0] == tensor.data_ptr
    assert np.shares_memory(first, second)
    assert not first.flags.owndata
    # Tensors lie in one mapping, at their manifest offsets.
    tensors = {t.name: t for t in model.tensors()}
    base = tensors["embed.weight"].data_ptr - tensors["embed.weight"].offset
    assert all(t.data_ptr - t.offset == base for t in tensors.values() if t.byte_length)


def test_numpy_arrays_are_read_only(session: modelshare.Session):
    """A write to an array, or making it writeable, raises ValueError: the weights are shared."""
    arrays = session.attach("mixed").numpy(["embed.weight", "ids", "scale"])
    for array in arrays.values():
        assert not array.flags.writeable
        with pytest.raises(ValueError):
            array[...] = 0
        with pytest.raises(ValueError):
            array.setflags(write=True)
    with pytest.raises(ValueError):
        arrays["embed.weight"].reshape(-1)[3] = 1.0
    with pytest.raises(ValueError):
        np.add(arrays["ids"], 1, out=arrays["ids"])


def test_arrays_hold_the_lease(server: Server):
    """Arrays stay valid after the session and model objects go; the lease (and the session) is
    released once the last array is gone."""
    name = worker_name("lease")
    session = modelshare.Session.open(server.address, name=name, token=TOKEN_A)
    model = session.attach("mixed")
    arrays = model.numpy(["embed.weight", "ids"])
    assert server.leases_of(name) == 1
    del session, model
    gc.collect()
    assert server.leases_of(name) == 1, "the lease went while arrays still use it"
    _, _, data = server.expected["embed.weight"]
    assert arrays["embed.weight"].tobytes() == data
    keep = arrays["ids"][2:5]  # a view keeps its base, and so the lease
    del arrays
    gc.collect()
    assert server.leases_of(name) == 1
    assert keep.tobytes() == server.expected["ids"][2][2 * 8:5 * 8]
    del keep
    gc.collect()
    server.wait_for("the lease released after the last array", lambda: server.leases_of(name) is None)


def test_close_releases_at_once(server: Server):
    """close() ends the session on the server, and arrays of host memory stay readable."""
    name = worker_name("close")
    with modelshare.Session.open(server.address, name=name, token=TOKEN_A) as session:
        array = session.attach("small").numpy()["w"]
        assert server.leases_of(name) == 1
    assert session.closed
    assert server.leases_of(name) is None
    assert array.tolist() == [1.0, 2.0, 3.0, 4.0]
    with pytest.raises(modelshare.SessionEnded):
        session.attach("small")


def test_versions(server: Server, session: modelshare.Session):
    """A version is attached by number; one that does not exist is NotFound (version 0 refused)."""
    assert session.attach("small", 1).version == 1
    with pytest.raises(modelshare.NotFound):
        session.attach("small", 7)
    with pytest.raises(ValueError):
        session.attach("small", 0)


def test_unknown_tensor(session: modelshare.Session):
    """Asking for a tensor the model lacks is NotFound (a KeyError would hide the model name)."""
    model = session.attach("small")
    with pytest.raises(modelshare.NotFound, match="no tensor 'nope'"):
        model.tensor("nope")
    with pytest.raises(modelshare.NotFound):
        model.numpy(["nope"])
