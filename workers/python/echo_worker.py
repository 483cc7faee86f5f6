#!/usr/bin/env python3
"""The modelshare echo worker in Python, from the .proto files alone (grpcio, stubs compiled
from proto/ at start): the same computation and the same Serve rules as the Rust
modelshare-echo-worker (workers/echo), so that the server's tests can run either.

Computation (see workers/echo/src/echo.rs, the reference):
- w: the model's first tensor in name order whose dtype is F32, F16 or BF16, flattened, as
  f32 values; [0.0] if there is none (or it has no elements). Read in place from the mapped
  arena.
- Text item s: "fail:MSG" fails with INVALID_ARGUMENT, message MSG. "sleep:N ..." (N: the
  characters after "sleep:" up to the first space or the end, ASCII digits, else
  INVALID_ARGUMENT) sleeps N ms first (a batch sleeps once, for its longest item, and stops
  early once all its items are cancelled). Output "embedding", FP32, [D]:
  w[j] + (UTF-8 byte length of s), rounded to f32 as an f32 addition; output parameter
  "prompt_tokens" (int64): the words of s split on Unicode white space (Rust's
  char::is_whitespace set).
- D: item parameter "dimensions" (int64, or uint64 that fits int64) if given, else
  min(len(w), 64); anything else, or outside 1..len(w), fails with INVALID_ARGUMENT
  "parameter 'dimensions' must be an integer from 1 to {len(w)}".
- Tensor item whose only input is "input_ids", INT32 or INT64, shape [n]: as text with the
  byte length replaced by n; prompt_tokens = n.
- Other tensor items: output "echo" = the first input tensor unchanged (dtype, shape, bytes);
  if it is FP32 also "plus_weights", FP32, same shape, x[k] + w[k % len(w)]. No tensors:
  INVALID_ARGUMENT.

Serve rules (as the Rust SDK's Session::serve): at most --credits batches run at once (a batch
sent beyond them waits); exactly one BatchResult per batch; items cancelled before their batch
starts, past their deadline, or with malformed input are answered without running; an item
cancelled while it ran is answered CANCELLED; heartbeats when nothing else was sent for the
session's heartbeat interval; on Drain, answer what is held, close, then attach the latest
version and serve again; on SIGTERM/SIGINT, answer what is held (batches sent after the signal
are left to the server, which requeues them), close, exit 0. A broken stream: open a new
session and start again, with backoff.

Usage: echo_worker.py --server unix:/path --model NAME [--credits 2] [--token T]
       echo_worker.py --self-test
Prints "serving <model> v<version>" on stdout each time an offer is accepted.
"""

import argparse
import array
import collections
import concurrent.futures
import mmap
import os
import queue
import re
import signal
import socket
import struct
import sys
import tempfile
import threading
import time

import grpc
from grpc_tools import protoc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Filled by load_stubs().
common_pb2 = serving_pb2 = worker_pb2 = worker_pb2_grpc = None

DEFAULT_DIMENSIONS = 64
ACCEPT_TIMEOUT = 10.0
CLOSE_TIMEOUT = 5.0
MIN_BACKOFF, MAX_BACKOFF = 0.1, 2.0

# gRPC status codes, as google.rpc.Code numbers.
CANCELLED, INVALID_ARGUMENT, DEADLINE_EXCEEDED, INTERNAL, UNAVAILABLE = 1, 3, 4, 13, 14

# Rust's char::is_whitespace (Unicode White_Space); Python's str.split() uses another set.
WHITESPACE = re.compile("[\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+")


def log(msg):
    print(f"echo_worker: {msg}", file=sys.stderr, flush=True)


def load_stubs():
    """Compiles proto/modelshare/v1/*.proto into a temporary directory and imports them."""
    global common_pb2, serving_pb2, worker_pb2, worker_pb2_grpc
    with tempfile.TemporaryDirectory() as out_dir:
        protos = [f"modelshare/v1/{n}.proto" for n in ("common", "serving", "worker")]
        args = ["protoc", f"-I{os.path.join(ROOT, 'proto')}", f"--python_out={out_dir}", f"--grpc_python_out={out_dir}"]
        rc = protoc.main(args + protos)
        if rc != 0:
            raise RuntimeError(f"protoc failed with {rc}")
        sys.path.insert(0, out_dir)
        try:
            from modelshare.v1 import common_pb2 as c, serving_pb2 as s, worker_pb2 as w, worker_pb2_grpc as g  # noqa: E402
        finally:
            sys.path.remove(out_dir)
    common_pb2, serving_pb2, worker_pb2, worker_pb2_grpc = c, s, w, g


