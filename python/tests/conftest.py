"""A real modelshare server (host backend, tenants) with test models, for the package's tests.

The server is the debug binary (``--bin``, default ``target/debug/modelshare``), started once per
test session on a Unix socket in a temporary folder; models are loaded with the CLI, from
safetensors files written here by hand (an independent producer). Run through scripts/test,
which builds the wheel into a virtual environment first.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
ADMIN = "ms_py_admin_token"
TOKEN_A = "ms_py_token_a"
TOKEN_B = "ms_py_token_b"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--bin",
        default=str(ROOT / "target" / "debug" / "modelshare"),
        help="the modelshare binary to serve with (default: target/debug/modelshare)",
    )


def write_safetensors(path: Path, tensors: list[tuple[str, str, list[int], bytes]], metadata=None) -> None:
    """Writes a safetensors file: a JSON header, then each tensor's bytes in order."""
    header: dict = {}
    offset = 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    if metadata:
        header["__metadata__"] = metadata
    raw = json.dumps(header).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for _, _, _, data in tensors:
            f.write(data)


def mixed_tensors(seed: int = 27) -> list[tuple[str, str, list[int], bytes]]:
    """One tensor of each dtype the package maps (random bits; valid bools), a scalar and an
    empty tensor."""
    rng = np.random.default_rng(seed)

    def bits(n: int) -> bytes:
        return rng.integers(0, 256, n, dtype=np.uint8).tobytes()

    return [
        ("embed.weight", "F32", [37, 16], rng.standard_normal((37, 16), dtype=np.float32).tobytes()),
        ("half", "F16", [8, 8], rng.standard_normal(64).astype(np.float16).tobytes()),
        ("brain", "BF16", [5, 9], bits(5 * 9 * 2)),
        ("double", "F64", [3, 2], bits(3 * 2 * 8)),
        ("i8", "I8", [11], bits(11)),
        ("i16", "I16", [3, 3], bits(3 * 3 * 2)),
        ("i32", "I32", [4], bits(4 * 4)),
        ("ids", "I64", [17], bits(17 * 8)),
        ("bytes", "U8", [1001], bits(1001)),
        ("u16", "U16", [3], bits(6)),
        ("u32", "U32", [3], bits(12)),
        ("u64", "U64", [3], bits(24)),
        ("mask", "BOOL", [2, 3], bytes([0, 1, 1, 0, 1, 0])),
        ("complex", "C64", [2], rng.standard_normal(4).astype(np.float32).tobytes()),
        ("f8", "F8_E4M3", [6], bits(6)),
        ("f8e5", "F8_E5M2", [6], bits(6)),
        ("scale", "F32", [], bits(4)),
        ("nothing", "F32", [0, 3], b""),
    ]


@dataclass
class Server:
    """A running server and what the tests need of it."""

    bin: str
    address: str
    tmp: Path
    expected: dict[str, tuple[str, list[int], bytes]] = field(default_factory=dict)
    process: subprocess.Popen | None = None

    def cli(self, *args: str, token: str = ADMIN) -> str:
        env = dict(os.environ, MODELSHARE_TOKEN=token)
        env.pop("MODELSHARE_TOKEN_FILE", None)
        done = subprocess.run(
            [self.bin, *args, "--server", self.address],
            env=env, capture_output=True, text=True, timeout=60,
        )
        if done.returncode != 0:
            raise AssertionError(f"modelshare {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
        return done.stdout

    def sessions(self) -> list[dict]:
        """`modelshare ps --output json`: every session, with its leases."""
        return json.loads(self.cli("ps", "--output", "json"))["sessions"]

    def leases_of(self, worker_name: str) -> int | None:
        """Leases held by the session of `worker_name`; None when there is no such session."""
        found = [s for s in self.sessions() if s["worker_name"] == worker_name]
        if not found:
            return None
        return sum(len(s["leases"]) for s in found)

    def wait_for(self, what: str, check, timeout: float = 10.0):
        deadline = time.monotonic() + timeout
        while True:
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout} s")
            time.sleep(0.05)


def sha(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


@pytest.fixture(scope="session")
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    binary = request.config.getoption("--bin")
    if not os.access(binary, os.X_OK):
        pytest.fail(f"no modelshare binary at {binary}: build it (cargo build -p modelshare-cli) or pass --bin")
    tmp = tmp_path_factory.mktemp("modelshare")
    models = tmp / "models"
    tensors = mixed_tensors()
    write_safetensors(models / "mixed" / "model.safetensors", tensors, metadata={"format": "pt"})
    (models / "mixed" / "config.json").write_text('{"hidden_size": 16}')
    (models / "mixed" / "tokenizer.json").write_text('{"version": "1.0"}')
    write_safetensors(models / "small" / "model.safetensors",
                      [("w", "F32", [4], struct.pack("<4f", 1.0, 2.0, 3.0, 4.0))])
    (tmp / "tenants.toml").write_text(
        f'[admin]\ntoken_hashes = ["{sha(ADMIN)}"]\n\n'
        f'[[tenants]]\nname = "a"\ntoken_hashes = ["{sha(TOKEN_A)}"]\n\n'
        f'[[tenants]]\nname = "b"\ntoken_hashes = ["{sha(TOKEN_B)}"]\n'
    )
    socket = tmp / "grpc.sock"
    log = open(tmp / "server.log", "wb")
    process = subprocess.Popen(
        [binary, "serve", "--backend", "host", "--model-root", str(models),
         "--unix-socket", str(socket), "--handle-socket", str(tmp / "handles.sock"),
         "--tenants-file", str(tmp / "tenants.toml")],
        stdout=log, stderr=subprocess.STDOUT,
    )
    srv = Server(bin=binary, address=f"unix:{socket}", tmp=tmp, process=process,
                 expected={name: (dtype, shape, data) for name, dtype, shape, data in tensors})
    try:
        deadline = time.monotonic() + 60
        while True:
            ready = subprocess.run([binary, "ready", "--server", srv.address],
                                   env=dict(os.environ, MODELSHARE_TOKEN=ADMIN), capture_output=True)
            if ready.returncode == 0:
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the server did not start:\n" + (tmp / "server.log").read_text())
            time.sleep(0.1)
        # Public: every tenant may attach them; "private" is tenant a's alone.
        srv.cli("load", "mixed", "mixed", "--public")
        srv.cli("load", "small", "small", "--public")
        srv.cli("load", "private", "small", "--tenant", "a")
        yield srv
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
