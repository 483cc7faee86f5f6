#!/usr/bin/env python3
"""Both echo workers (the Rust modelshare-echo-worker and echo_worker.py, on the modelshare
Python package) against a fake modelshare server written here with grpcio (sessions, Attach of a sealed memfd arena over a
real handle socket, Serve driven by hand): their answers must agree byte for byte, match the
computation's definition, and follow the Serve rules (offer, credits, cancel, heartbeats,
drain and the offer again, SIGTERM).

Usage: parity_test.py [--rust-bin target/debug/modelshare-echo-worker] [--worker-python VENV/bin/python]
--worker-python: the Python worker's interpreter, one with the modelshare package installed
(default target/py-venv/bin/python, where scripts/test builds it). This script itself runs on an
interpreter without that package: its stubs are a package of the same name.
Prints "N passed, M failed" last; exits non-zero on any failure.
"""

import argparse
import array
import fcntl
import os
import queue
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from concurrent import futures

import grpc
from grpc_tools import protoc

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


class Stubs:
    """The modules compiled from proto/modelshare/v1/*.proto (filled by ``load``)."""

    common_pb2 = serving_pb2 = worker_pb2 = worker_pb2_grpc = None

    @classmethod
    def load(cls):
        with tempfile.TemporaryDirectory() as out_dir:
            protos = [f"modelshare/v1/{n}.proto" for n in ("common", "serving", "worker")]
            args = ["protoc", f"-I{os.path.join(ROOT, 'proto')}", f"--python_out={out_dir}",
                    f"--grpc_python_out={out_dir}"]
            if protoc.main(args + protos) != 0:
                raise RuntimeError("protoc failed")
            sys.path.insert(0, out_dir)
            try:
                from modelshare.v1 import common_pb2, serving_pb2, worker_pb2, worker_pb2_grpc
            finally:
                sys.path.remove(out_dir)
        cls.common_pb2, cls.serving_pb2 = common_pb2, serving_pb2
        cls.worker_pb2, cls.worker_pb2_grpc = worker_pb2, worker_pb2_grpc


ew = Stubs

HEARTBEAT_MS = 100
# The arena: a non-float tensor first in name order, then w ("emb", F32), then a BF16 one.
W = [round(0.1 * i - 3.3, 3) for i in range(100)]


def arena_bytes():
    buf = bytearray(1024)
    struct.pack_into("<2q", buf, 0, 5, 6)
    struct.pack_into("<100f", buf, 256, *W)
    struct.pack_into("<4H", buf, 768, 0x3F80, 0x4000, 0x4040, 0x4080)
    return bytes(buf)


def manifest():
    c = ew.common_pb2
    return c.Manifest(model="tiny", version=1, arena_bytes=1024, alignment=256, tensors=[
        c.TensorInfo(name="a_ids", dtype=c.DTYPE_I64, shape=[2], offset=0, byte_length=16),
        c.TensorInfo(name="emb", dtype=c.DTYPE_F32, shape=[100], offset=256, byte_length=400),
        c.TensorInfo(name="z", dtype=c.DTYPE_BF16, shape=[4], offset=768, byte_length=8),
    ])


def sealed_memfd(data):
    fd = os.memfd_create("tiny@1", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, len(data))
    os.pwrite(fd, data, 0)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL)
    return fd


class Call:
    """One Serve call seen from the server: the worker's messages, and events to send."""

    def __init__(self, request_iterator):
        self.inbound, self.outbound = queue.Queue(), queue.Queue()

        def read():
            try:
                for m in request_iterator:
                    self.inbound.put(m)
            except Exception:  # noqa: BLE001 -- the call ended
                pass
            self.inbound.put(None)

        threading.Thread(target=read, daemon=True).start()

    def recv(self, timeout=5):
        """The worker's next message (None: it closed its side)."""
        return self.inbound.get(timeout=timeout)

    def recv_no_beat(self, timeout=5):
        while True:
            m = self.recv(timeout)
            if m is None or m.WhichOneof("kind") != "heartbeat":
                return m

    def result(self, timeout=5):
        m = self.recv_no_beat(timeout)
        assert m is not None and m.WhichOneof("kind") == "result", m
        return m.result

    def send(self, **kind):
        self.outbound.put(ew.worker_pb2.ServeEvent(**kind))

    def end(self):
        self.outbound.put(None)


