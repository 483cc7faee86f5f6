#!/usr/bin/env python3
"""Structural checks of deploy/: every YAML and JSON file parses, the Kubernetes manifests
validate against the Kubernetes API schemas (offline, `kubernetes-validate`, strict: unknown
fields are errors), and the settings that matter are there (GPU requests, IPC namespace, the
socket volume and its owner, probes on /healthz and /readyz, scrape annotations, a non-root
user, a health check in the image, no server settings in the image's environment, the example
tenant's uid and model). Every metric the dashboard and the alert rules use must be one the
server exports. (tests/python/deploy_run_test.py runs the deploy's commands.)

Prints "N passed, M failed" last; exits non-zero on any failure.
"""

import json
import os
import re
import sys
import traceback

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(ROOT, "deploy")


def load_yaml(rel):
    with open(os.path.join(DEPLOY, rel)) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def by_kind(docs, kind):
    found = [d for d in docs if d.get("kind") == kind]
    assert found, f"no {kind}"
    return found[0]


def exported_metrics():
    src = open(os.path.join(ROOT, "server", "src", "metrics", "mod.rs")).read()
    return set(re.findall(r'"(modelshare_[a-z_]+)"', src))


def used_metrics(text):
    names = set(re.findall(r"\b(modelshare_[a-z_]+)", text))
    return {re.sub(r"_(bucket|count|sum)$", "", n) for n in names}


