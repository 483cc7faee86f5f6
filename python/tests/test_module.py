"""``modelshare.module_from``: torch modules built on the meta device over the shared tensors
(host backend, CPU torch). Models are made here, saved with ``safetensors.torch.save_file`` and
loaded by the server through the CLI; each module is compared, bit for bit, with the same module
loaded from the file by ``safetensors.torch.load_file`` and ``load_state_dict``."""

from __future__ import annotations

import copy
import gc
import json
import threading
import uuid
from pathlib import Path

import pytest

import modelshare
from conftest import TOKEN_A, Server

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch", reason="safetensors is needed to write the test models")
nn = torch.nn


class MLP(nn.Module):
    """Two layers."""

    def __init__(self, d_in: int = 8, hidden: int = 16, d_out: int = 4, *, bias2: bool = True, extra: bool = False):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, d_out, bias=bias2)
        self.fc3 = nn.Linear(d_out, d_out) if extra else None

    def forward(self, x):
        y = self.fc2(nn.functional.gelu(self.fc1(x)))
        return self.fc3(y) if self.fc3 is not None else y


class Rotary(nn.Module):
    """A LayerNorm, a persistent buffer, and what the checkpoint lacks: non-persistent buffers
    (a rotary ``inv_freq``, BERT-like ``position_ids``, non-contiguous) and a plain tensor
    attribute, all computed by the constructor."""

    def __init__(self, dim: int = 8, base: float = 10000.0, max_positions: int = 32):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.proj = nn.Linear(dim, dim)
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("position_ids", torch.arange(max_positions).expand((1, -1)), persistent=False)
        self.register_buffer("scale", torch.tensor(0.5))
        self.bias_table = torch.linspace(-1.0, 1.0, dim)

    def forward(self, x):
        angles = self.position_ids[:, : x.shape[1], None].to(x.dtype) * self.inv_freq.to(x.dtype)
        cos = angles.cos().repeat_interleave(2, -1)
        sin = angles.sin().repeat_interleave(2, -1)
        rotated = x * cos + x.roll(1, -1) * sin
        return self.proj(self.norm(x)) * self.scale + rotated + self.bias_table.to(x.dtype)


class TiedLM(nn.Module):
    """An embedding whose weight is also the output projection's (one Parameter)."""

    def __init__(self, vocab: int = 32, dim: int = 8):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.norm = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, ids):
        return self.lm_head(self.norm(self.embed(ids)))


MLP_CONFIG = {"d_in": 8, "hidden": 16, "d_out": 4}


def made(cls, seed: int, **kwargs) -> nn.Module:
    torch.manual_seed(seed)
    return cls(**kwargs)


def from_file(build, path: Path, dtype=None) -> nn.Module:
    """The reference: the module built normally, loaded from the file with safetensors."""
    module = build()
    if dtype is not None:
        module.to(dtype)
    module.load_state_dict(st.load_file(str(path)))
    return module.eval()


@pytest.fixture(scope="module")
def models(server: Server) -> dict[str, Path]:
    """Saves the test models under the server's model root and loads them (public)."""
    root = server.tmp / "models"
    files: dict[str, Path] = {}

    def save(name: str, state: dict, config: dict | None = None) -> None:
        folder = root / name
        folder.mkdir(parents=True)
        st.save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
        if config is not None:
            (folder / "config.json").write_text(json.dumps(config))
        server.cli("load", name, name, "--public")
        files[name] = folder / "model.safetensors"

    mlp = made(MLP, 1, **MLP_CONFIG).state_dict()
    save("mod-mlp", mlp, MLP_CONFIG)
    save("mod-mlp-bf16", {k: v.to(torch.bfloat16) for k, v in made(MLP, 2).state_dict().items()})
    save("mod-rotary", made(Rotary, 3).state_dict())
    backbone = {f"backbone.{k}": v for k, v in made(MLP, 4).state_dict().items()}
    save("mod-backbone", {**backbone, "head.weight": torch.ones(2, 4)})
    tied = made(TiedLM, 5).state_dict()
    del tied["lm_head.weight"]  # the same tensor as embed.weight: saved once
    save("mod-tied", tied)
    return files


@pytest.fixture
def session(server: Server):
    s = modelshare.Session.open(server.address, name=f"module-{uuid.uuid4().hex[:8]}", token=TOKEN_A)
    yield s
    s.close()


def counting(build):
    """``build``, counting its calls."""

    def counted():
        counted.calls += 1
        return build()

    counted.calls = 0
    return counted