class Fake:
    """The fake WorkerService."""

    def __init__(self, tmp):
        self.fd = sealed_memfd(arena_bytes())
        self.handles = os.path.join(tmp, "handles.sock")
        self.calls = queue.Queue()
        self.sessions = 0
        self.lock = threading.Lock()
        lst = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        lst.bind(self.handles)
        lst.listen(16)

        def handles():
            while True:
                conn, _ = lst.accept()
                with conn:
                    conn.recv(1024)
                    socket.send_fds(conn, [b"OK\n"], [self.fd])

        threading.Thread(target=handles, daemon=True).start()

    # The servicer methods.
    def Session(self, request_iterator, context):
        first = next(request_iterator)
        assert first.WhichOneof("kind") == "hello"
        with self.lock:
            self.sessions += 1
            sid = f"s{self.sessions}"
        yield ew.worker_pb2.SessionEvent(welcome=ew.worker_pb2.Welcome(session_id=sid, heartbeat_interval_ms=HEARTBEAT_MS))
        for _ in request_iterator:
            pass

    def Attach(self, request, context):
        return ew.worker_pb2.AttachResponse(lease_id=f"l-{request.session_id}", manifest=manifest(),
                                            host=ew.worker_pb2.HostArenaHandle(ticket="t", handle_socket=self.handles, ticket_ttl_ms=5000))

    def Release(self, request, context):
        return ew.worker_pb2.ReleaseResponse()

    def Serve(self, request_iterator, context):
        call = Call(request_iterator)
        self.calls.put(call)
        while True:
            ev = call.outbound.get()
            if ev is None:
                return
            if isinstance(ev, tuple):
                context.abort(*ev)
            yield ev

    def accept(self, timeout=20):
        """The next Serve call, its offer accepted."""
        call = self.calls.get(timeout=timeout)
        m = call.recv(timeout)
        assert m.WhichOneof("kind") == "offer", m
        call.send(accepted=ew.serving_pb2.ServeAccepted(serve_id="serve-1", version=m.offer.version))
        return call, m.offer


def start_fake(tmp):
    fake = Fake(tmp)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
    # The calls the fake leaves out answer UNIMPLEMENTED, as the generated base class does.
    base = ew.worker_pb2_grpc.WorkerServiceServicer()
    for name in dir(base):
        if not name.startswith("_") and not hasattr(fake, name):
            setattr(fake, name, getattr(base, name))
    ew.worker_pb2_grpc.add_WorkerServiceServicer_to_server(fake, server)
    sock = os.path.join(tmp, "grpc.sock")
    server.add_insecure_port(f"unix:{sock}")
    server.start()
    return fake, server, f"unix:{sock}"


# --- the cases --------------------------------------------------------------------------------

S = None  # serving_pb2, once the stubs are loaded


def text(i, s, **params):
    return S.Item(item_id=i, text=S.TextInput(text=s), parameters=params)


def tensors(i, *ts, **params):
    return S.Item(item_id=i, tensors=S.Tensors(tensors=[S.TensorInput(name=n, dtype=d, shape=sh, data=data) for n, d, sh, data in ts]),
                  parameters=params)


def items():
    c = ew.common_pb2
    P = S.Parameter
    return [
        text(1, "hello world"),
        text(2, "héllo  wörld\n\u3000x\x1cy"),
        text(3, ""),
        text(4, "fail:told to fail"),
        text(5, "sleep:30 after a nap"),
        text(6, "sleep:abc"),
        text(7, "dims", dimensions=P(int64_value=3)),
        text(8, "dims", dimensions=P(int64_value=100)),
        text(9, "dims", dimensions=P(int64_value=101)),
        text(10, "dims", dimensions=P(uint64_value=5)),
        text(11, "dims", dimensions=P(string_value="5")),
        text(12, "dims", dimensions=P(int64_value=0), other=P(bool_value=True)),
        tensors(13, ("input_ids", c.DTYPE_I64, [3], struct.pack("<3q", 1, 2, 3))),
        tensors(14, ("input_ids", c.DTYPE_I32, [5], struct.pack("<5i", 1, 2, 3, 4, 5)), dimensions=P(int64_value=2)),
        tensors(15, ("input_ids", c.DTYPE_I64, [1, 2], struct.pack("<2q", 1, 2))),
        tensors(16, ("x", c.DTYPE_F32, [2, 3], struct.pack("<6f", 1e38, 3.4e38, -0.1, 0.3, 7.0, 1e-40))),
        tensors(17, ("x", c.DTYPE_I64, [2], struct.pack("<2q", -1, 2)), ("y", c.DTYPE_F32, [1], struct.pack("<f", 1))),
        tensors(18, ("s", c.DTYPE_BYTES, [2], b"\2\0\0\0hi\0\0\0\0")),
        tensors(19),
        tensors(20, ("x", c.DTYPE_F32, [3], b"\0" * 8)),
        tensors(21, ("x", c.DTYPE_BYTES, [2], b"\1\0\0\0a")),
        tensors(22, ("x", 99, [1], b"\0" * 4)),
        tensors(23, ("x", c.DTYPE_F32, [1], b"\0" * 4), ("x", c.DTYPE_F32, [1], b"\0" * 4)),
        tensors(24, ("x", c.DTYPE_F32, [-1], b"")),
        tensors(25, ("input_ids", c.DTYPE_I64, [0], b"")),
        S.Item(item_id=26),
        S.Item(item_id=27, text=S.TextInput(text="too late"), deadline_unix_ms=1),
        tensors(28, ("x", c.DTYPE_F32, [0], b"")),
    ]


