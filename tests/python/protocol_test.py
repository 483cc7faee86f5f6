#!/usr/bin/env python3
"""The modelshare protocol through an independent gRPC stack (Python grpcio, stubs generated
from the project's .proto files): load, open a session, attach, redeem the fd ticket, map the
arena, check every tensor's bytes and XXH3 against the file, release, and the failure paths.

Usage: protocol_test.py [--bin target/debug/modelshare]
Prints "N passed, M failed" last; exits non-zero on any failure.
"""

import argparse
import hashlib
import json
import mmap
import os
import queue
import random
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import grpc
import xxhash
from grpc_tools import protoc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def generate_stubs(out_dir):
    """Compiles proto/modelshare/v1/*.proto into out_dir and imports them."""
    os.makedirs(out_dir, exist_ok=True)
    protos = [f"modelshare/v1/{n}.proto" for n in ("common", "serving", "admin", "worker")]
    args = ["protoc", f"-I{os.path.join(ROOT, 'proto')}", f"--python_out={out_dir}", f"--grpc_python_out={out_dir}"]
    rc = protoc.main(args + protos)
    if rc != 0:
        raise RuntimeError(f"protoc failed with {rc}")
    sys.path.insert(0, out_dir)
    from modelshare.v1 import admin_pb2, admin_pb2_grpc, common_pb2, worker_pb2, worker_pb2_grpc  # noqa: E402
    return admin_pb2, admin_pb2_grpc, common_pb2, worker_pb2, worker_pb2_grpc


def write_safetensors(path, tensors):
    """Writes a safetensors file by hand (an independent producer); returns {name: bytes}."""
    header, blobs, offset = {}, [], 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for b in blobs:
            f.write(b)
    return {name: data for name, _, _, data in tensors}


def offer(handle_socket, ticket, fd):
    """Offers a kept arena back: the ticket line with the fd attached (SCM_RIGHTS); the answer line."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(handle_socket)
        socket.send_fds(s, [ticket.encode() + b"\n"], [fd])
        answer = b""
        while not answer.endswith(b"\n"):
            chunk = s.recv(1024)
            if not chunk:
                break
            answer += chunk
        return answer


def redeem(handle_socket, ticket):
    """Sends the ticket on the handle socket and receives the arena's fd (SCM_RIGHTS)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(handle_socket)
        s.sendall(ticket.encode() + b"\n")
        msg, fds, _flags, _addr = socket.recv_fds(s, 1024, 4)
        return msg, fds


