#!/usr/bin/env python3
"""The request path through clients no one here wrote: tritonclient (gRPC and HTTP, KServe v2 /
OIP) and the official openai client call a real modelshare server; the answers are computed by
the Rust echo worker (modelshare-echo-worker, on the SDK) and by the Python echo worker
(workers/python/echo_worker.py, on the modelshare Python package), each over the shared weights.

Then the failure paths, each with its documented status: wrong tenant, unknown model, oversized
body, malformed JSON, expired deadline, cancelled request, full queue (the tenant's request
quota), and a kill -9 of a worker holding items (they go to the other worker). After each, the
admin API must show nothing left: no request outstanding, no item queued, tenants' counts at 0.

Usage: inference_test.py --bin target/debug/modelshare --worker-bin target/debug/modelshare-echo-worker
                         [--worker-python VENV/bin/python]
--worker-python: the interpreter of the Python worker, one with the modelshare package installed
(scripts/test builds it into target/py-venv); this script runs beside it with stubs of the same
package name, so it needs an interpreter without that package.
Prints "N passed, M failed" last; exits non-zero on any failure.
"""

import argparse
import base64
import hashlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request

import grpc
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from protocol_test import generate_stubs, write_safetensors  # noqa: E402

ADMIN, TA, TB, TC = "ms_admin_tok", "ms_tok_a", "ms_tok_b", "ms_tok_c"
W = [0.5 * j - 3.0 for j in range(16)]  # the first (only) tensor of model "enc"