def canonical(result):
    """{item id: outcome} in a comparable form."""
    out = {}
    for r in result.results:
        if r.WhichOneof("outcome") == "error":
            out[r.item_id] = ("error", r.error.code, r.error.message)
        else:
            ts = [(t.name, t.dtype, list(t.shape), t.data.hex()) for t in r.output.tensors]
            ps = sorted((k, str(v)) for k, v in r.output.parameters.items())
            out[r.item_id] = ("output", ts, ps)
    return out


def f32_add(a, b):
    return array.array("f", [array.array("f", [a])[0] + array.array("f", [b])[0]])[0]


def check_against_definition(got):
    """Spot checks of the computation's definition, independent of both workers."""
    w = array.array("f", W)

    def emb(i):
        kind, ts, ps = got[i]
        assert kind == "output", got[i]
        (name, dtype, shape, data), = ts
        assert name == "embedding" and dtype == ew.common_pb2.DTYPE_F32
        values = array.array("f", bytes.fromhex(data))
        return list(values), shape, dict(ps)

    v, shape, ps = emb(1)
    assert shape == [64] and v == [f32_add(w[j], 11) for j in range(64)], v[:3]
    assert ps["prompt_tokens"].strip() == "int64_value: 2"
    v, shape, ps = emb(2)
    n = len("héllo  wörld\n\u3000x\x1cy".encode())
    assert v[0] == f32_add(w[0], n) and ps["prompt_tokens"].strip() == "int64_value: 3", (v[0], ps)
    assert emb(7)[1] == [3] and emb(8)[1] == [100] and emb(10)[1] == [5]
    for i in (9, 11, 12):
        assert got[i] == ("error", 3, "parameter 'dimensions' must be an integer from 1 to 100"), got[i]
    assert got[4] == ("error", 3, "told to fail")
    v, shape, ps = emb(14)
    assert v == [f32_add(w[0], 5), f32_add(w[1], 5)] and ps["prompt_tokens"].strip() == "int64_value: 5"
    kind, ts, _ = got[16]
    assert [t[0] for t in ts] == ["echo", "plus_weights"] and ts[0][3] == struct.pack("<6f", 1e38, 3.4e38, -0.1, 0.3, 7.0, 1e-40).hex()
    plus = array.array("f", bytes.fromhex(ts[1][3]))
    assert plus[1] == f32_add(3.4e38, w[1]) and plus[0] == f32_add(1e38, w[0])
    assert [t[0] for t in got[17][1]] == ["echo"] and got[17][1][0][1] == ew.common_pb2.DTYPE_I64
    assert got[15][1][0][0] == "echo"
    assert emb(25)[1] == [64] and emb(25)[0][0] == w[0]
    for i in (6, 19, 20, 21, 22, 23, 24, 26):
        assert got[i][0] == "error" and got[i][1] == 3, (i, got[i])
    assert got[27][:2] == ("error", 4)


def run_worker(cmd, fake, address, log):
    proc = subprocess.Popen(cmd + ["--server", address, "--model", "tiny", "--credits", "2"],
                            stdout=log, stderr=log, env={**os.environ, "RUST_LOG": "info"})
    return proc