class Failure(Exception):
    """One item's failure: a google.rpc.Code and a message for the caller."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code, self.message = code, message


def invalid(message):
    return Failure(INVALID_ARGUMENT, message)


# --- dtypes -----------------------------------------------------------------------------------

def element_size(dtype):
    """Bytes per element; None for BYTES and unknown dtypes."""
    d = common_pb2
    sizes = {
        d.DTYPE_BOOL: 1, d.DTYPE_U8: 1, d.DTYPE_I8: 1, d.DTYPE_F8_E4M3: 1, d.DTYPE_F8_E5M2: 1, d.DTYPE_F8_E8M0: 1,
        d.DTYPE_I16: 2, d.DTYPE_U16: 2, d.DTYPE_F16: 2, d.DTYPE_BF16: 2,
        d.DTYPE_I32: 4, d.DTYPE_U32: 4, d.DTYPE_F32: 4,
        d.DTYPE_F64: 8, d.DTYPE_I64: 8, d.DTYPE_U64: 8, d.DTYPE_C64: 8,
    }
    return sizes.get(dtype)


def oip_datatype(dtype):
    d = common_pb2
    names = {
        d.DTYPE_BOOL: "BOOL", d.DTYPE_U8: "UINT8", d.DTYPE_I8: "INT8", d.DTYPE_I16: "INT16", d.DTYPE_U16: "UINT16",
        d.DTYPE_F16: "FP16", d.DTYPE_BF16: "BF16", d.DTYPE_I32: "INT32", d.DTYPE_U32: "UINT32", d.DTYPE_F32: "FP32",
        d.DTYPE_F64: "FP64", d.DTYPE_I64: "INT64", d.DTYPE_U64: "UINT64", d.DTYPE_F8_E4M3: "F8_E4M3",
        d.DTYPE_F8_E5M2: "F8_E5M2", d.DTYPE_F8_E8M0: "F8_E8M0", d.DTYPE_C64: "C64", d.DTYPE_BYTES: "BYTES",
    }
    return names.get(dtype, "UNSPECIFIED")


def shape_str(shape):
    """A shape as Rust's Debug prints a Vec<i64>."""
    return "[" + ", ".join(str(d) for d in shape) + "]"


USIZE_MAX = (1 << 64) - 1


def element_count(shape):
    n = 1
    for d in shape:
        if d < 0:
            return None
        n *= d
        if n > USIZE_MAX:
            return None
    return n


def split_strings(data):
    """OIP BYTES elements (4-byte LE length, then the bytes); None if malformed."""
    out, i = [], 0
    while i < len(data):
        if len(data) - i < 4:
            return None
        (n,) = struct.unpack_from("<I", data, i)
        i += 4
        if len(data) - i < n:
            return None
        out.append(bytes(data[i:i + n]))
        i += n
    return out


class Tensor:
    """An input or output tensor: name, dtype (common_pb2.DType number), shape, bytes."""

    def __init__(self, name, dtype, shape, data):
        self.name, self.dtype, self.shape, self.data = name, dtype, list(shape), bytes(data)

    def __repr__(self):
        return f"Tensor({self.name!r}, {self.dtype}, {self.shape}, {len(self.data)} bytes)"


def check_tensors(tensors):
    """The SDK's checks of an item's tensors (same order, same messages); returns [Tensor]."""
    seen, out = set(), []
    for t in tensors:
        if t.name in seen:
            raise invalid(f"input tensor '{t.name}' appears twice")
        seen.add(t.name)
        if t.dtype == common_pb2.DTYPE_UNSPECIFIED or t.dtype not in common_pb2.DType.values():
            raise invalid(f"input tensor '{t.name}' has no known dtype ({t.dtype})")
        shape = list(t.shape)
        count = element_count(shape)
        if count is None:
            raise invalid(f"input tensor '{t.name}' has an impossible shape {shape_str(shape)}")
        size = element_size(t.dtype)
        if size is not None:
            need = count * size
            if need != len(t.data):
                need_s = str(need) if need <= USIZE_MAX else "more"
                raise invalid(f"input tensor '{t.name}' has {len(t.data)} bytes, its shape {shape_str(shape)} "
                              f"of {oip_datatype(t.dtype)} needs {need_s}")
        else:
            strings = split_strings(t.data)
            if strings is None or len(strings) != count:
                raise invalid(f"input tensor '{t.name}' (BYTES, shape {shape_str(shape)}) must hold {count} "
                              "length-prefixed strings")
        out.append(Tensor(t.name, t.dtype, shape, t.data))
    return out


# --- the computation --------------------------------------------------------------------------

def f32(x):
    """x rounded to the nearest f32 (as Rust's `as f32` and f32 arithmetic round)."""
    return array.array("f", [x])[0]


