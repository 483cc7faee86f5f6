#!/usr/bin/env python3
"""Streamed answers through the official openai client and tritonclient (issue 30): a real modelshare server and
the Rust echo worker as a streaming worker (`--streams`, its generation: the prompt's words as
tokens, docs in workers/echo/src/generate.rs).

- The openai client streams a completion and a chat completion (with usage), and gets the same
  text whole when it does not stream.
- Errors before the stream starts are plain OpenAI errors with their status (unknown model,
  bad max_tokens, n > 1, a tenant's caps on max_tokens, prompt tokens and stop strings); an error after it is
  an error event the client raises.
- A client that goes away mid-stream cancels the item at the worker: the worker logs the cancel,
  its slot is free again (the time printed).
- Another tenant's stream keeps receiving parts while one reader stalls.
- A worker that stops sending mid-stream: the idle limit ends the stream with an error event.
- KServe's generate and generate_stream (HTTP, server-sent events).
- tritonclient's decoupled gRPC stream (ModelStreamInfer): a generation's parts as responses, the
  last marked final; a plain request answered once; a failed request reported on the stream.
- A kill -9 of the worker ends its started stream with an error, and its unstarted item is
  requeued to the next worker: never a hang.

After each, the admin API must show nothing left.

Usage: streaming_test.py --bin target/debug/modelshare --worker-bin target/debug/modelshare-echo-worker
Prints "N passed, M failed" last; exits non-zero on any failure.
"""

import argparse
import http.client
import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from inference_test import TA, TB, TC, run_steps  # noqa: E402

WORDS = " ".join(f"w{i}" for i in range(200))


def client(stack, token, timeout=30):
    from openai import OpenAI

    return OpenAI(base_url=f"{stack.http()}/v1", api_key=token, max_retries=0, timeout=timeout)


def in_flight(stack):
    return sum(w.items_in_flight for _, w in stack.serving())


def check_streams(stack):
    c = client(stack, TA)
    chunks = list(c.completions.create(model="enc", prompt="the quick brown fox", max_tokens=3, stream=True))
    texts = [ch.choices[0].text for ch in chunks]
    assert texts == ["the", " quick", " brown", ""], texts
    assert [ch.choices[0].finish_reason for ch in chunks] == [None, None, None, "length"], chunks
    assert len({ch.id for ch in chunks}) == 1 and chunks[0].id.startswith("cmpl-"), chunks[0].id
    whole = c.completions.create(model="enc", prompt="the quick brown fox", max_tokens=3)
    assert whole.choices[0].text == "the quick brown" and whole.choices[0].finish_reason == "length", whole
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens, whole.usage.total_tokens) == (4, 3, 7), whole.usage
    stop = c.completions.create(model="enc", prompt="one two three four", stop=["ee f"])
    assert stop.choices[0].text == "one two thr" and stop.choices[0].finish_reason == "stop", stop

    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there world"}]
    chunks = list(c.chat.completions.create(model="enc", messages=messages, stream=True,
                                            stream_options={"include_usage": True}))
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert content == "hello there world", chunks
    assert chunks[0].choices[0].delta.role == "assistant", chunks[0]
    assert chunks[-2].choices[0].finish_reason == "stop", chunks[-2]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 3, chunks[-1]
    whole = c.chat.completions.create(model="enc", messages=messages, max_completion_tokens=2)
    assert whole.choices[0].message.content == "hello there", whole
    assert whole.choices[0].message.role == "assistant" and whole.object == "chat.completion", whole
    # Time to first part, between parts, parts and tokens, for Prometheus.
    text = urllib.request.urlopen(f"http://127.0.0.1:{stack.metrics_port}/metrics", timeout=5).read().decode()
    metric = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line and not line.startswith("#")}
    got = {k: v for k, v in metric.items() if k.startswith(("modelshare_stream_", "modelshare_generated_")) and "_bucket" not in k}
    # Five answers (three completions, two chats), each a stream of parts: 3, 3, 3 ("one",
    # " two", " thr"), 3 and 2 parts; 3 + 3 + 4 (through the stop string) + 3 + 2 tokens.
    assert got['modelshare_stream_first_part_seconds_count{model="enc"}'] == 5, got
    assert got['modelshare_stream_part_interval_seconds_count{model="enc"}'] == 2 + 2 + 2 + 2 + 1, got
    assert got['modelshare_stream_parts_total{model="enc",tenant="a"}'] == 14, got
    assert got['modelshare_generated_tokens_total{model="enc",tenant="a"}'] == 15, got
    stack.assert_drained()


