"""A project's source distribution, read into the trees a repository task is made of:
the package's own sources and the project's own tests (issue 29, the task factory in
`trialbox/judge/factory.py`).

    sd = read_sdist("toolz-1.0.0.tar.gz")  # as `pip download --no-binary :all: --no-deps`
    sd.project, sd.version                 # ('toolz', '1.0.0'), from PKG-INFO
    dict(sd.files)["toolz/itertoolz.py"]   # the package's sources (bytes)
    dict(sd.tests)["toolz/tests/test_itertoolz.py"]  # its test modules and their helpers

What is taken from the archive (one top directory, `NAME-VERSION/`, as sdists are):

* **packages**: each top-level directory (or one under `src/`, moved to the top so the
  judge's `pythonpath` — the tree's root — imports it) holding an `__init__.py`, other
  than test, doc and example directories and `*.egg-info`; or a single top-level module
  named like the project (`six.py`). Their files go to `files`, except tests.
* **tests**: every file under a directory named `tests`/`test`/`testing` (at the top or
  inside a package), every `test_*.py` / `*_test.py` inside a package, and a top-level
  `conftest.py`. At least one test module is needed.
* never: bytecode and extension modules (`__pycache__`, `*.pyc`, `*.so`), the build
  files (`setup.py`, `pyproject.toml`, `setup.cfg`, `PKG-INFO`, `*.egg-info`), docs.

The archive is read member by member, never extracted: only regular files, each path
cleaned (`patches.clean_path`: no absolute paths, no `..`), at most `MAX_BYTES` in all.
Every problem is a `UsageError` that names the file and what to change.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path

from trialbox.errors import UsageError
from trialbox.store.patches import TreeError, clean_path

MAX_BYTES = 64 << 20
"""Uncompressed bytes read from one archive (a task row's tree is capped at this too)."""
TEST_DIRS = frozenset({"tests", "test", "testing"})
_NOT_PACKAGES = TEST_DIRS | {"docs", "doc", "examples", "example", "benchmarks", "bench",
                             "scripts", "tools", "build", "dist"}
_SKIP_SUFFIXES = (".pyc", ".pyo", ".so", ".pyd", ".dll", ".dylib")
GET_ONE = ("`pip download --no-binary :all: --no-deps NAME==VERSION -d DIR` writes (for "
           "a project that publishes its sources)")
"""Ends every message that asks for another archive: "give the .tar.gz that …"."""


@dataclass(frozen=True)
class Sdist:
    """What a repository task is built from: one project's sources and tests."""

    project: str
    """The distribution's name, as PKG-INFO spells it (else from the top directory)."""
    version: str
    files: tuple[tuple[str, bytes], ...]
    """The packages' files (no tests), sorted by path: the starting tree."""
    tests: tuple[tuple[str, bytes], ...]
    """Test modules, their helpers, conftest.py and data files, sorted by path."""
    archive: str
    """The archive's file name."""
    sha256: str
    """Of the archive's bytes: the same hash, the same sources."""

    @property
    def test_modules(self) -> list[str]:
        """The files pytest is given (`test_*.py`, `*_test.py`)."""
        return [p for p, _ in self.tests if is_test_module(p)]


def is_test_module(path: str) -> bool:
    name = posixpath.basename(path)
    return name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))


