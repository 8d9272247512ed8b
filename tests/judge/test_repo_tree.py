"""The candidate's tree for repository tasks, without a sandbox: patches apply strictly,
paths stay inside the tree, and what could configure or pre-empt the test run is stripped
and flagged."""

from __future__ import annotations

import pytest

from trialbox.errors import UsageError
from trialbox.judge.repo_tree import candidate_tree, expected_tests
from trialbox.store.patches import TreeError, apply_patch, clean_path
from trialbox.types import Task, TaskKind

BASE = {"a.py": b"one\ntwo\nthree\n"}
TASK = Task("t", TaskKind.REPO, prompt="p",
            files=(("pkg/__init__.py", b""), ("pkg/m.py", b"x = 1\n"),
                   ("conftest.py", b"# trusted\n"), ("setup.cfg", b"[metadata]\n")),
            test_files=(("tests/test_m.py", b"def test_x():\n    pass\n"),),
            hidden_test_files=(("tests/test_h.py", b"def test_h():\n    pass\n"),))


def test_modify_create_delete():
    diff = ("--- a/a.py\n+++ b/a.py\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n"
            "--- /dev/null\n+++ b/new.py\n@@ -0,0 +1,2 @@\n+n1\n+n2\n")
    out = apply_patch(BASE, diff)
    assert out == {"a.py": b"one\nTWO\nthree\n", "new.py": b"n1\nn2\n"}
    gone = apply_patch(out, "--- a/new.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-n1\n-n2\n")
    assert "new.py" not in gone


def test_moved_hunk_and_no_newline_at_end():
    moved = {"a.py": b"zero\none\ntwo\nthree"}
    diff = ("--- a/a.py\n+++ b/a.py\n@@ -2,2 +2,2 @@\n two\n-three\n"
            "\\ No newline at end of file\n+3\n")
    assert apply_patch(moved, diff) == {"a.py": b"zero\none\ntwo\n3\n"}


@pytest.mark.parametrize("diff,why", [
    ("--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-nope\n+x\n", "does not apply"),
    ("--- a/missing.py\n+++ b/missing.py\n@@ -1 +1 @@\n-x\n+y\n", "does not exist"),
    ("--- a/../etc/passwd\n+++ b/../etc/passwd\n@@ -1 +1 @@\n-x\n+y\n", "inside"),
    ("--- /dev/null\n+++ b//abs.py\n@@ -0,0 +1 @@\n+x\n", "bad path"),
    ("hello\n", "changes no file"),
    ("--- a/a.py\n+++ b/a.py\n@@ -1,3 +1,3 @@\n one\n", "ends early"),
    ("diff --git a/a.py b/b.py\nrename from a.py\nrename to b.py\n", "not supported"),
])
def test_bad_patches_say_why(diff, why):
    with pytest.raises(TreeError, match=why):
        apply_patch(BASE, diff)


@pytest.mark.parametrize("path", ["", "/x", "a/../../x", "..", "a\\b", "a\x00b"])
def test_paths_must_stay_inside(path):
    with pytest.raises(TreeError):
        clean_path(path)


def test_sanitise_restores_trusted_files_and_flags_what_it_strips():
    tree = candidate_tree(TASK, files={
        "conftest.py": "evil", "setup.cfg": "[tool:pytest]\naddopts=-x\n",
        "tests/test_m.py": "def test_x():\n    assert True\n",
        "tests/test_h.py": "mine", "x.pth": "import os", "pkg/__pycache__/m.cpython-311.pyc":
        "\x00", "sitecustomize.py": "", "json.py": "", "pkg/json.py": "ok = 1\n",
        "pkg/m.py": "x = 1\nimport sys\nsys._getframe(1)\n"})
    files = tree.files
    assert files["conftest.py"] == b"# trusted\n" and files["setup.cfg"] == b"[metadata]\n"
    assert files["tests/test_m.py"] == dict(TASK.test_files)["tests/test_m.py"]
    assert files["tests/test_h.py"] == dict(TASK.hidden_test_files)["tests/test_h.py"]
    for gone in ("x.pth", "pkg/__pycache__/m.cpython-311.pyc", "sitecustomize.py", "json.py"):
        assert gone not in files
    assert files["pkg/json.py"] == b"ok = 1\n"  # inside a package: shadows nothing
    assert {f.detector for f in tree.flags} == {
        "conftest-injection", "test-config", "test-file-edit", "pth-file", "bytecode",
        "sitecustomize", "module-shadow"}
    assert tree.changed == {"pkg/m.py": frozenset({2, 3}), "pkg/json.py": frozenset({1})}


def test_unchanged_tree_has_no_flags_and_no_hidden_tests_in_the_start():
    tree = candidate_tree(TASK, files={})
    assert tree.flags == () and tree.changed == {}
    with pytest.raises(UsageError, match="exactly one"):
        candidate_tree(TASK)


def test_expected_tests_are_read_statically():
    src = (b"def test_a(): pass\nasync def test_b(): pass\ndef helper(): pass\n"
           b"class TestC:\n    def test_d(self): pass\n    def other(self): pass\n"
           b"class TestInit:\n    def __init__(self): pass\n    def test_e(self): pass\n")
    assert expected_tests("t.py", src) == ["t.py::test_a", "t.py::test_b",
                                           "t.py::TestC::test_d"]
    assert expected_tests("t.py", b"def (") == []


def test_plain_diff_names_and_odd_line_separators():
    files = {"a.py": b"x = 1\n\x0cy = 2\r\nz = 3\n"}
    diff = ("--- a.py.orig\t2024-01-01\n+++ a.py\t2024-01-02\n@@ -2,2 +2,2 @@\n"
            " \x0cy = 2\r\n-z = 3\n+z = 4\n")
    assert apply_patch(files, diff) == {"a.py": b"x = 1\n\x0cy = 2\r\nz = 4\n"}