def check_triton_stream(stack):
    """tritonclient's decoupled gRPC stream: a generation's parts as responses, a plain request
    answered once, a failed request reported on the stream, which goes on."""
    import queue

    import numpy as np
    import tritonclient.grpc as tg

    results = queue.Queue()
    c = tg.InferenceServerClient(f"127.0.0.1:{stack.grpc_port}")
    c.start_stream(callback=lambda result, error: results.put((result, error)),
                   headers={"authorization": f"Bearer {TA}"})
    try:
        prompt = tg.InferInput("text_input", [1], "BYTES")
        prompt.set_data_from_numpy(np.array([b"the quick brown fox jumps"], dtype=object))
        c.async_stream_infer("enc", [prompt], request_id="gen-1", parameters={"max_tokens": 4},
                             enable_empty_final_response=True)
        texts, final = [], None
        while final is None:
            result, error = results.get(timeout=10)
            assert error is None, error
            response = result.get_response()
            assert response.id == "gen-1", response
            texts.append(result.as_numpy("text_output")[0].decode())
            if response.parameters["triton_final_response"].bool_param:
                final = response
        assert texts == ["the", " quick", " brown", " fox", ""], texts
        assert final.parameters["finish_reason"].string_param == "length", final.parameters
        assert final.parameters["completion_tokens"].int64_param == 4, final.parameters
        # A request that is not a generation is answered once, final.
        x = tg.InferInput("input", [1, 3], "FP32")
        x.set_data_from_numpy(np.array([[1.0, 2.0, 3.0]], dtype=np.float32))
        c.async_stream_infer("enc", [x], request_id="plain-1")
        result, error = results.get(timeout=10)
        assert error is None, error
        assert np.array_equal(result.as_numpy("echo"), [[1.0, 2.0, 3.0]])
        assert result.get_response().parameters["triton_final_response"].bool_param
        # An unknown model fails that request only.
        c.async_stream_infer("nope", [prompt], request_id="bad-1")
        result, error = results.get(timeout=10)
        assert error is not None and "not found" in str(error), error
        c.async_stream_infer("enc", [prompt], request_id="gen-2", parameters={"max_tokens": 1})
        result, error = results.get(timeout=10)
        assert error is None and result.as_numpy("text_output")[0] == b"the", (result, error)
        results.get(timeout=10)  # its final response
        # A client that cancels its stream mid-generation cancels the item at the worker.
        cancels = cancels_seen(stack)
        slow = tg.InferInput("text_input", [1], "BYTES")
        slow.set_data_from_numpy(np.array([("sleep:100 " + WORDS).encode()], dtype=object))
        c.async_stream_infer("enc", [slow], request_id="slow", parameters={"max_tokens": 150})
        for _ in range(2):
            result, error = results.get(timeout=10)
            assert error is None, error
        t0 = time.monotonic()
        c.stop_stream(cancel_requests=True)
        while cancels_seen(stack) == cancels or in_flight(stack):
            assert time.monotonic() - t0 < 5, "the worker still holds the cancelled stream's item"
            time.sleep(0.02)
        print(f"  tritonclient's cancel to the worker's slot free: {1000 * (time.monotonic() - t0):.0f} ms")
    finally:
        c.stop_stream()
        c.close()
    stack.assert_drained()


