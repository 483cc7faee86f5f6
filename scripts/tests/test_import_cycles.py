"""Tests of scripts/import-cycles on small fake crates written to a temporary directory.

Run: python3 -m unittest discover -s scripts/tests   (or python3 -m pytest scripts/tests)
"""

import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "import-cycles")


def write_crate(root, files, name="demo"):
    """A workspace at root with one crate, modelshare-<name>, in <name>/; files: {path under
    src/: Rust source}."""
    with open(os.path.join(root, "Cargo.toml"), "w") as fh:
        fh.write(f'[workspace]\nresolver = "3"\nmembers = ["{name}"]\n')
    os.makedirs(os.path.join(root, name, "src"), exist_ok=True)
    with open(os.path.join(root, name, "Cargo.toml"), "w") as fh:
        fh.write(f'[package]\nname = "modelshare-{name}"\nversion = "0.1.0"\nedition = "2024"\n')
    for rel, text in files.items():
        path = os.path.join(root, name, "src", rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            fh.write(textwrap.dedent(text).lstrip("\n"))


def run(root, *args):
    r = subprocess.run([sys.executable, SCRIPT, "--root", root, *args], capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


# a/x.rs uses b/y.rs and b/z.rs uses a/w.rs: no file uses a file that uses it back, but the
# folders a and b use each other.
FOLDER_CYCLE = {
    "lib.rs": "mod a;\nmod b;\n",
    "a/mod.rs": "pub mod w;\nmod x;\n",
    "a/w.rs": "pub struct W;\n",
    "a/x.rs": "use crate::b::y::Y;\npub fn x() -> Y { Y }\n",
    "b/mod.rs": "pub mod y;\nmod z;\n",
    "b/y.rs": "pub struct Y;\n",
    "b/z.rs": "pub fn z() -> crate::a::w::W { crate::a::w::W }\n",
}


class ImportCyclesTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.root = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def test_folder_cycle_without_file_cycle_is_found(self):
        """A cycle between two folders whose files form no cycle fails, naming both edges."""
        write_crate(self.root, FOLDER_CYCLE)
        rc, out = run(self.root)
        self.assertEqual(rc, 1, out)
        self.assertIn("no import cycles", out)
        self.assertIn("folder cycle 1 in demo/src/ (2 modules", out)
        self.assertIn("a -> b -> a", out)
        self.assertIn("demo/src/a/x.rs:1: use crate::b::y::Y;", out)
        self.assertIn("demo/src/b/z.rs:1: pub fn z() -> crate::a::w::W { crate::a::w::W }  (+1 more)", out)
        self.assertIn("FAIL: 1 folder cycle (modelshare-demo)", out)

    def test_clean_tree_passes(self):
        """Folders that use each other one way only pass."""
        files = dict(FOLDER_CYCLE)
        files["b/z.rs"] = "pub fn z() {}\n"
        write_crate(self.root, files)
        rc, out = run(self.root)
        self.assertEqual(rc, 0, out)
        self.assertIn("no folder cycles", out)
        self.assertIn("OK: no import cycles, no folder cycles, crate rules respected", out)

    def test_file_cycle_is_found_and_not_repeated_as_a_folder_cycle(self):
        """Two top-level files that use each other are a file cycle (reported once, as such)."""
        write_crate(self.root, {
            "lib.rs": "mod p;\nmod q;\n",
            "p.rs": "pub struct P;\npub fn p() -> crate::q::Q { crate::q::Q }\n",
            "q.rs": "use crate::p::P;\npub struct Q;\npub fn q() -> P { P }\n",
        })
        rc, out = run(self.root)
        self.assertEqual(rc, 1, out)
        self.assertIn("cycle 1 (2 files: demo/src/p.rs, demo/src/q.rs)", out)
        self.assertIn("no folder cycles", out)
        self.assertIn("FAIL: 1 import cycle (modelshare-demo)", out)

    def test_test_only_edges_do_not_count(self):
        """A folder cycle closed only by cfg(test) code passes; --include-tests shows it apart."""
        files = dict(FOLDER_CYCLE)
        files["b/z.rs"] = """
            pub fn z() {}

            #[cfg(test)]
            mod tests {
                use crate::a::w::W;

                #[test]
                fn z_and_w() {
                    let _ = W;
                }
            }
        """
        write_crate(self.root, files)
        rc, out = run(self.root)
        self.assertEqual(rc, 0, out)
        self.assertIn("no folder cycles", out)
        rc, out = run(self.root, "--include-tests")
        self.assertEqual(rc, 0, out)
        self.assertIn("folder cycle with test code 1 in demo/src/", out)
        self.assertIn("demo/src/b/z.rs:5: use crate::a::w::W; [test]", out)

    def test_test_only_file_does_not_count(self):
        """A `#[cfg(test)] mod tests;` file that closes a folder cycle is left out."""
        files = dict(FOLDER_CYCLE)
        files["b/z.rs"] = "pub fn z() {}\n\n#[cfg(test)]\nmod tests;\n"
        files["b/z/tests.rs"] = "use crate::a::w::W;\n\n#[test]\nfn w() {\n    let _ = W;\n}\n"
        write_crate(self.root, files)
        rc, out = run(self.root)
        self.assertEqual(rc, 0, out)

    def test_top_level_file_and_folder(self):
        """A top-level file is its own node: app.rs <-> the folder s/ is a folder cycle."""
        write_crate(self.root, {
            "lib.rs": "mod app;\nmod s;\n",
            "app.rs": "pub struct App;\npub fn run() { crate::s::x::go(); }\n",
            "s/mod.rs": "pub mod x;\nmod y;\n",
            "s/x.rs": "pub fn go() {}\n",
            "s/y.rs": "use crate::app::App;\nfn f(_: App) {}\n",
        })
        rc, out = run(self.root)
        self.assertEqual(rc, 1, out)
        self.assertIn("folder cycle 1 in demo/src/ (2 modules, each with what is under it: app, s)", out)

    def test_module_file_beside_its_folder_is_one_node(self):
        """c.rs and c/inner.rs are the one node `c` (as c/mod.rs would be)."""
        write_crate(self.root, {
            "lib.rs": "mod c;\nmod d;\n",
            "c.rs": "pub mod inner;\npub fn c() -> crate::d::D { crate::d::D }\n",
            "c/inner.rs": "pub struct I;\n",
            "d.rs": "pub struct D;\npub fn d() -> crate::c::inner::I { crate::c::inner::I }\n",
        })
        rc, out = run(self.root)
        self.assertEqual(rc, 1, out)
        self.assertIn("no import cycles", out)
        self.assertIn("(2 modules, each with what is under it: c, d)", out)

    def test_nested_folder_level(self):
        """Inside reg/, the subfolders p/ and q/ that use each other are a cycle at that level."""
        write_crate(self.root, {
            "lib.rs": "mod reg;\n",
            "reg/mod.rs": "mod p;\nmod q;\n",
            "reg/p/mod.rs": "pub mod p1;\nmod p2;\n",
            "reg/p/p1.rs": "pub struct P1;\n",
            "reg/p/p2.rs": "use super::super::q::q1::Q1;\nfn f(_: Q1) {}\n",
            "reg/q/mod.rs": "pub mod q1;\nmod q2;\n",
            "reg/q/q1.rs": "pub struct Q1;\n",
            "reg/q/q2.rs": "use crate::reg::p::p1::P1;\nfn f(_: P1) {}\n",
        })
        rc, out = run(self.root)
        self.assertEqual(rc, 1, out)
        self.assertIn("folder cycle 1 in demo/src/reg/ (2 modules, each with what is under it: reg/p, reg/q)", out)
        self.assertIn("demo/src/reg/p/p2.rs:1: use super::super::q::q1::Q1;", out)

    def test_module_file_of_a_folder_is_a_node_at_its_level(self):
        """reg/mod.rs and reg/p/ using each other is a folder cycle inside reg/."""
        write_crate(self.root, {
            "lib.rs": "mod reg;\n",
            "reg/mod.rs": "mod p;\npub struct R;\nfn f() { p::p1::go(); }\n",
            "reg/p/mod.rs": "pub mod p1;\nmod p2;\n",
            "reg/p/p1.rs": "pub fn go() {}\n",
            "reg/p/p2.rs": "use crate::reg::R;\nfn f(_: R) {}\n",
        })
        rc, out = run(self.root)
        self.assertEqual(rc, 1, out)
        self.assertIn("in demo/src/reg/ (2 modules, each with what is under it: reg/mod.rs, reg/p)", out)

    def test_verbose_lists_every_file_edge_of_a_folder_edge(self):
        """--verbose names each file edge behind a folder edge."""
        files = dict(FOLDER_CYCLE)
        files["a/mod.rs"] = "pub mod w;\nmod x;\nmod x2;\n"
        files["a/x2.rs"] = "use crate::b::y::Y;\nfn f(_: Y) {}\n"
        write_crate(self.root, files)
        rc, out = run(self.root, "--verbose")
        self.assertEqual(rc, 1, out)
        self.assertIn("demo/src/a/x.rs:1: use crate::b::y::Y;  (+1 more, 2 file edges)", out)
        self.assertIn("demo/src/a/x2.rs:1 -> demo/src/b/y.rs", out)


if __name__ == "__main__":
    unittest.main()
