"""Failures are `modelshare.Error` subclasses, raised promptly: a wrong token, an unknown or
invisible model, no server, a server that never answers; tokens from the environment and files;
waits release the GIL and give way to signals."""

from __future__ import annotations

import signal
import socket
import threading
import time
import uuid

import pytest

import modelshare
from conftest import ADMIN, TOKEN_A, TOKEN_B, Server


def name() -> str:
    return f"errors-{uuid.uuid4().hex[:8]}"


def test_wrong_token_is_unauthenticated(server: Server):
    """A token the server does not know is refused at once, as Unauthenticated."""
    start = time.monotonic()
    with pytest.raises(modelshare.Unauthenticated) as caught:
        modelshare.Session.open(server.address, name=name(), token="ms_not_a_token")
    assert time.monotonic() - start < 10
    assert caught.value.code == "UNAUTHENTICATED"
    assert isinstance(caught.value, modelshare.Error)
    assert "ms_not_a_token" not in str(caught.value), "a token must never be echoed"


def test_unknown_model_is_not_found(server: Server):
    """An unknown model, and another tenant's private one, are NotFound, not a hang."""
    with modelshare.Session.open(server.address, name=name(), token=TOKEN_B) as session:
        start = time.monotonic()
        for model in ("no-such-model", "private"):
            with pytest.raises(modelshare.NotFound) as caught:
                session.attach(model)
            assert caught.value.code == "NOT_FOUND"
        assert time.monotonic() - start < 10
    with modelshare.Session.open(server.address, name=name(), token=TOKEN_A) as owner:
        assert owner.attach("private").version == 1


def test_token_from_environment_and_file(server: Server, tmp_path, monkeypatch: pytest.MonkeyPatch):
    """With no token argument the SDK's variables are read; a token argument overrides them."""
    monkeypatch.delenv("MODELSHARE_TOKEN_FILE", raising=False)
    monkeypatch.setenv("MODELSHARE_TOKEN", TOKEN_A)
    with modelshare.Session.open(server.address, name=name()) as session:
        assert session.attach("private").version == 1
    monkeypatch.setenv("MODELSHARE_TOKEN", "ms_wrong")
    with pytest.raises(modelshare.Unauthenticated):
        modelshare.Session.open(server.address, name=name())
    with modelshare.Session.open(server.address, name=name(), token=TOKEN_A) as session:
        assert session.attach("small").version == 1
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN_A + "\n")
    monkeypatch.delenv("MODELSHARE_TOKEN")
    monkeypatch.setenv("MODELSHARE_TOKEN_FILE", str(token_file))
    with modelshare.Session.open(server.address, name=name()) as session:
        assert session.attach("private").version == 1
    monkeypatch.delenv("MODELSHARE_TOKEN_FILE")
    with modelshare.Session.open(server.address, name=name(), token_file=token_file) as session:
        assert session.attach("private").version == 1
    with pytest.raises(modelshare.CredentialsError, match="token file"):
        modelshare.Session.open(server.address, name=name(), token_file=tmp_path / "missing")
    with pytest.raises(ValueError):
        modelshare.Session.open(server.address, name=name(), token=TOKEN_A, token_file=token_file)


def test_no_server_is_a_connect_error(tmp_path, monkeypatch: pytest.MonkeyPatch):
    """Nothing listening, a malformed address, or no address and no server where one listens by
    default: ConnectError."""
    with pytest.raises(modelshare.ConnectError):
        modelshare.Session.open(f"unix:{tmp_path}/none.sock", name=name())
    with pytest.raises(modelshare.ConnectError):
        modelshare.Session.open("not an address", name=name())
    # No address: the discovery rule, which names every place it looked.
    monkeypatch.delenv("MODELSHARE_SERVER", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    with pytest.raises(modelshare.ConnectError) as refused:
        modelshare.Session.open(name=name(), timeout=5)
    for place in ("MODELSHARE_SERVER: not set", f"unix:{tmp_path}/modelshare-", "--server"):
        assert place in str(refused.value), refused.value


def test_no_address_finds_the_server_by_the_rule(server, monkeypatch: pytest.MonkeyPatch):
    """``Session.open()`` with no address takes ``MODELSHARE_SERVER``, as the CLI and the Rust
    workers do."""
    monkeypatch.setenv("MODELSHARE_SERVER", server.address)
    session = modelshare.Session.open(name=name(), token=ADMIN)
    try:
        assert session.server == server.address
    finally:
        session.close()


@pytest.fixture
def silent_server():
    """A TCP port that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()


def test_timeout_and_the_gil(silent_server: str):
    """A server that never answers times out as asked, and Python threads run meanwhile (the
    wait holds no GIL)."""
    ticks = 0
    stop = threading.Event()

    def count() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.001)

    counter = threading.Thread(target=count)
    counter.start()
    start = time.monotonic()
    try:
        with pytest.raises(modelshare.Timeout):
            modelshare.Session.open(silent_server, name=name(), timeout=1.0)
    finally:
        stop.set()
        counter.join()
    elapsed = time.monotonic() - start
    assert 0.9 <= elapsed < 5, elapsed
    assert ticks > 50, f"the other thread ran {ticks} times in {elapsed:.1f} s"


def test_a_signal_interrupts_a_wait(silent_server: str):
    """A signal handler's exception (Ctrl-C's KeyboardInterrupt) ends a wait with no timeout."""

    class Interrupted(Exception):
        pass

    def handler(signum, frame):
        raise Interrupted

    previous = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        start = time.monotonic()
        with pytest.raises(Interrupted):
            modelshare.Session.open(silent_server, name=name(), timeout=None)
        assert time.monotonic() - start < 3
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