def check_kserve_generate(stack):
    """KServe's generate extension: one JSON answer, or server-sent events of the parts."""
    def post(path, body, token=TA):
        req = urllib.request.Request(f"{stack.http()}/v2/models/enc/{path}", data=json.dumps(body).encode(),
                                     headers={"authorization": f"Bearer {token}", "content-type": "application/json"})
        return urllib.request.urlopen(req, timeout=30)

    r = json.loads(post("generate", {"text_input": "a b c d", "parameters": {"max_tokens": 3}}).read())
    assert (r["text_output"], r["finish_reason"], r["completion_tokens"], r["model_name"]) == ("a b c", "length", 3, "enc"), r
    r = post("generate_stream", {"text_input": "a b c d", "max_tokens": 2, "id": "g1"})
    assert r.headers["content-type"].startswith("text/event-stream"), r.headers
    events = [json.loads(line[len("data: "):]) for line in r.read().decode().splitlines() if line.startswith("data: ")]
    assert [e["text_output"] for e in events] == ["a", " b", ""], events
    assert events[-1]["finish_reason"] == "length" and all(e["id"] == "g1" for e in events), events
    try:
        post("generate", {"text_input": "x", "parameters": {"max_tokens": 0}})
    except urllib.error.HTTPError as e:
        assert e.code == 400 and "max_tokens" in json.loads(e.read())["error"], e
    else:
        raise AssertionError("max_tokens 0 was taken")
    try:
        post("generate", {"text_input": "x"}, token=TB)  # tenant b may see "enc": fine
        post("generate", {"text_input": "x"}, token="ms_bad_token")
    except urllib.error.HTTPError as e:
        assert e.code == 401, e.code
    else:
        raise AssertionError("a bad token was taken")
    stack.assert_drained()