def test_server_daemonset():
    docs = load_yaml("k8s/server-daemonset.yaml")
    ds = by_kind(docs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert "hostIPC" not in pod and "hostPID" not in pod, "VMM handles need neither"
    c = pod["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["sockets"] == "/run/modelshare"
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["sockets"]["hostPath"]["path"] == "/run/modelshare"
    ann = ds["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/port"] == "9400"
    cfg = by_kind(docs, "ConfigMap")["data"]["modelshare.toml"]
    assert 'metrics_listen = "0.0.0.0:9400"' in cfg and 'unix_socket = "/run/modelshare/grpc.sock"' in cfg
    # The tenants file and the TLS files are where their Secrets are mounted.
    import tomllib
    conf = tomllib.loads(cfg)
    assert conf["cuda_handles"] == "vmm"
    assert conf["tenants_file"].startswith(mounts["tenants"] + "/"), conf["tenants_file"]
    assert conf["tls"]["cert"].startswith(mounts["tls"] + "/")
    assert conf["tls"]["key"].startswith(mounts["tls"] + "/")
    assert vols["tenants"]["secret"]["secretName"] and vols["tls"]["secret"]["secretName"]
    assert by_kind(docs, "Service")["spec"]["ports"]
    # The socket hostPath is handed to the image's uid before the server starts.
    uid = image_uid()
    (init,) = pod["initContainers"]
    assert f"chown {uid}:" in " ".join(init["command"]), init["command"]
    assert {m["mountPath"] for m in init["volumeMounts"]} == {"/run/modelshare"}
    assert pod["securityContext"]["runAsUser"] == uid
    # The example tenant's workers see the example model.
    tenants = example_tenants()
    worker_uid = worker_pod()["securityContext"]["runAsUser"]
    bound = [t["name"] for t in tenants["tenants"] if worker_uid in t.get("uids", [])]
    assert bound, f"no example tenant is bound to the worker pods' uid {worker_uid}"
    model = next(m for m in conf["models"] if m["name"] == worker_model())
    assert model.get("public") or set(bound) & set(model.get("share_with", []) + [model.get("tenant")]), model


def image_uid():
    text = open(os.path.join(DEPLOY, "Dockerfile")).read()
    return int(re.search(r"^USER (\d+)", text, re.M).group(1))


def example_tenants():
    import tomllib
    with open(os.path.join(DEPLOY, "tenants.example.toml"), "rb") as f:
        return tomllib.load(f)


def worker_pod():
    return by_kind(load_yaml("k8s/worker-deployment.yaml"), "Deployment")["spec"]["template"]["spec"]


def worker_model():
    return worker_pod()["containers"][0]["args"][1]


def test_manifests_validate_against_the_kubernetes_schemas():
    import copy
    import kubernetes_validate
    version = "1.30.0"
    docs = load_yaml("k8s/server-daemonset.yaml") + load_yaml("k8s/worker-deployment.yaml")
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)
    # The validation can fail: a misspelt field is caught.
    bad = copy.deepcopy(by_kind(docs, "DaemonSet"))
    bad["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    try:
        kubernetes_validate.validate(bad, version, strict=True)
    except kubernetes_validate.ValidationError:
        pass
    else:
        raise AssertionError("a misspelt field passed the schema validation")


def test_worker_deployment():
    dep = by_kind(load_yaml("k8s/worker-deployment.yaml"), "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert "hostIPC" not in pod and "hostPID" not in pod
    c = pod["containers"][0]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["MODELSHARE_SERVER"] == "unix:/run/modelshare/grpc.sock"
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["sockets"] == "/run/modelshare"
    assert pod["volumes"][0]["hostPath"]["path"] == "/run/modelshare"
    # The tenant token comes from a Secret mounted where MODELSHARE_TOKEN_FILE points.
    token_file = env["MODELSHARE_TOKEN_FILE"]
    assert token_file.startswith(mounts["token"] + "/"), token_file
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["token"]["secret"]["secretName"]


def test_compose():
    (doc,) = load_yaml("compose.yaml")
    s, w = doc["services"]["modelshare"], doc["services"]["worker"]
    assert "ipc" not in s and "ipc" not in w and w["pid"] == "service:modelshare"
    assert s["command"][s["command"].index("--cuda-handles") + 1] == "vmm"
    # TCP without a tenants file is asked for by name.
    assert "--listen" in s["command"] and "--unauthenticated-tcp" in s["command"]
    for svc in (s, w):
        dev = svc["deploy"]["resources"]["reservations"]["devices"][0]
        assert dev["driver"] == "nvidia" and "gpu" in dev["capabilities"]
    assert "sockets:/run/modelshare" in s["volumes"] and "sockets:/run/modelshare" in w["volumes"]
    assert w["depends_on"]["modelshare"]["condition"] == "service_healthy"
    # The unauthenticated admin API stays on loopback; the worker comes back if it exits.
    assert all(p.startswith("127.0.0.1:") for p in s["ports"]), s["ports"]
    assert w["restart"] == "unless-stopped"


def test_cpu_compose():
    (doc,) = load_yaml("compose.cpu.yaml")
    s = doc["services"]["modelshare"]
    assert s["command"][s["command"].index("--backend") + 1] == "host"
    for svc in doc["services"].values():
        assert "deploy" not in svc, "the CPU stack reserves no GPU"
    assert all(p.startswith("127.0.0.1:") for p in s["ports"]), s["ports"]


def test_dockerfile():
    ignored = open(os.path.join(ROOT, ".dockerignore")).read().split()
    assert "target/" in ignored and ".git/" in ignored, "the build context must leave out target/ and .git/"
    text = open(os.path.join(DEPLOY, "Dockerfile")).read()
    froms = re.findall(r"^FROM (\S+)", text, re.M)
    assert len(froms) == 2 and froms[1].startswith("nvidia/cuda:"), froms
    assert re.search(r"^USER (?!root|0\b)\S+", text, re.M), "must run as a non-root user"
    assert "HEALTHCHECK" in text and "EXPOSE 50051 9400" in text
    # Healthy means serving (start-up models loaded), not merely answering.
    healthcheck = r'HEALTHCHECK[^\n]*\\\n\s*CMD \["modelshare", "ready"\]'
    assert re.search(healthcheck, text), "HEALTHCHECK must run `modelshare ready`"
    assert "docker build -f deploy/Dockerfile" in text
    # No server setting in the image's environment: it would win over a mounted config file.
    env = re.findall(r"\b(MODELSHARE_[A-Z_]+)=", text)
    assert set(env) <= {"MODELSHARE_CONFIG", "MODELSHARE_SERVER"}, env
    assert "COPY deploy/modelshare.toml /etc/modelshare/modelshare.toml" in text


def test_dashboard():
    dash = json.load(open(os.path.join(DEPLOY, "grafana", "modelshare.json")))
    assert dash["panels"], "no panels"
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
    unknown = used_metrics(exprs) - exported_metrics()
    assert not unknown, f"dashboard uses metrics the server does not export: {unknown}"


def test_alert_rules_use_exported_metrics():
    (doc,) = load_yaml("prometheus/alerts.yml")
    exprs = " ".join(r["expr"] for g in doc["groups"] for r in g["rules"])
    unknown = used_metrics(exprs) - exported_metrics()
    assert not unknown, f"alert rules use metrics the server does not export: {unknown}"


def main():
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
