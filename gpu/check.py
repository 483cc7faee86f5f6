#!/usr/bin/env python3
"""The GPU check: every GPU test and benchmark of modelshare in one run, ending in a table.

Run on a GPU machine, after `scripts/gpu-build` built the binaries elsewhere:
    python3 gpu/check.py --bin gpu-carry/bin --out "$OUT"

What it checks (each row of the table says PASS/FAIL and the figures):
  kernels      GEMV (f32/f16/bf16) and ms64 against the CPU references; GEMV GB/s vs D2D copy
  anchors      safetensors.torch.load_file, torch.multiprocessing IPC, pinned/pageable H2D, D2D
  load         our load of the same 8 GiB file from page cache (GB/s)
  during-load  workers attached while the load runs: first GEMV results correct (ready event)
  8 workers    8 processes attach one model; results vs CPU reference; device memory held once
  kill -9      a worker killed with kernels in flight: server healthy, accounting right, next ok
  gemv         GEMV over the imported mapping vs a private copy (ratio), vs D2D bandwidth
  attach       attach latency p50/p99 over 1000 attaches of a 256-tensor model
  remap        a worker with CUDA_VISIBLE_DEVICES naming the GPU by UUID finds it
  write (vmm)  a worker's copy and kernel writes into a VMM mapping fail; the server, a worker
               computing beside it and the device checksums of the weights are unaffected
  namespaces   a worker in its own PID, IPC and mount namespaces attaches through VMM, correct
  legacy       a server with --cuda-handles legacy: the same write goes through (a worker's
               check sees the changed bytes); attach latency beside VMM's
  loader rows  (gpu/loader_steps.py) the anchors fastsafetensors and instanttensor beside
               safetensors; `modelshare load` median of 3; a cold load against the raw direct-I/O
               read of the same file; two 8 GiB models at once
  server kill -9  4 workers run GEMV in a loop while the server is killed and restarted: every
               pass stays bit-identical, the restarted server adopts the memory they kept (one
               copy on the device, not two) and their sessions re-attach
  share        (a server with the default --share-identical) the same 8 GiB files under a second
               name: device memory does not grow, the load compares instead of copying (GB/s
               beside the copy's), workers compute right on the second name before and after the
               first is unloaded; a 1 GiB model and a copy with its last byte changed: two copies

The main server shares arenas through VMM (--cuda-handles auto on a device that supports it),
with --share-identical off, so that the load rows, which load the same file under several
names, measure copies; the share step runs a server of its own with the default.
"""

import argparse
import datetime
import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time

import loader_steps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 1 << 30


def log(msg):
    print(msg, flush=True)