def read_sdist(path: str | Path) -> Sdist:
    """The project in the source distribution at `path` (a `.tar.gz`)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read the source distribution {str(path)!r}: "
                         f"{e.strerror}; give the path of the .tar.gz that {GET_ONE}"
                         ) from None
    members = _members(path, raw)
    tops = {p.split("/", 1)[0] for p in members}
    if len(tops) != 1 or not any("/" in p for p in members):
        raise UsageError(f"{path.name}: a source distribution holds one top directory "
                         f"(NAME-VERSION/), this one holds {len(tops)} top entries; "
                         f"give the .tar.gz that {GET_ONE}")
    top = tops.pop()
    tree = {p[len(top) + 1:]: d for p, d in members.items() if p.startswith(top + "/")}
    project, version = _name_version(tree.get("PKG-INFO"), top, path.name)
    files, tests = _split(tree, project, path.name)
    return Sdist(project=project, version=version, files=files, tests=tests,
                 archive=path.name, sha256=hashlib.sha256(raw).hexdigest())


def _members(path: Path, raw: bytes) -> dict[str, bytes]:
    import io
    if not path.name.endswith((".tar.gz", ".tgz")):
        raise UsageError(f"{path.name}: not a .tar.gz source distribution (zip sdists and "
                         f"wheels are not read); give the .tar.gz that {GET_ONE}")
    out: dict[str, bytes] = {}
    total = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:gz") as tar:
            for m in tar:
                if not m.isfile():
                    continue  # directories are implied; links and devices are refused
                try:
                    name = clean_path(m.name)
                except TreeError as e:
                    raise UsageError(f"{path.name}: member {m.name!r} refused: {e}; give "
                                     f"the .tar.gz that {GET_ONE}") from None
                total += m.size
                if total > MAX_BYTES:
                    raise UsageError(f"{path.name}: more than {MAX_BYTES >> 20} MiB "
                                     "uncompressed; the factory takes small projects")
                f = tar.extractfile(m)
                if f is not None:
                    out[name] = f.read()
    except (tarfile.TarError, EOFError, OSError) as e:
        raise UsageError(f"{path.name}: not a readable .tar.gz archive ({e}); give the "
                         f".tar.gz that {GET_ONE}") from None
    if not out:
        raise UsageError(f"{path.name}: the archive holds no files; give the .tar.gz "
                         f"that {GET_ONE}")
    return out


def _name_version(pkg_info: bytes | None, top: str, archive: str) -> tuple[str, str]:
    fields: dict[str, str] = {}
    for line in (pkg_info or b"").decode("utf-8", "replace").splitlines():
        if not line.strip():
            break  # the headers end at the first blank line
        key, sep, value = line.partition(":")
        if sep and key in ("Name", "Version"):
            fields.setdefault(key, value.strip())
    name, _, version = top.rpartition("-")
    project = fields.get("Name") or name
    version = fields.get("Version") or version
    if not project or not version:
        raise UsageError(f"{archive}: cannot tell the project's name and version (no "
                         f"PKG-INFO and top directory {top!r} is not NAME-VERSION)")
    return project, version


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _split(tree: dict[str, bytes], project: str, archive: str
           ) -> tuple[tuple[tuple[str, bytes], ...], tuple[tuple[str, bytes], ...]]:
    src = "src/" if any(p.startswith("src/") and p.count("/") >= 2 and
                        p.endswith("/__init__.py") for p in tree) else ""
    packages = sorted({p[len(src):].split("/", 1)[0] for p in tree
                       if p.startswith(src) and p[len(src):].count("/") == 1
                       and p.endswith("/__init__.py")}
                      - _NOT_PACKAGES)
    packages = [p for p in packages if not p.endswith(".egg-info")]
    single = f"{_normal(project)}.py"
    modules = [single] if not packages and single in tree else []
    if not packages and not modules:
        raise UsageError(f"{archive}: no package found (a top-level or src/ directory "
                         f"with an __init__.py, or a module {single}); the factory builds "
                         "tasks from pure-Python packages")
    files: dict[str, bytes] = {}
    tests: dict[str, bytes] = {}
    for p, d in sorted(tree.items()):
        if p.endswith(_SKIP_SUFFIXES) or "__pycache__" in p.split("/"):
            continue
        parts = p.split("/")
        if parts[0] in TEST_DIRS or p == "conftest.py":
            tests[p] = d
            continue
        rel = p[len(src):] if src and p.startswith(src) else p
        if rel.split("/", 1)[0] not in packages and rel not in modules:
            continue
        in_tests = any(part in TEST_DIRS for part in rel.split("/")[1:-1])
        if in_tests or is_test_module(rel):
            tests[rel] = d
        else:
            files[rel] = d
    if not any(is_test_module(p) for p in tests):
        raise UsageError(f"{archive}: no test modules (test_*.py or *_test.py under "
                         "tests/, test/ or inside the package): the factory needs the "
                         "project's own tests in its source distribution; pick a project "
                         "that ships them")
    clash = sorted(set(files) & set(tests))
    if clash:  # a src/ package and a top-level file of the same path
        raise UsageError(f"{archive}: {clash[0]!r} is both a package file and a test file")
    return tuple(sorted(files.items())), tuple(sorted(tests.items()))