def exercise(fake, proc):
    """The rules and the answers of one worker; returns its canonical answers."""
    call, offer = fake.accept()
    assert (offer.model, offer.version, offer.credits, offer.max_batch_items) == ("tiny", 1, 2, 32), offer
    assert offer.max_batch_bytes == 4 << 20 and sorted(offer.accepts) == ["tensor", "text"], offer
    assert offer.session_id.startswith("s"), offer
    assert [s.name for s in offer.outputs] == ["embedding", "echo", "plus_weights"], offer.outputs

    # Answers: one batch of every case.
    call.send(batch=S.Batch(batch_id=1, version=1, items=items()))
    r = call.result()
    assert r.batch_id == 1
    got = canonical(r)
    assert sorted(got) == [i.item_id for i in items()], sorted(got)
    check_against_definition(got)

    # Oversized: 33 items.
    call.send(batch=S.Batch(batch_id=2, version=1, items=[text(100 + i, "x") for i in range(33)]))
    r = call.result()
    assert {c[1] for c in canonical(r).values()} == {13}, canonical(r)

    # Heartbeats while idle.
    t0, beats = time.time(), 0
    while time.time() - t0 < 0.6:
        try:
            m = call.recv(timeout=0.7)
        except queue.Empty:
            break
        assert m.WhichOneof("kind") == "heartbeat", m
        beats += 1
    assert 3 <= beats <= 8, beats

    # Credits and cancel: two sleeping batches take both credits; a third (beyond them) waits
    # and is cancelled whole before it starts; one item of a running batch is cancelled.
    call.send(batch=S.Batch(batch_id=3, version=1, items=[text(301, "sleep:400 a"), text(302, "sleep:400 b")]))
    call.send(batch=S.Batch(batch_id=4, version=1, items=[text(401, "sleep:400 c")]))
    call.send(batch=S.Batch(batch_id=5, version=1, items=[text(501, "d"), text(502, "e")]))
    call.send(cancel=S.Cancel(item_ids=[302, 501, 502]))
    results = {}
    for _ in range(3):
        r = call.result(timeout=5)
        results[r.batch_id] = canonical(r)
    assert results[3][301][0] == "output" and results[3][302][:2] == ("error", 1), results[3]
    assert results[4][401][0] == "output"
    assert results[5] == {501: ("error", 1, "the server cancelled the item"), 502: ("error", 1, "the server cancelled the item")}, results[5]

    # Cancelling every item of a sleeping batch ends its sleep early.
    call.send(batch=S.Batch(batch_id=6, version=1, items=[text(601, "sleep:3000 long")]))
    time.sleep(0.1)
    t0 = time.time()
    call.send(cancel=S.Cancel(item_ids=[601]))
    r = call.result()
    assert canonical(r)[601][:2] == ("error", 1) and time.time() - t0 < 1.5

    # Drain: the batch in flight is answered, the worker closes, then offers again.
    call.send(batch=S.Batch(batch_id=7, version=1, items=[text(701, "sleep:300 x")]))
    time.sleep(0.05)
    call.send(drain=S.Drain(reason="version 1 is draining"))
    r = call.result()
    assert r.batch_id == 7 and canonical(r)[701][0] == "output"
    assert call.recv_no_beat() is None, "the worker closes its side after a drain"
    call.end()
    call, offer = fake.accept()
    assert offer.model == "tiny"

    # SIGTERM: the batch in flight is answered, the stream closed, exit 0.
    call.send(batch=S.Batch(batch_id=8, version=1, items=[text(801, "sleep:300 y")]))
    time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    r = call.result()
    assert r.batch_id == 8 and canonical(r)[801][0] == "output"
    assert call.recv_no_beat() is None, "the worker closes its side after SIGTERM"
    call.end()
    assert proc.wait(timeout=10) == 0
    return got


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rust-bin", default=os.path.join(ROOT, "target", "debug", "modelshare-echo-worker"))
    ap.add_argument("--worker-python", default=os.path.join(ROOT, "target", "py-venv", "bin", "python"),
                    help="the Python worker's interpreter, with the modelshare package installed")
    opts = ap.parse_args()
    global S
    ew.load()
    S = ew.serving_pb2
    workers = [("rust", [opts.rust_bin]), ("python", [opts.worker_python, os.path.join(HERE, "echo_worker.py")])]
    answers, passed, failed = {}, 0, 0
    for name, cmd in workers:
        with tempfile.TemporaryDirectory() as tmp:
            fake, server, address = start_fake(tmp)
            log_path = os.path.join(tmp, "worker.log")
            with open(log_path, "wb") as log:
                proc = run_worker(cmd, fake, address, log)
                try:
                    answers[name] = exercise(fake, proc)
                    print(f"test {name}_worker_follows_the_rules ... ok")
                    passed += 1
                except Exception:  # noqa: BLE001 -- report, go on with the other worker
                    print(f"test {name}_worker_follows_the_rules ... FAILED")
                    traceback.print_exc()
                    failed += 1
                finally:
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait()
                    server.stop(0)
            if failed:
                print(open(log_path, errors="replace").read()[-4000:])
    if len(answers) == 2:
        if answers["rust"] == answers["python"]:
            print("test workers_agree_byte_for_byte ... ok")
            passed += 1
        else:
            print("test workers_agree_byte_for_byte ... FAILED")
            for i in sorted(answers["rust"]):
                if answers["rust"][i] != answers["python"].get(i):
                    print(f"  item {i}:\n    rust:   {answers['rust'][i]}\n    python: {answers['python'].get(i)}")
            failed += 1
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
