#!/usr/bin/env python3
"""The several-GPU check (needs 2 GPUs: the device tool's nvidia-h200-x2). One server, both GPUs.

  python3 gpu/multi_gpu.py --bin gpu-carry/multi-bin --model-dir gpu-carry/minilm-f16 --out "$OUT"

(--bin holds modelshare, gpu_worker and modelshare-embed, or their .xz; --model-dir MiniLM's
sentence-transformers files, whose tokenizer the BERT-large-shaped model made here borrows.)

Rows:
- devices: `--devices all` (the default) opens both GPUs; GetStats lists them by UUID.
- peer copy anchor: torch's cuda:0 -> cuda:1 copy of 4 GiB, both ways, same run.
- replicas=2: `modelshare load m m --replicas 2` (4 GiB): loaded from the file onto one GPU, copied
  to the other device to device; the copy's seconds and GB/s (server log) beside the anchor; each
  GPU's memory in use (cuMemGetInfo, GetStats) grows by one arena, not two.
- workers per GPU: 4 gpu_worker processes per GPU (CUDA_VISIBLE_DEVICES=0 or 1) attach to the
  replica on their own GPU (the attach reply's device UUID) and compute GEMVs and device
  checksums correctly.
- embeddings 1 -> 2 GPUs: a BERT-large-shaped model (random weights, f16) held with replicas = 2
  (a start-up model of the config file); 4 modelshare-embed workers on GPU 0, then 4 more on
  GPU 1; sentences/s through the OpenAI front door, and the ratio.
- kill -9 of one GPU's workers: while requests flow, every worker on GPU 1 is killed; every
  request is answered (by GPU 0's workers), none fails.
- one device of two (`--devices 1`): a worker seeing that GPU as its ordinal 0 computes on it; a
  worker that cannot see it fails naming the UUID; `--devices 9` is refused at start.
Writes $OUT/multi-gpu.md, $OUT/multi-gpu.json and the logs under $OUT/logs/.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import embed_bench as eb  # noqa: E402
from check import last_json  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 1 << 30

PEER_ANCHOR = r"""
import json, torch
n = 4 << 30
out = {"can_access_peer": torch.cuda.can_device_access_peer(0, 1), "bytes": n}
for a, b in ((0, 1), (1, 0)):
    x = torch.empty(n, dtype=torch.uint8, device=f"cuda:{a}")
    y = torch.empty(n, dtype=torch.uint8, device=f"cuda:{b}")
    y.copy_(x); torch.cuda.synchronize(a); torch.cuda.synchronize(b)
    runs = []
    for _ in range(5):
        s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
        with torch.cuda.device(a):
            s.record(); y.copy_(x); e.record()
        torch.cuda.synchronize(a); torch.cuda.synchronize(b)
        runs.append(n / (s.elapsed_time(e) / 1e3) / 1e9)
    out[f"gbps_{a}to{b}"] = sorted(runs)[len(runs) // 2]
    del x, y; torch.cuda.empty_cache()
print(json.dumps(out))
"""


class Run:
    def __init__(self, args):
        self.args = args
        self.rows, self.figures = [], {}
        self.bench = eb.Bench(types.SimpleNamespace(
            out=args.out, model_dir=args.model_dir, sentences=args.sentences, budget_s=1e9, bin=args.bin,
            st_device="cuda", backend="cuda", child=None))
        self.env = self.bench.env
        self.work = args.work
        os.makedirs(os.path.join(self.work, "models"), exist_ok=True)
        self.server = None

    def row(self, name, ok, text):
        self.rows.append((name, "PASS" if ok else "FAIL", text))
        print(f"[{'PASS' if ok else 'FAIL'}] {name}: {text}", flush=True)

    def b(self, name):
        return self.bench.binary(name)

    def cli(self, *a, addr=None):
        p = subprocess.run([self.b("modelshare"), "--server", addr or self.addr, "--output", "json", *a],
                           capture_output=True, text=True, env=self.env, timeout=600)
        return p, last_json(p.stdout) or {}

    def start_server(self, name, extra, config=""):
        sock = os.path.join(self.work, f"{name}.sock")
        self.addr = f"unix:{sock}"
        self.port, self.metrics_port = eb.free_port(), eb.free_port()
        cfg = os.path.join(self.work, f"{name}.toml")
        with open(cfg, "w") as f:
            f.write("[serving]\nmax_queue_items = 1048576\nmax_tenant_requests = 4096\n" + config)
        self.server_log = os.path.join(self.bench.logs, f"{name}-server.log")
        self.server = self.bench.spawn(f"{name}-server", [
            self.b("modelshare"), "serve", "--backend", "cuda", "--config", cfg, "--log-format", "json",
            "--model-root", os.path.join(self.work, "models"), "--unix-socket", sock,
            "--handle-socket", os.path.join(self.work, f"{name}-h.sock"), "--http-listen", f"127.0.0.1:{self.port}",
            "--metrics-listen", f"127.0.0.1:{self.metrics_port}", *extra])
        deadline = time.time() + 300
        while time.time() < deadline:
            if self.server.poll() is not None:
                raise RuntimeError(f"server {name} exited: {open(self.server_log).read()[-2000:]}")
            try:
                import urllib.request
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as r:
                    if r.status == 200:
                        return
            except Exception:  # noqa: BLE001
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server {name} not ready after 300 s")

    def stop_server(self):
        if self.server:
            eb.stop(self.server, grace=60)
            rc = self.server.returncode
            self.server = None
            return rc
        return None

    def log_lines(self, message):
        out = []
        for line in open(self.server_log):
            if f'"{message}"' in line:
                try:
                    out.append(json.loads(line)["fields"])
                except (ValueError, KeyError):
                    pass
        return out

    def stats(self):
        return self.cli("stats")[1]

    # -- rows ------------------------------------------------------------------------------------

    def gpus(self):
        rows = eb.nvidia_smi("--query-gpu=index,uuid,name,memory.total")
        self.uuids = [r[1] for r in rows]
        self.figures["gpus"] = rows
        print("\n".join(", ".join(r) for r in rows), flush=True)
        return len(self.uuids) >= 2

    def peer_anchor(self):
        p = subprocess.run([sys.executable, "-c", PEER_ANCHOR], capture_output=True, text=True, env=self.env,
                           timeout=300)
        r = last_json(p.stdout) or {}
        self.figures["peer_anchor"] = r
        self.row("peer copy anchor", bool(r.get("gbps_0to1")),
                 f"torch copy_ of 4 GiB cuda:0->cuda:1 {r.get('gbps_0to1', 0):.1f} GB/s, cuda:1->cuda:0 "
                 f"{r.get('gbps_1to0', 0):.1f} GB/s (peer access {r.get('can_access_peer')}) {p.stderr[-300:]}")

    def devices(self):
        s = self.stats()
        listed = [d.get("uuid") for d in s.get("devices", [])]
        self.row("devices", listed == self.uuids, f"--devices all: GetStats lists {listed}")

    def replicas(self):
        before = {d["uuid"]: d["used_bytes"] for d in self.stats().get("devices", [])}
        t = time.perf_counter()
        p, done = self.cli("load", "m", "m", "--replicas", "2")
        seconds = time.perf_counter() - t
        v = done.get("version", {})
        after_stats = self.stats()
        after = {d["uuid"]: d["used_bytes"] for d in after_stats.get("devices", [])}
        arena = v.get("arena_bytes", 0)
        grew = {u: after.get(u, 0) - before.get(u, 0) for u in self.uuids}
        one_each = arena > 0 and all(arena <= g <= arena * 1.02 + (256 << 20) for g in grew.values())
        copied = [f for f in self.log_lines("replica copied") if f.get("model") == "m"]
        loaded = [f for f in self.log_lines("model loaded") if f.get("model") == "m"]
        c = copied[-1] if copied else {}
        anchor = self.figures.get("peer_anchor", {})
        self.figures["replicas"] = {"cli_seconds": seconds, "version": v, "used_growth": grew, "copied": c,
                                    "loaded": loaded[-1] if loaded else {}}
        ok = p.returncode == 0 and sorted(v.get("devices", [])) == sorted(self.uuids) and one_each and bool(c)
        self.row("replicas=2", ok,
                 f"{arena / GIB:.2f} GiB on {v.get('devices')}: CLI {seconds:.2f} s; load from the file "
                 f"{(loaded[-1] if loaded else {}).get('gb_per_s', 0):.1f} GB/s; second replica copied device to "
                 f"device in {c.get('copy_seconds', 0):.3f} s = {c.get('gb_per_s', 0):.1f} GB/s (torch peer copy "
                 f"{anchor.get('gbps_0to1', 0):.1f} / {anchor.get('gbps_1to0', 0):.1f} GB/s); memory in use grew "
                 + ", ".join(f"{u[:12]}… {g / GIB:.2f} GiB" for u, g in grew.items())
                 + f" (one arena each: {one_each}) {p.stderr[-300:]}")

    def workers_per_gpu(self):
        procs = []
        for gpu in (0, 1):
            for i in range(4):
                procs.append((gpu, subprocess.Popen(
                    [self.b("gpu_worker"), "check", "--server", self.addr, "--model", "m"],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                    env=dict(self.env, CUDA_VISIBLE_DEVICES=str(gpu)))))
        results = []
        for gpu, p in procs:
            out, err = p.communicate(timeout=300)
            r = last_json(out) or {"error": err[-300:]}
            results.append((gpu, r))
        right = [r.get("ok") and r.get("device") == self.uuids[gpu] for gpu, r in results]
        self.figures["workers_per_gpu"] = [dict(r, gpu=g) for g, r in results]
        self.row("4 workers per GPU", all(right),
                 f"{sum(right)}/8 attached to the replica on their own GPU and computed "
                 f"{results[0][1].get('matrices')} GEMVs + {results[0][1].get('ms64_checked')} device checksums "
                 f"correctly; attach ms " + ", ".join(f"{r.get('attach_ms', 0):.2f}" for _, r in results)
                 + "".join(f"; GPU {g}: {r.get('error', '')[:200]}" for g, r in results if r.get("error")))

    def embed_workers(self, gpu, n, first):
        out = []
        for i in range(first, first + n):
            out.append(self.bench.spawn(f"embed-worker-{i}-gpu{gpu}", [
                self.b("modelshare-embed"), "--server", self.addr, "--model", "bert", "--name", f"gpu{gpu}-{i}",
                "--max-batch-items", "256", "--max-batch-tokens", "16384"]))
            out[-1].gpu = gpu
        # The CUDA_VISIBLE_DEVICES of each (spawn takes the bench's env): set through the env.
        return out

    def spawn_on(self, gpu, n, first):
        saved = self.bench.env
        self.bench.env = dict(saved, CUDA_VISIBLE_DEVICES=str(gpu))
        try:
            return self.embed_workers(gpu, n, first)
        finally:
            self.bench.env = saved

    def serving(self):
        want = 'modelshare_serving_workers{model="bert"} '
        for line in (eb.Stack.get(self, "/metrics") or "").splitlines():
            if line.startswith(want):
                return int(float(line.split()[-1]))
        return 0

    def get(self, path):
        return eb.Stack.get(self, path)

    def wait_serving(self, n, procs):
        deadline = time.time() + 180
        while self.serving() < n:
            dead = [p for p in procs if p.poll() is not None]
            if dead or time.time() > deadline:
                raise RuntimeError(f"{n} workers do not serve (exited: {[p.returncode for p in dead]})")
            time.sleep(0.2)

    def embeddings(self):
        sentences = self.bench.sentences
        chunks = eb.make_requests(len(sentences))
        conc = self.args.concurrency
        gpu0 = self.spawn_on(0, 4, 0)
        self.wait_serving(4, [self.server, *gpu0])
        eb.http_load(self.port, "bert", sentences, chunks, conc)
        one, _ = eb.http_load(self.port, "bert", sentences, chunks, conc)
        gpu1 = self.spawn_on(1, 4, 4)
        self.wait_serving(8, [self.server, *gpu0, *gpu1])
        eb.http_load(self.port, "bert", sentences, chunks, conc)
        two, _ = eb.http_load(self.port, "bert", sentences, chunks, conc)
        _, ps = self.cli("ps")
        on = {}
        for s in ps.get("sessions", []):
            for lease in s.get("leases", []):
                if lease.get("model") == "bert":
                    on[lease.get("device_uuid")] = on.get(lease.get("device_uuid"), 0) + 1
        s1, s2 = one["sentences"] / one["seconds"], two["sentences"] / two["seconds"]
        self.figures["embeddings"] = {"one_gpu": one, "two_gpus": two, "leases_by_device": on,
                                      "sentences": len(sentences), "concurrency": conc}
        ok = one["errors"] == 0 and two["errors"] == 0 and sorted(on.values()) == [4, 4]
        self.row("embeddings 1 -> 2 GPUs", ok,
                 f"BERT-large-shaped f16, replicas = 2, {len(sentences)} sentences in requests of 64-128, {conc} "
                 f"clients: 4 workers on GPU 0 {s1:,.0f} sentences/s; + 4 on GPU 1 {s2:,.0f} sentences/s: "
                 f"**{s2 / s1:.2f}x**; leases by device {on}; errors {one['errors']}/{two['errors']} "
                 f"{one['first_errors'] or two['first_errors'] or ''}")
        return gpu0, gpu1

    def kill_one_gpu(self, gpu1):
        # Long enough that the kill lands mid-run (the whole set takes ~1 s on two GPUs).
        sentences = self.bench.sentences * 5
        chunks = eb.make_requests(len(sentences))
        result = {}

        def flow():
            result["run"], _ = eb.http_load(self.port, "bert", sentences, chunks, self.args.concurrency)

        t = threading.Thread(target=flow)
        started = time.time()
        t.start()
        time.sleep(0.5)
        for p in gpu1:
            p.send_signal(signal.SIGKILL)
        killed_after = time.time() - started
        alive = t.is_alive()
        t.join(timeout=600)
        after = time.time() - started - killed_after
        run = result.get("run", {})
        self.figures["kill_one_gpu"] = dict(run, killed_after_s=killed_after, ended_after_kill_s=after)
        # Valid only if requests were still flowing when the workers died.
        ok = alive and after > 0.5 and run.get("errors") == 0 and run.get("sentences") == len(sentences)
        self.row("kill -9 of GPU 1's workers", ok,
                 f"4 workers on GPU 1 killed {killed_after:.1f} s into a {len(sentences)}-sentence run (still "
                 f"running: {alive}); it ended {after:.1f} s later: {run.get('sentences')} answered, "
                 f"{run.get('errors')} errors {run.get('first_errors') or ''}")

    def one_of_two(self):
        self.start_server("one", ["--devices", "1"])
        try:
            s = self.stats()
            listed = [d.get("uuid") for d in s.get("devices", [])]
            self.row("--devices 1", listed == [self.uuids[1]], f"GetStats lists {listed} (GPU 1 is {self.uuids[1]})")
            self.cli("load", "m", "m")
            w = subprocess.run([self.b("gpu_worker"), "check", "--server", self.addr, "--model", "m"],
                               capture_output=True, text=True, env=dict(self.env, CUDA_VISIBLE_DEVICES="1"), timeout=300)
            r = last_json(w.stdout) or {}
            self.row("remapped worker", bool(r.get("ok")) and r.get("device") == self.uuids[1],
                     f"CUDA_VISIBLE_DEVICES=1 (the server's GPU 1 is this worker's ordinal 0): {r.get('matrices')} "
                     f"GEMVs and {r.get('ms64_checked')} device checksums correct: {r.get('ok')}")
            w = subprocess.run([self.b("gpu_worker"), "check", "--server", self.addr, "--model", "m"],
                               capture_output=True, text=True, env=dict(self.env, CUDA_VISIBLE_DEVICES="0"), timeout=300)
            err = (last_json(w.stdout) or {}).get("error", "") or w.stderr[-300:]
            self.row("invisible device", w.returncode != 0 and self.uuids[1] in err, f"CUDA_VISIBLE_DEVICES=0: {err[:200]}")
        finally:
            rc = self.stop_server()
        self.row("shutdown", rc == 0, f"exit {rc}")
        bad = subprocess.run([self.b("modelshare"), "serve", "--backend", "cuda", "--devices", "9", "--unix-socket",
                              os.path.join(self.work, "bad.sock"), "--handle-socket", os.path.join(self.work, "bad-h.sock")],
                             capture_output=True, text=True, env=self.env, timeout=60)
        last = bad.stderr.strip().splitlines()[-1][:200] if bad.stderr.strip() else "(no message)"
        self.row("bad device", bad.returncode != 0 and "'9'" in bad.stderr and "panicked" not in bad.stderr, last)

    def run(self):
        if not self.gpus():
            self.row("gpus", False, f"{len(self.uuids)} GPU(s): this check needs 2")
            return
        if not self.args.only:
            self.peer_anchor()
        models = os.path.join(self.work, "models")
        m = os.path.join(models, "m", "model.safetensors")
        if not os.path.exists(m):
            subprocess.run([sys.executable, os.path.join(ROOT, "bench", "anchors.py"), "make-model", "--out", m,
                            "--gib", str(self.args.gib), "--tensors", "64", "--dtype", "bf16"], check=True, env=self.env)
        bert = os.path.join(models, "bert")
        if not os.path.exists(bert):
            os.rename(self.bench.make_large(), bert)
        self.start_server("two", [], '[[models]]\nname = "bert"\npath = "bert"\nreplicas = 2\n')
        want = lambda s: not self.args.only or s in self.args.only.split(",")  # noqa: E731
        try:
            self.devices()
            if want("replicas"):
                self.replicas()
                self.workers_per_gpu()
            _, gpu1 = self.embeddings()
            self.kill_one_gpu(gpu1)
        finally:
            for p in self.bench.procs:
                if p is not self.server and p.poll() is None:
                    eb.stop(p, grace=10)
            rc = self.stop_server()
        self.row("shutdown (two GPUs)", rc == 0, f"exit {rc}")
        if want("one"):
            self.one_of_two()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="gpu-carry/multi-bin")
    ap.add_argument("--model-dir", default="gpu-carry/minilm-f16")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/multi-gpu-out"))
    ap.add_argument("--work", default="/tmp/multi-gpu")
    ap.add_argument("--gib", type=float, default=4)
    ap.add_argument("--sentences", type=int, default=8000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--only", default="", help="replicas,one (default: all; devices, embeddings and the kill "
                    "always run)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    r = Run(args)
    try:
        r.run()
    except Exception as e:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        r.row("aborted", False, f"{type(e).__name__}: {e}")
        if r.server and r.server.poll() is None:
            r.server.kill()
    text = "| check | result | figures |\n| --- | --- | --- |\n" + "\n".join(f"| {n} | {s} | {t} |" for n, s, t in r.rows)
    print("\n" + text, flush=True)
    open(os.path.join(args.out, "multi-gpu.md"), "w").write(text + "\n")
    with open(os.path.join(args.out, "multi-gpu.json"), "w") as f:
        json.dump({"rows": r.rows, "figures": r.figures}, f, indent=1, default=str)
    return 0 if r.rows and all(s == "PASS" for _, s, _ in r.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
