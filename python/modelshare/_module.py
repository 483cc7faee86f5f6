"""``module_from``: a ``torch.nn.Module`` whose parameters and buffers are the shared tensors.

The module is built on the meta device (no memory, no initialisation), its state is checked
against the shared tensors (names, shapes, dtypes; every problem reported at once), then the
tensors are assigned to it with ``load_state_dict(..., assign=True)``: the parameters *are* the
shared memory, nothing is copied.

What the checkpoint does not hold is computed, not loaded: non-persistent buffers (a rotary
embedding's ``inv_freq``, BERT's ``position_ids``) and plain tensor attributes the module made
in its constructor. Built on meta, they are meta tensors with no values; ``module_from`` builds
the module a second time with its *parameters* sent to the meta device as they are registered
(a parameter registration hook, active on this thread only) and everything else made where the
constructor makes it, so the buffers get exactly the values a normal construction gives them.
That build costs about the buffers: each parameter's uninitialised allocation is dropped as it
is registered and its initialisation (``reset_parameters``, ``_init_weights``) runs on meta; a
``Parameter`` subclass is left as made (a cost, not an error). A module whose buffers depend on
parameter values cannot be served that way: give ``init_buffers`` instead.

Nothing here reads pickles or runs code from the model: the tensors come from the server (which
reads safetensors only) and the module's code is the caller's ``build``; configuration, if any,
is the model's JSON metadata (``model.metadata["config.json"]``), read by the caller.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, Union

from ._native import Error
from ._session import Model
from ._torch import torch_dtype

if TYPE_CHECKING:
    import torch
    from torch import nn

    M = TypeVar("M", bound=nn.Module)
    Rename = Union[Mapping[str, Union[str, None]], Callable[[str], Union[str, None]]]

#: Names shown per kind of problem in a message (the exception's attributes hold them all).
SHOWN = 10


class ModuleMismatch(Error, ValueError):
    """The shared tensors do not fit the module that ``build`` made.

    The message lists each kind of problem with the first names of each; the attributes hold
    every name:

    - ``missing``: module names (parameters, persistent buffers) no tensor was given for;
    - ``unexpected``: tensor names (after ``rename``) the module has no place for;
    - ``shapes``: ``{module name: (tensor's shape, module's shape)}``;
    - ``dtypes``: ``{module name: (tensor's dtype, module's dtype)}``;
    - ``collisions``: ``{module name: [tensor names renamed to it]}``;
    - ``unmaterialised``: tensors of the module still on the meta device after the
      assignment (buffers nothing computed, tied tensors that differ in the checkpoint).
    """

    def __init__(
        self,
        message: str,
        *,
        missing: Iterable[str] = (),
        unexpected: Iterable[str] = (),
        shapes: Mapping[str, tuple[tuple[int, ...], tuple[int, ...]]] | None = None,
        dtypes: Mapping[str, tuple[Any, Any]] | None = None,
        collisions: Mapping[str, list[str]] | None = None,
        unmaterialised: Iterable[str] = (),
    ) -> None:
        super().__init__(message)
        self.code: str | None = None
        self.missing = list(missing)
        self.unexpected = list(unexpected)
        self.shapes = dict(shapes or {})
        self.dtypes = dict(dtypes or {})
        self.collisions = dict(collisions or {})
        self.unmaterialised = list(unmaterialised)


def module_from(
    source: Model | Mapping[str, torch.Tensor],
    build: Callable[[], M],
    *,
    rename: Rename | None = None,
    strict: bool = True,
    dtype: torch.dtype | None = None,
    init_buffers: Callable[[M], None] | None = None,
) -> M:
    """Builds ``build()`` on the meta device and makes the shared tensors its parameters and
    buffers, with no copy.

    Example::

        config = json.loads(model.metadata["config.json"])
        net = modelshare.module_from(model, lambda: Net(**config), dtype=torch.bfloat16)
        with torch.inference_mode():
            y = net(x)

    Args:
        source: an attached ``Model`` (its tensors are taken with ``model.torch()``, after
            ``wait_ready``), or a mapping of names to torch tensors (``model.torch()``, several
            models' tensors merged, ...).
        build: makes the module, with no argument (``lambda: Net(cfg)``,
            ``functools.partial(Net, cfg)``). It runs under ``torch.device("meta")``, and runs
            a second time when the module has non-persistent buffers or tensor attributes to
            compute (see the module's notes), so it must make the same module each time.
        rename: maps the source's names to the module's: a dict of prefixes (the longest
            matching prefix is replaced by its value: ``{"backbone.": ""}``; a value of ``None``
            drops the names with that prefix), or a function of a name returning the module's
            name, or ``None`` to drop the tensor. Two names renamed to one are an error.
        strict: tensors the module has no place for are an error (``True``) or are left out.
            A module tensor with no source tensor is always an error: it would stay on the
            meta device, with no values.
        dtype: the floating-point dtype of the module: ``build().to(dtype)``, done on the meta
            device (free), every floating-point parameter and buffer cast as ``Module.to``
            casts them. The source's tensors must then have it: a dtype differing between a
            tensor and the module is an error, never a conversion (a conversion is a copy; do
            it yourself, ``module.to(...)``, if you want one). A module keeping some tensors in
            f32 on purpose is built in its own dtype instead (transformers:
            ``AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)``, which keeps
            ``inv_freq`` in f32 as ``from_pretrained`` does; ``dtype=`` here would cast it).
        init_buffers: sets the module's non-persistent buffers itself, given the module with
            its shared tensors assigned (instead of the second ``build``); for buffers that
            depend on parameter values. Buffers it leaves on the meta device are an error;
            the others are moved to the weights' device.

    Returns:
        The module, in eval mode, on the shared tensors' device (CPU for host memory, the
        arena's CUDA device for device memory), its parameters with ``requires_grad=False``.
        Computed buffers are moved to that device when all the shared tensors are on one.

    Raises:
        ModuleMismatch: missing or unexpected tensors, wrong shapes, wrong dtypes, renaming
            collisions, buffers left on the meta device; every problem at once.
        TypeError: ``build`` is not a function making an ``nn.Module``, or a bad argument.
        DtypeError: a tensor's dtype has no equivalent in this torch.

    The parameters are the server's memory, so they are made with ``requires_grad=False``: an
    optimizer step writes in place, which kills the process on a read-only mapping (SIGSEGV on
    the host backend) and would change every worker's weights on a writable one (legacy CUDA
    IPC). To train, copy first: ``copy.deepcopy(module).requires_grad_(True)``.
    """
    import torch
    from torch import nn

    if isinstance(build, nn.Module) or not callable(build):
        raise TypeError(
            "build must be a function that makes the module (e.g. `lambda: Net(config)`), not "
            f"{type(build).__name__}: it is called on the meta device"
        )
    if dtype is not None and not (isinstance(dtype, torch.dtype) and (dtype.is_floating_point or dtype.is_complex)):
        raise TypeError(f"dtype must be a floating-point torch.dtype, not {dtype!r}")
    if init_buffers is not None and not callable(init_buffers):
        raise TypeError(f"init_buffers must be a function of the module, not {type(init_buffers).__name__}")

    described, shapes_of, fetch = _source(source)
    renamer = _renamer(rename)

    # Source names -> module names.
    names: dict[str, str] = {}  # module name -> source name
    collisions: dict[str, list[str]] = {}
    for name in shapes_of:
        new = renamer(name)
        if new is None:
            continue
        if new in names:
            collisions.setdefault(new, [names[new]]).append(name)
        else:
            names[new] = name

    module = _build(build, dtype, params_on_meta=False)
    what = f"{described} the module {type(module).__name__}"

    # What the module loads: its state_dict's tensors (parameters, persistent buffers). Tied
    # tensors (one object under several names) form one group, loaded from one source tensor.
    expected = {k: v for k, v in module.state_dict(keep_vars=True).items() if isinstance(v, torch.Tensor)}
    groups: dict[int, list[str]] = {}
    for key, value in expected.items():
        groups.setdefault(id(value), []).append(key)

    missing: list[str] = []
    wrong_shape: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    wrong_dtype: dict[str, tuple[Any, Any]] = {}
    take: dict[str, str] = {}  # module name -> module name whose source tensor it gets
    also: dict[str, list[str]] = {}  # first source of a tied group -> the group's other sources
    for keys in groups.values():
        present = [k for k in keys if k in names]
        if not present:
            missing.extend(keys)
            continue
        target = expected[keys[0]]
        for key in present:
            dtype_name, shape = shapes_of[names[key]]
            if tuple(shape) != tuple(target.shape):
                wrong_shape[key] = (tuple(shape), tuple(target.shape))
            kind = torch_dtype(dtype_name) if isinstance(dtype_name, str) else dtype_name
            if kind != target.dtype:
                wrong_dtype[key] = (kind, target.dtype)
        for key in keys:
            take[key] = present[0]
        if len(present) > 1:
            also[present[0]] = present[1:]
    unexpected = [n for n in names if n not in expected]

    if missing or wrong_shape or wrong_dtype or collisions or (unexpected and strict):
        computed = {n for n, _ in module.named_buffers(remove_duplicate=False)} - set(expected)
        lines = [f"{what}:"]

        def label(key: str) -> str:
            source_name = names.get(key)
            return repr(key) if source_name in (None, key) else f"{key!r} (source {source_name!r})"

        if missing:
            lines.append(f"  missing ({len(missing)}): {_listing([repr(k) for k in missing])}")
        if unexpected and strict:
            line = f"  unexpected ({len(unexpected)}): {_listing([label(k) for k in unexpected])}"
            buffers = [k for k in unexpected if k in computed]
            if buffers:
                line += (
                    f" (non-persistent buffers, which the module computes: {_listing([repr(k) for k in buffers])}; "
                    "drop them with rename, or pass strict=False)"
                )
            lines.append(line)
        if collisions:
            lines.append(
                f"  renamed to one name ({len(collisions)}): "
                + _listing([f"{k!r} <- {', '.join(map(repr, v))}" for k, v in collisions.items()])
            )
        if wrong_shape:
            lines.append(
                f"  wrong shape ({len(wrong_shape)}): "
                + _listing([f"{label(k)}: {list(s)} given, {list(m)} in the module" for k, (s, m) in wrong_shape.items()])
            )
        if wrong_dtype:
            pairs: dict[tuple[Any, Any], list[str]] = {}
            for key, pair in wrong_dtype.items():
                pairs.setdefault(pair, []).append(label(key))
            line = f"  wrong dtype ({len(wrong_dtype)}): " + "; ".join(
                f"{given} given, {want} in the module: {_listing(keys)}" for (given, want), keys in pairs.items()
            )
            floating = [k for k in names if k in expected and expected[k].is_floating_point()]
            if dtype is None and len(pairs) == 1 and set(floating) <= set(wrong_dtype):
                given = next(iter(pairs))[0]
                if given.is_floating_point:
                    line += f" (dtype={given} builds the module in that dtype; modelshare never converts)"
            lines.append(line)
        raise ModuleMismatch(
            "\n".join(lines),
            missing=missing,
            unexpected=unexpected if strict else (),
            shapes=wrong_shape,
            dtypes=wrong_dtype,
            collisions=collisions,
        )

    wanted = sorted({names[k] for k in take.values()} | {names[k] for v in also.values() for k in v})
    tensors = fetch(wanted)

    # Tied in the module, given twice: one is used, so both must hold the same values.
    differ = [
        k for first, rest in also.items() for k in rest
        if not torch.equal(tensors[names[first]], tensors[names[k]])
    ]
    if differ:
        raise ModuleMismatch(
            f"{what}: tied in the module, different in the source ({len(differ)}): "
            f"{_listing([repr(k) for k in differ])}",
            unmaterialised=differ,
        )

    state = {key: tensors[names[source_key]] for key, source_key in take.items()}
    module.load_state_dict(state, strict=True, assign=True)
    # assign=True wraps each name's tensor in a Parameter of its own: tie them again (one object).
    for keys in groups.values():
        if len(keys) > 1:
            first = _get(module, keys[0])
            for key in keys[1:]:
                _set(module, key, first)
    for param in module.parameters():
        param.requires_grad_(False)

    devices = {t.device for t in state.values()}
    device = next(iter(devices)) if len(devices) == 1 else None
    pending = _meta_tensors(module, set(expected))
    if pending:
        if init_buffers is not None:
            init_buffers(module)
            moved: dict[int, torch.Tensor] = {}
            for name, is_buffer in pending.items():
                if is_buffer:
                    value = _get(module, name)
                    if not value.is_meta:
                        _set(module, name, _to(value, device, moved))
        else:
            _materialise(module, pending, _build(build, dtype, params_on_meta=True), device)

    left = [n for n, p in module.named_parameters(remove_duplicate=False) if p.is_meta]
    left += [n for n, b in module.named_buffers(remove_duplicate=False) if b.is_meta]
    if left:
        how = "init_buffers left them there" if init_buffers is not None else (
            "a second build did not compute them (do they depend on parameters? pass init_buffers)"
        )
        raise ModuleMismatch(
            f"{what}: tensors left on the meta device, {how} ({len(left)}): "
            f"{_listing([repr(n) for n in left])}",
            unmaterialised=left,
        )
    module.eval()
    return module


def _source(source: Any) -> tuple[str, dict[str, tuple[Any, tuple[int, ...]]], Callable[[list[str]], dict[str, Any]]]:
    """A description, ``{name: (dtype, shape)}`` (a modelshare dtype name or a torch dtype), and a
    function giving the torch tensors of some names."""
    import torch

    if isinstance(source, Model):
        shapes = {t["name"]: (t["dtype"], tuple(t["shape"])) for t in source.manifest}

        def fetch(wanted: list[str]) -> dict[str, Any]:
            source.wait_ready()
            return source.torch(wanted)

        return f"model {source.name!r} version {source.version} does not fit", shapes, fetch
    if isinstance(source, Mapping):
        for name, value in source.items():
            if not isinstance(name, str) or not isinstance(value, torch.Tensor):
                raise TypeError(
                    f"source must map names to torch tensors; {name!r} maps to {type(value).__name__}"
                )
        tensors = dict(source)
        return "the tensors given do not fit", {n: (t.dtype, tuple(t.shape)) for n, t in tensors.items()}, (
            lambda wanted: {n: tensors[n] for n in wanted}
        )
    raise TypeError(
        f"source must be a modelshare.Model or a mapping of names to torch tensors, not {type(source).__name__}"
    )


def _renamer(rename: Any) -> Callable[[str], str | None]:
    if rename is None:
        return lambda name: name
    if isinstance(rename, Mapping):
        for prefix, new in rename.items():
            if not isinstance(prefix, str) or not (new is None or isinstance(new, str)):
                raise TypeError(f"rename maps prefixes to a str or None, not {prefix!r} to {new!r}")
        prefixes = sorted(rename.items(), key=lambda item: len(item[0]), reverse=True)

        def by_prefix(name: str) -> str | None:
            for prefix, new in prefixes:
                if name.startswith(prefix):
                    return None if new is None else new + name[len(prefix):]
            return name

        return by_prefix
    if callable(rename):

        def by_function(name: str) -> str | None:
            new = rename(name)
            if new is not None and not isinstance(new, str):
                raise TypeError(f"rename({name!r}) returned {type(new).__name__}, not a str or None")
            return new

        return by_function
    raise TypeError(f"rename must be a dict of prefixes or a function, not {type(rename).__name__}")


# The second build: parameters go to the meta device as they are registered, on this thread only.
_local = threading.local()


def _params_to_meta(module: Any, name: str, param: Any) -> Any:
    from torch import nn

    if not getattr(_local, "params_on_meta", False) or param.is_meta or type(param) is not nn.Parameter:
        return None  # other threads, and Parameter subclasses (left as made: a cost, not an error)
    return nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)


def _build(build: Callable[[], Any], dtype: Any, *, params_on_meta: bool) -> Any:
    import torch
    from torch import nn
    from torch.nn.modules.module import register_module_parameter_registration_hook

    if params_on_meta:
        before = getattr(_local, "params_on_meta", False)
        handle = register_module_parameter_registration_hook(_params_to_meta)
        _local.params_on_meta = True
        try:
            module = build()
        finally:
            _local.params_on_meta = before
            handle.remove()
    else:
        with torch.device("meta"):
            module = build()
    if not isinstance(module, nn.Module):
        raise TypeError(f"build made a {type(module).__name__}, not a torch.nn.Module")
    if dtype is not None:
        module.to(dtype)
    return module


def _meta_tensors(module: Any, loaded: set[str]) -> dict[str, bool]:
    """The module's tensors on the meta device that no source tensor was assigned to:
    ``{name: is a buffer}`` (else a plain tensor attribute)."""
    import torch
    from torch import nn

    found = {n: True for n, b in module.named_buffers(remove_duplicate=False) if b.is_meta and n not in loaded}
    for prefix, sub in module.named_modules(remove_duplicate=False):
        for attr, value in vars(sub).items():
            if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter) and value.is_meta:
                found.setdefault(f"{prefix}.{attr}" if prefix else attr, False)
    return found


def _materialise(module: Any, pending: Mapping[str, bool], donor: Any, device: Any) -> None:
    """Gives ``module``'s pending tensors the values of ``donor``'s same-named ones (same shape
    and dtype, not meta), moved to ``device``; tensors shared in the donor stay shared."""
    moved: dict[int, Any] = {}
    for name in pending:
        try:
            value = _get(donor, name)
        except AttributeError:
            continue
        like = _get(module, name)
        if value is None or value.is_meta or value.shape != like.shape or value.dtype != like.dtype:
            continue  # left on meta: reported if it is a buffer
        _set(module, name, _to(value, device, moved))


def _to(value: Any, device: Any, moved: dict[int, Any]) -> Any:
    if device is None or value.device == device:
        return value
    if id(value) not in moved:
        moved[id(value)] = value.to(device)
    return moved[id(value)]


def _get(module: Any, name: str) -> Any:
    owner, _, leaf = name.rpartition(".")
    return getattr(module.get_submodule(owner) if owner else module, leaf)


def _set(module: Any, name: str, value: Any) -> None:
    owner, _, leaf = name.rpartition(".")
    setattr(module.get_submodule(owner) if owner else module, leaf, value)


def _listing(items: list[str]) -> str:
    shown = ", ".join(items[:SHOWN])
    return shown + (f" and {len(items) - SHOWN} more" if len(items) > SHOWN else "")