class Weights:
    """w: read on demand from a buffer (the mapped arena, or bytes) at `offset`."""

    def __init__(self, buf, offset, dtype, length):
        self.buf, self.offset, self.dtype, self.len = buf, offset, dtype, length

    @staticmethod
    def from_f32(values):
        values = list(values) or [0.0]
        return Weights(array.array("f", values).tobytes(), 0, common_pb2.DTYPE_F32, len(values))

    @staticmethod
    def of_manifest(manifest, buf):
        floats = (common_pb2.DTYPE_F32, common_pb2.DTYPE_F16, common_pb2.DTYPE_BF16)
        for t in sorted(manifest.tensors, key=lambda t: t.name):
            if t.dtype in floats:
                n = 1
                for d in t.shape:
                    n *= d
                if n == 0:
                    break
                size = element_size(t.dtype)
                if t.byte_length < n * size or t.offset + n * size > len(buf):
                    raise RuntimeError(f"tensor '{t.name}' does not hold its {n} elements")
                return Weights(buf, t.offset, t.dtype, n)
        return Weights.from_f32([0.0])

    def get(self, i):
        if self.dtype == common_pb2.DTYPE_F32:
            return struct.unpack_from("<f", self.buf, self.offset + 4 * i)[0]
        if self.dtype == common_pb2.DTYPE_F16:
            return struct.unpack_from("<e", self.buf, self.offset + 2 * i)[0]
        (bits,) = struct.unpack_from("<H", self.buf, self.offset + 2 * i)
        return struct.unpack("<f", struct.pack("<I", bits << 16))[0]


def sleep_ms(kind, value):
    """Milliseconds a text item asks to sleep (0: none); raises INVALID_ARGUMENT if malformed."""
    if kind != "text" or not value.startswith("sleep:"):
        return 0
    digits = value[len("sleep:"):].split(" ", 1)[0]
    if (not digits or not all("0" <= c <= "9" for c in digits)
            or len(digits.lstrip("0")) > 20 or int(digits) > (1 << 64) - 1):
        raise invalid(f"sleep:N needs N in milliseconds, got '{digits}'")
    return int(digits)


def dimensions(w, params):
    p = params.get("dimensions")
    if p is None:
        return min(w.len, DEFAULT_DIMENSIONS)
    which = p.WhichOneof("value")
    d = None
    if which == "int64_value":
        d = p.int64_value
    elif which == "uint64_value" and p.uint64_value < (1 << 63):
        d = p.uint64_value
    if d is None or not 1 <= d <= w.len:
        raise invalid(f"parameter 'dimensions' must be an integer from 1 to {w.len}")
    return d


def embed(w, params, add, prompt_tokens):
    d = dimensions(w, params)
    add = f32(add)
    values = array.array("f", [w.get(j) + add for j in range(d)])
    return [Tensor("embedding", common_pb2.DTYPE_F32, [d], values.tobytes())], {"prompt_tokens": prompt_tokens}


def compute(w, kind, value, params):
    """One item's output, ([Tensor], {name: int64}); raises Failure. `kind` is "text" (value: str)
    or "tensors" (value: [Tensor], checked); params: {name: serving_pb2.Parameter}."""
    if kind == "text":
        if value.startswith("fail:"):
            raise invalid(value[len("fail:"):])
        words = len([x for x in WHITESPACE.split(value) if x])
        return embed(w, params, len(value.encode("utf-8")), words)
    tensors = value
    if not tensors:
        raise invalid("the item has no input tensors")
    first = tensors[0]
    if (len(tensors) == 1 and first.name == "input_ids"
            and first.dtype in (common_pb2.DTYPE_I32, common_pb2.DTYPE_I64) and len(first.shape) == 1):
        n = first.shape[0]
        return embed(w, params, n, n)
    out = [Tensor("echo", first.dtype, first.shape, first.data)]
    if first.dtype == common_pb2.DTYPE_F32:
        x = array.array("f")
        x.frombytes(first.data)
        plus = array.array("f", [v + w.get(k % w.len) for k, v in enumerate(x)])
        out.append(Tensor("plus_weights", common_pb2.DTYPE_F32, first.shape, plus.tobytes()))
    return out, {}


# --- wire helpers -----------------------------------------------------------------------------

def item_result(item_id, outcome):
    """outcome: ([Tensor], {name: int}) or a Failure."""
    if isinstance(outcome, Failure):
        return serving_pb2.ItemResult(item_id=item_id, error=serving_pb2.ItemError(code=outcome.code, message=outcome.message))
    tensors, params = outcome
    return serving_pb2.ItemResult(item_id=item_id, output=serving_pb2.ItemOutput(
        tensors=[serving_pb2.TensorOutput(name=t.name, dtype=t.dtype, shape=t.shape, data=t.data) for t in tensors],
        parameters={k: serving_pb2.Parameter(int64_value=v) for k, v in params.items()},
    ))


