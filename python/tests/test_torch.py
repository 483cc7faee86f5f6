"""torch tensors through DLPack (CPU, host backend): bit-exact for every dtype, no copy, and
the lease held by the tensors and by an unconsumed capsule. Skipped where torch is missing."""

from __future__ import annotations

import gc
import uuid

import numpy as np
import pytest

import modelshare
from conftest import TOKEN_A, Server

torch = pytest.importorskip("torch")

TORCH_DTYPES = {
    "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
    "I8": torch.int8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64, "U8": torch.uint8,
    "U16": torch.uint16, "U32": torch.uint32, "U64": torch.uint64, "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "C64": torch.complex64,
}


def raw_bytes(t: torch.Tensor) -> bytes:
    """The tensor's bytes, as stored."""
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


@pytest.fixture
def session(server: Server):
    s = modelshare.Session.open(server.address, name=f"torch-{uuid.uuid4().hex[:8]}", token=TOKEN_A)
    yield s
    s.close()


def test_torch_is_bit_exact(server: Server, session: modelshare.Session):
    """Every dtype (f16 and bf16 among them) reads back exactly as the file holds it."""
    tensors = session.attach("mixed").torch()
    assert list(tensors) == list(server.expected)
    for name, t in tensors.items():
        dtype, shape, data = server.expected[name]
        assert t.device.type == "cpu", name
        assert t.dtype == TORCH_DTYPES[dtype], name
        assert tuple(t.shape) == tuple(shape), name
        assert t.is_contiguous(), name
        assert raw_bytes(t) == data, name
    # Values, not only bits: bf16 widened by torch equals the bits shifted into an f32.
    brain = np.frombuffer(server.expected["brain"][2], dtype="<u2").astype(np.uint32) << 16
    assert np.array_equal(tensors["brain"].float().numpy().view(np.uint32), brain.reshape(5, 9))


def test_torch_shares_the_mapping(session: modelshare.Session):
    """torch tensors point at the arena's bytes (no copy), the same bytes numpy sees."""
    model = session.attach("mixed")
    tensor = model.tensor("half")
    t = model.torch(["half"])["half"]
    assert t.data_ptr() == tensor.data_ptr
    assert t.data_ptr() == model.numpy(["half"])["half"].__array_interface__["data"][0]
    # Every tensor of torch() is a view of the one arena export, at its own tensor's address.
    arena = model._native.arena()
    for name, view in model.torch().items():
        native = model.tensor(name)
        if native.byte_length:
            assert view.data_ptr() == native.data_ptr, name
            assert arena.data_ptr <= view.data_ptr() < arena.data_ptr + arena.byte_length, name


def test_legacy_capsule(server: Server, session: modelshare.Session):
    """A consumer that asks for no DLPack version gets a legacy `dltensor` capsule and reads it."""
    tensor = session.attach("mixed").tensor("brain")
    capsule = tensor.__dlpack__()
    assert "dltensor" in repr(capsule) and "versioned" not in repr(capsule)
    t = torch.utils.dlpack.from_dlpack(capsule)
    assert t.dtype == torch.bfloat16 and raw_bytes(t) == server.expected["brain"][2]


def test_versioned_capsule_is_flagged_read_only(session: modelshare.Session):
    """A DLPack 1.x consumer is told the memory is read-only (numpy then refuses writes)."""
    if tuple(int(p) for p in np.__version__.split(".")[:2]) < (2, 1):
        pytest.skip("numpy before 2.1 asks for no versioned capsule")
    tensor = session.attach("mixed").tensor("embed.weight")
    assert "dltensor_versioned" in repr(tensor.__dlpack__(max_version=(1, 0)))
    array = np.from_dlpack(tensor)
    assert not array.flags.writeable
    with pytest.raises(ValueError):
        array[0, 0] = 1.0


def test_dlpack_refusals(session: modelshare.Session):
    """A copy or another device is refused with BufferError (modelshare never copies on export)."""
    tensor = session.attach("small").tensor("w")
    assert tensor.__dlpack_device__() == (1, 0)
    with pytest.raises(BufferError):
        tensor.__dlpack__(copy=True)
    with pytest.raises(BufferError):
        tensor.__dlpack__(dl_device=(2, 0))
    assert tensor.__dlpack__(dl_device=(1, 0), copy=False) is not None


def test_torch_tensors_hold_the_lease(server: Server):
    """torch tensors, and a capsule nobody consumed, keep the lease; it goes with the last."""
    name = f"torch-lease-{uuid.uuid4().hex[:8]}"
    session = modelshare.Session.open(server.address, name=name, token=TOKEN_A)
    model = session.attach("small")
    t = model.torch()["w"]
    capsule = model.tensor("w").__dlpack__(max_version=(1, 0))
    del session, model
    gc.collect()
    assert server.leases_of(name) == 1
    assert t.tolist() == [1.0, 2.0, 3.0, 4.0]
    del t
    gc.collect()
    assert server.leases_of(name) == 1, "an unconsumed capsule must keep the lease"
    del capsule
    gc.collect()
    server.wait_for("the lease released after the capsule", lambda: server.leases_of(name) is None)