def cpu_seconds(pid):
    """User and system CPU seconds of process `pid` (all its threads) so far; 0 once it is gone."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def lib_path():
    paths = ["/usr/local/nvidia/lib64", "/usr/local/cuda/lib64"]
    for pattern in ["/usr/local/lib/python3*/dist-packages/nvidia/*/lib", "/opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib",
                    "/usr/lib/python3*/site-packages/nvidia/*/lib"]:
        paths += glob.glob(pattern)
    try:
        import torch  # noqa: F401
        base = os.path.dirname(os.path.dirname(torch.__file__))
        paths += glob.glob(os.path.join(base, "nvidia", "*", "lib"))
    except Exception:  # noqa: BLE001
        pass
    return ":".join(p for p in paths if os.path.isdir(p))


def last_json(text):
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


class Check:
    def __init__(self, args):
        self.args = args
        self.bin = os.path.abspath(args.bin)
        self.work = args.work
        self.out = args.out
        os.makedirs(self.work, exist_ok=True)
        os.makedirs(self.out, exist_ok=True)
        self.env = dict(os.environ)
        self.env["LD_LIBRARY_PATH"] = lib_path() + ":" + self.env.get("LD_LIBRARY_PATH", "")
        self.env["MODELSHARE_KERNEL_CACHE"] = os.path.join(self.work, "kernel-cache")
        self.rows = []
        self.results = {}
        self.socket = os.path.join(self.work, "grpc.sock")
        self.address = f"unix:{self.socket}"
        self.server = None

    def row(self, name, ok, figures):
        self.rows.append((name, "PASS" if ok else "FAIL", figures))
        log(f"[{'PASS' if ok else 'FAIL'}] {name}: {figures}")
        with open(os.path.join(self.out, "rows.txt"), "a") as f:
            f.write(f"[{'PASS' if ok else 'FAIL'}] {name}: {figures}\n")

    def run(self, cmd, timeout=600, env=None, check=False):
        log("$ " + " ".join(cmd))
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env or self.env)
        if p.returncode != 0:
            log(p.stdout[-3000:])
            log(p.stderr[-3000:])
            if check:
                raise RuntimeError(f"{cmd[0]} failed with {p.returncode}")
        return p

    def cli(self, *args, timeout=600):
        return self.run([f"{self.bin}/modelshare", "--server", self.address, "--output", "json", *args], timeout=timeout)

    def stats(self):
        return last_json(self.cli("stats").stdout) or {}

    def worker(self, *args, env=None):
        return subprocess.Popen([f"{self.bin}/gpu_worker", *args, "--server", self.address], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env or self.env)

    # ---- steps -------------------------------------------------------------------------------

    def device(self):
        p = self.run(["nvidia-smi", "--query-gpu=name,uuid,memory.total,driver_version", "--format=csv,noheader"])
        name, uuid, mem, driver = [x.strip() for x in p.stdout.strip().splitlines()[0].split(",")]
        self.results["device"] = {"name": name, "uuid": uuid, "memory": mem, "driver": driver,
                                  "date": datetime.date.today().isoformat()}
        log(f"device: {name} {uuid} {mem} driver {driver}")

    def kernels(self):
        p = self.run([f"{self.bin}/kernel_check"], timeout=900)
        r = last_json(p.stdout) or {}
        self.results["kernels"] = r
        with open(os.path.join(self.out, "kernel_check.txt"), "w") as f:
            f.write(p.stdout + p.stderr)
        gemv = r.get("gemv", [])
        best = max((g.get("gbps") or 0 for g in gemv), default=0)
        self.row("kernels", p.returncode == 0, f"gemv/ms64 vs CPU ref ok={p.returncode == 0}; best gemv {best:.0f} GB/s; "
                 f"d2d {r.get('d2d_gbps') or 0:.0f} GB/s")

    def encoder_kernels(self):
        p = self.run([f"{self.bin}/encoder_check"], timeout=600)
        r = last_json(p.stdout) or {}
        self.results["encoder_kernels"] = r
        with open(os.path.join(self.out, "encoder_check.txt"), "w") as f:
            f.write(p.stdout + p.stderr)
        checks = r.get("checks", [])
        good = sum(1 for c in checks if c.get("ok"))
        layer = next((t for t in r.get("bert_large_f16", []) if "layer" in str(t.get("step", ""))), {})
        self.row("encoder kernels", p.returncode == 0 and checks and good == len(checks),
                 f"{good}/{len(checks)} checks vs the CPU references (f32/f16/bf16); BERT-large f16 layer "
                 f"{layer.get('tflops') or 0:.0f} TFLOP/s")

    def anchors(self, model_file):
        py = sys.executable
        a = os.path.join(ROOT, "bench", "anchors.py")
        if not os.path.exists(model_file):
            self.run([py, a, "make-model", "--out", model_file, "--gib", str(self.args.gib), "--tensors", "256", "--dtype", "bf16"],
                     timeout=900, check=True)
        with open(os.path.join(os.path.dirname(model_file), "config.json"), "w") as f:
            json.dump({"model_type": "gpu-check", "tensors": 256}, f)
        load = last_json(self.run([py, a, "load-baseline", "--path", model_file, "--repeat", "3"], timeout=900).stdout) or {}
        ipc = last_json(self.run([py, a, "ipc-baseline", "--gib", str(self.args.gib), "--tensors", "256", "--repeat", "20"],
                                 timeout=900).stdout) or {}
        copy = last_json(self.run([py, a, "copy-bandwidth"], timeout=600).stdout) or {}
        self.results["anchors"] = {"load": load, "ipc": ipc, "copy": copy}
        self.row("anchors", bool(load.get("gbps")) and bool(ipc.get("ipc_baseline_ms")),
                 f"safetensors load_file {load.get('gbps') or 0:.2f} GB/s; torch IPC p50 "
                 f"{(ipc.get('ipc_baseline_ms') or {}).get('p50') or 0:.1f} ms; pinned H2D {copy.get('h2d_pinned_gbps') or 0:.1f} GB/s")

    def start_server(self, log_name="server.log", extra=("--share-identical", "off")):
        self.server_log = open(os.path.join(self.out, log_name), "w")
        self.server = subprocess.Popen(
            [f"{self.bin}/modelshare", "serve", "--backend", "cuda", "--device", "0", "--unix-socket", self.socket,
             "--handle-socket", os.path.join(self.work, "handles.sock"), "--model-root", os.path.join(self.work, "models"),
             "--log-format", "json", *extra], stdout=self.server_log, stderr=self.server_log, env=self.env)
        for _ in range(600):
            if os.path.exists(self.socket) and self.stats().get("device"):
                return
            if self.server.poll() is not None:
                raise RuntimeError("server exited at start; see server.log")
            time.sleep(0.1)
        raise RuntimeError("server not ready in 60 s")

    def load_during_attach(self):
        s0 = self.stats()
        # Workers first: each creates its context, says so, then polls Attach every 5 ms until
        # version 1 exists, so that they attach at the start of the load, not after it.
        workers = [self.worker("check", "--model", "m", "--version", "1", "--retry-secs", "60", "--announce")
                   for _ in range(4)]
        for w in workers:
            w.stdout.readline()
        t = time.perf_counter()
        load = subprocess.Popen([f"{self.bin}/modelshare", "--server", self.address, "--output", "json", "load", "m", "m"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env)
        out, err = load.communicate(timeout=180)
        wall = time.perf_counter() - t
        done = last_json(out) or {}
        reports = []
        for w in workers:
            o, e = w.communicate(timeout=300)
            reports.append(last_json(o) or {"ok": False, "error": e[-500:]})
        s1 = self.stats()
        loaded = [json.loads(l) for l in open(self.server_log.name) if '"model loaded"' in l]
        server_gbps = loaded[-1]["fields"]["gb_per_s"] if loaded else 0
        total = (done.get("version") or {}).get("bytes_total") or 0
        during = sum(1 for r in reports if r.get("attached_while_loading"))
        self.results["load"] = {"cli": done, "wall_s": wall, "server_gbps": server_gbps, "bytes": total,
                                "device_used_before": s0.get("device_used_bytes"), "device_used_after": s1.get("device_used_bytes")}
        self.results["during_load"] = reports
        ok_load = (done.get("version") or {}).get("state") == "ready"
        self.row("load", ok_load, f"{total / GIB:.2f} GiB: {server_gbps:.2f} GB/s in the loader, {total / wall / 1e9:.2f} GB/s "
                 f"end to end (CLI wall {wall:.2f} s); safetensors load_file "
                 f"{self.results.get('anchors', {}).get('load', {}).get('gbps') or 0:.2f} GB/s")
        self.row("during-load", all(r.get("ok") for r in reports) and during > 0,
                 f"{during}/4 workers attached while loading; all results match the CPU reference: "
                 f"{all(r.get('ok') for r in reports)}; max rel err {max((r.get('max_rel_err', 9) for r in reports), default=9):.1e}")
        return s1

    def load_again(self):
        """A second load of the same file into a warm server (staging buffers reused)."""
        t = time.perf_counter()
        p = self.cli("load", "again", "m", "--keep-previous", timeout=300)
        wall = time.perf_counter() - t
        done = last_json(p.stdout) or {}
        loaded = [json.loads(l) for l in open(self.server_log.name) if '"model loaded"' in l]
        phases = [json.loads(l) for l in open(self.server_log.name) if '"load phases"' in l]
        gbps = loaded[-1]["fields"]["gb_per_s"] if loaded else 0
        self.results["load_again"] = {"cli": done, "wall_s": wall, "server_gbps": gbps,
                                      "phases": [p["fields"] for p in phases]}
        self.cli("unload", "again")
        ph = phases[-1]["fields"] if phases else {}
        self.row("load (2nd)", (done.get("version") or {}).get("state") == "ready",
                 f"{gbps:.2f} GB/s in the loader (copy {ph.get('copy_seconds') or 0:.2f} s with {ph.get('threads')} threads, "
                 f"device checksums {ph.get('checksum_seconds') or 0:.3f} s), CLI wall {wall:.2f} s")

    def eight_workers(self, s1):
        procs = [self.worker("check", "--model", "m", "--hold") for _ in range(self.args.workers)]
        reports = []
        for p in procs:
            line = p.stdout.readline()
            try:
                reports.append(json.loads(line))
            except json.JSONDecodeError:
                reports.append({"ok": False, "error": line + p.stderr.read()[-500:] if p.poll() is not None else line})
        time.sleep(1)
        s2 = self.stats()
        apps = self.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]).stdout
        per_pid = {int(a.split(",")[0]): int(a.split(",")[1]) for a in apps.strip().splitlines() if a.strip()}
        model_bytes = self.results["load"]["bytes"]
        grow_load = (s1.get("device_used_bytes") or 0 or 0) - (self.results["load"]["device_used_before"] or 0)
        grow_workers = (s2.get("device_used_bytes") or 0 or 0) - (s1.get("device_used_bytes") or 0 or 0)
        worker_mib = [per_pid.get(r.get("pid"), 0) for r in reports]
        self.results["eight_workers"] = {"reports": reports, "stats": s2, "device_used_growth_load": grow_load,
                                         "device_used_growth_8_workers": grow_workers, "per_worker_mib": worker_mib,
                                         "server_mib": per_pid.get(self.server.pid)}
        ok = bool(reports) and all(r.get("ok") for r in reports) and s2.get("leases") == self.args.workers and grow_workers < model_bytes
        self.row(f"{self.args.workers} workers", ok,
                 f"all match CPU ref: {all(r.get('ok') for r in reports)}; device use +{grow_load / GIB:.2f} GiB at load "
                 f"(model {model_bytes / GIB:.2f} GiB), +{grow_workers / GIB:.2f} GiB for {self.args.workers} workers "
                 f"(contexts + x/y buffers; nvidia-smi per worker {min(worker_mib, default=0)}-{max(worker_mib, default=0)} MiB) "
                 f"vs {self.args.workers * model_bytes / GIB:.0f} GiB for private copies")
        return procs

    def kill_nine(self, procs):
        victim = procs[0]
        os.kill(victim.pid, signal.SIGKILL)
        t = time.perf_counter()
        gone = None
        while time.perf_counter() - t < 5:
            s = self.stats()
            if s.get("leases") == self.args.workers - 1:
                gone = time.perf_counter() - t
                break
            time.sleep(0.02)
        after = self.stats()
        nxt = self.worker("check", "--model", "m")
        o, e = nxt.communicate(timeout=900)
        r = last_json(o) or {"ok": False, "error": e[-500:]}
        self.results["kill9"] = {"noticed_s": gone, "stats": after, "next": r}
        self.row("kill -9", gone is not None and r.get("ok") and after.get("arenas") == 1,
                 f"session+lease gone {1000 * (gone or 99):.0f} ms after kill -9 with GEMVs in flight; arenas {after.get('arenas')}; "
                 f"next worker correct: {r.get('ok')}")
        for p in procs[1:]:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)

    def gemv_bench(self):
        p = self.worker("bench-gemv", "--model", "m", "--iters", "20")
        o, e = p.communicate(timeout=900)
        r = last_json(o) or {}
        self.results["gemv"] = r
        ratio = r.get("ratio_imported_over_private") or 0
        self.row("gemv", ratio >= 0.98,
                 f"imported {r.get('imported_gbps') or 0:.0f} GB/s vs private {r.get('private_gbps') or 0:.0f} GB/s "
                 f"(ratio {ratio:.3f}); D2D copy {r.get('d2d_copy_gbps') or 0:.0f} GB/s read+write")

    def attach_bench(self):
        p = self.worker("attach-bench", "--model", "m", "--n", "1000")
        o, e = p.communicate(timeout=900)
        r = last_json(o) or {}
        self.results["attach"] = r
        ipc = (self.results.get("anchors", {}).get("ipc", {}).get("ipc_baseline_ms") or {})
        self.row("attach", r.get("p50_ms", 99) < 2.0,
                 f"p50 {r.get('p50_ms') or 0:.3f} ms, p99 {r.get('p99_ms') or 0:.3f} ms over {r.get('n')} attaches of "
                 f"{r.get('tensors')} tensors (context creation {r.get('context_ms') or 0:.0f} ms, separate); torch IPC p50 "
                 f"{ipc.get('p50') or 0:.1f} ms")

    def remap(self):
        uuid = self.results["device"]["uuid"]
        env = dict(self.env, CUDA_VISIBLE_DEVICES=uuid)
        p = self.worker("check", "--model", "m", env=env)
        o, e = p.communicate(timeout=900)
        r = last_json(o) or {"ok": False, "error": e[-500:]}
        self.results["remap"] = r
        self.row("remap", bool(r.get("ok")), f"worker with CUDA_VISIBLE_DEVICES={uuid[:12]}... found the device by UUID "
                 "(one GPU: the ordinal stays 0)")

    def probe(self, how, address=None):
        p = subprocess.run([f"{self.bin}/gpu_worker", "write-probe", "--model", "m", "--how", how, "--server",
                            address or self.address], capture_output=True, text=True, timeout=600, env=self.env)
        return last_json(p.stdout) or {"result": "no report", "error": p.stderr[-300:]}

    def loop_workers(self, n, secs, address=None):
        procs = [subprocess.Popen([f"{self.bin}/gpu_worker", "loop", "--model", "m", "--secs", str(secs), "--server",
                                   address or self.address], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=self.env) for _ in range(n)]
        started = [json.loads(p.stdout.readline() or "{}") for p in procs]
        return procs, started

    @staticmethod
    def finish(procs):
        out = []
        for p in procs:
            o, e = p.communicate(timeout=600)
            out.append(last_json(o) or {"ok": False, "error": e[-400:]})
        return out

    def vmm_writes(self):
        """Writes through VMM mappings fail, in the writer only."""
        kind = (self.stats().get("device") or {}).get("backend")
        procs, started = self.loop_workers(1, 12)
        memcpy = self.probe("memcpy")
        kernel = self.probe("kernel")
        after = last_json(self.worker("check", "--model", "m").communicate(timeout=900)[0]) or {}
        bystander = self.finish(procs)[0]
        alive = self.server.poll() is None and bool(self.stats().get("device"))
        self.results["vmm_writes"] = {"backend": kind, "memcpy": memcpy, "kernel": kernel, "check_after": after,
                                      "bystander": bystander, "server_alive": alive}
        ok = (kind == "cuda-vmm" and memcpy.get("read_only") is True and memcpy.get("result") == "CUDA_ERROR_INVALID_VALUE"
              and "ILLEGAL_ADDRESS" in str(kernel.get("result")) and after.get("ok") and after.get("ms64_checked", 0) > 0
              and bystander.get("ok") and alive)
        self.row("write (vmm)", ok,
                 f"server shares {kind}; copy into the mapping: {memcpy.get('result')}; kernel store: "
                 f"{kernel.get('result')} (that worker only); afterwards device ms64 of {after.get('ms64_checked')} "
                 f"tensors and GEMV {'match' if after.get('ok') else 'DO NOT match'}; a worker computing beside it: "
                 f"{bystander.get('passes')} passes, {bystander.get('bad')} bad; server alive: {alive}")

    def namespaces(self):
        """A worker in its own PID, IPC and mount namespaces attaches through VMM."""
        cmd = ["unshare", "--pid", "--ipc", "--mount", "--mount-proc", "--fork", f"{self.bin}/gpu_worker", "check",
               "--model", "m", "--server", self.address]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=self.env)
        r = last_json(p.stdout) or {"ok": False, "error": p.stderr[-400:]}
        self.results["namespaces"] = r
        self.row("namespaces", bool(r.get("ok")) and r.get("pid") == 1,
                 f"unshare --pid --ipc --mount --mount-proc: worker pid {r.get('pid')} in its namespace; GEMV and "
                 f"device ms64 of {r.get('ms64_checked')} tensors {'correct' if r.get('ok') else 'WRONG: ' + str(r.get('error') or r.get('failures'))}")

    def legacy(self):
        """A legacy-IPC server: a worker's write goes through; attach latency beside VMM's."""
        sock = os.path.join(self.work, "legacy.sock")
        address = f"unix:{sock}"
        with open(os.path.join(self.out, "legacy-server.log"), "w") as lf:
            srv = subprocess.Popen(
                [f"{self.bin}/modelshare", "serve", "--backend", "cuda", "--cuda-handles", "legacy", "--unix-socket", sock,
                 "--handle-socket", os.path.join(self.work, "legacy-handles.sock"), "--model-root",
                 os.path.join(self.work, "models"), "--log-format", "json"], stdout=lf, stderr=lf, env=self.env)
            try:
                cli = lambda *a: self.run([f"{self.bin}/modelshare", "--server", address, "--output", "json", *a],  # noqa: E731
                                          timeout=900)
                for _ in range(600):
                    if os.path.exists(sock) and cli("stats").returncode == 0:
                        break
                    time.sleep(0.1)
                kind = ((last_json(cli("stats").stdout) or {}).get("device") or {}).get("backend")
                cli("load", "m", "m")
                bench = last_json(self.run([f"{self.bin}/gpu_worker", "attach-bench", "--model", "m", "--n", "1000",
                                            "--server", address], timeout=900).stdout) or {}
                # The SDK's verify() (`modelshare probe`): the manifest's checksums are ms64 only
                # (no CPU hash on CUDA loads); clean before the write, a mismatch after it.
                sdk_before = last_json(cli("probe", "m").stdout) or {}
                memcpy = self.probe("memcpy", address)
                after = last_json(self.run([f"{self.bin}/gpu_worker", "check", "--model", "m", "--server", address],
                                           timeout=900).stdout) or {}
                sdk_after = last_json(cli("probe", "m").stdout) or {}
            finally:
                srv.terminate()
                try:
                    srv.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    srv.kill()
        vmm = self.results.get("attach") or {}
        ipc = (self.results.get("anchors", {}).get("ipc", {}).get("ipc_baseline_ms") or {})
        self.results["legacy"] = {"backend": kind, "attach": bench, "memcpy": memcpy, "check_after": after,
                                  "sdk_verify_before": sdk_before, "sdk_verify_after": sdk_after}
        seen = not after.get("ok") and any("ms64" in f for f in after.get("failures", []))
        sdk_seen = sdk_before.get("verified") is True and sdk_after.get("verified") is False \
            and bool(sdk_after.get("mismatched"))
        self.row("legacy", kind == "cuda-ipc" and memcpy.get("result") == "ok" and memcpy.get("read_only") is False
                 and seen and sdk_seen,
                 f"--cuda-handles legacy: a worker's copy into its mapping: {memcpy.get('result')}; another worker's "
                 f"check then {'SEES the change' if seen else 'does not see it'} ({(after.get('failures') or ['-'])[0]}); "
                 f"the SDK's verify() (ms64 manifest, no CPU hash): {'clean' if sdk_before.get('verified') else 'NOT clean'} "
                 f"before, {sdk_after.get('mismatched') or 'NO mismatch'} after. "
                 f"Attach p50/p99 over 1000 attaches of {bench.get('tensors')} tensors: legacy "
                 f"{bench.get('p50_ms') or 0:.3f}/{bench.get('p99_ms') or 0:.3f} ms, VMM {vmm.get('p50_ms') or 0:.3f}/"
                 f"{vmm.get('p99_ms') or 0:.3f} ms, torch IPC p50 {ipc.get('p50') or 0:.1f} ms")

    def server_kill9(self):
        """Workers outlive a kill -9 of the server; the restarted server adopts their memory."""
        procs, started = self.loop_workers(4, 40)
        before = self.stats()
        smi = lambda: int(self.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]).stdout.split()[0])  # noqa: E731
        used_before = smi()
        time.sleep(3)  # the records name the workers as holders (kept current every 2 s)
        os.kill(self.server.pid, signal.SIGKILL)
        self.server.wait(timeout=30)
        time.sleep(3)
        used_down = smi()
        t = time.perf_counter()
        self.start_server("server-restarted.log")
        back = None
        while time.perf_counter() - t < 30:
            listed = last_json(self.cli("ls").stdout)
            models = listed if isinstance(listed, list) else (listed or {}).get("models", [])
            if any(m.get("name") == "m" and m.get("latest_ready") for m in models):
                back = time.perf_counter() - t
                break
            time.sleep(0.2)
        after = self.stats()
        reports = self.finish(procs)
        used_after = smi()
        log = open(os.path.join(self.out, "server-restarted.log")).read()
        adopted = "adopted the memory a worker kept" in log
        model_gib = (self.results.get("load") or {}).get("bytes", 0) / GIB
        grew = (used_after - used_before) / 1024
        self.results["server_kill9"] = {"reports": reports, "started": started, "stats_before": before,
                                        "stats_after": after, "nvidia_smi_mib": [used_before, used_down, used_after],
                                        "back_s": back, "adopted": adopted}
        ok = (all(r.get("ok") for r in reports) and all(r.get("reattached") for r in reports) and back is not None
              and adopted and after.get("arenas") == 1 and grew < model_gib / 2)
        self.row("server kill -9", ok,
                 f"4 workers x {sum(r.get('passes', 0) for r in reports)} GEMV passes over 40 s, "
                 f"{sum(r.get('bad', 0) for r in reports)} differing from the first; server back with m in "
                 f"{back or 0:.1f} s, memory adopted: {adopted}; sessions re-attached: "
                 f"{sum(1 for r in reports if r.get('reattached'))}/4; device used {used_before} MiB before, "
                 f"{used_down} MiB while down, {used_after} MiB after (model {model_gib:.1f} GiB: one copy, not two); "
                 f"arenas {after.get('arenas')}")

    def tenants(self):
        """A server with a tenants file: a tenant's worker checks the model over CUDA IPC with its
        token, a worker without one is refused, and attach latency is compared with the open
        server's (the `attach` row)."""
        import hashlib
        admin, token = "ms_gpu_check_admin", "ms_gpu_check_tenant"
        h = lambda t: "sha256:" + hashlib.sha256(t.encode()).hexdigest()  # noqa: E731
        tf = os.path.join(self.work, "tenants.toml")
        with open(tf, "w") as f:
            f.write(f'[admin]\ntoken_hashes = ["{h(admin)}"]\n[[tenants]]\nname = "gpu"\n'
                    f'token_hashes = ["{h(token)}"]\n[tenants.quota]\nleases = 4\n')
        sock = os.path.join(self.work, "tenants.sock")
        address = f"unix:{sock}"
        with open(os.path.join(self.out, "tenants-server.log"), "w") as lf:
            srv = subprocess.Popen(
                [f"{self.bin}/modelshare", "serve", "--backend", "cuda", "--unix-socket", sock, "--handle-socket",
                 os.path.join(self.work, "tenants-handles.sock"), "--model-root", os.path.join(self.work, "models"),
                 "--tenants-file", tf, "--log-format", "json"], stdout=lf, stderr=lf, env=self.env)
            try:
                for _ in range(600):
                    if os.path.exists(sock):
                        break
                    time.sleep(0.1)
                cli = lambda tok, *a: self.run([f"{self.bin}/modelshare", "--server", address, "--output", "json", *a],  # noqa: E731
                                               env=dict(self.env, MODELSHARE_TOKEN=tok), timeout=900)
                loaded = cli(admin, "load", "m", "m", "--tenant", "gpu").returncode == 0

                def worker(tok, *a):
                    env = dict(self.env)
                    env.pop("MODELSHARE_TOKEN", None)
                    if tok:
                        env["MODELSHARE_TOKEN"] = tok
                    p = subprocess.Popen([f"{self.bin}/gpu_worker", *a, "--server", address], stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True, env=env)
                    o, e = p.communicate(timeout=900)
                    return p.returncode, last_json(o) or {}, e

                rc, ok_report, _ = worker(token, "check", "--model", "m")
                rc_none, out_none, err_none = worker(None, "check", "--model", "m")
                refused = rc_none != 0 and "unauthenticated" in (json.dumps(out_none) + err_none).lower()
                _, bench, _ = worker(token, "attach-bench", "--model", "m", "--n", "1000")
                open_p50 = (self.results.get("attach") or {}).get("p50_ms") or 0
                self.results["tenants"] = {"check": ok_report, "attach": bench, "refused_without_token": refused,
                                           "open_attach_p50_ms": open_p50}
                good = loaded and rc == 0 and bool(ok_report.get("ok")) and refused and bench.get("p50_ms", 99) < 2.0
                self.row("tenants", good,
                         f"tenant worker with a token: GEMV/ms64 {'ok' if ok_report.get('ok') else 'FAILED'}; without: "
                         f"{'UNAUTHENTICATED' if refused else 'NOT refused'}; attach p50 "
                         f"{bench.get('p50_ms') or 0:.3f} ms, p99 {bench.get('p99_ms') or 0:.3f} ms with auth vs "
                         f"{open_p50:.3f} ms open")
            finally:
                srv.terminate()
                try:
                    srv.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    srv.kill()

    def sweep(self):
        """Warm loads of the same file by servers with 4, 8, 12 and 16 load threads, and with 16
        threads hashing every byte on the CPU as well (--load-cpu-hash: what the CPU hash costs)."""
        figures = []
        for threads, cpu_hash in ((4, False), (8, False), (12, False), (14, False), (16, False), (16, True)):
            tag = f"{threads}{'-cpuhash' if cpu_hash else ''}"
            sock = os.path.join(self.work, f"sweep{tag}.sock")
            logf = os.path.join(self.out, f"sweep{tag}.log")
            with open(logf, "w") as lf:
                srv = subprocess.Popen(
                    [f"{self.bin}/modelshare", "serve", "--backend", "cuda", "--unix-socket", sock, "--handle-socket",
                     os.path.join(self.work, f"sweep{tag}-h.sock"), "--model-root", os.path.join(self.work, "models"),
                     "--log-format", "json", "--load-threads", str(threads)] + (["--load-cpu-hash"] if cpu_hash else []),
                    stdout=lf, stderr=lf, env=self.env)
                try:
                    addr = f"unix:{sock}"
                    for _ in range(300):
                        p = self.run([f"{self.bin}/modelshare", "--server", addr, "--output", "json", "stats"], timeout=30)
                        if p.returncode == 0:
                            break
                        time.sleep(0.1)
                    for i in range(2):
                        self.run([f"{self.bin}/modelshare", "--server", addr, "--output", "json", "load", f"s{i}", "m",
                                  "--keep-previous"], timeout=300)
                finally:
                    srv.send_signal(signal.SIGTERM)
                    srv.wait(timeout=60)
            lines = [json.loads(l) for l in open(logf) if l.startswith("{")]
            loaded = [l["fields"] for l in lines if l["fields"].get("message") == "model loaded"]
            phases = [l["fields"] for l in lines if l["fields"].get("message") == "load phases"]
            gb = loaded[-1]["gb_per_s"] if loaded else 0
            copy_s = phases[-1]["copy_seconds"] if phases else 0
            figures.append((tag, gb, copy_s))
        self.results["sweep"] = figures
        self.row("load threads", all(g > 0 for _, g, _ in figures),
                 "warm load GB/s by threads (device checksums only): " + ", ".join(
                     f"{t.replace('-cpuhash', ' with --load-cpu-hash')}: {g:.1f}" for t, g, _ in figures))

    def share(self, model_file):
        """Loads of the same bytes under two names hold one arena (issue 28, item 24)."""
        self.start_server("share-server.log", extra=())
        try:
            self._share(model_file)
        finally:
            self.stop_server()

    def _share(self, model_file):
        used = lambda: self.stats().get("device_used_bytes") or 0  # noqa: E731
        loaded = lambda: [json.loads(l)["fields"] for l in open(self.server_log.name)  # noqa: E731
                          if '"model loaded' in l]
        t = time.perf_counter()
        first = (last_json(self.cli("load", "m", "m", timeout=600).stdout) or {}).get("version") or {}
        copy_s = time.perf_counter() - t
        u1 = used()
        t = time.perf_counter()
        second = (last_json(self.cli("load", "twin", "m", timeout=600).stdout) or {}).get("version") or {}
        share_s = time.perf_counter() - t
        u2 = used()
        size = first.get("arena_bytes") or 0
        logs = loaded()
        copy_gbps = next((f.get("gb_per_s") for f in logs if f.get("model") == "m"), 0) or 0
        shared_log = next((f for f in logs if f.get("model") == "twin"), {})
        twin_check = last_json(self.worker("check", "--model", "twin").communicate(timeout=900)[0]) or {}
        self.cli("unload", "m")
        time.sleep(0.5)
        u3 = used()
        after_check = last_json(self.worker("check", "--model", "twin").communicate(timeout=900)[0]) or {}
        self.cli("unload", "twin")
        time.sleep(0.5)
        u4 = used()
        # A model of the same layout with one byte changed: a copy of its own.
        small = os.path.join(self.work, "models", "small", "model.safetensors")
        diff = os.path.join(self.work, "models", "small-diff", "model.safetensors")
        if not os.path.exists(small):
            self.run([sys.executable, os.path.join(ROOT, "bench", "anchors.py"), "make-model", "--out", small, "--gib", "1",
                      "--tensors", "64", "--dtype", "bf16"], timeout=900, check=True)
        os.makedirs(os.path.dirname(diff), exist_ok=True)
        self.run(["cp", small, diff], check=True)
        with open(diff, "r+b") as f:
            f.seek(-1, os.SEEK_END)
            last = f.read(1)
            f.seek(-1, os.SEEK_END)
            f.write(bytes([last[0] ^ 1]))
        v5 = used()
        a = (last_json(self.cli("load", "small", "small").stdout) or {}).get("version") or {}
        v6 = used()
        b = (last_json(self.cli("load", "small-diff", "small-diff").stdout) or {}).get("version") or {}
        v7 = used()
        self.cli("unload", "small")
        self.cli("unload", "small-diff")
        small_bytes = a.get("arena_bytes") or 0
        self.results["share"] = {
            "first": first, "second": second, "used": [u1, u2, u3, u4], "copy_wall_s": copy_s, "share_wall_s": share_s,
            "copy_gbps": copy_gbps, "shared_log": shared_log, "twin_check": twin_check, "after_check": after_check,
            "small": a, "small_diff": b, "small_used": [v5, v6, v7]}
        grew = u2 - u1
        share_gbps = size / share_s / 1e9 if share_s else 0
        self.row("share", bool(second.get("shares_memory")) and abs(grew) < 64 << 20 and twin_check.get("ok")
                 and after_check.get("ok") and u4 < u3 - size // 2,
                 f"{size / GIB:.2f} GiB under a 2nd name: device use {grew / (1 << 20):+.0f} MiB (shares_memory "
                 f"{second.get('shares_memory')}, {second.get('content_sha256', '')[:19]}...), compared at "
                 f"{share_gbps:.1f} GB/s end to end ({share_s:.2f} s) vs copied at {size / copy_s / 1e9:.1f} GB/s end "
                 f"to end ({copy_gbps:.1f} in the loader); workers correct on it: {twin_check.get('ok')}, after the 1st "
                 f"name's unload: {after_check.get('ok')} (device use {(u3 - u2) / (1 << 20):+.0f} MiB), freed with the "
                 f"2nd: {(u4 - u3) / GIB:+.2f} GiB")
        self.row("share (differs)", b.get("state") == "ready" and not b.get("shares_memory")
                 and (v7 - v6) > small_bytes // 2,
                 f"{small_bytes / GIB:.2f} GiB model and a copy with its last byte changed: shares_memory "
                 f"{b.get('shares_memory')}, device use +{(v6 - v5) / GIB:.2f} then +{(v7 - v6) / GIB:.2f} GiB")

    def stop_server(self):
        self.server.send_signal(signal.SIGTERM)
        rc = self.server.wait(timeout=60)
        self.row("shutdown", rc == 0, f"SIGTERM exit code {rc}")

    def table(self):
        d = self.results.get("device", {})
        lines = [f"modelshare GPU check, {d.get('date')}, {d.get('name')} (driver {d.get('driver')})", "",
                 "| check | result | figures |", "| --- | --- | --- |"]
        lines += [f"| {n} | {r} | {f} |" for n, r, f in self.rows]
        text = "\n".join(lines)
        print("\n" + text, flush=True)
        with open(os.path.join(self.out, "gpu-check.md"), "w") as f:
            f.write(text + "\n")
        with open(os.path.join(self.out, "gpu-check.json"), "w") as f:
            json.dump(self.results, f, indent=1, default=str)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="gpu-carry/bin")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpu-check-out"))
    ap.add_argument("--work", default="/tmp/gpu-check")
    ap.add_argument("--gib", type=float, default=8)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--only", default="", help="comma-separated steps to run (default: all): kernels, "
                    "anchors, core, vmm, loader, tenants, share, load-threads")
    args = ap.parse_args()
    c = Check(args)
    steps = args.only.split(",") if args.only else []
    want = lambda s: not steps or s in steps  # noqa: E731
    model_file = os.path.join(c.work, "models", "m", "model.safetensors")
    os.makedirs(os.path.dirname(model_file), exist_ok=True)
    try:
        c.device()
        if want("kernels"):
            c.kernels()
            c.encoder_kernels()
        if want("anchors"):
            c.anchors(model_file)
        elif not os.path.exists(model_file):
            c.run([sys.executable, os.path.join(ROOT, "bench", "anchors.py"), "make-model", "--out", model_file, "--gib",
                   str(args.gib), "--tensors", "256", "--dtype", "bf16"], timeout=900, check=True)
        if want("core") or want("loader"):
            c.start_server()
        if want("core"):
            s1 = c.load_during_attach()
            c.load_again()
            procs = c.eight_workers(s1)
            c.kill_nine(procs)
            c.gemv_bench()
            c.attach_bench()
            c.remap()
        if want("vmm"):
            c.vmm_writes()
            c.namespaces()
            c.legacy()
            c.server_kill9()
        if want("loader"):
            loader_steps.anchors(c, model_file)
            loader_steps.cli_median(c)
            loader_steps.cold(c)
            loader_steps.two_at_once(c)
        if c.server and c.server.poll() is None:
            c.stop_server()
        if want("tenants"):
            c.tenants()
        if want("share"):
            c.share(model_file)
        if want("load-threads"):
            c.sweep()
    except Exception as e:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        c.row("aborted", False, f"{type(e).__name__}: {e}")
        if c.server and c.server.poll() is None:
            c.server.kill()
    finally:
        c.table()
    return 0 if all(r == "PASS" for _, r, _ in c.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
