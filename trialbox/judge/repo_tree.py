"""The candidate's file tree for a repository task, made safe to test.

    tree = candidate_tree(task, patch=diff)        # or files={"pkg/mod.py": b"..."}
    tree.files   # what the judge writes under the grading sandbox's repo/ directory
    tree.flags   # what was stripped or overridden, as anti-cheat flags
    tree.changed # candidate-written Python files -> the lines it wrote (for the scan)

The candidate starts from `task.files` plus the visible test files (what its own session
showed it). Its answer is a unified diff against that tree, or an overlay of files
(`None` deletes one). Then, whatever it wrote:

* the trusted test files (visible and hidden) are written from the task's copy;
* test configuration comes from the task only: `conftest.py`, `pytest.ini`,
  `.pytest.ini`, `tox.ini`, `setup.cfg`, `pyproject.toml` are the task's versions (or
  absent) — pytest is also started with our own ini, so these could not configure it
  anyway; stripping them is defence in depth and keeps the flag honest;
* files that run code without being imported by name — `*.pth`, `sitecustomize.py`,
  `usercustomize.py` — and compiled code that the static scan cannot read —
  `__pycache__/`, `*.pyc`/`*.pyo`, extension modules `*.so`/`*.pyd` (an unchecked
  hash-based `.pyc` is loaded without ever looking at its source) — are removed;
* a candidate module that would shadow a standard-library or test-runner module the
  tests may import later (`fractions.py` with an always-equal `Fraction`) is removed.

Each removal of something the candidate added or changed is flagged (see `REPO_FLAGS`):
notable, never a verdict — what was neutralised cannot reach the evidence, so an
answer that adds a conftest.py with fixtures, a pytest section in pyproject.toml or a
regression test to a visible test file is graded by the trusted tests like any other.
Paths must be relative and stay inside the tree; a patch that does not apply is the
candidate's failure (`TreeError`), never the judge's.
"""

from __future__ import annotations

import ast
import difflib
import posixpath
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from trialbox.errors import UsageError
from trialbox.judge.anticheat import Flag
from trialbox.store.patches import TreeError, apply_patch, clean_path, diff_lines
from trialbox.types import Task

REPO_FLAGS: dict[str, str] = {
    "conftest-injection": "added or changed a conftest.py (test configuration is the task's)",
    "test-config": "added or changed pytest configuration (pytest.ini, tox.ini, setup.cfg "
                   "[tool:pytest], pyproject [tool.pytest.ini_options])",
    "pth-file": "added a .pth file (code run at interpreter start)",
    "sitecustomize": "added sitecustomize.py / usercustomize.py (code run at start)",
    "test-file-edit": "changed or deleted a trusted test file",
    "module-shadow": "a module named like a standard-library or test-runner module",
    "pytest-internals": "the candidate's code names the test runner's internals (_pytest, "
                        "pluggy) or defines pytest_* hook functions (repo.scan_tree)",
    "bytecode": "shipped compiled bytecode (__pycache__, .pyc)",
    "binary-module": "shipped a compiled extension module (.so, .pyd)",
    "pytest-tamper": "evidence, CHEAT: the runner saw its report, hooks, plugins, import "
                     "finder or channel changed at run time, or an untrusted conftest.py "
                     "imported (repo_plugin.py)",
    "verdict-differs": "evidence, CHEAT (in-process tier): a flagged attempt passed "
                       "in-process but not on the trusted tier, where its code cannot "
                       "reach the report (repo.py)",
}
"""Repository-specific flags and what each means. Every flag is notable (reported, the
row audited) and changes nothing by itself: what the tree flags is neutralised before
any run (the task's copy or configuration used, the file removed), so it cannot reach
the evidence, and the trusted tests decide the verdict of the tree that is run. Only
the two marked *evidence* make an attempt CHEAT: an act seen reaching the report."""

CONFIG_FILES = frozenset({"conftest.py", "pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg",
                          "pyproject.toml"})
_STARTUP_FILES = frozenset({"sitecustomize.py", "usercustomize.py"})
_PYTEST_SECTION = re.compile(rb"^\s*\[(pytest|tool:pytest|tool\.pytest\.ini_options)\]",
                             re.M)
RUNNER_MODULES = frozenset({"pytest", "_pytest", "pluggy", "py", "iniconfig", "packaging",
                            "attr", "attrs", "exceptiongroup", "tomli", "_trialbox_pytest",
                            "_trialbox_repo_proxy", "_trialbox_repo_stub", "_trialbox_codec"})
"""Top-level modules the test runner is made of (Debian's python3-pytest and its
dependencies) or the judge's own: a candidate module of the same name is shadowing."""
SHADOWED = frozenset(sys.stdlib_module_names) | RUNNER_MODULES


@dataclass(frozen=True)
class CandidateTree:
    """A sanitised tree and what was done to it."""

    files: dict[str, bytes]
    """Path (relative to the repository root) -> content, trusted files included."""
    flags: tuple[Flag, ...] = ()
    changed: dict[str, frozenset[int]] = field(default_factory=dict)
    """Candidate-written Python files that are kept -> the lines it wrote or changed."""


def starting_files(task: Task) -> dict[str, bytes]:
    """What the candidate's own session starts with: the task's tree and the visible test
    files. Hidden test files are never part of it."""
    return {**dict(task.files), **dict(task.test_files)}


