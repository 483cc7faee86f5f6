#!/usr/bin/env python3
"""Runs what deploy/ describes, outside containers, with the real binaries:

- **Configuration precedence**: the same setting (`http_listen`) given in the file, in the
  environment and as a flag: the flag wins over the variable, the variable over the file, as
  the README says; observed on the port that answers.
- **The CPU compose stack** (`deploy/compose.cpu.yaml`): every service's command, with the
  image's environment (the Dockerfile's `ENV`) and its configuration file
  (`deploy/modelshare.toml`), the service's own environment, container paths mapped into a
  temporary directory and published ports onto free loopback ports. The model service must
  exit 0; the image's health check (`HEALTHCHECK CMD`) must pass once the server is ready; the
  worker must attach (its session shows in `modelshare ps`); the published gRPC port answers.

    python3 tests/python/deploy_run_test.py --bin target/debug

Prints "N passed, M failed" last; exits non-zero on any failure.
"""

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(ROOT, "deploy")
BIN = None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env():
    """This process's environment without any MODELSHARE_ setting."""
    return {k: v for k, v in os.environ.items() if not k.startswith("MODELSHARE_")}


def answers(port, path="/healthz"):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def wait_for(what, check, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def stop(proc):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_flags_win_over_variables_which_win_over_the_file():
    with tempfile.TemporaryDirectory() as tmp:
        a, b, c = free_port(), free_port(), free_port()
        cfg = os.path.join(tmp, "modelshare.toml")
        with open(cfg, "w") as f:
            f.write(f'http_listen = "127.0.0.1:{a}"\n')
        cases = [
            ("file", {}, [], a),
            ("variable over file", {"MODELSHARE_HTTP_LISTEN": f"127.0.0.1:{b}"}, [], b),
            ("flag over variable", {"MODELSHARE_HTTP_LISTEN": f"127.0.0.1:{b}"},
             ["--http-listen", f"127.0.0.1:{c}"], c),
        ]
        for i, (what, env, flags, expected) in enumerate(cases):
            proc = subprocess.Popen(
                [f"{BIN}/modelshare", "serve", "--backend", "host", "--model-root", tmp, "--config", cfg,
                 "--unix-socket", os.path.join(tmp, f"g{i}.sock"),
                 "--handle-socket", os.path.join(tmp, f"h{i}.sock"), *flags],
                env={**clean_env(), **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                wait_for(f"{what}: port {expected}", lambda: answers(expected), timeout=30)
                others = [p for p in (a, b, c) if p != expected and answers(p)]
                assert not others, f"{what}: ports {others} answer too"
            finally:
                stop(proc)


class Mapper:
    """Maps container paths into a directory and published ports onto loopback ports."""

    def __init__(self, tmp, ports):
        self.pairs = sorted(
            [("/run/modelshare", os.path.join(tmp, "run")),
             ("/etc/modelshare", os.path.join(tmp, "etc")),
             ("/models", os.path.join(tmp, "models"))] + list(ports.items()),
            key=lambda kv: -len(kv[0]))
        for _, path in self.pairs[:3]:
            if path.startswith("/"):
                os.makedirs(path, exist_ok=True)

    def __call__(self, text):
        # One pass, whole path components only (`/models` is not the start of `/modelshare`).
        table = dict(self.pairs)
        pattern = "|".join(re.escape(c) for c, _ in self.pairs)
        return re.sub(f"(?:{pattern})(?![\\w.-])", lambda m: table[m.group(0)], text)


def image_env(mapper):
    """The Dockerfile's ENV, mapped."""
    text = open(os.path.join(DEPLOY, "Dockerfile")).read().replace("\\\n", " ")
    env = {}
    for line in re.findall(r"^ENV (.+)$", text, re.M):
        for key, value in re.findall(r"(\w+)=(\S+)", line):
            env[key] = mapper(value)
    return env


def healthcheck(mapper):
    text = open(os.path.join(DEPLOY, "Dockerfile")).read().replace("\\\n", " ")
    cmd = json.loads(re.search(r"^HEALTHCHECK .*?CMD (\[.*?\])", text, re.M).group(1))
    assert cmd[0] == "modelshare", cmd
    return [f"{BIN}/modelshare"] + [mapper(a) for a in cmd[1:]]


def test_the_cpu_compose_stack_runs_as_written():
    (doc,) = [d for d in yaml.safe_load_all(open(os.path.join(DEPLOY, "compose.cpu.yaml"))) if d]
    services = doc["services"]
    with tempfile.TemporaryDirectory() as tmp:
        published = {}
        for port in services["modelshare"]["ports"]:
            host_ip, _host_port, container_port = port.split(":")
            assert host_ip == "127.0.0.1", port
            published[f"0.0.0.0:{container_port}"] = f"127.0.0.1:{free_port()}"
        mapper = Mapper(tmp, published)
        # The image's configuration file, at its mapped place.
        with open(os.path.join(DEPLOY, "modelshare.toml")) as f:
            config = mapper(f.read())
        with open(mapper("/etc/modelshare/modelshare.toml"), "w") as f:
            f.write(config)
        base = {**clean_env(), **image_env(mapper)}

        def run_env(svc):
            return {**base, **{k: mapper(str(v)) for k, v in (svc.get("environment") or {}).items()}}

        def command(svc):
            return [f"{BIN}/modelshare"] + [mapper(a) for a in svc["command"]]

        logs = os.path.join(tmp, "logs")
        os.makedirs(logs)
        models = services["models"]
        done = subprocess.run(command(models), env=run_env(models), capture_output=True, text=True,
                              timeout=180)
        assert done.returncode == 0, f"models: {done.stdout}\n{done.stderr}"
        procs = []
        try:
            server = services["modelshare"]
            procs.append(subprocess.Popen(command(server), env=run_env(server),
                                          stdout=open(os.path.join(logs, "server.log"), "w"),
                                          stderr=subprocess.STDOUT))
            check = healthcheck(mapper)
            wait_for("the health check", lambda: subprocess.run(
                check, env=base, capture_output=True).returncode == 0, timeout=120)
            worker = services["worker"]
            procs.append(subprocess.Popen(command(worker), env=run_env(worker),
                                          stdout=open(os.path.join(logs, "worker.log"), "w"),
                                          stderr=subprocess.STDOUT))
            name = worker["command"][worker["command"].index("--name") + 1]

            def worker_attached():
                out = subprocess.run([f"{BIN}/modelshare", "-o", "json", "ps"], env=base,
                                     capture_output=True, text=True)
                return out.returncode == 0 and name in out.stdout

            wait_for(f"session {name}", worker_attached, timeout=60)
            assert procs[1].poll() is None, "the worker exited"
            # The published gRPC port answers (loopback, no tenants: --unauthenticated-tcp).
            grpc = published["0.0.0.0:50051"]
            out = subprocess.run([f"{BIN}/modelshare", "--server", f"http://{grpc}", "-o", "json", "ls"],
                                 env=clean_env(), capture_output=True, text=True, timeout=30)
            assert out.returncode == 0 and "tiny-demo" in out.stdout, out
            http_port = int(published["0.0.0.0:9400"].rsplit(":", 1)[1])
            assert answers(http_port, "/readyz"), "the published HTTP port is not ready"
        except Exception:
            for log in sorted(os.listdir(logs)):
                print(f"--- {log}\n" + open(os.path.join(logs, log)).read()[-4000:])
            raise
        finally:
            for p in reversed(procs):
                stop(p)


def main():
    global BIN
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", default=os.path.join(ROOT, "target", "debug"))
    BIN = os.path.abspath(parser.parse_args().bin)
    tests = [v for k, v in sorted(globals().items()) if k.startswith("test_")]
    failed = 0
    for t in tests:
        try:
            t()
            print(f"test {t.__name__} ... ok")
        except Exception:  # noqa: BLE001
            failed += 1
            print(f"test {t.__name__} ... FAILED")
            traceback.print_exc()
    print(f"{len(tests) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