def assert_shares(module: nn.Module, shared: dict, rename=lambda n: n) -> None:
    """Every parameter and persistent buffer of ``module`` is the shared tensor (no copy)."""
    state = module.state_dict(keep_vars=True)
    assert state
    for name, tensor in state.items():
        assert tensor.data_ptr() == shared[rename(name)].data_ptr(), name


def test_mlp_from_shared_weights(models, session: modelshare.Session):
    """Outputs bit-exact with the module loaded from the file; the parameters are the shared
    tensors; read-only parameters, eval mode; built once (nothing to compute); config from the
    model's JSON metadata."""
    model = session.attach("mod-mlp")
    config = json.loads(model.metadata["config.json"])
    build = counting(lambda: MLP(**config))
    module = modelshare.module_from(model, build)
    assert build.calls == 1
    assert isinstance(module, MLP) and not module.training
    reference = from_file(lambda: MLP(**config), models["mod-mlp"])
    x = torch.randn(5, 8)
    assert torch.equal(module(x), reference(x))
    assert_shares(module, model.torch())
    assert all(not p.requires_grad and p.device.type == "cpu" for p in module.parameters())
    # A copy to train: its own memory, trainable.
    trainable = copy.deepcopy(module).requires_grad_(True)
    assert trainable.fc1.weight.data_ptr() != module.fc1.weight.data_ptr()
    assert torch.equal(trainable(x), reference(x))


def test_non_persistent_buffers_are_computed(models, session: modelshare.Session):
    """Non-persistent buffers and plain tensor attributes (meta after the meta build) get the
    values a normal construction gives them; the persistent buffer is the shared tensor."""
    model = session.attach("mod-rotary")
    build = counting(Rotary)
    module = modelshare.module_from(model, build)
    assert build.calls == 2, "a second build computes the buffers"
    normal = Rotary()
    for name in ("inv_freq", "position_ids", "bias_table"):
        ours, theirs = getattr(module, name), getattr(normal, name)
        assert not ours.is_meta, name
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape and torch.equal(ours, theirs), name
    assert "inv_freq" not in module.state_dict()
    assert_shares(module, model.torch())
    reference = from_file(Rotary, models["mod-rotary"])
    x = torch.randn(2, 7, 8)
    assert torch.equal(module(x), reference(x))


def test_second_build_moves_only_its_own_parameters(session: modelshare.Session):
    """The second build sends parameters to meta on its own thread only, and only while it
    runs: a module another thread makes meanwhile, or anyone makes after, is real."""
    model = session.attach("mod-rotary")
    elsewhere: list[nn.Module] = []

    def build() -> Rotary:
        thread = threading.Thread(target=lambda: elsewhere.append(nn.Linear(2, 2)))
        thread.start()
        thread.join()
        return Rotary()

    modelshare.module_from(model, build)
    assert len(elsewhere) == 2, "built twice, one thread each time"
    assert all(not m.weight.is_meta for m in elsewhere)
    assert not nn.Linear(2, 2).weight.is_meta


def test_init_buffers_hook(models, session: modelshare.Session):
    """``init_buffers`` replaces the second build; a buffer it leaves on meta is named."""
    model = session.attach("mod-rotary")

    def init(module: Rotary) -> None:
        normal = Rotary()
        module.inv_freq = normal.inv_freq
        module.position_ids = normal.position_ids
        module.bias_table = normal.bias_table

    build = counting(Rotary)
    module = modelshare.module_from(model, build, init_buffers=init)
    assert build.calls == 1
    x = torch.randn(2, 7, 8)
    assert torch.equal(module(x), from_file(Rotary, models["mod-rotary"])(x))

    def forgets(module: Rotary) -> None:
        module.inv_freq = Rotary().inv_freq

    with pytest.raises(modelshare.ModuleMismatch, match="position_ids") as caught:
        modelshare.module_from(model, Rotary, init_buffers=forgets)
    assert caught.value.unmaterialised == ["position_ids"]


