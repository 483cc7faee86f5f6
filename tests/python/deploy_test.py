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
rules` on made-up series of two servers. Workers run as a uid of their own in the sockets' group,
with the socket folder read-only; the pods' Pod Security level is computed (a subset of the Pod
Security Standards' checks) and must be what the namespace enforces and the README says, with
every container hardened; the image's base and the driver it needs, its dependency cache, the
CPU image, the model folder's commands and the compose files' Prometheus.
(tests/python/deploy_run_test.py runs the deploy's commands.)

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
    # With [tls] the inference port speaks HTTPS: the kubelet's plain-HTTP probes ask the
    # operators' port.
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["port"] == "metrics", probe
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["sockets"] == "/run/modelshare"
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["sockets"]["hostPath"]["path"] == "/run/modelshare"
    ann = ds["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true" and ann["prometheus.io/port"] == "9401"
    cfg = by_kind(docs, "ConfigMap")["data"]["modelshare.toml"]
    # The doors and the operators' endpoints on ports of their own; Prometheus scrapes the latter.
    assert 'http_listen = "0.0.0.0:9400"' in cfg and 'metrics_listen = "0.0.0.0:9401"' in cfg
    assert 'unix_socket = "/run/modelshare/grpc.sock"' in cfg
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
    http_port = int(conf["http_listen"].rsplit(":", 1)[1])
    # The operators' port (/metrics, readiness with every tenant's model names) is in no Service.
    metrics_port = int(conf["metrics_listen"].rsplit(":", 1)[1])
    assert metrics_port not in {p.get("targetPort") for p in svc["spec"]["ports"]} | {
        container_ports.get(p.get("targetPort")) for p in svc["spec"]["ports"]}
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
    # The servers answer HTTPS on that port (their [tls]): the controller must speak it too.
    assert ing["metadata"]["annotations"]["nginx.ingress.kubernetes.io/backend-protocol"] == "HTTPS"
    assert "tls" in server_config(), "the inference port's HTTPS needs the server's [tls]"


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
    assert "sockets:/run/modelshare" in s["volumes"] and "sockets:/run/modelshare:ro" in w["volumes"]
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
    assert len(froms) == 2 and runtime_base(text).startswith("nvidia/cuda:"), froms
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


# --- Workers apart from the server (their own uid, the sockets' group, a read-only mount) ---

SOCKETS = "/run/modelshare"


def dockerfile_text():
    return open(os.path.join(DEPLOY, "Dockerfile")).read()


def dockerfile_args(text):
    """The global ARGs (before the first FROM) and their defaults."""
    head = text.split("\nFROM ", 1)[0]
    return dict(re.findall(r"^ARG (\w+)=(\S+)", head, re.M))


def runtime_base(text, build_args=None):
    """The image the last stage (the one `docker build` makes) runs on, its ARG resolved."""
    base = re.findall(r"^FROM (\S+)", text, re.M)[-1]
    args = {**dockerfile_args(text), **(build_args or {})}
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args[m.group(1)], base)


def image_gid():
    """The group the image's user runs as (its primary group: the sockets' group)."""
    text = dockerfile_text()
    m = re.search(r"useradd [^\n]*--uid (\d+) [^\n]*--gid (\d+)", text)
    assert m, "the image's user must be created with an explicit uid and gid"
    assert int(m.group(1)) == image_uid(), "USER must be the user created"
    return int(m.group(2))


def run_steps(text):
    """The Dockerfile's RUN instructions, their continuation lines joined."""
    return [r.replace("\\\n", " ") for r in re.findall(r"^RUN ((?:.*\\\n)*.*)$", text, re.M)]


def chmod_of(command, path):
    m = re.search(rf"chmod (0?[0-7]{{3,4}}) {re.escape(path)}\b", command)
    assert m, f"no chmod of {path} in {command!r}"
    return int(m.group(1), 8)


def chown_of(command, path):
    m = re.search(rf"chown (\d+):(\d+) (?:\S+ )*{re.escape(path)}\b", command)
    assert m, f"no chown uid:gid of {path} in {command!r}"
    return int(m.group(1)), int(m.group(2))


def check_socket_modes(dir_mode, socket_mode, what):
    # The directory: the group may reach the sockets in it, but not create, rename or remove
    # anything (the sockets, the adoption records); others nothing.
    assert dir_mode & 0o010 and not dir_mode & 0o020, f"{what}: directory mode {dir_mode:o}"
    assert not dir_mode & 0o007, f"{what}: directory mode {dir_mode:o} lets others in"
    # The sockets: the group may connect (write permission on the socket), others may not.
    assert socket_mode & 0o060 == 0o060 and not socket_mode & 0o007, f"{what}: socket mode {socket_mode:o}"


def test_kubernetes_workers_run_apart_from_the_server():
    """The workers have a uid of their own, join the sockets' group, and mount the socket folder
    read-only; the server owns the folder (0750) and makes the sockets 0660."""
    server = by_kind(server_docs(), "DaemonSet")["spec"]["template"]["spec"]
    worker = worker_pod()
    s_ctx, w_ctx = server["securityContext"], worker["securityContext"]
    server_uid, socket_gid = s_ctx["runAsUser"], s_ctx["runAsGroup"]
    assert w_ctx["runAsUser"] != server_uid, "the workers run as the server's uid"
    assert w_ctx["runAsUser"] != 0 and w_ctx.get("runAsGroup") != socket_gid, w_ctx
    # The sockets take the server's group (the server sets their mode, not their group).
    assert socket_gid in w_ctx.get("supplementalGroups", []), "the workers are not in the sockets' group"
    (init,) = server["initContainers"]
    command = " ".join(init["command"])
    assert chown_of(command, SOCKETS) == (server_uid, socket_gid), command
    mode = server_config().get("unix_socket_mode")
    assert mode, "no unix_socket_mode: the sockets' mode is left to the umask"
    check_socket_modes(chmod_of(command, SOCKETS), int(mode, 8), "Kubernetes")
    # The server writes there; the workers only connect.
    def sockets_mount(pod):
        (m,) = [m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == SOCKETS]
        return m
    assert not sockets_mount(server).get("readOnly"), "the server must write its sockets"
    assert sockets_mount(worker).get("readOnly") is True, "the workers mount the socket folder read-write"
    # The tenants' uid checks tell the workers from the server.
    for t in example_tenants()["tenants"]:
        assert server_uid not in t.get("uids", []), f"tenant {t['name']} is bound to the server's uid"


def test_compose_workers_run_apart_from_the_server():
    """As on Kubernetes: compose workers run as a uid of their own in the image user's group,
    with the socket volume read-only; the image's socket folder and config file match."""
    uid, gid = image_uid(), image_gid()
    text = dockerfile_text()
    run = " ".join(run_steps(text))
    assert chown_of(run, SOCKETS) == (uid, gid), run
    import tomllib
    with open(os.path.join(DEPLOY, "modelshare.toml"), "rb") as f:
        mode = tomllib.load(f).get("unix_socket_mode")
    assert mode, "the image's configuration leaves the sockets' mode to the umask"
    check_socket_modes(chmod_of(run, SOCKETS), int(mode, 8), "image")
    for rel in ("compose.yaml", "compose.cpu.yaml"):
        (doc,) = load_yaml(rel)
        s, w = doc["services"]["modelshare"], doc["services"]["worker"]
        assert "user" not in s, f"{rel}: the server runs as the image's user"
        w_uid, _, w_gid = str(w.get("user", "")).partition(":")
        assert w_uid and int(w_uid) not in (uid, 0), f"{rel}: the worker runs as the server's uid"
        assert w_gid and int(w_gid) != gid, f"{rel}: the worker's own group is the sockets' group"
        assert gid in [int(g) for g in w.get("group_add", [])], f"{rel}: the worker is not in the sockets' group"
        volume = [v for v in w["volumes"] if v.split(":")[1] == SOCKETS]
        assert volume == [f"sockets:{SOCKETS}:ro"], f"{rel}: {volume}"


# --- Pod Security ---

POD_SECURITY_LEVELS = ["restricted", "baseline", "privileged"]
# Capabilities "baseline" lets a container add; "restricted" only NET_BIND_SERVICE.
BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                         "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}


def pod_security_violations(pod):
    """What a pod spec breaks of the Pod Security Standards (those of their checks that apply
    to Linux pods like these): {"baseline": [...], "restricted": [...]}, "restricted" holding
    only what it adds to "baseline"."""
    base, restricted = [], []
    containers = pod.get("initContainers", []) + pod["containers"]
    pod_ctx = pod.get("securityContext", {})
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            base.append(key)
    for v in pod.get("volumes", []):
        kind = next(k for k in v if k != "name")
        if kind == "hostPath":
            base.append(f"hostPath volume {v['name']}")
        elif kind not in RESTRICTED_VOLUMES:
            restricted.append(f"{kind} volume {v['name']}")
    if pod_ctx.get("sysctls"):
        base.append("sysctls")

    def seccomp(ctx):
        return (ctx.get("seccompProfile") or {}).get("type")

    for c in containers:
        ctx = c.get("securityContext", {})
        name = c["name"]
        if ctx.get("privileged"):
            base.append(f"{name}: privileged")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            base.append(f"{name}: hostPort")
        if ctx.get("procMount", "Default") != "Default":
            base.append(f"{name}: procMount")
        caps = ctx.get("capabilities", {})
        added = set(caps.get("add", []))
        if added - BASELINE_CAPABILITIES:
            base.append(f"{name}: adds {sorted(added - BASELINE_CAPABILITIES)}")
        if added - {"NET_BIND_SERVICE"}:
            restricted.append(f"{name}: adds {sorted(added - {'NET_BIND_SERVICE'})}")
        if "ALL" not in caps.get("drop", []):
            restricted.append(f"{name}: does not drop ALL capabilities")
        profile = seccomp(ctx) or seccomp(pod_ctx)
        if profile == "Unconfined":
            base.append(f"{name}: seccomp Unconfined")
        if profile not in ("RuntimeDefault", "Localhost"):
            restricted.append(f"{name}: no RuntimeDefault seccomp profile")
        if ctx.get("allowPrivilegeEscalation") is not False:
            restricted.append(f"{name}: allowPrivilegeEscalation not false")
        if not ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot")):
            restricted.append(f"{name}: runAsNonRoot not true")
        if ctx.get("runAsUser", pod_ctx.get("runAsUser")) == 0:
            restricted.append(f"{name}: runs as uid 0")
    return {"baseline": base, "restricted": restricted}


def pod_security_level(pod):
    """The strictest level that admits the pod."""
    v = pod_security_violations(pod)
    if v["baseline"]:
        return "privileged"
    return "baseline" if v["restricted"] else "restricted"


def test_pod_security_check_works():
    """The level computation itself: a hardened pod is restricted, and each lapse lowers it."""
    import copy
    pod = {"securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
           "containers": [{"name": "c", "securityContext": {
               "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}],
           "volumes": [{"name": "t", "emptyDir": {}}]}
    assert pod_security_level(pod) == "restricted"
    for change, level in [
        (lambda p: p["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"), "baseline"),
        (lambda p: p["containers"][0]["securityContext"]["capabilities"].update(add=["CHOWN"]), "baseline"),
        (lambda p: p["securityContext"].pop("seccompProfile"), "baseline"),
        (lambda p: p["containers"][0]["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]), "privileged"),
        (lambda p: p["volumes"].append({"name": "h", "hostPath": {"path": "/x"}}), "privileged"),
        (lambda p: p.update(hostIPC=True), "privileged"),
    ]:
        bad = copy.deepcopy(pod)
        change(bad)
        assert pod_security_level(bad) == level, (bad, pod_security_level(bad))


def workload_pods():
    return {
        "server": by_kind(server_docs(), "DaemonSet")["spec"]["template"]["spec"],
        "workers": worker_pod(),
    }


def test_containers_are_hardened():
    """Every container: no privilege escalation, no capability but what it needs, a read-only
    root filesystem, the runtime's seccomp profile; only the init container runs as root."""
    for part, pod in workload_pods().items():
        pod_ctx = pod["securityContext"]
        assert pod_ctx["seccompProfile"] == {"type": "RuntimeDefault"}, part
        assert pod_ctx["runAsNonRoot"] is True and pod_ctx["runAsUser"] != 0, part
        emptydirs = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
        for c in pod.get("initContainers", []) + pod["containers"]:
            ctx = c.get("securityContext", {})
            what = f"{part}/{c['name']}"
            assert ctx.get("allowPrivilegeEscalation") is False, what
            assert ctx.get("readOnlyRootFilesystem") is True, what
            assert ctx.get("capabilities", {}).get("drop") == ["ALL"], what
            assert not ctx.get("privileged"), what
        for c in pod["containers"]:
            ctx = c["securityContext"]
            what = f"{part}/{c['name']}"
            assert not ctx["capabilities"].get("add"), f"{what} adds capabilities"
            assert ctx.get("runAsUser", pod_ctx["runAsUser"]) != 0, what
            # With the root filesystem read-only, /tmp is an emptyDir.
            tmp = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
            assert tmp and tmp[0]["name"] in emptydirs and not tmp[0].get("readOnly"), f"{what}: no writable /tmp"
    # The init container: root for the chown, and only the capabilities chown and chmod need.
    (init,) = workload_pods()["server"]["initContainers"]
    assert set(init["securityContext"]["capabilities"].get("add", [])) <= {"CHOWN", "FOWNER"}, init


def test_pod_security_levels():
    """Each pod is admitted at the level the namespace enforces, which is the strictest that
    admits them all; what keeps them from "restricted" is only what the README explains; the
    README's table names each part's level."""
    pods = workload_pods()
    levels = {part: pod_security_level(pod) for part, pod in pods.items()}
    for part, pod in pods.items():
        v = pod_security_violations(pod)
        # Nothing but the hostPaths keeps them from "baseline".
        assert all(x.startswith("hostPath volume") for x in v["baseline"]), (part, v["baseline"])
        # ... and from "restricted", but the server's init container (root, CHOWN and FOWNER).
        init = {c["name"] for c in pod.get("initContainers", [])}
        assert all(x.split(":")[0] in init for x in v["restricted"]), (part, v["restricted"])
    ns = by_kind(server_docs(), "Namespace")
    labels = ns["metadata"].get("labels", {})
    enforce = labels.get("pod-security.kubernetes.io/enforce")
    needed = max(levels.values(), key=POD_SECURITY_LEVELS.index)
    assert enforce == needed, f"the namespace enforces {enforce!r}; its pods need {needed!r} ({levels})"
    for mode in ("audit", "warn"):
        level = labels.get(f"pod-security.kubernetes.io/{mode}")
        assert level is None or level in POD_SECURITY_LEVELS, (mode, level)
    # Every pod of deploy/k8s/ is in that namespace (the levels above are all there is to admit).
    for doc in k8s_docs():
        if doc["kind"] in ("Pod", "DaemonSet", "Deployment", "StatefulSet", "ReplicaSet", "Job", "CronJob"):
            assert doc["metadata"].get("namespace") == ns["metadata"]["name"], doc["metadata"]
            assert doc["kind"] in ("DaemonSet", "Deployment"), f"{doc['kind']}: its level is not checked"
    readme = open(os.path.join(DEPLOY, "README.md")).read()
    section = readme.split("\n## Pod Security\n", 1)
    assert len(section) == 2, "deploy/README.md has no Pod Security section"
    section = section[1].split("\n## ", 1)[0]
    rows = {r.split("|")[1].strip(): r.split("|")[2] for r in section.splitlines() if r.startswith("| ")}
    for part, kind in (("server", "DaemonSet"), ("workers", "Deployment")):
        (row,) = [v for k, v in rows.items() if kind in k]
        assert f"**{levels[part]}**" in row, f"README: {kind} row says {row.strip()!r}, the pod needs {levels[part]}"


# --- The image, the driver, the CPU image, the model folder, Prometheus in compose ---

# The NVIDIA driver branch each CUDA major version needs at least (the toolkit's release notes).
MIN_DRIVER = {12: "R525", 13: "R580"}


def test_the_readme_names_the_driver_the_image_needs():
    text = dockerfile_text()
    base = runtime_base(text)
    m = re.match(r"nvidia/cuda:(\d+)\.", base)
    assert m, base
    major = int(m.group(1))
    # The binaries are built against the same CUDA API version (cudarc's cuda-XXYYY feature).
    cargo = open(os.path.join(ROOT, "Cargo.toml")).read()
    api = re.search(r'^cudarc = .*"cuda-(\d+)"', cargo, re.M)
    assert api and int(api.group(1)) // 1000 == major, (api and api.group(0), base)
    readme = open(os.path.join(DEPLOY, "README.md")).read()
    assert MIN_DRIVER[major] in readme, f"deploy/README.md must say the driver CUDA {major} needs ({MIN_DRIVER[major]}+)"
    assert MIN_DRIVER[major] in text, "the Dockerfile must say which driver its base needs"


def cargo_build_step(text):
    (step,) = [r for r in run_steps(text) if "cargo build" in r]
    return step


def test_dockerfile_caches_dependencies():
    """Cargo's registry and the target directory are BuildKit cache mounts; the binaries leave
    the cache in the same step (a cache mount is not in the layer COPY --from reads)."""
    text = dockerfile_text()
    assert text.startswith("# syntax=docker/dockerfile:1"), "cache mounts want the dockerfile:1 frontend"
    step = cargo_build_step(text)
    caches = {dict(kv.split("=", 1) for kv in m.split(","))["target"]
              for m in re.findall(r"--mount=(type=cache,\S+)", step)}
    workdir = re.findall(r"^WORKDIR (\S+)", text.split("\nFROM ", 2)[1], re.M)[-1]
    target_dir = f"{workdir}/target"
    assert "/usr/local/cargo/registry" in caches and target_dir in caches, caches
    for src in re.findall(r"^COPY --from=build (\S+)", text, re.M):
        assert not src.startswith(target_dir + "/"), f"COPY --from=build {src}: the target directory is a cache mount"
        assert re.search(rf"\bcp [^&]*{re.escape(os.path.basename(src))}\b[^&]* {re.escape(os.path.dirname(src))}/?(\s|$)", step), \
            f"{src} is not copied out of the cache in the build step"


def test_cpu_compose_builds_the_cpu_image():
    """compose.cpu.yaml builds the image without the CUDA base, under a tag of its own."""
    text = dockerfile_text()
    (cpu,) = load_yaml("compose.cpu.yaml")
    (gpu,) = load_yaml("compose.yaml")
    builds = [s for s in cpu["services"].values() if "build" in s]
    assert len(builds) == 1, builds
    build = builds[0]["build"]
    args = build.get("args", {})
    assert set(args) <= set(dockerfile_args(text)), f"build args the Dockerfile does not declare: {args}"
    base = runtime_base(text, args)
    assert not base.startswith("nvidia/"), f"the CPU image runs on {base}"
    # The same distribution as the CUDA image (the same packages, glibc new enough).
    cuda = runtime_base(text)
    assert cuda.endswith("-" + base.replace(":", "")), (base, cuda)
    tag = builds[0]["image"]
    ours = {s["image"] for s in cpu["services"].values() if s["image"].startswith("modelshare:")}
    assert ours == {tag}, ours
    assert tag not in {s.get("image") for s in gpu["services"].values()}, "the CPU image would replace the GPU one"


def test_readme_says_how_to_make_the_model_folder():
    """compose.yaml's model, under its models folder, is what the README's commands make."""
    (doc,) = load_yaml("compose.yaml")
    s = doc["services"]["modelshare"]
    model = s["command"][s["command"].index("--model") + 1]
    _name, path = model.split("=", 1)
    (mount,) = [v for v in s["volumes"] if v.split(":")[1] == "/models"]
    host = os.path.normpath(os.path.join("deploy", mount.split(":")[0]))
    readme = open(os.path.join(DEPLOY, "README.md")).read()
    blocks = "\n".join(re.findall(r"```sh\n(.*?)```", readme, re.S))
    assert f"mkdir -p {host}" in blocks, f"no command makes {host}"
    # The generated demo model is copied to where compose.yaml looks for it.
    gen = [b for b in re.findall(r"```sh\n(.*?)```", readme, re.S) if "modelshare demo" in b]
    assert gen, "no command writes the demo model"
    assert f'-v "$PWD/{host}:/models"' in gen[0] and re.search(rf"\s/models/{re.escape(path)}'", gen[0]), gen[0]
    assert f"{host}/{path}" in blocks


def test_compose_files_run_prometheus():
    """Both compose files run Prometheus on prometheus/ (its scrape target is their server's
    operators' port, which the server's command opens), published on loopback only; promtool
    accepts the configuration."""
    prom = load_yaml("prometheus/prometheus.yml")[0]
    targets = [t for c in prom["scrape_configs"] for sc in c["static_configs"] for t in sc["targets"]]
    import tomllib
    with open(os.path.join(DEPLOY, "modelshare.toml"), "rb") as f:
        metrics_port = tomllib.load(f)["metrics_listen"].rsplit(":", 1)[1]
    for rel in ("compose.yaml", "compose.cpu.yaml"):
        (doc,) = load_yaml(rel)
        services = doc["services"]
        proms = [s for s in services.values() if s.get("image", "").startswith("prom/prometheus:")]
        assert len(proms) == 1, f"{rel}: no Prometheus service"
        p = proms[0]
        assert not p["image"].endswith(":latest"), "pin Prometheus"
        assert "./prometheus:/etc/prometheus:ro" in p["volumes"], p["volumes"]
        assert all(x.startswith("127.0.0.1:") for x in p["ports"]), p["ports"]
        for t in targets:
            host, port = t.rsplit(":", 1)
            assert host in services and port == metrics_port, f"{rel}: scrape target {t} is not the metrics port"
            command = services[host]["command"]
            assert f"0.0.0.0:{port}" in command[command.index("--metrics-listen") + 1], command
    promtool = shutil.which("promtool")
    assert promtool, "promtool is needed (Debian's prometheus package; scripts/test installs it)"
    out = subprocess.run([promtool, "check", "config", os.path.join(DEPLOY, "prometheus", "prometheus.yml")],
                         capture_output=True, text=True)
    assert out.returncode == 0, f"promtool check config:\n{out.stdout}{out.stderr}"


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