class Session:
    """A bidirectional Session stream: hello, then heartbeats from a queue."""

    def __init__(self, stub, worker_pb2, name, metadata=None):
        self.requests = queue.Queue()
        self.worker_pb2 = worker_pb2
        self.requests.put(worker_pb2.SessionRequest(hello=worker_pb2.Hello(worker_name=name, pid=os.getpid(), labels={"client": "python"})))
        self.responses = stub.Session(self._iter(), metadata=metadata)
        first = next(self.responses)
        assert first.WhichOneof("kind") == "welcome", first
        self.welcome = first.welcome
        self.stop = threading.Event()
        self.beat = threading.Thread(target=self._heartbeat, daemon=True)
        self.beat.start()

    def _iter(self):
        while True:
            item = self.requests.get()
            if item is None:
                return
            yield item

    def _heartbeat(self):
        interval = max(self.welcome.heartbeat_interval_ms, 10) / 1000
        while not self.stop.wait(interval):
            self.requests.put(self.worker_pb2.SessionRequest(heartbeat=self.worker_pb2.Heartbeat()))

    def close(self):
        self.stop.set()
        self.requests.put(None)
        self.responses.cancel()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "debug", "modelshare"))
    opts = ap.parse_args()
    results = []

    def check(name, fn):
        try:
            fn()
            results.append((name, True))
            print(f"test {name} ... ok")
        except Exception:  # noqa: BLE001 -- report every failure, keep going
            results.append((name, False))
            print(f"test {name} ... FAILED")
            traceback.print_exc()

    with tempfile.TemporaryDirectory() as tmp:
        admin_pb2, admin_pb2_grpc, common_pb2, worker_pb2, worker_pb2_grpc = generate_stubs(os.path.join(tmp, "stubs"))
        root = os.path.join(tmp, "models")
        rng = random.Random(42)
        tensors = [
            ("embed", "F32", [300, 64], rng.randbytes(300 * 64 * 4)),
            ("wq", "BF16", [64, 64], rng.randbytes(64 * 64 * 2)),
            ("ids", "I64", [17], rng.randbytes(17 * 8)),
            ("bytes", "U8", [1001], rng.randbytes(1001)),
        ]
        expected = write_safetensors(os.path.join(root, "py", "model.safetensors"), tensors)
        sock = os.path.join(tmp, "grpc.sock")
        handles = os.path.join(tmp, "handles.sock")
        log = open(os.path.join(tmp, "server.log"), "wb")
        serve_args = [opts.bin, "serve", "--backend", "host", "--unix-socket", sock, "--handle-socket", handles,
                      "--model-root", root]
        server = subprocess.Popen(serve_args, stdout=log, stderr=log)
        try:
            # tonic (h2) rejects a socket path as :authority; send "localhost" as grpc-go does.
            channel = grpc.insecure_channel(f"unix:{sock}", options=[("grpc.default_authority", "localhost")])
            admin = admin_pb2_grpc.AdminServiceStub(channel)
            worker = worker_pb2_grpc.WorkerServiceStub(channel)
            deadline = time.time() + 20
            while True:
                try:
                    admin.GetStats(admin_pb2.GetStatsRequest(), timeout=1)
                    break
                except grpc.RpcError:
                    if time.time() > deadline:
                        raise
                    time.sleep(0.05)

            state = {}

            def load():
                done = None
                for msg in admin.LoadModel(admin_pb2.LoadModelRequest(name="py", path="py")):
                    if msg.WhichOneof("event") == "done":
                        done = msg.done
                assert done is not None and done.state == common_pb2.VERSION_STATE_READY, done
                assert done.tensor_count == 4

            def open_session():
                state["session"] = Session(worker, worker_pb2, "python-worker")
                assert state["session"].welcome.session_id
                assert state["session"].welcome.device.backend == common_pb2.BACKEND_KIND_HOST

            def attach_and_read():
                sid = state["session"].welcome.session_id
                reply = worker.Attach(worker_pb2.AttachRequest(session_id=sid, model="py"))
                assert reply.WhichOneof("handle") == "host"
                state["lease"] = reply.lease_id
                msg, fds = redeem(reply.host.handle_socket, reply.host.ticket)
                assert msg == b"OK\n" and len(fds) == 1, (msg, fds)
                fd = fds[0]
                m = reply.manifest
                assert os.fstat(fd).st_size == m.arena_bytes
                view = mmap.mmap(fd, m.arena_bytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
                for t in m.tensors:
                    got = view[t.offset:t.offset + t.byte_length]
                    assert got == expected[t.name], f"bytes of {t.name} differ"
                    assert xxhash.xxh3_64_intdigest(got) == t.xxh3, f"checksum of {t.name}"
                    assert t.offset % m.alignment == 0
                # The mapping is read-only and the memfd is sealed against writes.
                try:
                    view[0] = 1
                    raise AssertionError("wrote through a read-only mapping")
                except TypeError:
                    pass
                try:
                    os.pwrite(fd, b"x", 0)
                    raise AssertionError("wrote through the sealed fd")
                except PermissionError:
                    pass
                view.close()
                os.close(fd)

            def ticket_is_single_use():
                sid = state["session"].welcome.session_id
                reply = worker.Attach(worker_pb2.AttachRequest(session_id=sid, model="py", version=1))
                msg, fds = redeem(reply.host.handle_socket, reply.host.ticket)
                for fd in fds:
                    os.close(fd)
                msg, fds = redeem(reply.host.handle_socket, reply.host.ticket)
                assert msg.startswith(b"ERR") and not fds, msg
                worker.Release(worker_pb2.ReleaseRequest(session_id=sid, lease_id=reply.lease_id))

            def release_and_errors():
                sid = state["session"].welcome.session_id
                worker.Release(worker_pb2.ReleaseRequest(session_id=sid, lease_id=state["lease"]))
                for req, code in [
                    (lambda: worker.Release(worker_pb2.ReleaseRequest(session_id=sid, lease_id=state["lease"])), grpc.StatusCode.NOT_FOUND),
                    (lambda: worker.Attach(worker_pb2.AttachRequest(session_id=sid, model="nope")), grpc.StatusCode.NOT_FOUND),
                    (lambda: worker.Attach(worker_pb2.AttachRequest(session_id="bogus", model="py")), grpc.StatusCode.NOT_FOUND),
                    (lambda: worker.Attach(worker_pb2.AttachRequest(session_id=sid, model="py", version=9)), grpc.StatusCode.NOT_FOUND),
                ]:
                    try:
                        req()
                        raise AssertionError(f"expected {code}")
                    except grpc.RpcError as e:
                        assert e.code() == code, (e.code(), e.details())

            def session_end_is_seen():
                sessions = admin.ListSessions(admin_pb2.ListSessionsRequest()).sessions
                assert len(sessions) == 1 and sessions[0].labels["client"] == "python", sessions
                state["session"].close()
                deadline = time.time() + 3
                while admin.GetStats(admin_pb2.GetStatsRequest()).sessions != 0:
                    assert time.time() < deadline, "session still open after close"
                    time.sleep(0.02)

            def offers_and_adoption_after_kill9():
                nonlocal server
                # No restart yet: nothing is wanted; a nameless offer is refused.
                no = worker.OfferHeld(worker_pb2.OfferHeldRequest(model="py", version=1, device_uuid="host",
                                                                  allocation_bytes=1))
                assert not no.wanted and "no record" in no.reason, no
                try:
                    worker.OfferHeld(worker_pb2.OfferHeldRequest())
                    raise AssertionError("a nameless offer was taken")
                except grpc.RpcError as e:
                    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (e.code(), e.details())
                # A Python worker keeps its fd of the arena while the server is killed.
                keeper = Session(worker, worker_pb2, "python-keeper")
                reply = worker.Attach(worker_pb2.AttachRequest(session_id=keeper.welcome.session_id, model="py"))
                msg, fds = redeem(reply.host.handle_socket, reply.host.ticket)
                assert msg == b"OK\n" and len(fds) == 1, (msg, fds)
                kept, arena_bytes = fds[0], reply.manifest.arena_bytes
                record = handles + ".held/py@1.json"
                deadline = time.time() + 10
                while True:
                    try:
                        holders = json.load(open(record))["holders"]
                    except (OSError, ValueError, KeyError):
                        holders = []
                    if any(h["pid"] == os.getpid() for h in holders):
                        break
                    assert time.time() < deadline, "the record never named this process"
                    time.sleep(0.05)
                keeper.stop.set()
                server.kill()
                server.wait(timeout=10)
                server = subprocess.Popen(serve_args, stdout=log, stderr=log)
                channel2 = grpc.insecure_channel(f"unix:{sock}", options=[("grpc.default_authority", "localhost")])
                admin2 = admin_pb2_grpc.AdminServiceStub(channel2)
                worker2 = worker_pb2_grpc.WorkerServiceStub(channel2)
                deadline = time.time() + 20
                while True:
                    try:
                        stats = admin2.GetStats(admin_pb2.GetStatsRequest(), timeout=1)
                        break
                    except grpc.RpcError:
                        assert time.time() < deadline, "the server did not come back"
                        time.sleep(0.05)
                assert stats.held_by_workers_bytes == arena_bytes, stats
                yes = worker2.OfferHeld(worker_pb2.OfferHeldRequest(model="py", version=1, device_uuid="host",
                                                                    allocation_bytes=arena_bytes))
                assert yes.wanted and yes.ticket, yes
                assert offer(yes.handle_socket, yes.ticket, kept) == b"OK\n"
                os.close(kept)
                models = admin2.ListModels(admin_pb2.ListModelsRequest()).models
                assert [(m.name, m.latest_ready) for m in models] == [("py", 1)], models
                assert admin2.GetStats(admin_pb2.GetStatsRequest()).held_by_workers_bytes == 0

            check("load_model_streams_to_done", load)
            check("session_hello_welcome", open_session)
            check("attach_redeem_map_and_verify", attach_and_read)
            check("ticket_is_single_use", ticket_is_single_use)
            check("release_and_error_codes", release_and_errors)
            check("closing_the_stream_ends_the_session", session_end_is_seen)
            check("offered_memory_is_adopted_after_kill9", offers_and_adoption_after_kill9)
        finally:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
            log.close()
            if any(not ok for _, ok in results):
                print(open(os.path.join(tmp, "server.log")).read()[-4000:])

        # The same contract with tenants: the hash format and the bearer header, from an
        # independent implementation (hashlib, grpcio metadata).
        admin_tok, alice, bob = "ms_py_admin", "ms_py_alice", "ms_py_bob"
        digest = lambda t: "sha256:" + hashlib.sha256(t.encode()).hexdigest()  # noqa: E731
        tenants = os.path.join(tmp, "tenants.toml")
        with open(tenants, "w") as f:
            f.write(f'[admin]\ntoken_hashes = ["{digest(admin_tok)}"]\n'
                    f'[[tenants]]\nname = "alice"\ntoken_hashes = ["{digest(alice)}"]\n'
                    f'[[tenants]]\nname = "bob"\ntoken_hashes = ["{digest(bob)}"]\n')
        sock2 = os.path.join(tmp, "grpc2.sock")
        log2 = open(os.path.join(tmp, "server2.log"), "wb")
        server2 = subprocess.Popen(
            [opts.bin, "serve", "--backend", "host", "--unix-socket", sock2, "--handle-socket",
             os.path.join(tmp, "handles2.sock"), "--model-root", root, "--tenants-file", tenants],
            stdout=log2, stderr=log2,
        )
        bearer = lambda t: [("authorization", f"Bearer {t}")]  # noqa: E731
        try:
            channel = grpc.insecure_channel(f"unix:{sock2}", options=[("grpc.default_authority", "localhost")])
            admin = admin_pb2_grpc.AdminServiceStub(channel)
            worker = worker_pb2_grpc.WorkerServiceStub(channel)
            deadline = time.time() + 20
            while not os.path.exists(sock2):
                assert time.time() < deadline, "second server did not start"
                time.sleep(0.05)

            def refused_without_a_token():
                for md in [None, bearer("ms_wrong"), [("authorization", f"Basic {alice}")]]:
                    try:
                        admin.ListModels(admin_pb2.ListModelsRequest(), metadata=md, timeout=5)
                        raise AssertionError(f"accepted {md}")
                    except grpc.RpcError as e:
                        assert e.code() == grpc.StatusCode.UNAUTHENTICATED, (e.code(), e.details())

            def tenant_attaches_its_own_model_only():
                for msg in admin.LoadModel(admin_pb2.LoadModelRequest(name="py", path="py", tenant="alice"),
                                           metadata=bearer(admin_tok)):
                    pass
                names = [m.name for m in admin.ListModels(admin_pb2.ListModelsRequest(), metadata=bearer(alice)).models]
                assert names == ["py"], names
                assert not admin.ListModels(admin_pb2.ListModelsRequest(), metadata=bearer(bob)).models
                s = Session(worker, worker_pb2, "alice-worker", metadata=bearer(alice))
                try:
                    sid = s.welcome.session_id
                    reply = worker.Attach(worker_pb2.AttachRequest(session_id=sid, model="py"), metadata=bearer(alice))
                    msg, fds = redeem(reply.host.handle_socket, reply.host.ticket)
                    assert msg == b"OK\n" and len(fds) == 1, msg
                    for fd in fds:
                        os.close(fd)
                    try:
                        worker.Attach(worker_pb2.AttachRequest(session_id=sid, model="py"), metadata=bearer(bob))
                        raise AssertionError("bob used alice's session")
                    except grpc.RpcError as e:
                        assert e.code() == grpc.StatusCode.NOT_FOUND, (e.code(), e.details())
                finally:
                    s.close()

            check("tenants_refuse_missing_and_wrong_tokens", refused_without_a_token)
            check("tenants_attach_with_a_bearer_token", tenant_attaches_its_own_model_only)
        finally:
            server2.terminate()
            try:
                server2.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server2.kill()
            log2.close()
            if any(not ok for _, ok in results):
                print(open(os.path.join(tmp, "server2.log")).read()[-4000:])

    passed = sum(ok for _, ok in results)
    failed = len(results) - passed
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