def item_input(item):
    """(kind, value) of a wire item after the SDK's checks; raises Failure."""
    which = item.WhichOneof("input")
    if which == "text":
        return "text", item.text.text
    if which == "tensors":
        return "tensors", check_tensors([Tensor(t.name, t.dtype, t.shape, t.data) for t in item.tensors.tensors])
    raise invalid("the item has no input")


def input_bytes(item):
    which = item.WhichOneof("input")
    if which == "text":
        return len(item.text.text.encode("utf-8"))
    if which == "tensors":
        return sum(len(t.data) for t in item.tensors.tensors)
    return 0


def redeem(handle_socket, ticket):
    """Sends the ticket on the handle socket and receives the arena's fd (SCM_RIGHTS)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(handle_socket)
        s.sendall(ticket.encode() + b"\n")
        msg, fds, _flags, _addr = socket.recv_fds(s, 1024, 4)
        return msg, fds


class Session:
    """A bidirectional Session stream: hello, then heartbeats from a queue."""

    def __init__(self, stub, name, metadata):
        self.requests = queue.Queue()
        self.requests.put(worker_pb2.SessionRequest(hello=worker_pb2.Hello(
            worker_name=name, pid=os.getpid(), labels={"worker": "python-echo"})))
        self.responses = stub.Session(self._iter(), metadata=metadata)
        first = next(self.responses)
        if first.WhichOneof("kind") != "welcome":
            raise RuntimeError(f"the server's first session message was not a welcome: {first}")
        self.welcome = first.welcome
        self.stop = threading.Event()
        threading.Thread(target=self._heartbeat, daemon=True).start()

    def _iter(self):
        while True:
            item = self.requests.get()
            if item is None:
                return
            yield item

    def _heartbeat(self):
        interval = max(self.welcome.heartbeat_interval_ms, 10) / 1000
        while not self.stop.wait(interval):
            self.requests.put(worker_pb2.SessionRequest(heartbeat=worker_pb2.Heartbeat()))

    def close(self):
        self.stop.set()
        self.requests.put(None)
        self.responses.cancel()


class Attached:
    """A lease on the latest ready version, its arena mapped read-only, and w."""

    def __init__(self, stub, session, model, metadata):
        sid = session.welcome.session_id
        delay = 0.005
        deadline = time.time() + 5
        while True:
            try:
                reply = stub.Attach(worker_pb2.AttachRequest(session_id=sid, model=model), metadata=metadata)
                break
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or time.time() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 0.2)
        self.stub, self.sid, self.metadata, self.lease = stub, sid, metadata, reply.lease_id
        self.manifest = reply.manifest
        self.version = reply.manifest.version
        self.view = None
        try:
            if reply.WhichOneof("handle") != "host":
                raise Fatal("the Python echo worker maps host arenas only (server --backend host)")
            msg, fds = redeem(reply.host.handle_socket, reply.host.ticket)
            if msg != b"OK\n" or len(fds) != 1:
                raise RuntimeError(f"redeeming the arena ticket failed: {msg!r}")
            try:
                size = self.manifest.arena_bytes
                if size:
                    self.view = mmap.mmap(fds[0], size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
            finally:
                for fd in fds:
                    os.close(fd)
            self.weights = Weights.of_manifest(self.manifest, self.view if self.view is not None else b"")
        except BaseException:
            self.release()
            raise

    def release(self):
        try:
            self.stub.Release(worker_pb2.ReleaseRequest(session_id=self.sid, lease_id=self.lease), metadata=self.metadata)
        except grpc.RpcError:
            pass
        # The weights may still be read by a straggling thread: leave the mapping to the GC.
        self.view = None


class Fatal(Exception):
    """An error that trying again cannot fix."""


class Broken(Exception):
    """The Serve stream broke or the offer was refused."""

    def __init__(self, code, details):
        super().__init__(f"{code}: {details}")
        self.code = code


# --- one Serve stream -------------------------------------------------------------------------

class Stream:
    """One Serve stream, run by the calling thread; handler calls run on a pool of `credits`
    threads and report back through the event queue, so all state lives in one thread."""

    def __init__(self, stub, session, attached, args, stop, metadata):
        self.args, self.stop, self.weights = args, stop, attached.weights
        interval_ms = session.welcome.heartbeat_interval_ms or 1000
        self.heartbeat = interval_ms / 1000
        self.requests = queue.Queue()
        self.events = queue.Queue()
        offer = serving_pb2.ServeOffer(
            session_id=session.welcome.session_id, model=args.model, version=attached.version,
            credits=args.credits, max_batch_items=args.max_batch_items, max_batch_bytes=args.max_batch_bytes,
            accepts=["text", "tensor"],
            inputs=[serving_pb2.TensorSpec(name="input_ids", datatype="INT64", shape=[-1]),
                    serving_pb2.TensorSpec(name="input", datatype="FP32", shape=[-1])],
            outputs=[serving_pb2.TensorSpec(name="embedding", datatype="FP32", shape=[-1]),
                     serving_pb2.TensorSpec(name="echo", datatype="FP32", shape=[-1]),
                     serving_pb2.TensorSpec(name="plus_weights", datatype="FP32", shape=[-1])],
        )
        self.requests.put(worker_pb2.ServeRequest(offer=offer))
        self.call = stub.Serve(self._outgoing(), metadata=metadata)
        threading.Thread(target=self._read, daemon=True).start()
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.credits)
        self.running = {}  # batch id -> (ran item ids, all item ids, answered results)
        self.queued = collections.deque()
        self.tokens = {}  # item id -> threading.Event, set when the server cancels it
        self.warned = False

    def _outgoing(self):
        """Our side: queued messages, and a heartbeat whenever nothing was sent for an interval."""
        while True:
            try:
                item = self.requests.get(timeout=self.heartbeat)
            except queue.Empty:
                item = worker_pb2.ServeRequest(heartbeat=worker_pb2.Heartbeat())
            if item is None:
                return
            yield item

    def _read(self):
        try:
            for event in self.call:
                self.events.put(("event", event))
            self.events.put(("end", None))
        except grpc.RpcError as e:
            self.events.put(("end", e))

    def send_result(self, batch_id, results):
        self.requests.put(worker_pb2.ServeRequest(result=serving_pb2.BatchResult(batch_id=batch_id, results=results)))

    def run(self):
        """Serves until drained ("drained") or stopped ("stopped"); raises Broken."""
        try:
            return self._run()
        finally:
            self.requests.put(None)
            self.pool.shutdown(wait=False, cancel_futures=True)

    def _run(self):
        try:
            kind, event = self.events.get(timeout=ACCEPT_TIMEOUT)
        except queue.Empty:
            self.call.cancel()
            raise Broken(None, "no answer to the offer")
        if kind == "end":
            raise Broken(event.code() if event else None, event.details() if event else "ended")
        if event.WhichOneof("kind") != "accepted":
            raise Fatal(f"the server's first serve message was not ServeAccepted: {event}")
        print(f"serving {self.args.model} v{event.accepted.version}", flush=True)
        log(f"serving {self.args.model} v{event.accepted.version} (serve id {event.accepted.serve_id})")
        phase = "serving"
        while True:
            if phase != "serving" and not self.running and not self.queued:
                break
            if phase == "serving" and self.stop.is_set():
                log("stopping: answering the batches held, then closing the stream")
                phase = "stopping"
                continue
            try:
                kind, event = self.events.get(timeout=0.05)
            except queue.Empty:
                continue
            if kind == "end":
                if phase == "serving":
                    raise Broken(event.code() if event else None, event.details() if event else "ended")
                return "drained" if phase == "draining" else "stopped"
            if kind == "done":
                self.on_done(*event)
                continue
            which = event.WhichOneof("kind")
            if which == "batch":
                if phase == "serving":
                    self.receive(event.batch)
                elif phase == "draining":
                    f = Failure(UNAVAILABLE, "the worker's stream is draining")
                    self.send_result(event.batch.batch_id, [item_result(i.item_id, f) for i in event.batch.items])
                # stopping: left unanswered; the server requeues it when the stream closes.
            elif which == "cancel":
                for item_id in event.cancel.item_ids:
                    token = self.tokens.get(item_id)
                    if token is not None:
                        token.set()
            elif which == "drain":
                log(f"drained by the server ({event.drain.reason}): answering the batches held, then closing")
                if phase == "serving":
                    phase = "draining"
        # Close our side; the server then ends the stream.
        self.requests.put(None)
        deadline = time.time() + CLOSE_TIMEOUT
        while time.time() < deadline:
            try:
                kind, _ = self.events.get(timeout=max(0.0, deadline - time.time()))
            except queue.Empty:
                break
            if kind == "end":
                break
        self.call.cancel()
        return "drained" if phase == "draining" else "stopped"

    def receive(self, batch):
        for item in batch.items:
            self.tokens.setdefault(item.item_id, threading.Event())
        if len(self.running) < self.args.credits:
            self.start(batch)
            return
        if not self.warned:
            log("the server sent a batch beyond the credits: it waits for a free handler call")
            self.warned = True
        self.queued.append(batch)

    def start(self, batch):
        all_ids = [i.item_id for i in batch.items]
        failure = self.over_limits(batch)
        if failure is not None:
            self.finish(batch.batch_id, all_ids, [item_result(i, failure) for i in all_ids])
            return
        now_ms = time.time() * 1000
        answered, runnable = [], []
        for item in batch.items:
            token = self.tokens.get(item.item_id) or threading.Event()
            try:
                if token.is_set():
                    raise Failure(CANCELLED, "the server cancelled the item")
                if item.deadline_unix_ms > 0 and item.deadline_unix_ms <= now_ms:
                    raise Failure(DEADLINE_EXCEEDED, "the item's deadline passed before it ran")
                kind, value = item_input(item)
                runnable.append((item.item_id, kind, value, dict(item.parameters), token))
            except Failure as f:
                answered.append(item_result(item.item_id, f))
        if not runnable:
            self.finish(batch.batch_id, all_ids, answered)
            return
        self.running[batch.batch_id] = ([r[0] for r in runnable], all_ids, answered)
        self.pool.submit(self.handle, batch.batch_id, runnable)

    def over_limits(self, batch):
        if len(batch.items) > self.args.max_batch_items:
            return Failure(INTERNAL, f"the server sent a batch of {len(batch.items)} items, over the offer's "
                                     f"max_batch_items {self.args.max_batch_items}")
        total = sum(input_bytes(i) for i in batch.items)
        if self.args.max_batch_bytes > 0 and total > self.args.max_batch_bytes:
            return Failure(INTERNAL, f"the server sent a batch of {total} input bytes, over the offer's "
                                     f"max_batch_bytes {self.args.max_batch_bytes}")
        return None

    def handle(self, batch_id, runnable):
        """The handler, on a pool thread: sleep (once, for the longest item), then compute."""
        try:
            sleeps = []
            for _, kind, value, _, _ in runnable:
                try:
                    sleeps.append(sleep_ms(kind, value))
                except Failure as f:
                    sleeps.append(f)
            longest = max([s for s in sleeps if not isinstance(s, Failure)], default=0)
            if longest > 0:
                end = time.monotonic() + longest / 1000
                while not all(r[4].is_set() for r in runnable):
                    left = end - time.monotonic()
                    if left <= 0:
                        break
                    time.sleep(min(left, 0.005))
            outcomes = []
            for (item_id, kind, value, params, _), slept in zip(runnable, sleeps):
                if isinstance(slept, Failure):
                    outcomes.append(slept)
                    continue
                try:
                    outcomes.append(compute(self.weights, kind, value, params))
                except Failure as f:
                    outcomes.append(f)
        except Exception as e:  # noqa: BLE001 -- a handler bug fails its items, not the stream
            outcomes = [Failure(INTERNAL, f"the worker's handler failed: {e}") for _ in runnable]
        self.events.put(("done", (batch_id, outcomes)))

    def on_done(self, batch_id, outcomes):
        ran, all_ids, answered = self.running.pop(batch_id)
        results = answered + [item_result(i, o) for i, o in zip(ran, outcomes)]
        self.finish(batch_id, all_ids, results)
        while len(self.running) < self.args.credits and self.queued:
            self.start(self.queued.popleft())

    def finish(self, batch_id, all_ids, results):
        for i, r in enumerate(results):
            token = self.tokens.get(r.item_id)
            if token is not None and token.is_set():
                results[i] = item_result(r.item_id, Failure(CANCELLED, "the server cancelled the item"))
        for i in all_ids:
            self.tokens.pop(i, None)
        self.send_result(batch_id, results)


# --- the worker -------------------------------------------------------------------------------

# Refusals that trying again cannot fix (as the Rust SDK).
FATAL = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNIMPLEMENTED)


def serve_forever(args, stop):
    """Session, attach, serve; after a drain, attach the latest version and serve again; after a
    break, a new session. Returns on stop; raises Fatal."""
    metadata = [("authorization", f"Bearer {args.token}")] if args.token else None
    backoff = MIN_BACKOFF
    while not stop.is_set():
        channel = grpc.insecure_channel(args.server, options=[("grpc.default_authority", "localhost")])
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        session = None
        try:
            session = Session(stub, args.name, metadata)
            log(f"session {session.welcome.session_id} open on {args.server}")
            while not stop.is_set():
                attached = Attached(stub, session, args.model, metadata)
                try:
                    end = Stream(stub, session, attached, args, stop, metadata).run()
                finally:
                    attached.release()
                backoff = MIN_BACKOFF
                if end == "stopped":
                    return
                log("drained; attaching the latest version again")
        except grpc.RpcError as e:
            if e.code() in FATAL:
                raise Fatal(f"{e.code()}: {e.details()}") from e
            log(f"{e.code()}: {e.details()}; retrying in {backoff:.1f} s")
        except Broken as e:
            if e.code in FATAL:
                raise Fatal(str(e)) from e
            log(f"the serve stream broke ({e}); retrying in {backoff:.1f} s")
        except (OSError, RuntimeError) as e:
            log(f"{e}; retrying in {backoff:.1f} s")
        finally:
            if session is not None:
                session.close()
            channel.close()
        stop.wait(backoff)
        backoff = min(backoff * 2, MAX_BACKOFF)


# --- self-test --------------------------------------------------------------------------------

def self_test():
    """Checks the computation on a fake w, with the same cases as the Rust unit tests."""
    P = serving_pb2.Parameter
    d = common_pb2

    def f32s(t):
        a = array.array("f")
        a.frombytes(t.data)
        return list(a)

    def fails(fn, code=INVALID_ARGUMENT, message=None):
        try:
            fn()
        except Failure as f:
            assert f.code == code, (f.code, f.message)
            assert message is None or f.message == message, f.message
            return
        raise AssertionError("expected a failure")

    w = Weights.from_f32([1.0, -2.0, 0.5])
    tensors, params = compute(w, "text", "héllo  wörld\n", {})
    assert [t.name for t in tensors] == ["embedding"] and tensors[0].dtype == d.DTYPE_F32
    assert tensors[0].shape == [3] and f32s(tensors[0]) == [16.0, 13.0, 15.5], f32s(tensors[0])
    assert params == {"prompt_tokens": 2}
    tensors, params = compute(w, "text", "", {})
    assert f32s(tensors[0]) == [1.0, -2.0, 0.5] and params == {"prompt_tokens": 0}
    # Rust's white space, not Python's: \x1c is no separator; U+3000 is.
    assert compute(w, "text", "a\x1cb c\u3000d", {})[1] == {"prompt_tokens": 3}

    w100 = Weights.from_f32([float(i) for i in range(100)])
    assert compute(w100, "text", "ab", {})[0][0].shape == [64]
    assert f32s(compute(w100, "text", "ab", {"dimensions": P(int64_value=3)})[0][0]) == [2.0, 3.0, 4.0]
    assert compute(w100, "text", "ab", {"dimensions": P(uint64_value=100)})[0][0].shape == [100]
    for bad in [P(int64_value=0), P(int64_value=101), P(int64_value=-1), P(string_value="3"), P(double_value=3.0)]:
        fails(lambda: compute(w100, "text", "ab", {"dimensions": bad}),
              message="parameter 'dimensions' must be an integer from 1 to 100")

    w0 = Weights.from_f32([0.0])
    fails(lambda: compute(w0, "text", "fail:no good", {}), message="no good")
    assert sleep_ms("text", "sleep:250 hello") == 250 and sleep_ms("text", "sleep:7") == 7
    assert sleep_ms("text", "hello sleep:7") == 0
    fails(lambda: sleep_ms("text", "sleep:x"))
    fails(lambda: sleep_ms("text", "sleep: 5"))
    fails(lambda: sleep_ms("text", "sleep:\u0663"))  # an Arabic-Indic digit is no ASCII digit
    tensors, params = compute(w0, "text", "sleep:5 hi", {})
    assert f32s(tensors[0]) == [10.0] and params == {"prompt_tokens": 2}

    w2 = Weights.from_f32([1.0, 2.0])
    ids = Tensor("input_ids", d.DTYPE_I64, [3], struct.pack("<3q", 7, 8, 9))
    tensors, params = compute(w2, "tensors", [ids], {})
    assert f32s(tensors[0]) == [4.0, 5.0] and params == {"prompt_tokens": 3}
    x = Tensor("x", d.DTYPE_F32, [3, 1], struct.pack("<3f", 0.5, 1.5, 2.5))
    tensors, params = compute(w2, "tensors", [x, ids], {})
    assert [t.name for t in tensors] == ["echo", "plus_weights"] and params == {}
    assert tensors[0].shape == [3, 1] and tensors[0].data == x.data and tensors[0].dtype == d.DTYPE_F32
    assert f32s(tensors[1]) == [1.5, 3.5, 3.5] and tensors[1].shape == [3, 1]
    ids2 = Tensor("input_ids", d.DTYPE_I64, [1, 3], ids.data)
    tensors, _ = compute(w2, "tensors", [ids2], {})
    assert len(tensors) == 1 and tensors[0].data == ids.data and tensors[0].dtype == d.DTYPE_I64
    fails(lambda: compute(w2, "tensors", [], {}))

    # f32 rounding: the sum is rounded as an f32 addition, overflow included.
    big = Weights.from_f32([3.0e38])
    assert f32s(compute(big, "tensors", [Tensor("x", d.DTYPE_F32, [1], struct.pack("<f", 3.0e38))], {})[0][1]) == [float("inf")]
    third = Weights.from_f32([0.1])
    assert f32s(compute(third, "text", "abc", {})[0][0]) == [f32(f32(0.1) + 3.0)]

    # Half-precision weights.
    bf = Weights(struct.pack("<2H", 0x3FC0, 0xC040), 0, d.DTYPE_BF16, 2)
    assert (bf.get(0), bf.get(1)) == (1.5, -3.0)
    assert Weights(struct.pack("<e", 0.25), 0, d.DTYPE_F16, 1).get(0) == 0.25

    # w from a manifest: the first float tensor in name order.
    m = common_pb2.Manifest(tensors=[
        common_pb2.TensorInfo(name="z", dtype=d.DTYPE_F32, shape=[1], offset=0, byte_length=4),
        common_pb2.TensorInfo(name="b", dtype=d.DTYPE_I64, shape=[1], offset=8, byte_length=8),
        common_pb2.TensorInfo(name="m", dtype=d.DTYPE_F16, shape=[2], offset=16, byte_length=4),
    ])
    buf = struct.pack("<f4xq2e", 9.0, 1, 0.5, 2.0)
    wm = Weights.of_manifest(m, buf)
    assert (wm.len, wm.get(0), wm.get(1)) == (2, 0.5, 2.0)
    assert Weights.of_manifest(common_pb2.Manifest(), b"").len == 1

    # The SDK's input checks.
    T = Tensor
    for bad in [
        [T("x", d.DTYPE_F32, [2], b"\0" * 4)], [T("x", d.DTYPE_F32, [-1], b"")], [T("x", 999, [1], b"\0" * 4)],
        [T("x", 0, [1], b"\0" * 4)], [T("x", d.DTYPE_F32, [2**63 - 1, 2**63 - 1], b"")],
        [T("x", d.DTYPE_BYTES, [2], b"\1\0\0\0a")], [T("x", d.DTYPE_BYTES, [1], b"\5\0\0\0a")],
        [T("x", d.DTYPE_F32, [1], b"\0" * 4), T("x", d.DTYPE_F32, [1], b"\0" * 4)],
    ]:
        fails(lambda: check_tensors(bad))
    fails(lambda: check_tensors([T("x", d.DTYPE_F32, [2], b"\0" * 4)]),
          message="input tensor 'x' has 4 bytes, its shape [2] of FP32 needs 8")
    check_tensors([T("x", d.DTYPE_BYTES, [2], b"\1\0\0\0a\0\0\0\0"), T("y", d.DTYPE_F32, [2, 1], b"\0" * 8)])
    print("self-test ok")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", default=os.environ.get("MODELSHARE_SERVER", "unix:/run/modelshare/grpc.sock"),
                    help="unix:/path/to/grpc.sock (env MODELSHARE_SERVER)")
    ap.add_argument("--model", help="the model to serve (its latest ready version)")
    ap.add_argument("--name", default="python-echo-worker", help="worker name shown by `modelshare ps`")
    ap.add_argument("--credits", type=int, default=2, help="batches taken at once")
    ap.add_argument("--max-batch-items", type=int, default=32, help="most items in one batch")
    ap.add_argument("--max-batch-bytes", type=int, default=4 << 20, help="most input bytes in one batch")
    ap.add_argument("--token", default=os.environ.get("MODELSHARE_TOKEN"), help="bearer token (env MODELSHARE_TOKEN)")
    ap.add_argument("--self-test", action="store_true", help="check the computation on a fake w and exit")
    args = ap.parse_args()
    load_stubs()
    if args.self_test:
        self_test()
        return 0
    if not args.model:
        ap.error("--model is required")
    if args.credits < 1 or args.max_batch_items < 1:
        ap.error("--credits and --max-batch-items must be at least 1")
    if not args.server.startswith("unix:"):
        ap.error("--server must be unix:/path (this worker redeems fd tickets over Unix sockets)")

    stop = threading.Event()

    def on_signal(signum, _frame):
        if stop.is_set():
            log("second signal: exiting now")
            os._exit(1)
        log(f"signal {signum}: draining")
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        serve_forever(args, stop)
    except Fatal as e:
        log(f"error: {e}")
        return 1
    log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