def sha(token):
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stack:
    """A server (tenants admin, a, b (at most 2 requests), c (generation caps: 3 tokens, prompts
    of 6); models enc public, priv owned by a), and its workers."""

    def __init__(self, args, tmp):
        self.args, self.tmp = args, tmp
        root = os.path.join(tmp, "models")
        data = struct.pack("<16f", *W)
        write_safetensors(os.path.join(root, "enc", "model.safetensors"), [("w", "F32", [16], data)])
        write_safetensors(os.path.join(root, "priv", "model.safetensors"), [("w", "F32", [16], data)])
        with open(os.path.join(tmp, "tenants.toml"), "w") as f:
            f.write(f'[admin]\ntoken_hashes = ["{sha(ADMIN)}"]\n\n')
            f.write(f'[[tenants]]\nname = "a"\ntoken_hashes = ["{sha(TA)}"]\n\n')
            f.write(f'[[tenants]]\nname = "b"\ntoken_hashes = ["{sha(TB)}"]\n[tenants.quota]\nrequests = 2\n')
            f.write(f'\n[[tenants]]\nname = "c"\ntoken_hashes = ["{sha(TC)}"]\n[tenants.quota]\nmax_tokens = 3\n'
                    'prompt_tokens = 6\nstop_strings = 1\n')
        with open(os.path.join(tmp, "modelshare.toml"), "w") as f:
            f.write("[serving]\nmax_request_bytes = 1048576\nstream_idle_secs = 2\n\n")
            f.write('[[models]]\nname = "enc"\npath = "enc"\npublic = true\n\n')
            f.write('[[models]]\nname = "priv"\npath = "priv"\ntenant = "a"\n')
        self.grpc_port, self.http_port, self.metrics_port = free_port(), free_port(), free_port()
        self.socket = os.path.join(tmp, "grpc.sock")
        self.log = open(os.path.join(tmp, "server.log"), "w")
        self.server = subprocess.Popen(
            [args.bin, "serve", "--backend", "host", "--config", os.path.join(tmp, "modelshare.toml"),
             "--model-root", root, "--unix-socket", self.socket,
             "--handle-socket", os.path.join(tmp, "handles.sock"),
             "--listen", f"127.0.0.1:{self.grpc_port}", "--http-listen", f"127.0.0.1:{self.http_port}",
             "--metrics-listen", f"127.0.0.1:{self.metrics_port}",
             "--tenants-file", os.path.join(tmp, "tenants.toml"), "--no-worker-wait-ms", "1500"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.workers = []
        self.pb = generate_stubs(os.path.join(tmp, "stubs"))
        admin_pb2, admin_pb2_grpc = self.pb[0], self.pb[1]
        self.admin_pb2 = admin_pb2
        ch = grpc.insecure_channel(f"unix:{self.socket}", options=[("grpc.default_authority", "localhost")])
        self.admin = admin_pb2_grpc.AdminServiceStub(ch)
        deadline = time.time() + 60
        while True:
            try:
                self.admin.ListModels(admin_pb2.ListModelsRequest(), metadata=self.md(ADMIN), timeout=2)
                urllib.request.urlopen(f"{self.http()}/readyz", timeout=2)
                break
            except Exception:
                if time.time() > deadline or self.server.poll() is not None:
                    raise RuntimeError("server did not start:\n" + open(self.log.name).read())
                time.sleep(0.1)

    @staticmethod
    def md(token):
        return [("authorization", f"Bearer {token}")]

    def http(self):
        return f"http://127.0.0.1:{self.http_port}"

    def start_worker(self, kind, token=ADMIN, extra=()):
        """Starts a worker of `kind` (rust, python) serving "enc"; `extra`: more of its flags."""
        env = dict(os.environ, MODELSHARE_TOKEN=token, RUST_LOG="info")
        if kind == "rust":
            cmd = [self.args.worker_bin, "--server", f"unix:{self.socket}", "--model", "enc",
                   "--credits", "2", "--name", "rust-echo", *extra]
        else:
            cmd = [self.args.worker_python, os.path.join(ROOT, "workers", "python", "echo_worker.py"),
                   "--server", f"unix:{self.socket}", "--model", "enc", "--credits", "2", *extra]
        log = open(os.path.join(self.tmp, f"worker-{kind}-{len(self.workers)}.log"), "w")
        p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.workers.append(p)
        self.wait_serving(len([w for w in self.workers if w.poll() is None]))
        return p

    def serving(self):
        r = self.admin.ListSessions(self.admin_pb2.ListSessionsRequest(), metadata=self.md(ADMIN))
        return [(s.pid, w) for s in r.sessions for w in s.serving]

    def wait_serving(self, n, timeout=30):
        deadline = time.time() + timeout
        while len(self.serving()) != n:
            if time.time() > deadline:
                raise AssertionError(f"expected {n} serving workers, have {self.serving()}")
            time.sleep(0.1)

    def stop_worker(self, p, sig=signal.SIGTERM):
        p.send_signal(sig)
        p.wait(timeout=20)
        self.workers.remove(p)
        self.wait_serving(len(self.workers))

    def assert_drained(self):
        deadline = time.time() + 10
        while True:
            s = self.admin.GetStats(self.admin_pb2.GetStatsRequest(), metadata=self.md(ADMIN))
            left = (s.requests_outstanding, [(m.model, m.queued_items) for m in s.serving if m.queued_items],
                    [(t.name, t.requests) for t in s.tenants if t.requests])
            if left == (0, [], []):
                return
            if time.time() > deadline:
                raise AssertionError(f"request path not drained: {left}")
            time.sleep(0.05)

    def close(self):
        for p in self.workers:
            p.kill()
            p.wait()
        self.server.send_signal(signal.SIGTERM)
        try:
            self.server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.server.kill()


def expect_embedding(values, text_len, dims=16):
    want = [w + text_len for w in W[:dims]]
    assert len(values) == dims, (len(values), dims)
    assert np.allclose(values, want, atol=1e-6), (values, want)


def check_clients(stack, who):
    """Correct answers through tritonclient gRPC and HTTP and the openai client."""
    import tritonclient.grpc as tg
    import tritonclient.http as th
    from openai import OpenAI
    from tritonclient.utils import InferenceServerException

    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    plus = x + np.array([W[k % 16] for k in range(4)], dtype=np.float32)
    texts = np.array([b"hello", "d\u00e9j\u00e0 vu".encode()], dtype=object)

    g = tg.InferenceServerClient(f"127.0.0.1:{stack.grpc_port}")
    # tritonclient.http writes Inference-Header-Content-Length into the headers dict it is
    # given: each HTTP call gets its own copy.
    hdr = {"authorization": f"Bearer {TB}"}
    assert g.is_server_live(headers=hdr) and g.is_server_ready(headers=hdr)
    assert g.is_model_ready("enc", headers=hdr)
    meta = g.get_model_metadata("enc", headers=hdr)
    assert meta.name == "enc", meta
    # The worker declares one item's shapes; a request stacks items on a first dimension.
    shapes = {t.name: list(t.shape) for t in [*meta.inputs, *meta.outputs]}
    assert shapes == {"text": [-1, -1], "input_ids": [-1, -1], "input": [-1, -1], "embedding": [-1, -1],
                      "echo": [-1, -1], "plus_weights": [-1, -1]}, shapes
    inp = tg.InferInput("input", [2, 4], "FP32")
    inp.set_data_from_numpy(x)
    r = g.infer("enc", [inp], headers=hdr)
    assert np.array_equal(r.as_numpy("echo"), x), r.as_numpy("echo")
    assert np.allclose(r.as_numpy("plus_weights"), plus), (who, r.as_numpy("plus_weights"))
    t = tg.InferInput("text", [2], "BYTES")
    t.set_data_from_numpy(texts)
    emb = g.infer("enc", [t], headers=hdr).as_numpy("embedding")
    assert emb.shape == (2, 16), emb.shape
    expect_embedding(emb[0], 5)
    expect_embedding(emb[1], len("d\u00e9j\u00e0 vu".encode()))

    h = th.InferenceServerClient(f"127.0.0.1:{stack.http_port}")
    assert h.is_server_live(headers=dict(hdr)) and h.is_server_ready(headers=dict(hdr))
    assert h.is_model_ready("enc", headers=dict(hdr))
    for binary in (True, False):
        hi = th.InferInput("input", [2, 4], "FP32")
        hi.set_data_from_numpy(x, binary_data=binary)
        outs = [th.InferRequestedOutput("plus_weights", binary_data=binary)]
        r = h.infer("enc", [hi], outputs=outs, headers=dict(hdr))
        assert np.allclose(r.as_numpy("plus_weights"), plus), (who, binary, r.as_numpy("plus_weights"))
    ht = th.InferInput("text", [2], "BYTES")
    ht.set_data_from_numpy(texts)
    emb = h.infer("enc", [ht], headers=dict(hdr)).as_numpy("embedding")
    expect_embedding(emb[1], len("d\u00e9j\u00e0 vu".encode()))
    # An input the worker did not declare is refused, naming it and the declared ones, instead of
    # being computed as if it were one of them (texts under another name, a tensor misnamed).
    for misnamed in (("sentences", [2], "BYTES", texts), ("x", [2, 4], "FP32", x)):
        gi = tg.InferInput(*misnamed[:3])
        gi.set_data_from_numpy(misnamed[3])
        try:
            g.infer("enc", [gi], headers=hdr)
            raise AssertionError(f"{who}: input {misnamed[0]!r} was served")
        except InferenceServerException as e:
            assert e.status() == "StatusCode.INVALID_ARGUMENT", (who, e.status(), e)
            assert f"no input '{misnamed[0]}'" in str(e) and "input_ids" in str(e), (who, e)
        hi = th.InferInput(*misnamed[:3])
        hi.set_data_from_numpy(misnamed[3])
        try:
            h.infer("enc", [hi], headers=dict(hdr))
            raise AssertionError(f"{who}: input {misnamed[0]!r} was served over HTTP")
        except InferenceServerException as e:
            assert e.status() == "400", (who, e.status(), e)
            assert f"no input '{misnamed[0]}'" in str(e), (who, e)

    check_triton_extensions(stack, g, h, hdr, who)

    oa = OpenAI(base_url=f"{stack.http()}/v1", api_key=TB, max_retries=0)
    ids = [m.id for m in oa.models.list().data]
    assert "enc" in ids and "priv" not in ids, ids
    e = oa.embeddings.create(model="enc", input=["hi", "there you"])  # base64 on the wire
    assert [d.index for d in e.data] == [0, 1]
    expect_embedding(e.data[0].embedding, 2)
    expect_embedding(e.data[1].embedding, 9)
    assert e.usage.prompt_tokens == 3, e.usage
    e = oa.embeddings.create(model="enc", input="one", encoding_format="float", dimensions=4)
    expect_embedding(e.data[0].embedding, 3, dims=4)
    e = oa.embeddings.create(model="enc", input=[[1, 2, 3]])
    expect_embedding(e.data[0].embedding, 3)
    stack.assert_drained()


def http_post(stack, path, body, token=TB, content_type="application/json"):
    req = urllib.request.Request(f"{stack.http()}{path}", data=body, method="POST",
                                 headers={"Content-Type": content_type, "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def check_triton_extensions(stack, g, h, hdr, who):
    """tritonclient's model configuration, repository index and statistics calls on both doors,
    with their defaults, scoped to the caller: tenant b sees "enc" (public), not "priv"."""
    from tritonclient.utils import InferenceServerException

    config = g.get_model_config("enc", headers=hdr, as_json=True)["config"]
    assert config["name"] == "enc" and int(config["max_batch_size"]) > 0, (who, config)
    # One item's shapes: the batch dimension is max_batch_size's.
    dims = {t["name"]: (t["data_type"], [int(d) for d in t["dims"]]) for t in config["input"]}
    assert dims["input"] == ("TYPE_FP32", [-1]) and dims["text"] == ("TYPE_STRING", [-1]), (who, dims)
    hconfig = h.get_model_config("enc", headers=dict(hdr))
    assert hconfig["name"] == "enc" and hconfig["max_batch_size"] == int(config["max_batch_size"]), hconfig
    assert {t["name"] for t in hconfig["output"]} == {"embedding", "echo", "plus_weights"}, hconfig

    index = g.get_model_repository_index(headers=hdr, as_json=True).get("models", [])
    names = {(m["name"], m.get("state")) for m in index}
    assert ("enc", "READY") in names and not any(n == "priv" for n, _ in names), (who, index)
    hindex = h.get_model_repository_index(headers=dict(hdr))
    assert {m["name"] for m in hindex} == {"enc"}, hindex

    stats = g.get_inference_statistics("enc", headers=hdr, as_json=True)["model_stats"]
    assert stats and stats[0]["name"] == "enc" and int(stats[0]["inference_count"]) > 0, (who, stats)
    hstats = h.get_inference_statistics(headers=dict(hdr))["model_stats"]
    assert {m["name"] for m in hstats} == {"enc"}, hstats
    for call in (lambda: g.get_model_config("priv", headers=hdr),
                 lambda: h.get_model_config("priv", headers=dict(hdr)),
                 lambda: g.get_inference_statistics("priv", headers=hdr),
                 lambda: h.get_inference_statistics("priv", headers=dict(hdr))):
        try:
            call()
            raise AssertionError(f"{who}: another tenant's private model was described")
        except InferenceServerException as e:
            assert e.status() in ("StatusCode.NOT_FOUND", "404"), (who, e.status(), e)
    # Names are found in any case, but only among the caller's models: another spelling of
    # another tenant's private model is unknown, in the caller's own spelling (not the owner's).
    try:
        g.get_model_metadata("PRIV", headers=hdr)
        raise AssertionError(f"{who}: another tenant's private model answered under another case")
    except InferenceServerException as e:
        assert e.status() == "StatusCode.NOT_FOUND" and "'PRIV'" in str(e) and "'priv'" not in str(e), (who, e)


def check_failures(stack):
    import tritonclient.grpc as tg
    from tritonclient.utils import InferenceServerException
    import openai
    from openai import OpenAI

    g = tg.InferenceServerClient(f"127.0.0.1:{stack.grpc_port}")
    hb = {"authorization": f"Bearer {TB}"}

    def text_input(*texts):
        t = tg.InferInput("text", [len(texts)], "BYTES")
        t.set_data_from_numpy(np.array([s.encode() for s in texts], dtype=object))
        return t

    # Wrong tenant: b may not see a's private model (as if it did not exist), on every door.
    try:
        g.infer("priv", [text_input("x")], headers=hb)
        raise AssertionError("b computed on a's private model")
    except InferenceServerException as e:
        assert e.status() == "StatusCode.NOT_FOUND", e.status()
    oa = OpenAI(base_url=f"{stack.http()}/v1", api_key=TB, max_retries=0)
    try:
        oa.embeddings.create(model="priv", input="x")
        raise AssertionError("b computed on a's private model over OpenAI")
    except openai.NotFoundError as e:
        assert e.body and "not found" in json.dumps(e.body), e.body
    # A wrong token.
    try:
        OpenAI(base_url=f"{stack.http()}/v1", api_key="nope", max_retries=0).embeddings.create(model="enc", input="x")
        raise AssertionError("unknown token accepted")
    except openai.AuthenticationError:
        pass
    # Unknown model.
    code, _, body = http_post(stack, "/v2/models/missing/infer",
                              json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}).encode())
    assert code == 404 and "error" in json.loads(body), (code, body)
    # Malformed JSON, on both REST doors.
    code, _, body = http_post(stack, "/v1/embeddings", b'{"model": "enc", "input": ')
    assert code == 400 and json.loads(body)["error"]["type"] == "invalid_request_error", (code, body)
    code, _, body = http_post(stack, "/v2/models/enc/infer", b"{not json")
    assert code == 400 and "error" in json.loads(body), (code, body)
    # Wrong dtype/shape: 3 values for a [2, 2] tensor.
    code, _, body = http_post(stack, "/v2/models/enc/infer",
                              json.dumps({"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [1, 2, 3]}]}).encode())
    assert code == 400, (code, body)
    # Oversized body (the server's limit is 1 MiB here).
    code, _, _ = http_post(stack, "/v1/embeddings", json.dumps({"model": "enc", "input": "x" * (2 << 20)}).encode())
    assert code == 413, code
    stack.assert_drained()

    # Expired deadline: a 300 ms client timeout on an item that takes 2 s.
    t0 = time.time()
    try:
        g.infer("enc", [text_input("sleep:2000 late")], headers=hb, client_timeout=0.3)
        raise AssertionError("answered after its deadline")
    except InferenceServerException as e:
        assert "DEADLINE_EXCEEDED" in e.status(), e.status()
    assert time.time() - t0 < 1.5
    stack.assert_drained()  # the server gave it up too (grpc-timeout)

    # Cancelled request: the client goes away; the worker is told, and the tenant's count drops
    # once the worker has answered the cancelled item (it counts while a worker computes it).
    ch = grpc.insecure_channel(f"127.0.0.1:{stack.grpc_port}")
    from tritonclient.grpc import service_pb2, service_pb2_grpc
    stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
    req = service_pb2.ModelInferRequest(model_name="enc", inputs=[service_pb2.ModelInferRequest.InferInputTensor(
        name="text", datatype="BYTES", shape=[1], contents=service_pb2.InferTensorContents(bytes_contents=[b"sleep:3000 x"]))])
    fut = stub.ModelInfer.future(req, metadata=list(hb.items()))
    time.sleep(0.3)
    fut.cancel()
    stack.assert_drained()
    ch.close()

    # Full queue: b's quota is 2 requests outstanding; the third is refused at once, 429 + Retry-After.
    results = []
    def slow():
        results.append(http_post(stack, "/v1/embeddings", json.dumps({"model": "enc", "input": "sleep:1500 x"}).encode()))
    threads = [threading.Thread(target=slow) for _ in range(2)]
    for th_ in threads:
        th_.start()
    time.sleep(0.3)
    code, headers, body = http_post(stack, "/v1/embeddings", json.dumps({"model": "enc", "input": "x"}).encode())
    assert code == 429, (code, body)
    assert any(k.lower() == "retry-after" for k in headers), headers
    assert json.loads(body)["error"]["type"] == "rate_limit_error", body
    for th_ in threads:
        th_.join()
    assert [r[0] for r in results] == [200, 200], [r[0] for r in results]
    stack.assert_drained()


def sessions_ended(stack):
    """modelshare_sessions_ended_total by reason, from the metrics endpoint."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{stack.metrics_port}/metrics", timeout=10).read().decode()
    counts = {}
    for line in text.splitlines():
        if line.startswith("modelshare_sessions_ended_total{"):
            counts[line.split('reason="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
    return counts


def check_clean_goodbye(stack, worker):
    """A worker stopped by SIGTERM says goodbye: its session ends as `closed`, not as a stream
    error (the SDK closes its side of the stream before the process exits)."""
    before = sessions_ended(stack)
    stack.stop_worker(worker)
    deadline = time.time() + 10
    while sum(sessions_ended(stack).values()) <= sum(before.values()):
        assert time.time() < deadline, "the stopped worker's session did not end"
        time.sleep(0.05)
    after = sessions_ended(stack)
    grew = {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}
    assert grew == {"closed": 1}, f"sessions ended by reason, growth {grew}"


def check_kill9(stack):
    """A worker is killed with items in flight: they are computed by the other worker."""
    import tritonclient.grpc as tg
    g = tg.InferenceServerClient(f"127.0.0.1:{stack.grpc_port}")
    t = tg.InferInput("text", [1], "BYTES")
    t.set_data_from_numpy(np.array([b"sleep:1500 abc"], dtype=object))
    out = {}
    def call():
        try:
            out["r"] = g.infer("enc", [t], headers={"authorization": f"Bearer {TB}"}).as_numpy("embedding")
        except Exception as e:  # noqa: BLE001
            out["e"] = e
    th_ = threading.Thread(target=call)
    th_.start()
    deadline = time.time() + 10
    holder = None
    while holder is None and time.time() < deadline:
        holder = next((pid for pid, w in stack.serving() if w.items_in_flight > 0), None)
        time.sleep(0.02)
    assert holder, "no worker took the item"
    victim = next(p for p in stack.workers if p.pid == holder)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    stack.workers.remove(victim)
    th_.join(timeout=20)
    assert "r" in out, out
    expect_embedding(out["r"][0], len("sleep:1500 abc"))
    stack.assert_drained()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "debug", "modelshare"))
    ap.add_argument("--worker-bin", default=os.path.join(ROOT, "target", "debug", "modelshare-echo-worker"))
    ap.add_argument("--worker-python", default=os.path.join(ROOT, "target", "py-venv", "bin", "python"),
                    help="the Python worker's interpreter, with the modelshare package installed")
    args = ap.parse_args()
    run_steps(args, lambda stack: [
        ("clients against the Rust worker", lambda: (stack.start_worker("rust"), check_clients(stack, "rust"))),
        ("clients against the Python worker", lambda: (
            stack.start_worker("python"), check_clean_goodbye(stack, stack.workers[0]),
            check_clients(stack, "python"))),
        ("failure paths", lambda: (stack.start_worker("rust"), check_failures(stack))),
        ("kill -9 of a worker with items in flight", lambda: check_kill9(stack)),
    ])


def run_steps(args, steps_of):
    """Runs the steps ``steps_of(stack)`` lists (name, callable) on a new stack, each reported
    ``ok`` or ``FAILED`` with its traceback; on a failure, the server's and workers' logs. Prints
    "N passed, M failed" last and exits non-zero on any failure."""
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack(args, tmp)
        try:
            for name, step in steps_of(stack):
                try:
                    step()
                    passed += 1
                    print(f"test {name} ... ok")
                except Exception:  # noqa: BLE001
                    failed += 1
                    print(f"test {name} ... FAILED")
                    traceback.print_exc()
        finally:
            stack.close()
            if failed:
                print("--- server log ---")
                print(open(os.path.join(tmp, "server.log")).read()[-6000:])
                for f in sorted(os.listdir(tmp)):
                    if f.startswith("worker-"):
                        print(f"--- {f} ---")
                        print(open(os.path.join(tmp, f)).read()[-3000:])
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
