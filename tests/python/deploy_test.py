#!/usr/bin/env python3
"""Structural checks of deploy/: every YAML and JSON file parses, the Kubernetes manifests
(deploy/k8s/, its subfolders too) validate against the Kubernetes API schemas (offline,
`kubernetes-validate`, strict: unknown fields are errors; KEDA's ScaledObject, a custom resource,
is checked field by field), and the settings that matter are there (the GPUs the server and the
workers see, IPC namespace, the socket volume and its owner, probes on /healthz and /readyz,
scrape annotations, a non-root user, a health check in the image, no server settings in the
image's environment, the example tenant's uid and model, the front door's ports and routes, the
autoscalers' target). Every metric the dashboard, the alert rules and the autoscaling rules use
must be one the server exports, and the autoscaling queries are evaluated by `promtool test
rules` on made-up series of two servers. (tests/python/deploy_run_test.py runs the deploy's
commands.)

Prints "N passed, M failed" last; exits non-zero on any failure.
"""

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
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


def k8s_docs():
    """Every document of deploy/k8s/ and its subfolders."""
    files = sorted(glob.glob(os.path.join(DEPLOY, "k8s", "**", "*.yaml"), recursive=True))
    assert files, "no manifests"
    return [d for f in files for d in load_yaml(os.path.relpath(f, DEPLOY))]


# Custom resources the API schemas do not hold, checked by hand (test_keda_scaled_object).
CUSTOM_API_GROUPS = {"keda.sh"}