def test_rename(models, session: modelshare.Session):
    """A dict of prefixes and a function map "backbone.x" to "x" and drop the head; without
    the dropping, the head is an unexpected tensor (or left out with strict=False)."""
    model = session.attach("mod-backbone")
    shared = model.torch()
    reference = made(MLP, 4).eval()  # the same weights as the file's, built the same way
    x = torch.randn(3, 8)
    by_dict = modelshare.module_from(model, MLP, rename={"backbone.": "", "head.": None})
    by_function = modelshare.module_from(
        model, MLP, rename=lambda n: n.removeprefix("backbone.") if n.startswith("backbone.") else None
    )
    for module in (by_dict, by_function):
        assert torch.equal(module(x), reference(x))
        assert_shares(module, shared, rename=lambda n: f"backbone.{n}")

    with pytest.raises(modelshare.ModuleMismatch, match=r"unexpected \(1\): 'head.weight'") as caught:
        modelshare.module_from(model, MLP, rename={"backbone.": ""})
    assert caught.value.unexpected == ["head.weight"]
    lenient = modelshare.module_from(model, MLP, rename={"backbone.": ""}, strict=False)
    assert torch.equal(lenient(x), reference(x))

    with pytest.raises(modelshare.ModuleMismatch, match="renamed to one name") as caught:
        modelshare.module_from(model, MLP, rename=lambda n: "fc1.weight")
    assert sorted(caught.value.collisions["fc1.weight"]) == sorted(model.keys())
    # The source's name is shown beside the module's.
    with pytest.raises(modelshare.ModuleMismatch, match=r"'fc1.weight' \(source 'backbone.fc1.weight'\): \[16, 8\] given, \[32, 8\]"):
        modelshare.module_from(model, lambda: MLP(hidden=32), rename={"backbone.": "", "head.": None})


def test_missing_tensor(session: modelshare.Session):
    model = session.attach("mod-mlp")
    with pytest.raises(modelshare.ModuleMismatch, match=r"missing \(2\): 'fc3.weight', 'fc3.bias'") as caught:
        modelshare.module_from(model, lambda: MLP(extra=True))
    error = caught.value
    assert isinstance(error, modelshare.Error) and isinstance(error, ValueError)
    assert error.missing == ["fc3.weight", "fc3.bias"] and not error.unexpected
    assert "model 'mod-mlp' version" in str(error) and "MLP" in str(error)


def test_unexpected_tensor(session: modelshare.Session):
    model = session.attach("mod-mlp")
    with pytest.raises(modelshare.ModuleMismatch, match=r"unexpected \(1\): 'fc2.bias'") as caught:
        modelshare.module_from(model, lambda: MLP(bias2=False))
    assert caught.value.unexpected == ["fc2.bias"] and not caught.value.missing
    module = modelshare.module_from(model, lambda: MLP(bias2=False), strict=False)
    assert module.fc2.bias is None


def test_unexpected_non_persistent_buffer_is_explained(session: modelshare.Session):
    """An old checkpoint that saved a buffer the module now computes: the message says so."""
    state = {k: v.clone() for k, v in made(Rotary, 3).state_dict().items()}
    state["inv_freq"] = torch.zeros(4)
    with pytest.raises(modelshare.ModuleMismatch, match="non-persistent buffers, which the module computes: 'inv_freq'"):
        modelshare.module_from(state, Rotary)
    module = modelshare.module_from(state, Rotary, rename={"inv_freq": None})
    assert torch.equal(module.inv_freq, Rotary().inv_freq)


def test_wrong_shape(session: modelshare.Session):
    model = session.attach("mod-mlp")
    with pytest.raises(modelshare.ModuleMismatch, match=r"wrong shape \(3\): 'fc1.weight': \[16, 8\] given, \[32, 8\] in the module, 'fc1.bias'") as caught:
        modelshare.module_from(model, lambda: MLP(hidden=16 * 2, d_out=4))
    assert caught.value.shapes["fc1.weight"] == ((16, 8), (32, 8))
    assert set(caught.value.shapes) == {"fc1.weight", "fc1.bias", "fc2.weight"}


def test_wrong_dtype_then_dtype_argument(models, session: modelshare.Session):
    """bf16 tensors and a module built in f32: an error naming the tensors and the way out
    (dtype=), never a conversion; with dtype=torch.bfloat16, bit-exact with the module loaded
    from the file and cast."""
    model = session.attach("mod-mlp-bf16")
    with pytest.raises(modelshare.ModuleMismatch, match="wrong dtype") as caught:
        modelshare.module_from(model, MLP)
    message = str(caught.value)
    assert "torch.bfloat16 given, torch.float32 in the module: 'fc1.weight'" in message
    assert "dtype=torch.bfloat16" in message
    assert caught.value.dtypes["fc2.bias"] == (torch.bfloat16, torch.float32)

    module = modelshare.module_from(model, MLP, dtype=torch.bfloat16)
    assert module.fc1.weight.dtype == torch.bfloat16
    assert_shares(module, model.torch())
    reference = from_file(MLP, models["mod-mlp-bf16"], dtype=torch.bfloat16)
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    assert torch.equal(module(x), reference(x))

    # One tensor of another dtype among right ones: named, and no dtype= advice.
    state = {k: v.clone() for k, v in made(MLP, 1).state_dict().items()}
    state["fc2.weight"] = state["fc2.weight"].double()
    with pytest.raises(modelshare.ModuleMismatch, match="torch.float64 given, torch.float32 in the module: 'fc2.weight'") as caught:
        modelshare.module_from(state, MLP)
    assert "dtype=" not in str(caught.value)


