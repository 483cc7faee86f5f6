#!/usr/bin/env python3
"""The Python package on a GPU: a CUDA server holds a small model; `modelshare.Session` attaches
it; `model.torch()` gives CUDA tensors with no copy (their data pointers inside the one
imported mapping, their values the file's); `model.numpy()` refuses device memory;
`module_from` builds a module on the shared weights whose output equals the module loaded
from the file. Prints one JSON line; exit 0 when every check holds.

    python3 gpu/python_smoke.py --bin DIR_WITH_modelshare --wheel modelshare-*.whl --out $OUT
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--wheel", required=True)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/python-smoke"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall",
                    a.wheel], check=True)
    import torch
    from safetensors.torch import load_file, save_file

    import modelshare

    tmp = tempfile.mkdtemp()
    root = os.path.join(tmp, "models")
    os.makedirs(os.path.join(root, "mlp"))
    torch.manual_seed(0)
    build = lambda: torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 8))  # noqa: E731
    ref = build().half()
    path = os.path.join(root, "mlp", "model.safetensors")
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, path)
    sock = os.path.join(tmp, "grpc.sock")
    log = open(os.path.join(a.out, "server.log"), "w")
    server = subprocess.Popen([os.path.join(a.bin, "modelshare"), "serve", "--backend", "cuda", "--model-root", root,
                               "--unix-socket", sock, "--handle-socket", os.path.join(tmp, "h.sock"),
                               "--model", "mlp=mlp"], stdout=log, stderr=subprocess.STDOUT)
    checks = {}
    try:
        for _ in range(300):
            if subprocess.run([os.path.join(a.bin, "modelshare"), "--server", f"unix:{sock}", "ready"],
                              capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        started = time.perf_counter()
        session = modelshare.Session.open(f"unix:{sock}", name="gpu-smoke")
        model = session.attach("mlp")
        tensors = model.torch()
        checks["attach_to_torch_ms"] = round((time.perf_counter() - started) * 1e3, 1)
        want = load_file(path)
        checks["devices"] = sorted({str(t.device) for t in tensors.values()})
        checks["values_equal"] = all(torch.equal(tensors[k].cpu(), v) for k, v in want.items())
        ptrs = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in tensors.values())
        span = ptrs[-1][1] - ptrs[0][0]
        checks["one_mapping_span_bytes"] = span
        checks["within_one_arena"] = span <= sum(m["byte_length"] for m in model.manifest) + 256 * len(ptrs)
        try:
            model.numpy()
            checks["numpy_refuses_device"] = False
        except modelshare.Error as e:
            checks["numpy_refuses_device"] = type(e).__name__
        module = modelshare.module_from(model, lambda: build().half())
        x = torch.randn(4, 64, device="cuda", dtype=torch.half)
        ref_cuda = build().half().cuda()
        ref_cuda.load_state_dict({k: v.cuda() for k, v in want.items()})
        with torch.no_grad():
            checks["module_output_equal"] = bool(torch.equal(module(x), ref_cuda(x)))
        shared = {k: t.data_ptr() for k, t in tensors.items()}
        checks["module_no_copy"] = all(p.data_ptr() == shared[n] for n, p in module.named_parameters())
        del module, tensors, model
        session.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    ok = (checks.get("devices") == ["cuda:0"] and checks.get("values_equal") and checks.get("within_one_arena")
          and checks.get("numpy_refuses_device") not in (None, False) and checks.get("module_output_equal")
          and checks.get("module_no_copy"))
    checks["ok"] = bool(ok)
    print(json.dumps(checks))
    with open(os.path.join(a.out, "python-smoke.json"), "w") as f:
        json.dump(checks, f)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
