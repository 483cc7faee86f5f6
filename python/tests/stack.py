"""A server with its front doors (OpenAI and KServe v2 over HTTP), for the serving tests.

Unlike conftest's shared server (sessions and attach only), this one is started per test module
and may be restarted: its models come from a configuration file, so a restarted server loads them
again. Model "enc": one F32 tensor ``w`` of 16 values, public.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from conftest import ADMIN, TOKEN_A, TOKEN_B, sha, write_safetensors

HERE = Path(__file__).resolve().parent
W1 = [0.5 * i - 2.0 for i in range(16)]
W2 = [100.0 + i for i in range(16)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_weights(folder: Path, values: list[float]) -> None:
    write_safetensors(folder / "model.safetensors", [("w", "F32", [len(values)], struct.pack(f"<{len(values)}f", *values))])


class Stack:
    """The server process (restartable) and the worker processes the tests start."""

    def __init__(self, binary: str, tmp: Path) -> None:
        self.bin, self.tmp = binary, tmp
        self.models = tmp / "models"
        write_weights(self.models / "enc", W1)
        write_weights(self.models / "enc2", W2)
        (tmp / "tenants.toml").write_text(
            f'[admin]\ntoken_hashes = ["{sha(ADMIN)}"]\n\n'
            f'[[tenants]]\nname = "a"\ntoken_hashes = ["{sha(TOKEN_A)}"]\n\n'
            f'[[tenants]]\nname = "b"\ntoken_hashes = ["{sha(TOKEN_B)}"]\n'
        )
        (tmp / "modelshare.toml").write_text('[[models]]\nname = "enc"\npath = "enc"\npublic = true\n')
        self.socket = tmp / "grpc.sock"
        self.address = f"unix:{self.socket}"
        self.http_port = free_port()
        self.http = f"http://127.0.0.1:{self.http_port}"
        self.server: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []
        self.starts = 0

    # --- the server ----------------------------------------------------------------------------

    def start(self) -> None:
        self.starts += 1
        log = open(self.tmp / f"server-{self.starts}.log", "wb")
        self.server = subprocess.Popen(
            [self.bin, "serve", "--backend", "host", "--config", str(self.tmp / "modelshare.toml"),
             "--model-root", str(self.models), "--unix-socket", str(self.socket),
             "--handle-socket", str(self.tmp / "handles.sock"),
             "--http-listen", f"127.0.0.1:{self.http_port}",
             "--tenants-file", str(self.tmp / "tenants.toml"), "--no-worker-wait-ms", "1500"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{self.http}/readyz", timeout=2)
                return
            except Exception:
                if self.server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the server did not start:\n" + self.server_log()) from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.server is not None and self.server.poll() is None:
            self.server.send_signal(signal.SIGTERM)
            try:
                self.server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()

    def server_log(self) -> str:
        return (self.tmp / f"server-{self.starts}.log").read_text(errors="replace")

    def cli(self, *args: str, token: str = ADMIN) -> str:
        env = dict(os.environ, MODELSHARE_TOKEN=token)
        env.pop("MODELSHARE_TOKEN_FILE", None)
        done = subprocess.run([self.bin, *args, "--server", self.address], env=env,
                              capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise AssertionError(f"modelshare {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
        return done.stdout

    def sessions(self) -> list[dict]:
        return json.loads(self.cli("ps", "--output", "json"))["sessions"]

    def serving(self, worker_name: str) -> int:
        """How many sessions of ``worker_name`` serve a model now."""
        return sum(1 for s in self.sessions() if s["worker_name"] == worker_name and s.get("serving"))

    # --- workers -------------------------------------------------------------------------------

    def worker(self, name: str, *args: str, token: str = ADMIN, script: Path | None = None) -> subprocess.Popen:
        """A worker process (python/tests/worker.py with ``--name name`` and ``args``, or
        ``script`` with ``args``) told the server and ``token`` through the environment, as in
        a deployment; its output goes to a log."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("MODELSHARE_") or k == "MODELSHARE_LOG"}
        env.update(MODELSHARE_SERVER=self.address, MODELSHARE_TOKEN=token)
        log = open(self.tmp / f"worker-{name}-{len(self.workers)}.log", "wb")
        cmd = [sys.executable, str(script), *args] if script else [sys.executable, str(HERE / "worker.py"), "--name", name, *args]
        p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        p.log_path = log.name  # type: ignore[attr-defined]
        self.workers.append(p)
        return p

    def wait_serving(self, name: str, count: int = 1, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while self.serving(name) != count:
            dead = [p for p in self.workers if p.poll() is not None and name in p.log_path]  # type: ignore[attr-defined]
            if time.monotonic() > deadline:
                logs = "\n".join(Path(p.log_path).read_text(errors="replace")[-2000:] for p in dead)  # type: ignore[attr-defined]
                raise AssertionError(f"{count} worker(s) {name!r} not serving within {timeout} s\n{logs}")
            time.sleep(0.05)

    def close(self) -> None:
        for p in self.workers:
            if p.poll() is None:
                p.kill()
                p.wait()
        self.stop()


def serving_folders(stack: Stack, names, script: Path, *args: str):
    """Starts ``stack``, loads each model folder of ``names`` (public) and a worker ``script``
    serving it (``--model name --name name`` and ``args``); yields once all serve, then closes
    the stack (a generator for a module-scoped fixture)."""
    try:
        stack.start()
        for name in names:
            stack.cli("load", name, name, "--public")
            stack.worker(name, "--model", name, "--name", name, *args, script=script)
        for name in names:
            stack.wait_serving(name, timeout=180)
        yield
    finally:
        stack.close()


def started(request, tmp_path_factory, name: str):
    """A module's stack (a generator for a module-scoped fixture): started, then closed."""
    s = Stack(request.config.getoption("--bin"), tmp_path_factory.mktemp(name))
    try:
        s.start()
        yield s
    finally:
        s.close()


def stop_workers(stack: Stack) -> None:
    """Kills the test's worker processes and waits until none serves (after each test)."""
    for p in stack.workers:
        if p.poll() is None:
            p.kill()
            p.wait()
    stack.workers.clear()
    deadline = time.monotonic() + 10
    while any(s.get("serving") for s in stack.sessions()):
        assert time.monotonic() < deadline, f"workers still serving after the test: {stack.sessions()}"
        time.sleep(0.05)


def embeddings(stack: Stack, texts: list[str], token: str = TOKEN_B, timeout: float = 30.0, model: str = "enc"):
    """``/v1/embeddings`` through the official openai client."""
    import openai

    client = openai.OpenAI(base_url=f"{stack.http}/v1", api_key=token, max_retries=0, timeout=timeout)
    return client.embeddings.create(model=model, input=texts)