def test_long_lists_are_bounded():
    """Ten names per kind of problem, then a count; the attribute holds them all."""
    build = lambda: nn.Sequential(*[nn.Linear(2, 2) for _ in range(20)])  # noqa: E731
    with pytest.raises(modelshare.ModuleMismatch, match=r"missing \(40\): '0.weight', .*'4.bias' and 30 more$") as caught:
        modelshare.module_from({}, build)
    assert len(caught.value.missing) == 40


def test_tied_weights(models, session: modelshare.Session):
    """A tensor saved once for two tied names: both names get it, still one Parameter."""
    model = session.attach("mod-tied")
    module = modelshare.module_from(model, TiedLM)
    assert module.lm_head.weight is module.embed.weight
    assert module.embed.weight.data_ptr() == model.torch()["embed.weight"].data_ptr()
    reference = TiedLM()
    state = st.load_file(str(models["mod-tied"]))
    reference.load_state_dict({**state, "lm_head.weight": state["embed.weight"]})
    ids = torch.randint(0, 32, (2, 5))
    assert torch.equal(module(ids), reference.eval()(ids))
    # Given twice with different values: refused.
    twice = {k: v.clone() for k, v in made(TiedLM, 5).state_dict().items()}
    twice["lm_head.weight"] = twice["embed.weight"] + 1
    with pytest.raises(modelshare.ModuleMismatch, match="tied in the module, different in the source.*'lm_head.weight'"):
        modelshare.module_from(twice, TiedLM)


def test_module_holds_the_lease(server: Server, models):
    """The module's tensors hold the model's lease after the session and model objects go."""
    name = f"module-lease-{uuid.uuid4().hex[:8]}"
    session = modelshare.Session.open(server.address, name=name, token=TOKEN_A)
    module = modelshare.module_from(session.attach("mod-mlp"), lambda: MLP(**MLP_CONFIG))
    del session
    gc.collect()
    assert server.leases_of(name) == 1
    x = torch.randn(2, 8)
    assert torch.equal(module(x), from_file(MLP, models["mod-mlp"])(x))
    del module
    gc.collect()
    server.wait_for("the lease released with the module", lambda: server.leases_of(name) is None)


def test_argument_errors(session: modelshare.Session):
    model = session.attach("mod-mlp")
    with pytest.raises(TypeError, match="build must be a function"):
        modelshare.module_from(model, MLP())
    with pytest.raises(TypeError, match="not a torch.nn.Module"):
        modelshare.module_from(model, lambda: "an MLP")
    with pytest.raises(TypeError, match="rename"):
        modelshare.module_from(model, MLP, rename=["backbone."])
    with pytest.raises(TypeError, match="source must"):
        modelshare.module_from(model.numpy(), MLP)
    with pytest.raises(TypeError, match="dtype"):
        modelshare.module_from(model, MLP, dtype=torch.int8)


def test_transformers_llama(server: Server, session: modelshare.Session):
    """A tiny bf16 Llama of transformers (rotary inv_freq buffers kept in f32, tied embeddings),
    written by save_pretrained and built from the served config.json alone (no remote code, no
    pickle), with transformers' own dtype argument: logits bit-exact with from_pretrained."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    torch.manual_seed(6)
    folder = server.tmp / "models" / "mod-llama"
    transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(str(folder))
    server.cli("load", "mod-llama", "mod-llama", "--public")
    reference = transformers.LlamaForCausalLM.from_pretrained(str(folder), dtype=torch.bfloat16).eval()

    model = session.attach("mod-llama")
    assert "lm_head.weight" not in model.keys()
    saved = json.loads(model.metadata["config.json"])

    def build():
        return transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model(**saved), dtype=torch.bfloat16
        )

    module = modelshare.module_from(model, build)
    assert module.lm_head.weight is module.model.embed_tokens.weight
    assert_shares(module, model.torch(), rename=lambda n: "model.embed_tokens.weight" if n == "lm_head.weight" else n)
    ours, theirs = module.model.rotary_emb.inv_freq, reference.model.rotary_emb.inv_freq
    assert ours.dtype == theirs.dtype == torch.float32 and torch.equal(ours, theirs)
    ids = torch.randint(0, 64, (2, 9))
    with torch.inference_mode():
        assert torch.equal(module(ids).logits, reference(ids).logits)