def check_errors(stack):
    import openai

    c = client(stack, TA)
    for call, want in [
        (lambda: c.completions.create(model="nope", prompt="x", stream=True), openai.NotFoundError),
        (lambda: c.completions.create(model="enc", prompt="x", max_tokens=0, stream=True), openai.BadRequestError),
        (lambda: c.chat.completions.create(model="enc", messages=[{"role": "user", "content": "x"}], n=2),
         openai.BadRequestError),
        (lambda: c.chat.completions.create(model="enc", messages=[], stream=True), openai.BadRequestError),
        # Model "priv" is tenant a's: tenant b is told it does not exist.
        (lambda: client(stack, TB).completions.create(model="priv", prompt="x"), openai.NotFoundError),
    ]:
        try:
            call()
        except want as e:
            assert e.body is None or "message" in (e.body if isinstance(e.body, dict) else {}), e.body
        else:
            raise AssertionError(f"expected {want.__name__}")
    # Tenant c's caps: at most 3 tokens (asking none asks 3), prompts of at most 6 (the worker
    # counts them), one stop string.
    cc = client(stack, TC)
    try:
        cc.completions.create(model="enc", prompt="a b", max_tokens=5)
    except openai.BadRequestError as e:
        assert "at most 3" in str(e), e
    else:
        raise AssertionError("max_tokens over the tenant's cap was taken")
    capped = cc.completions.create(model="enc", prompt="a b c d e f")
    assert (capped.choices[0].text, capped.usage.completion_tokens) == ("a b c", 3), capped
    try:
        cc.completions.create(model="enc", prompt="a b c d e f g", stream=True)
    except openai.BadRequestError as e:
        assert "at most 6" in str(e), e
    else:
        raise AssertionError("a prompt over the tenant's cap was taken")
    try:
        cc.chat.completions.create(model="enc", messages=[{"role": "user", "content": "a b"}], stop=["x", "y"])
    except openai.BadRequestError as e:
        assert "at most 1" in str(e), e
    else:
        raise AssertionError("stop strings over the tenant's cap were taken")
    assert cc.completions.create(model="enc", prompt="a b", stop=["b"]).choices[0].text == "a ", "one stop string"
    # The generation parameters come only through the generation doors: on a plain door they
    # would skip the caps and the token fairness.
    body = json.dumps({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a b"]}],
                       "parameters": {"task": "completion", "max_tokens": 100000}}).encode()
    req = urllib.request.Request(f"{stack.http()}/v2/models/enc/infer", data=body,
                                 headers={"authorization": f"Bearer {TC}", "content-type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=10)
    except urllib.error.HTTPError as e:
        assert e.code == 400 and "task" in json.loads(e.read())["error"], e
    else:
        raise AssertionError("a plain door took a generation's parameters")
    # A chat whose last message has no string content fails at the worker before any part:
    # a plain 400, not an event.
    try:
        c.chat.completions.create(model="enc", messages=[{"role": "user", "content": [{"type": "text"}]}],
                                  stream=True)
    except openai.BadRequestError:
        pass
    else:
        raise AssertionError("expected a 400")
    stack.assert_drained()


def check_stalled_worker(stack):
    """A worker that stops sending mid-stream: the server's idle limit (stream_idle_secs = 2 in
    this stack) ends the stream with an error event, and cancels the item at the worker."""
    import openai

    c = client(stack, TA)
    cancels = cancels_seen(stack)
    # A token every 3 s: the first within the deadline, the second past the idle limit.
    t0 = time.monotonic()
    stream = c.completions.create(model="enc", prompt="sleep:3000 a b c", max_tokens=4, stream=True)
    got = []
    try:
        for chunk in stream:
            got.append(chunk.choices[0].text)
    except openai.APIError as e:
        assert "sent no part" in str(e) and "2000 ms" in str(e), e
    else:
        raise AssertionError(f"the stream was not ended: {got}")
    took = time.monotonic() - t0
    assert got == ["sleep:3000"] and 4.5 < took < 8, (got, took)
    wait_for_cancel_at_worker(stack, cancels)
    print(f"  a stalled stream ended {took:.1f} s after it started (first part at 3 s, idle limit 2 s)")
    stack.assert_drained()


def worker_log(stack):
    return "".join(open(os.path.join(stack.tmp, f)).read() for f in os.listdir(stack.tmp) if f.startswith("worker-"))


def cancels_seen(stack):
    """The cancels the echo workers logged so far."""
    return worker_log(stack).count("generation cancelled by the server")


def wait_for_cancel_at_worker(stack, before):
    """Waits (5 s at most) until a worker logs a cancel after the ``before`` seen."""
    deadline = time.monotonic() + 5
    while cancels_seen(stack) == before:
        assert time.monotonic() < deadline, "the worker did not see the cancel"
        time.sleep(0.05)


def check_disconnect(stack):
    c = client(stack, TA)
    cancels = cancels_seen(stack)
    stream = c.completions.create(model="enc", prompt="sleep:100 " + WORDS, max_tokens=150, stream=True)
    got = [next(stream).choices[0].text for _ in range(3)]
    assert got[0] == "sleep:100", got
    assert in_flight(stack) == 1
    t0 = time.monotonic()
    stream.close()
    while in_flight(stack) != 0:
        assert time.monotonic() - t0 < 5, "the worker still holds the item 5 s after the disconnect"
        time.sleep(0.01)
    freed = time.monotonic() - t0
    wait_for_cancel_at_worker(stack, cancels)
    print(f"  disconnect to the worker's slot free: {freed * 1000:.0f} ms (the stream had ~15 s to go)")
    stack.assert_drained()


def check_stalled_reader(stack):
    # Tenant a opens a stream of 200 slow tokens and reads nothing after the headers.
    conn = http.client.HTTPConnection("127.0.0.1", stack.http_port, timeout=30)
    body = json.dumps({"model": "enc", "prompt": "sleep:5 " + WORDS, "max_tokens": 200, "stream": True})
    conn.request("POST", "/v1/completions", body=body,
                 headers={"authorization": f"Bearer {TA}", "content-type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200 and r.getheader("content-type").startswith("text/event-stream"), r.status
    # Tenant b's stream goes on meanwhile, part after part.
    c = client(stack, TB)
    t0 = time.monotonic()
    stamps = []
    for ch in c.completions.create(model="enc", prompt="sleep:20 " + WORDS[:300], max_tokens=40, stream=True):
        stamps.append(time.monotonic() - t0)
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    assert len(stamps) == 41, len(stamps)
    assert max(gaps) < 2.0, f"tenant b's stream stalled {max(gaps):.2f} s"
    print(f"  tenant b: 40 parts in {stamps[-1]:.2f} s (largest gap {max(gaps) * 1000:.0f} ms) while a's reader stalled")
    conn.close()
    stack.assert_drained()


def check_kill9(stack):
    """Two streaming slots: item A streams (started), item B is at the worker but has sent
    nothing yet; kill -9 of the worker, and a new one starts."""
    import openai

    victim = stack.workers[-1]
    c = client(stack, TA)
    out = {}

    def started():
        try:
            for ch in c.completions.create(model="enc", prompt="sleep:100 " + WORDS, max_tokens=150, stream=True):
                out.setdefault("a", []).append(ch.choices[0].text)
        except openai.APIError as e:
            out["a_error"] = e

    def unstarted():
        try:
            out["b"] = c.completions.create(model="enc", prompt="sleep:2000 late", max_tokens=1).choices[0].text
        except Exception as e:  # noqa: BLE001
            out["b_error"] = e

    ta = threading.Thread(target=started)
    ta.start()
    deadline = time.monotonic() + 10
    while len(out.get("a", [])) < 2:
        assert time.monotonic() < deadline, "stream a did not start"
        time.sleep(0.01)
    tb = threading.Thread(target=unstarted)
    tb.start()
    while in_flight(stack) < 2:
        assert time.monotonic() < deadline, "item b did not reach the worker"
        time.sleep(0.01)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    stack.workers.remove(victim)
    t0 = time.monotonic()
    ta.join(timeout=10)
    assert not ta.is_alive(), "stream a hung after the kill"
    print(f"  the started stream ended with an error {1000 * (time.monotonic() - t0):.0f} ms after the kill")
    stack.start_worker("rust", extra=["--streams", "2"])
    tb.join(timeout=30)
    assert not tb.is_alive(), "item b hung after the kill"
    assert "a_error" in out, out
    assert "went away" in str(out["a_error"]), out["a_error"]
    assert out.get("b") == "sleep:2000", out
    stack.assert_drained()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "debug", "modelshare"))
    ap.add_argument("--worker-bin", default=os.path.join(ROOT, "target", "debug", "modelshare-echo-worker"))
    args = ap.parse_args()
    args.worker_python = None
    run_steps(args, lambda stack: [
        ("the openai client streams a completion and a chat", lambda: (
            stack.start_worker("rust", extra=["--streams", "4"]), check_streams(stack))),
        ("errors before and after the stream starts", lambda: check_errors(stack)),
        ("tritonclient's gRPC stream", lambda: check_triton_stream(stack)),
        ("KServe generate and generate_stream", lambda: check_kserve_generate(stack)),
        ("a disconnect cancels the item at the worker", lambda: check_disconnect(stack)),
        ("a stalled worker's stream ends at the idle limit", lambda: check_stalled_worker(stack)),
        ("another tenant's stream goes on while a reader stalls", lambda: check_stalled_reader(stack)),
        ("kill -9 ends a started stream and requeues an unstarted one", lambda: (
            stack.stop_worker(stack.workers[0]), stack.start_worker("rust", extra=["--streams", "2"]),
            check_kill9(stack))),
    ])


if __name__ == "__main__":
    main()