def exported_metrics():
    """The families the server registers: every name in core's metrics module."""
    files = glob.glob(os.path.join(ROOT, "core", "src", "metrics", "**", "*.rs"), recursive=True)
    assert files, "no metrics sources under core/src/metrics"
    src = "".join(open(f).read() for f in files)
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
    # Every GPU of the node, outside the device plugin's exclusive grants (the workers get
    # theirs from it); the taint GPU node pools carry is tolerated by name.
    for kind in ("limits", "requests"):
        assert "nvidia.com/gpu" not in c["resources"].get(kind, {}), c["resources"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"]), pod["tolerations"]
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
    # The per-node Service reaches the server of the client's own node only.
    svc = by_kind(docs, "Service")
    assert svc["spec"]["ports"] and svc["spec"]["internalTrafficPolicy"] == "Local"
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


K8S_VERSION = "1.30.0"


def test_manifests_validate_against_the_kubernetes_schemas():
    """Every manifest of deploy/k8s/ would be accepted by the API server as written."""
    import copy
    import kubernetes_validate
    version = K8S_VERSION
    docs = k8s_docs()
    kinds = set()
    for doc in docs:
        kinds.add(doc["kind"])
        if doc["apiVersion"].split("/")[0] in CUSTOM_API_GROUPS:
            # Only the custom resources a test checks by hand are let through.
            assert doc["kind"] == "ScaledObject", doc["kind"]
            continue
        kubernetes_validate.validate(doc, version, strict=True)
    expected = {"Namespace", "ConfigMap", "DaemonSet", "Service", "Deployment", "Ingress",
                "HorizontalPodAutoscaler", "ScaledObject"}
    assert expected <= kinds, f"missing manifests: {expected - kinds}"
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
    # Its GPU comes from the device plugin; the server sees them all.
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    # Spread over the nodes: every node's server behind the front door gets workers.
    labels = dep["spec"]["template"]["metadata"]["labels"]
    spread = [t for t in pod["topologySpreadConstraints"] if t["topologyKey"] == "kubernetes.io/hostname"]
    assert spread and spread[0]["labelSelector"]["matchLabels"].items() <= labels.items(), spread
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


def server_docs():
    return load_yaml("k8s/server-daemonset.yaml")


def server_config():
    import tomllib
    return tomllib.loads(by_kind(server_docs(), "ConfigMap")["data"]["modelshare.toml"])


def test_front_door():
    """The front door reaches every node's inference ports; the Ingress exposes only its routes."""
    docs = load_yaml("k8s/server-front-door.yaml")
    ds = by_kind(server_docs(), "DaemonSet")
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    svc = by_kind(docs, "Service")
    assert svc["metadata"]["namespace"] == ds["metadata"]["namespace"]
    assert svc["spec"]["selector"].items() <= pod_labels.items(), "selects no server"
    # Any node's server, not only the client's own.
    assert svc["spec"].get("internalTrafficPolicy", "Cluster") == "Cluster"
    ports = {p["name"]: p for p in svc["spec"]["ports"]}
    # HTTP (OIP REST, OpenAI) and gRPC (OIP) land on the ports the server listens on.
    conf = server_config()
    http_port = int(conf["metrics_listen"].rsplit(":", 1)[1])
    grpc_port = int(conf["listen"].rsplit(":", 1)[1])
    assert container_ports[ports["http"]["targetPort"]] == http_port
    assert container_ports[ports["grpc"]["targetPort"]] == grpc_port
    # From outside: /v1 and /v2 only (not /metrics or the probes), over TLS.
    ing = by_kind(docs, "Ingress")
    (rule,) = ing["spec"]["rules"]
    paths = {p["path"]: p["backend"]["service"] for p in rule["http"]["paths"]}
    assert set(paths) == {"/v1", "/v2"}, paths
    for backend in paths.values():
        assert backend == {"name": svc["metadata"]["name"], "port": {"name": "http"}}, backend
    assert rule["host"] in ing["spec"]["tls"][0]["hosts"]


def autoscaling_docs():
    return {
        "hpa": by_kind(load_yaml("k8s/autoscaling/hpa.yaml"), "HorizontalPodAutoscaler"),
        "keda": by_kind(load_yaml("k8s/autoscaling/keda.yaml"), "ScaledObject"),
        "adapter": yaml.safe_load(
            by_kind(load_yaml("k8s/autoscaling/prometheus-adapter.yaml"), "ConfigMap")["data"]["config.yaml"]
        ),
    }


def adapter_names(rule):
    """The external metric name a prometheus-adapter rule exposes for its series."""
    series = re.match(r"\s*([a-zA-Z_:][a-zA-Z0-9_:]*)", rule["seriesQuery"]).group(1)
    name = rule.get("name", {})
    if not name:
        return series
    assert re.search(name["matches"], series), (name, series)
    return re.sub(name["matches"], re.sub(r"\$\{?(\d+)\}?", r"\\g<\1>", name["as"]), series)


def test_autoscalers_scale_the_worker_deployment():
    """The HPA and the ScaledObject scale the example workers on their model's queue."""
    dep = by_kind(load_yaml("k8s/worker-deployment.yaml"), "Deployment")
    a = autoscaling_docs()
    hpa, so = a["hpa"], a["keda"]
    for doc in (hpa, so):
        assert doc["metadata"]["namespace"] == dep["metadata"]["namespace"]
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": dep["apiVersion"], "kind": dep["kind"], "name": dep["metadata"]["name"]}
    # KEDA's scaleTargetRef defaults to an apps/v1 Deployment.
    assert so["spec"]["scaleTargetRef"] == {"name": dep["metadata"]["name"]}
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    assert 1 <= so["spec"]["minReplicaCount"] <= so["spec"]["maxReplicaCount"]
    # On the model the workers serve.
    model = worker_model()
    for m in hpa["spec"]["metrics"]:
        assert m["type"] == "External", m
        assert m["external"]["metric"]["selector"]["matchLabels"] == {"model": model}, m
    for t in so["spec"]["triggers"]:
        assert f'model="{model}"' in t["metadata"]["query"], t
        assert f'namespace="{so["metadata"]["namespace"]}"' in t["metadata"]["query"], t
    # The HPA asks for metrics the adapter's rules expose.
    exposed = {adapter_names(r) for r in a["adapter"]["externalRules"]}
    asked = {m["external"]["metric"]["name"] for m in hpa["spec"]["metrics"]}
    assert asked <= exposed, f"the HPA asks for {asked - exposed}, which the adapter does not expose"


def test_keda_scaled_object():
    """The ScaledObject has only fields KEDA knows, of the types it takes (no schema here)."""
    import kubernetes_validate
    so = autoscaling_docs()["keda"]
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    assert set(so) <= {"apiVersion", "kind", "metadata", "spec"}, set(so)
    spec = so["spec"]
    # keda.sh/v1alpha1 ScaledObjectSpec (apis/keda/v1alpha1/scaledobject_types.go).
    known = {"scaleTargetRef", "pollingInterval", "initialCooldownPeriod", "cooldownPeriod",
             "idleReplicaCount", "minReplicaCount", "maxReplicaCount", "advanced", "triggers",
             "fallback"}
    assert set(spec) <= known, set(spec) - known
    assert set(spec["scaleTargetRef"]) <= {"name", "apiVersion", "kind", "envSourceContainerName"}
    for key in ("pollingInterval", "minReplicaCount", "maxReplicaCount"):
        assert isinstance(spec.get(key, 0), int), key
    advanced = spec.get("advanced", {})
    assert set(advanced) <= {"horizontalPodAutoscalerConfig", "restoreToOriginalReplicaCount",
                             "scalingModifiers"}, set(advanced)
    # Its HPA behaviour is autoscaling/v2's: validated as part of an HPA.
    behavior = advanced["horizontalPodAutoscalerConfig"]["behavior"]
    hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
           "metadata": {"name": "check"},
           "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "x"},
                    "maxReplicas": 1, "behavior": behavior}}
    kubernetes_validate.validate(hpa, K8S_VERSION, strict=True)
    # Triggers: KEDA's ScaleTriggers; the Prometheus scaler's metadata is a map of strings.
    names = [t["name"] for t in spec["triggers"]]
    assert len(names) == len(set(names)), names
    for t in spec["triggers"]:
        assert set(t) <= {"type", "name", "metadata", "metricType", "useCachedMetrics",
                          "authenticationRef"}, set(t)
        assert t["type"] == "prometheus" and t.get("metricType", "AverageValue") in ("AverageValue", "Value")
        meta = t["metadata"]
        assert all(isinstance(v, str) for v in meta.values()), f"metadata values must be strings: {meta}"
        assert {"serverAddress", "query", "threshold"} <= set(meta), meta
        assert set(meta) <= {"serverAddress", "query", "queryParameters", "threshold",
                             "activationThreshold", "namespace", "customHeaders",
                             "ignoreNullValues", "unsafeSsl", "timeout", "authModes"}, meta
        assert float(meta["threshold"]) > 0 and meta["serverAddress"].startswith("http")