def test_layers_of_one_shape_are_views_at_their_own_bytes(server: Server, session: modelshare.Session):
    """Tensors of one dtype and shape at equal spacing (a transformer's layers) are made as one
    strided view and unbound; irregular spacing, other shapes, scalars and empty tensors between
    them must still each be their own bytes, at their own addresses, in the file's order."""
    from conftest import write_safetensors

    rng = np.random.default_rng(5)
    tensors = []
    for layer in range(4):
        tensors.append((f"layers.{layer}.q", "F32", [8, 8], rng.standard_normal(64, dtype=np.float32).tobytes()))
        tensors.append((f"layers.{layer}.norm", "F32", [8], rng.standard_normal(8, dtype=np.float32).tobytes()))
        if layer == 2:  # breaks the spacing of the layers after it
            tensors.append(("extra", "BF16", [3, 5], rng.integers(0, 256, 30, dtype=np.uint8).tobytes()))
    tensors += [("scale", "F32", [], struct_f32(0.5)), ("nothing", "F32", [0, 4], b""),
                ("also.nothing", "F32", [0, 4], b""), ("head", "F32", [8, 8], rng.standard_normal(64, dtype=np.float32).tobytes())]
    write_safetensors(server.tmp / "models" / "layers" / "model.safetensors", tensors)
    server.cli("load", "layers", "layers", "--public")
    model = session.attach("layers")
    views = model.torch()
    assert list(views) == [name for name, *_ in tensors]
    for name, dtype, shape, data in tensors:
        t = views[name]
        assert t.dtype == TORCH_DTYPES[dtype] and list(t.shape) == shape and t.is_contiguous(), name
        assert raw_bytes(t) == data, name
        if data:
            assert t.data_ptr() == model.tensor(name).data_ptr, name
    # A choice of tensors comes in the order asked, each still its own bytes.
    chosen = ["head", "layers.3.q", "extra", "layers.0.q"]
    some = model.torch(chosen)
    assert list(some) == chosen
    for name in chosen:
        assert some[name].data_ptr() == views[name].data_ptr() and raw_bytes(some[name]) == raw_bytes(views[name]), name
    with pytest.raises(modelshare.NotFound, match="no tensor 'nope'"):
        model.torch(["layers.0.q", "nope"])


def struct_f32(x: float) -> bytes:
    return np.float32(x).tobytes()


def test_attach_in_two_steps(server: Server):
    """The two-step attach (`Session.attach` in a process running CUDA through torch): the grant
    gives the views' plan before the mapping, `finish` the model, whose tensors are the file's
    bytes and hold the lease; host memory has no early arena (its address is the mapping's);
    each error comes from the step it belongs to, and a second `finish` is refused."""
    name = f"two-steps-{uuid.uuid4().hex[:8]}"
    session = modelshare.Session.open(server.address, name=name, token=TOKEN_A)
    attaching = session._native.attach_early("mixed")
    assert attaching.arena() is None
    runs, order = attaching.runs()
    assert order == list(server.expected)
    assert sorted(n for *_, names in runs for n in names) == sorted(order)
    model = modelshare.Model(attaching.finish(timeout=10))
    assert server.leases_of(name) == 1
    with pytest.raises(modelshare.Error, match="already finished"):
        attaching.finish()
    tensors = model.torch()
    assert list(tensors) == list(server.expected)
    for tensor_name in tensors:
        again = session.attach("mixed").torch([tensor_name])[tensor_name]
        assert raw_bytes(tensors[tensor_name]) == raw_bytes(again), tensor_name
    del again
    with pytest.raises(modelshare.NotFound):
        session._native.attach_early("no-such-model")
    with pytest.raises(ValueError):
        session._native.attach_early("mixed", 0)
    del model, attaching
    gc.collect()
    assert server.leases_of(name) == 1, "the tensors hold the lease"
    del tensors
    gc.collect()
    server.wait_for("the two-step attach's lease released", lambda: server.leases_of(name) == 0)
    session.close()


def test_early_views_are_given_once():
    """A model attached with its views made early gives them on the first `torch()` only, and
    only while it is still mapped where they were made (after a reconnection re-attached it
    elsewhere, `torch()` makes views of the new mapping, as without them)."""

    class Arena:
        def __init__(self, address):
            self.data_ptr = address

    class Native:
        def __init__(self, address):
            self.address, self.planned = address, 0

        def arena(self):
            return Arena(self.address)

        def runs(self, names):
            self.planned += 1
            raise LookupError("planned anew")

    early = {"w": torch.zeros(2)}
    native = Native(0x7000)
    model = modelshare.Model(native, (0x7000, early))  # type: ignore[arg-type]
    assert model.torch() is early and native.planned == 0
    with pytest.raises(LookupError, match="planned anew"):
        model.torch()  # the second call makes views of its own
    moved = Native(0x9000)
    model = modelshare.Model(moved, (0x7000, early))  # type: ignore[arg-type]
    with pytest.raises(LookupError, match="planned anew"):
        model.torch()
    assert moved.planned == 1


def test_attach_takes_two_steps_where_torch_runs_cuda(server: Server, monkeypatch: pytest.MonkeyPatch):
    """`Session.attach` in a process running CUDA through torch goes through the two steps (here,
    host memory: no early views); views that cannot be made early (a dtype torch lacks, say)
    fail nothing: the attach succeeds and `torch()` makes them, or says why, itself."""
    import modelshare._session as session_module

    calls = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    real = session_module.early_views

    def counting(attaching):
        calls.append(attaching)
        return real(attaching)

    monkeypatch.setattr(session_module, "early_views", counting)
    with modelshare.Session.open(server.address, name=f"two-{uuid.uuid4().hex[:8]}", token=TOKEN_A) as s:
        tensors = s.attach("mixed").torch()
        assert len(calls) == 1 and list(tensors) == list(server.expected)

        def failing(attaching):
            raise modelshare.DtypeError("no such dtype in this torch")

        monkeypatch.setattr(session_module, "early_views", failing)
        model = s.attach("mixed")
        assert list(model.torch()) == list(server.expected)
