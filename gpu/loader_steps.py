"""The loader's steps of the GPU check (gpu/check.py --only loader, or part of a full run).

  loader anchors  the same 8 GiB file loaded by safetensors.torch.load_file(device="cuda"),
                  fastsafetensors and instanttensor (bench/loader_anchors.py; wheels carried in
                  gpu-carry/anchor-wheels by scripts/anchor-wheels),
                  and the pinned host-to-device copy ceiling
  load (CLI)      `modelshare load` until ready, page cache warm: 3 runs, the median
  cold load       the file dropped from the page cache (posix_fadvise DONTNEED), then loaded;
                  against a direct-I/O read of the same file (the best of 8 threads x 16 MiB
                  and 16 x 4 MiB O_DIRECT requests; dd iflag=direct beside), before and after
  two at once     two 8 GiB models loaded concurrently vs each alone: total time and each one's
Each step writes its figures into check.results and a row into the table.
"""

import json
import mmap
import os
import statistics
import subprocess
import sys
import threading
import time

GIB = 1 << 30
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def last_json(text):
    for line in reversed(text.strip().splitlines()):
        if line.strip().startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


def drop_from_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def warm(path):
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def resident_fraction(path):
    """The fraction of the file's pages in the page cache (fincore when present, else None)."""
    try:
        p = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES,SIZE", path],
                           capture_output=True, text=True, timeout=60)
        res, size = (int(x) for x in p.stdout.split()[:2])
        return res / size if size else None
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def direct_read(path, threads=8, chunk=16 << 20):
    """Reads the whole file with O_DIRECT, `threads` threads taking `chunk`-byte requests in file
    order; GB/s. The raw bandwidth the cold load is held against."""
    size = os.path.getsize(path)
    nxt = [0]
    lock = threading.Lock()
    errors = []

    def work():
        buf = mmap.mmap(-1, chunk)  # page-aligned, as O_DIRECT wants
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            while True:
                with lock:
                    off = nxt[0]
                    nxt[0] += chunk
                if off >= size:
                    return
                os.preadv(fd, [buf], off)
        except OSError as e:
            errors.append(str(e))
        finally:
            os.close(fd)
            buf.close()

    drop_from_cache(path)
    t = time.perf_counter()
    ts = [threading.Thread(target=work) for _ in range(threads)]
    for x in ts:
        x.start()
    for x in ts:
        x.join()
    secs = time.perf_counter() - t
    if errors:
        raise RuntimeError(f"direct read: {errors[0]}")
    return size / secs / 1e9


def dd_direct(path):
    drop_from_cache(path)
    t = time.perf_counter()
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=64M", "iflag=direct"], capture_output=True, check=True)
    return os.path.getsize(path) / (time.perf_counter() - t) / 1e9


def server_lines(log_path, message):
    out = []
    for line in open(log_path):
        if line.startswith("{") and f'"{message}"' in line:
            try:
                out.append(json.loads(line)["fields"])
            except (json.JSONDecodeError, KeyError):
                pass
    return out


def cli_load(c, name, path, extra=()):
    t = time.perf_counter()
    p = c.cli("load", name, path, *extra, timeout=900)
    wall = time.perf_counter() - t
    done = (last_json(p.stdout) or {}) if p.returncode == 0 else {}
    ok = (done.get("version") or {}).get("state") == "ready"
    return ok, wall, done


def anchors(c, model_file):
    py = sys.executable
    a = os.path.join(ROOT, "bench", "anchors.py")
    wheels = os.path.join(ROOT, "gpu-carry", "anchor-wheels")
    site = os.path.join(c.work, "anchor-site")
    if os.path.isdir(wheels) and not os.path.isdir(site):
        c.run([py, "-m", "pip", "install", "--no-index", "--no-deps", "--target", site]
              + sorted(os.path.join(wheels, w) for w in os.listdir(wheels) if w.endswith(".whl")), timeout=600)
    figures = {}
    warm(model_file)
    la = os.path.join(ROOT, "bench", "loader_anchors.py")
    for name, cmd in (("safetensors", [py, a, "load-baseline", "--path", model_file, "--repeat", "3"]),
                      ("fastsafetensors", [py, la, "fastsafetensors", "--path", model_file, "--site", site]),
                      ("instanttensor", [py, la, "instanttensor", "--path", model_file, "--site", site])):
        figures[name] = last_json(c.run(cmd, timeout=900).stdout) or {}
    copy = last_json(c.run([py, a, "copy-bandwidth"], timeout=600).stdout) or {}
    figures["h2d_pinned_gbps"] = copy.get("h2d_pinned_gbps")
    c.results["loader_anchors"] = figures
    text = "; ".join(f"{n} {(figures[n].get('gbps') or 0):.2f} GB/s" + (f" ({figures[n]['error'][:80]})"
                     if figures[n].get("error") else "") for n in ("safetensors", "fastsafetensors", "instanttensor"))
    c.row("loader anchors", bool(figures["safetensors"].get("gbps")),
          f"{text}; pinned H2D {figures.get('h2d_pinned_gbps') or 0:.1f} GB/s")
    return figures