def scaling_queries():
    """Every PromQL query of the autoscaling rules, as Prometheus runs it for the HPA and KEDA:
    (name, query, labels of its result)."""
    a = autoscaling_docs()
    hpa = a["hpa"]
    namespace = hpa["metadata"]["namespace"]
    queries = []
    for m in hpa["spec"]["metrics"]:
        metric = m["external"]["metric"]
        (rule,) = [r for r in a["adapter"]["externalRules"] if adapter_names(r) == metric["name"]]
        # The adapter's templates: the series, and the HPA's selector plus its namespace.
        series = re.match(r"\s*([a-zA-Z_:][a-zA-Z0-9_:]*)", rule["seriesQuery"]).group(1)
        labels = {"namespace": namespace, **metric["selector"]["matchLabels"]}
        matchers = ",".join(f'{k}="{v}"' for k, v in labels.items())
        query = rule["metricsQuery"].replace("<<.Series>>", series).replace("<<.LabelMatchers>>", matchers)
        assert "<<" not in query, query
        queries.append((f"adapter {metric['name']}", query, {"model": labels["model"]}))
    for t in a["keda"]["spec"]["triggers"]:
        queries.append((f"keda {t['name']}", t["metadata"]["query"], {}))
    return queries


def test_scaling_rules_use_exported_metrics():
    """The adapter's rules and KEDA's queries read series the server exports."""
    a = autoscaling_docs()
    text = " ".join(r["seriesQuery"] + " " + r["metricsQuery"] for r in a["adapter"]["externalRules"])
    text += " " + " ".join(t["metadata"]["query"] for t in a["keda"]["spec"]["triggers"])
    unknown = used_metrics(text) - exported_metrics()
    assert not unknown, f"autoscaling rules use metrics the server does not export: {unknown}"


def test_scaling_queries_evaluate():
    """Each scaling query sums its namespace's servers and reads 0, not NaN, when idle."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is needed (Debian's prometheus package; scripts/test installs it)"
    model = worker_model()
    ns = autoscaling_docs()["hpa"]["metadata"]["namespace"]
    wait = "modelshare_inference_queue_duration_seconds"
    series = [
        # Two servers of the namespace (two nodes): 10 and 30 items queued.
        (f'modelshare_inference_queue_items{{namespace="{ns}", pod="ms-a", model="{model}"}}', "10x15"),
        (f'modelshare_inference_queue_items{{namespace="{ns}", pod="ms-b", model="{model}"}}', "30x15"),
        # Server a: nothing waits until minute 6, then 60 items a minute, 0.1 s each.
        (f'{wait}_sum{{namespace="{ns}", pod="ms-a", model="{model}"}}', "0x5 6+6x9"),
        (f'{wait}_count{{namespace="{ns}", pod="ms-a", model="{model}"}}', "0x5 60+60x9"),
        # Server b: idle throughout.
        (f'{wait}_sum{{namespace="{ns}", pod="ms-b", model="{model}"}}', "3x15"),
        (f'{wait}_count{{namespace="{ns}", pod="ms-b", model="{model}"}}', "30x15"),
        # Another namespace's server: not counted.
        (f'modelshare_inference_queue_items{{namespace="other", pod="x", model="{model}"}}', "1000x15"),
        (f'{wait}_sum{{namespace="other", pod="x", model="{model}"}}', "0+100x15"),
        (f'{wait}_count{{namespace="other", pod="x", model="{model}"}}', "0+1x15"),
    ]
    tests = []
    for name, query, labels in scaling_queries():
        expected = [(4, 0.0), (12, 0.1)] if wait in query else [(4, 40), (12, 40)]
        label_text = "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
        for minute, value in expected:
            tests.append({"expr": query, "eval_time": f"{minute}m",
                          "exp_samples": [{"labels": label_text, "value": value}]})
    unit = {"rule_files": [], "evaluation_interval": "1m",
            "tests": [{"interval": "1m",
                       "input_series": [{"series": s, "values": v} for s, v in series],
                       "promql_expr_test": tests}]}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "scaling_test.yml")
        with open(path, "w") as f:
            yaml.safe_dump(unit, f)
        out = subprocess.run([promtool, "test", "rules", path], capture_output=True, text=True)
    assert out.returncode == 0, f"promtool test rules:\n{out.stdout}{out.stderr}"


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
