"""Tests of scripts/check-planes on fake `cargo metadata` output (no cargo needed).

Run: python3 -m unittest discover -s scripts/tests   (or python3 -m pytest scripts/tests)
"""

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "check-planes")


def load_script():
    loader = importlib.machinery.SourceFileLoader("check_planes", SCRIPT)
    spec = importlib.util.spec_from_loader("check_planes", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


cp = load_script()
ROOT = "/ws"
REGISTRY = "registry+https://github.com/rust-lang/crates.io-index"


def dep(name, kind=None, optional=False, default=True, features=(), target=None, workspace=True):
    return {
        "name": name, "source": None if workspace else REGISTRY, "req": "*", "kind": kind,
        "rename": None, "optional": optional, "uses_default_features": default,
        "features": list(features), "target": target, "registry": None,
    }


def fake_metadata(members, external=None):
    """cargo metadata output for a workspace: members = {name: (folder, [dep], features)},
    external = {name: ([dep], features)} for crates.io packages. The resolve graph lists every
    declared dependency, with the features of every package on: as unified as cargo's own."""
    external = external or {}
    ids = {}
    packages = []
    for name, (folder, deps, feats) in members.items():
        ids[name] = f"path+file://{ROOT}/{folder}#{name}@0.1.0"
    for name in external:
        ids[name] = f"{REGISTRY}#{name}@1.0.0"
    for name, (folder, deps, feats) in members.items():
        packages.append({"name": name, "version": "0.1.0", "id": ids[name], "source": None,
                         "dependencies": deps, "features": feats,
                         "manifest_path": f"{ROOT}/{folder}/Cargo.toml"})
    for name, (deps, feats) in external.items():
        for d in deps:
            d["source"] = REGISTRY
        packages.append({"name": name, "version": "1.0.0", "id": ids[name], "source": REGISTRY,
                         "dependencies": deps, "features": feats,
                         "manifest_path": f"/registry/{name}-1.0.0/Cargo.toml"})
    nodes = []
    for p in packages:
        node_deps = {}
        for d in p["dependencies"]:
            entry = node_deps.setdefault(d["name"], {"name": d["name"].replace("-", "_"),
                                                     "pkg": ids[d["name"]], "dep_kinds": []})
            entry["dep_kinds"].append({"kind": d["kind"], "target": d["target"]})
        nodes.append({"id": p["id"], "dependencies": sorted(ids[n] for n in node_deps),
                      "deps": list(node_deps.values()), "features": sorted(p["features"])})
    return {"packages": packages, "workspace_members": [ids[n] for n in members],
            "workspace_root": ROOT, "resolve": {"nodes": nodes, "root": None}, "version": 1}


# crates.io: tonic brings in http, hyper (through its `transport` feature); prost is harmless.
EXTERNAL = {
    "prost": ([], {}),
    "http": ([], {}),
    "hyper": ([dep("http", workspace=False)], {}),
    "tonic": ([dep("http", workspace=False), dep("hyper", optional=True, workspace=False)],
              {"default": ["transport"], "transport": ["dep:hyper"]}),
}
# modelshare-proto as issue 26 wants it: messages with prost alone, tonic stubs behind features.
PROTO = ("proto", [dep("prost", workspace=False), dep("tonic", optional=True, workspace=False)],
         {"default": [], "client": ["dep:tonic"], "server": ["dep:tonic", "tonic/transport"]})


def planes_after_split():
    """The workspace of issue 26, every arrow as allowed; the server turns on proto's tonic."""
    return {
        "modelshare-proto": PROTO,
        "modelshare-device": ("device", [], {}),
        "modelshare-core": ("core", [dep("modelshare-device"), dep("modelshare-proto", default=False)], {}),
        "modelshare-serving": ("serving", [dep("modelshare-core"), dep("modelshare-proto", default=False)], {}),
        "modelshare-server": ("server", [dep("modelshare-serving"), dep("modelshare-core"),
                                         dep("modelshare-proto", features=["server"]),
                                         dep("tonic", workspace=False)], {}),
        "modelshare-cli": ("cli", [dep("modelshare-server"), dep("modelshare-worker"),
                                   dep("modelshare-proto", features=["client"])], {}),
        "modelshare-worker": ("worker-sdk", [dep("modelshare-device"),
                                             dep("modelshare-proto", features=["client"]),
                                             dep("modelshare-server", kind="dev")], {}),
        "modelshare-kernels": ("kernels", [dep("modelshare-device"), dep("modelshare-worker", kind="dev")], {}),
        "modelshare-embed": ("workers/embed", [dep("modelshare-worker"), dep("modelshare-kernels"),
                                               dep("modelshare-proto")], {}),
        "modelshare-echo-worker": ("workers/echo", [dep("modelshare-worker"), dep("modelshare-proto")], {}),
        "modelshare-py": ("python", [dep("modelshare-worker"), dep("pyo3", workspace=False)], {}),
    }


def with_external(members, extra=()):
    ext = dict(EXTERNAL)
    ext["pyo3"] = ([], {})
    for name in extra:
        ext[name] = ([], {})
    return fake_metadata(members, {k: ([dict(d) for d in v[0]], v[1]) for k, v in ext.items()})


def today():
    """The workspace as it is before the split: the server crate holds core, serving and CLI."""
    return {
        "modelshare-proto": ("proto", [dep("prost", workspace=False), dep("tonic", workspace=False)],
                             {"default": ["client", "server"], "client": [], "server": []}),
        "modelshare-device": ("device", [], {}),
        "modelshare-server": ("server", [dep("modelshare-device"), dep("modelshare-proto"),
                                         dep("modelshare-worker")], {}),
        "modelshare-worker": ("worker-sdk", [dep("modelshare-device"), dep("modelshare-proto")], {}),
        "modelshare-kernels": ("kernels", [dep("modelshare-device"), dep("modelshare-proto", kind="dev"),
                                           dep("modelshare-worker", kind="dev")], {}),
        "modelshare-embed": ("workers/embed", [dep("modelshare-worker"), dep("modelshare-kernels"),
                                               dep("modelshare-proto")], {}),
        "modelshare-echo-worker": ("workers/echo", [dep("modelshare-worker"), dep("modelshare-proto")], {}),
    }


class CheckPlanesTest(unittest.TestCase):
    def check(self, members, **kw):
        violations, lines = cp.check(with_external(members), **kw)
        return violations, "\n".join(lines)

    def test_clean_graph_passes(self):
        """The workspace of issue 26 passes, though the server turns on proto's tonic stubs."""
        violations, out = self.check(planes_after_split())
        self.assertEqual(violations, [], out)
        self.assertIn("OK: crate arrows and transport-free crates as the planes say", out)
        self.assertIn("modelshare-core: 4 crates in its normal tree", out)
        self.assertIn("modelshare-py (python binding)", out)

    def test_core_to_tonic_path_is_caught_and_named(self):
        """core taking proto's default features, which pull tonic, fails with the path."""
        members = planes_after_split()
        members["modelshare-proto"] = ("proto", PROTO[1], dict(PROTO[2], default=["server"]))
        members["modelshare-core"] = ("core", [dep("modelshare-device"), dep("modelshare-proto")], {})
        violations, out = self.check(members)
        self.assertIn("modelshare-core has tonic in its normal dependency tree: "
                      "modelshare-core -> modelshare-proto -> tonic", violations)
        self.assertIn("modelshare-proto -> tonic v1.0.0; optional, on by feature server", out)
        self.assertIn("and behind those: http, hyper", out)
        # serving too (proto's default features now pull tonic, by the shortest path)
        self.assertIn("modelshare-serving has tonic in its normal dependency tree: "
                      "modelshare-serving -> modelshare-proto -> tonic", violations)
        self.assertEqual(len(violations), 2, violations)

    def test_direct_transport_dependency_of_serving_is_caught(self):
        """serving naming http itself fails."""
        members = planes_after_split()
        folder, deps, feats = members["modelshare-serving"]
        members["modelshare-serving"] = (folder, deps + [dep("http", workspace=False)], feats)
        violations, _ = self.check(members)
        self.assertEqual(violations, ["modelshare-serving has http in its normal dependency tree: "
                                      "modelshare-serving -> http"])

    def test_weak_feature_does_not_turn_a_dependency_on(self):
        """`tonic?/transport` asks for a feature of tonic only if something else turned tonic on."""
        members = planes_after_split()
        members["modelshare-proto"] = ("proto", PROTO[1], {"default": ["codec"], "codec": ["tonic?/transport"],
                                                           "server": ["dep:tonic"]})
        members["modelshare-core"] = ("core", [dep("modelshare-device"), dep("modelshare-proto")], {})
        violations, out = self.check(members)
        self.assertEqual(violations, [], out)

    def test_dev_and_build_dependencies(self):
        """core's dev-dependency on tonic is fine; its build-dependency on the server is not."""
        members = planes_after_split()
        folder, deps, feats = members["modelshare-core"]
        members["modelshare-core"] = (folder, deps + [dep("tonic", kind="dev", workspace=False),
                                                      dep("modelshare-server", kind="build")], feats)
        violations, _ = self.check(members)
        self.assertEqual(len(violations), 1, violations)
        self.assertIn("modelshare-core depends on modelshare-server ([build-dependencies])", violations[0])

    def test_serving_to_server_edge_is_caught(self):
        """serving depending on server (a layer above it) fails, and so brings in tonic."""
        members = planes_after_split()
        folder, deps, feats = members["modelshare-serving"]
        members["modelshare-serving"] = (folder, deps + [dep("modelshare-server")], feats)
        violations, out = self.check(members)
        self.assertEqual(violations, [
            "modelshare-serving depends on modelshare-server ([dependencies]): modelshare-serving "
            "may depend only on modelshare-core, modelshare-device, modelshare-proto",
            "modelshare-serving has tonic in its normal dependency tree: "
            "modelshare-serving -> modelshare-proto -> tonic",
        ])
        self.assertRegex(out, r"modelshare-serving +serving/ +core, device, proto +core, proto, server!")

    def test_core_on_serving_and_device_on_kernels_are_caught(self):
        """core -> serving and device -> kernels fail, each named."""
        members = planes_after_split()
        folder, deps, feats = members["modelshare-core"]
        members["modelshare-core"] = (folder, deps + [dep("modelshare-serving")], feats)
        members["modelshare-device"] = ("device", [dep("modelshare-kernels", optional=True)], {})
        violations, _ = self.check(members)
        text = "\n".join(violations)
        self.assertIn("modelshare-core depends on modelshare-serving", text)
        self.assertIn("modelshare-device depends on modelshare-kernels ([dependencies (optional)]): "
                      "modelshare-device may depend on no workspace crate", text)
        self.assertEqual(len(violations), 2, text)

    def test_only_cli_workers_and_python_use_the_worker_sdk(self):
        """serving (or kernels) depending on the worker SDK fails with the SDK rule."""
        members = planes_after_split()
        folder, deps, feats = members["modelshare-kernels"]
        members["modelshare-kernels"] = (folder, deps + [dep("modelshare-worker")], feats)
        violations, _ = self.check(members)
        self.assertEqual(violations, ["modelshare-kernels depends on modelshare-worker ([dependencies]): only "
                                      "modelshare-cli, the workers and the Python binding may depend on the "
                                      "worker SDK"])

    def test_server_on_worker_allowed_until_cli_exists(self):
        """Today (no modelshare-cli) server -> worker is a note; with modelshare-cli it fails."""
        violations, out = self.check(today())
        self.assertEqual(violations, [], out)
        self.assertIn("note: modelshare-server -> modelshare-worker ([dependencies]) allowed for now", out)
        self.assertIn("not in the workspace yet, their rules skipped: modelshare-cli, modelshare-serving, "
                      "modelshare-core", out)
        self.assertIn("modelshare-core: not in the workspace yet, skipped", out)
        members = planes_after_split()
        folder, deps, feats = members["modelshare-server"]
        members["modelshare-server"] = (folder, deps + [dep("modelshare-worker")], feats)
        violations, _ = self.check(members)
        self.assertEqual(len(violations), 1, violations)
        self.assertIn("modelshare-server depends on modelshare-worker", violations[0])

    def test_crate_of_no_plane_fails(self):
        """A workspace crate the table does not know fails (its place must be decided)."""
        members = planes_after_split()
        members["modelshare-extra"] = ("extra", [dep("modelshare-core")], {})
        violations, _ = self.check(members)
        self.assertEqual(violations, ["modelshare-extra (extra/) has no place in the planes: add it to "
                                      "ARROWS (or WORKER_CRATES) in scripts/check-planes"])

    def test_new_worker_under_workers_is_a_worker(self):
        """A crate under workers/ gets the workers' arrows without being listed."""
        members = planes_after_split()
        members["modelshare-rerank"] = ("workers/rerank", [dep("modelshare-worker"), dep("modelshare-kernels")], {})
        violations, out = self.check(members)
        self.assertEqual(violations, [], out)

    def test_cargo_tree_cross_check(self):
        """A transport crate that only cargo tree lists fails, with cargo's path."""
        def fake_tree(package, inverted=None):
            if inverted:
                return [f"0{inverted} v1.0.0", "1modelshare-proto v0.1.0 (/ws/proto)",
                        f"2{package} v0.1.0 (/ws/core)"], None
            lines = {"modelshare-core": ["modelshare-core v0.1.0 (/ws/core)", "modelshare-device v0.1.0 (/ws/device)",
                                         "modelshare-proto v0.1.0 (/ws/proto)", "prost v1.0.0", "h2 v1.0.0"],
                     "modelshare-serving": ["modelshare-serving v0.1.0 (/ws/serving)",
                                            "modelshare-core v0.1.0 (/ws/core)", "modelshare-device v0.1.0 (/ws/device)",
                                            "modelshare-proto v0.1.0 (/ws/proto)", "prost v1.0.0 (*)"]}
            return lines[package], None
        violations, out = self.check(planes_after_split(), cargo_tree=fake_tree)
        self.assertEqual(violations, ["modelshare-core has h2 in its normal dependency tree (cargo tree): "
                                      "modelshare-core -> modelshare-proto -> h2"], out)
        self.assertIn("only in the metadata walk: none; only in cargo tree: h2", out)
        self.assertIn("modelshare-serving: 5 crates in its normal tree", out)
        self.assertIn("cross-check with cargo tree: the same 5 crates", out)

    def test_exit_status(self):
        """The script exits 0 on a clean graph, 1 on a violation, 2 on unreadable metadata."""
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "meta.json")
            members = planes_after_split()
            for label, meta, want in (("clean", with_external(members), 0),
                                      ("bad", with_external(today() | {"modelshare-cli": ("cli", [], {})}), 1)):
                with open(path, "w") as fh:
                    json.dump(meta, fh)
                r = subprocess.run([sys.executable, SCRIPT, "--metadata", path], capture_output=True, text=True)
                self.assertEqual(r.returncode, want, label + "\n" + r.stdout + r.stderr)
            r = subprocess.run([sys.executable, SCRIPT, "--metadata", os.path.join(tmp, "none.json")],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 2, r.stdout + r.stderr)


if __name__ == "__main__":
    unittest.main()