def candidate_tree(task: Task, *, patch: str | None = None,
                   files: Mapping[str, bytes | str | None] | None = None) -> CandidateTree:
    """The tree to test: the candidate's answer (a unified diff, or an overlay of files;
    exactly one) applied to `starting_files(task)`, then sanitised. Raises `TreeError`
    when the answer cannot be applied, `UsageError` when neither or both are given."""
    if (patch is None) == (files is None):
        raise UsageError(f"{task.task_id}: give the candidate's answer as exactly one of "
                         "patch= (a unified diff) or files= (path -> content)")
    base = starting_files(task)
    if patch is not None:
        if not isinstance(patch, str):
            raise UsageError(f"{task.task_id}: the patch must be a str, got "
                             f"{type(patch).__name__}")
        cand = apply_patch(base, patch)
    else:
        assert files is not None
        cand = dict(base)
        for raw, content in files.items():
            path = clean_path(raw)
            if content is None:
                cand.pop(path, None)
            elif isinstance(content, (bytes, str)):
                cand[path] = content.encode("utf-8", "surrogateescape") \
                    if isinstance(content, str) else content
            else:
                raise TreeError(f"{path}: content must be text, bytes or null (delete), got "
                                f"{type(content).__name__}")
    return _sanitise(task, base, cand)


def _sanitise(task: Task, base: dict[str, bytes], cand: dict[str, bytes]) -> CandidateTree:
    original = dict(task.files)
    trusted_tests = {**dict(task.test_files), **dict(task.hidden_test_files)}
    flags: list[Flag] = []

    def flag(detector: str, path: str, what: str) -> None:
        flags.append(Flag(detector, f"{path}: {what}"))

    out: dict[str, bytes] = {}
    for path, data in sorted(cand.items()):
        name = posixpath.basename(path)
        parts = path.split("/")
        touched = base.get(path) != data  # the candidate added or changed it
        if path in trusted_tests:
            if touched and path in dict(task.test_files):
                flag("test-file-edit", path, "changed a trusted test file; the task's "
                     "copy is used")
            continue  # written from the trusted copy below
        if name in CONFIG_FILES:
            if touched:
                if name == "conftest.py":
                    flag("conftest-injection", path, "ignored; the task's test "
                         "configuration is used")
                elif name in ("setup.cfg", "pyproject.toml") and not _PYTEST_SECTION.search(
                        data):
                    pass  # not test configuration (still the task's version below)
                else:
                    flag("test-config", path, "ignored; the judge's own pytest "
                         "configuration is used")
            continue  # the task's version (if any) is restored below
        if "__pycache__" in parts or name.endswith((".pyc", ".pyo")):
            if touched:
                flag("bytecode", path, "removed (only sources are run)")
            continue
        if name.endswith((".so", ".pyd")) and path not in original:
            flag("binary-module", path, "removed (only sources are run)")
            continue
        if name.endswith(".pth"):
            if touched:
                flag("pth-file", path, "removed")
            continue
        if name in _STARTUP_FILES:
            if touched:
                flag("sitecustomize", path, "removed")
            continue
        out[path] = data
    for path in sorted(out):
        if path not in original and _shadows(path, out):
            flag("module-shadow", path, f"removed: shadows the module "
                 f"{_top_module(path)!r} the tests may import")
            del out[path]
    for path, _ in task.test_files:
        if path not in cand:
            flag("test-file-edit", path, "deleted a trusted test file; the task's copy "
                 "is used")
    for path, data in original.items():
        if posixpath.basename(path) in CONFIG_FILES or path.endswith((".so", ".pyd")):
            out[path] = data
    out.update(trusted_tests)
    changed = {p: _changed_lines(base.get(p, b""), d) for p, d in out.items()
               if p.endswith(".py") and p not in trusted_tests and base.get(p) != d}
    return CandidateTree(out, tuple(flags), changed)


def _top_module(path: str) -> str:
    parts = path.split("/")
    name = parts[-1]
    if name == "__init__.py" and len(parts) > 1:
        return parts[-2]
    return name[:-3] if name.endswith(".py") else name.split(".")[0]


def _shadows(path: str, tree: dict[str, bytes]) -> bool:
    """Whether `path` is a top-level module or package (its directory is not itself a
    package) named like a standard-library or runner module."""
    parts = path.split("/")
    name = parts[-1]
    if name == "__init__.py":
        if len(parts) < 2:
            return False
        parent = parts[:-2]
    elif name.endswith(".py"):
        parent = parts[:-1]
    else:
        return False
    in_package = bool(parent) and "/".join(parent + ["__init__.py"]) in tree
    return not in_package and _top_module(path) in SHADOWED


def _changed_lines(old: bytes, new: bytes) -> frozenset[int]:
    """1-based line numbers of `new` that are not in `old` (inserted or replaced)."""
    a = [line.rstrip("\r\n") for line in diff_lines(old.decode("utf-8", "replace"))]
    b = [line.rstrip("\r\n") for line in diff_lines(new.decode("utf-8", "replace"))]
    lines: set[int] = set()
    for op, _i1, _i2, j1, j2 in difflib.SequenceMatcher(None, a, b,
                                                        autojunk=False).get_opcodes():
        if op in ("replace", "insert"):
            lines.update(range(j1 + 1, j2 + 1))
    return frozenset(lines)


# --------------------------------------------------------------------------- tests

def expected_tests(path: str, source: bytes) -> list[str]:
    """The test names a trusted test file defines statically — `path::test_x`,
    `path::TestC::test_y` — so a test that never reports (its module was skipped, its
    items deselected) fails instead of vanishing. A lower bound: generated tests add to
    it, parametrised ones report as `name[...]`."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                node.name.startswith("test"):
            names.append(f"{path}::{node.name}")
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test") and not any(
                isinstance(s, ast.FunctionDef) and s.name == "__init__" for s in node.body):
            names += [f"{path}::{node.name}::{s.name}" for s in node.body
                      if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
                      and s.name.startswith("test")]
    return names