def cli_median(c, model_dir="m", runs=3):
    """`modelshare load` until ready, page cache warm, `runs` times; each version unloaded after."""
    path = os.path.join(c.work, "models", model_dir, "model.safetensors")
    walls, server = [], []
    ok_all = True
    for i in range(runs):
        warm(path)
        ok, wall, done = cli_load(c, f"cli{i}", model_dir)
        ok_all &= ok
        walls.append(wall)
        loaded = server_lines(c.server_log.name, "model loaded")
        phases = server_lines(c.server_log.name, "load phases")
        server.append({"loaded": loaded[-1] if loaded else {}, "phases": phases[-1] if phases else {}})
        c.cli("unload", f"cli{i}")
    size = (done.get("version") or {}).get("bytes_total") or os.path.getsize(path)
    med = statistics.median(walls)
    c.results["load_cli"] = {"walls": walls, "bytes": size, "median_gbps": size / med / 1e9, "server": server}
    best_anchor = max((v.get("gbps") or 0) for k, v in c.results.get("loader_anchors", {}).items() if isinstance(v, dict)) \
        if c.results.get("loader_anchors") else 0
    gb = size / med / 1e9
    c.row("load (CLI)", ok_all and gb >= 45,
          f"8 GiB page cache warm, `modelshare load` until ready: {', '.join(f'{size / w / 1e9:.1f}' for w in walls)} GB/s, "
          f"**median {gb:.1f} GB/s** (target 45); in the loader {', '.join(str(round(s['loaded'].get('gb_per_s') or 0, 1)) for s in server)}; "
          f"read path {server[-1]['phases'].get('read_path')}; best anchor {best_anchor:.1f} GB/s")
    return gb


def cold(c, model_dir="m"):
    path = os.path.join(c.work, "models", model_dir, "model.safetensors")
    # The raw bandwidth, the best of two shapes of request: 8 x 16 MiB and 16 x 4 MiB in flight.
    raw_before = max(direct_read(path), direct_read(path, threads=16, chunk=4 << 20))
    dd = dd_direct(path)
    drop_from_cache(path)
    before = resident_fraction(path)
    ok, wall, done = cli_load(c, "cold", model_dir)
    phases = server_lines(c.server_log.name, "load phases")
    loaded = server_lines(c.server_log.name, "model loaded")
    c.cli("unload", "cold")
    raw_after = max(direct_read(path), direct_read(path, threads=16, chunk=4 << 20))
    size = os.path.getsize(path)
    ours = size / wall / 1e9
    raw = max(raw_before, raw_after)
    ph = phases[-1] if phases else {}
    c.results["cold"] = {"raw_direct_gbps": [raw_before, raw_after], "dd_direct_gbps": dd, "cli_gbps": ours,
                         "wall_s": wall, "resident_before": before, "phases": ph,
                         "loader_gbps": (loaded[-1] if loaded else {}).get("gb_per_s")}
    c.row("cold load", ok and ours >= 0.9 * raw,
          f"file out of the page cache (resident before: {before if before is None else f'{before:.0%}'}): "
          f"`modelshare load` {ours:.2f} GB/s end to end = **{ours / raw:.0%}** of the raw direct-I/O read "
          f"({raw_before:.2f} before, {raw_after:.2f} after; dd iflag=direct bs=64M {dd:.2f}); read path "
          f"{ph.get('read_path')} ({(ph.get('direct_bytes') or 0) / GIB:.2f} GiB direct)")
    warm(path)


def two_at_once(c):
    """Two different 8 GiB models: each alone, then both at once (page cache warm)."""
    p1 = os.path.join(c.work, "models", "m", "model.safetensors")
    p2 = os.path.join(c.work, "models", "m2", "model.safetensors")
    if not os.path.exists(p2):
        c.run([sys.executable, os.path.join(ROOT, "bench", "anchors.py"), "make-model", "--out", p2, "--gib",
               str(c.args.gib), "--tensors", "256", "--dtype", "bf16", "--seed", "2"], timeout=900, check=True)
        with open(os.path.join(os.path.dirname(p2), "config.json"), "w") as f:
            json.dump({"model_type": "gpu-check", "tensors": 256}, f)
    alone = []
    for name, d, p in (("a1", "m", p1), ("a2", "m2", p2)):
        warm(p)
        ok, wall, _ = cli_load(c, name, d)
        alone.append(wall)
        c.cli("unload", name)
    warm(p1)
    warm(p2)
    walls = {}

    def one(name, d):
        walls[name] = cli_load(c, name, d)

    t = time.perf_counter()
    ts = [threading.Thread(target=one, args=(n, d)) for n, d in (("b1", "m"), ("b2", "m2"))]
    for x in ts:
        x.start()
    for x in ts:
        x.join()
    total = time.perf_counter() - t
    for n in ("b1", "b2"):
        c.cli("unload", n)
    ok = all(walls[n][0] for n in walls)
    each = sorted(walls[n][1] for n in walls)
    sizes = os.path.getsize(p1) + os.path.getsize(p2)
    c.results["two_at_once"] = {"alone_s": alone, "together_each_s": each, "together_total_s": total,
                                "bytes": sizes}
    c.row("two at once", ok and total <= 1.15 * sum(alone) and each[0] >= 0.8 * each[1],
          f"two 8 GiB models: alone {alone[0]:.2f} + {alone[1]:.2f} s = {sum(alone):.2f} s; at once both ready in "
          f"**{total:.2f} s** ({sizes / total / 1e9:.1f} GB/s), each {each[0]:.2f} / {each[1]:.2f} s "
          f"(the first done at {each[0] / each[1]:.0%} of the second's time)")
