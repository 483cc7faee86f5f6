#!/usr/bin/env python3
"""Host-backend load benchmark (no GPU): modelshare's load of a safetensors file into shared host
memory against `safetensors.numpy.load_file` of the same file, in the same run, page cache warm.

    python3 bench/host_load.py --bin target/release/modelshare [--gib 2] [--repeat 5] [--out F]

Both read the whole file and end with every tensor's bytes in memory: `load_file` as numpy
arrays in this process, modelshare in a sealed memfd arena with a checksum per tensor, timed
through the CLI (`modelshare load`, which returns once the version is ready). Prints a table
and, last, one JSON line; writes that JSON to --out when given. It measures, it does not judge:
the exit status is non-zero only when a load fails, never because of a timing.
"""

import argparse
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import anchors  # noqa: E402  (the streaming safetensors writer)

GIB = 1 << 30


def write_model(path, gib, tensors):
    """A safetensors file of `tensors` f16 tensors [rows, 4096], ~`gib` GiB: random bytes
    (rng.bytes, ~1 GB/s; a benchmark of reads needs no N(0,1) values), streamed."""
    import numpy as np

    rng = np.random.default_rng(0)
    specs = [(n, anchors.DTYPES["f16"][0], s) for n, s in anchors.plan_shapes(gib, tensors, "f16")]

    def source(name, nbytes):
        while nbytes > 0:
            k = min(nbytes, 16 << 20)
            yield rng.bytes(k)
            nbytes -= k

    os.makedirs(os.path.dirname(path), exist_ok=True)
    return anchors.write_safetensors_stream(path, specs, source, metadata={"format": "pt"})


def warm(path):
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def numpy_once(path):
    """One `load_file` of the whole file: (seconds, tensor bytes)."""
    from safetensors.numpy import load_file

    t = time.perf_counter()
    tensors = load_file(path)
    secs = time.perf_counter() - t
    nbytes = sum(a.nbytes for a in tensors.values())
    del tensors
    gc.collect()
    return secs, nbytes


class Server:
    """A `modelshare serve --backend host` over a unix socket in `root`, and loads through the CLI."""

    def __init__(self, binary, root, threads):
        self.root = root
        sock = os.path.join(root, "bench.sock")
        self.log_path = os.path.join(root, "server.log")
        cmd = [binary, "serve", "--backend", "host", "--unix-socket", sock, "--handle-socket",
               os.path.join(root, "handles.sock"), "--model-root", root, "--log-format", "json"]
        if threads:
            cmd += ["--load-threads", str(threads)]
        with open(self.log_path, "w") as log:
            self.server = subprocess.Popen(cmd, stdout=log, stderr=log)
        self.cli = [binary, "--server", f"unix:{sock}", "--output", "json"]
        try:
            for _ in range(300):
                if self.server.poll() is not None:
                    raise RuntimeError(f"server exited at start: {open(self.log_path).read()[-2000:]}")
                if os.path.exists(sock) and subprocess.run(self.cli + ["stats"], capture_output=True).returncode == 0:
                    return
                time.sleep(0.1)
            raise RuntimeError("the server did not answer within 30 s")
        except BaseException:
            self.stop()
            raise

    def load_once(self, name):
        """`modelshare load NAME m` until ready, timed, then unloaded: (seconds, the CLI's last
        JSON line)."""
        t = time.perf_counter()
        p = subprocess.run(self.cli + ["load", name, "m"], capture_output=True, text=True, timeout=600)
        secs = time.perf_counter() - t
        if p.returncode != 0:
            raise RuntimeError(f"modelshare load failed: {p.stderr.strip()[-2000:]}")
        done = json.loads(p.stdout.strip().splitlines()[-1])
        subprocess.run(self.cli + ["unload", name], capture_output=True, check=True)
        return secs, done

    def phases(self):
        return [json.loads(line)["fields"] for line in open(self.log_path)
                if '"load phases"' in line]

    def stop(self):
        self.server.send_signal(signal.SIGTERM)
        try:
            self.server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.server.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True, help="the modelshare binary (a release build)")
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--tensors", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="--load-threads (default: the server's)")
    ap.add_argument("--dir", help="work directory (default: a temporary one, removed after)")
    ap.add_argument("--out", help="write the JSON result here too")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        path = os.path.join(root, "m", "model.safetensors")
        write_model(path, args.gib, args.tensors)
        with open(os.path.join(root, "m", "config.json"), "w") as f:
            json.dump({"model_type": "bench"}, f)
        size = os.path.getsize(path)
        warm(path)
        # Interleaved, one of each per round: a machine whose speed drifts during the run (a
        # shared CI runner) slows both alike, instead of whichever ran during the slow spell.
        np_secs, ms_secs, loaded = [], [], []
        server = Server(os.path.abspath(args.bin), root, args.threads)
        try:
            for i in range(args.repeat):
                secs, np_bytes = numpy_once(path)
                np_secs.append(secs)
                secs, done = server.load_once(f"b{i}")
                ms_secs.append(secs)
                loaded.append(done)
            phases = server.phases()
        finally:
            server.stop()

    np_med, ms_med = statistics.median(np_secs), statistics.median(ms_secs)
    threads = phases[-1].get("threads") if phases else None
    rows = [
        ("safetensors.numpy.load_file", np_secs, np_med, np_bytes),
        (f"modelshare load (host backend, {threads} threads, CLI until ready)", ms_secs, ms_med, size),
    ]
    print(f"\nhost-backend load of a {size / GIB:.2f} GiB safetensors file, page cache warm, "
          f"{os.cpu_count()} CPUs, median of {args.repeat} interleaved rounds\n")
    print("| loader | runs (s) | median (s) | GB/s |")
    print("| --- | --- | --- | --- |")
    for name, secs, med, nbytes in rows:
        print(f"| {name} | {', '.join(f'{s:.3f}' for s in secs)} | {med:.3f} | {nbytes / med / 1e9:.2f} |")
    ratio = np_med / ms_med
    print(f"\nmodelshare / safetensors.numpy: {ratio:.2f}x "
          f"({'at least as fast' if ratio >= 1 else 'SLOWER'})")
    result = {
        "bench": "host-load", "bytes": size, "cpus": os.cpu_count(), "repeat": args.repeat,
        "numpy_seconds": np_secs, "numpy_gbps": np_bytes / np_med / 1e9,
        "modelshare_seconds": ms_secs, "modelshare_gbps": size / ms_med / 1e9,
        "modelshare_threads": threads, "ratio": ratio,
        "server_phases": phases,
        "versions": [(d.get("version") or {}).get("state") for d in loaded],
    }
    line = json.dumps(result)
    print(line)
    if args.out:
        with open(args.out, "w") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
