"""Reading a source distribution into a package tree and its tests (store/sdist.py):
where packages and tests are found, and every unusable archive a UsageError that says
what to give instead."""

from __future__ import annotations

import io
import tarfile

import pytest

from tests.store.sdist_maker import make_sdist
from trialbox.errors import UsageError
from trialbox.store.sdist import read_sdist

PKG = {"calc/__init__.py": "", "calc/ops.py": "def add(a, b):\n    return a + b\n"}
TEST = {"tests/test_ops.py": "from calc.ops import add\n\n\ndef test_add():\n"
                             "    assert add(1, 2) == 3\n"}


@pytest.mark.parametrize("files, sources, tests", [
    ({**PKG, **TEST, "tests/helpers.py": "X = 1\n", "conftest.py": "",
      "docs/index.rst": "", "calc/__pycache__/ops.cpython-311.pyc": "x"},
     ["calc/__init__.py", "calc/ops.py"],
     ["conftest.py", "tests/helpers.py", "tests/test_ops.py"]),
    # tests inside the package, and a second package beside it
    ({**PKG, "calc/tests/test_ops.py": TEST["tests/test_ops.py"], "calc2/__init__.py": "",
      "calc/test_inline.py": "def test_x():\n    pass\n"},
     ["calc/__init__.py", "calc/ops.py", "calc2/__init__.py"],
     ["calc/test_inline.py", "calc/tests/test_ops.py"]),
    # src layout: the package moves to the top, where the judge's pythonpath finds it
    ({**{f"src/{p}": t for p, t in PKG.items()}, **TEST},
     ["calc/__init__.py", "calc/ops.py"], ["tests/test_ops.py"]),
    # a single module named like the project
    ({"my_calc.py": "X = 1\n", **TEST}, ["my_calc.py"], ["tests/test_ops.py"]),
], ids=["top-level", "tests-in-package", "src-layout", "single-module"])
def test_packages_and_tests_are_found(tmp_path, files, sources, tests):
    sd = read_sdist(make_sdist(tmp_path, "my-calc", "1.2", files))
    assert (sd.project, sd.version, sd.archive) == ("my-calc", "1.2", "my-calc-1.2.tar.gz")
    assert [p for p, _ in sd.files] == sources
    assert [p for p, _ in sd.tests] == tests
    assert len(sd.sha256) == 64


def test_the_same_archive_reads_the_same(tmp_path):
    a = read_sdist(make_sdist(tmp_path, "calc", "1", {**PKG, **TEST}))
    assert read_sdist(tmp_path / "calc-1.tar.gz") == a


def _tar(tmp_path, names):
    path = tmp_path / "x-1.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for n in names:
            info = tarfile.TarInfo(n)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    return path


@pytest.mark.parametrize("make, says", [
    (lambda p: p / "missing.tar.gz", "cannot read"),
    (lambda p: (p / "x.tar.gz").write_bytes(b"not a tarball") and p / "x.tar.gz",
     "not a readable .tar.gz"),
    (lambda p: (p / "x.zip").write_bytes(b"PK") and p / "x.zip", "not a .tar.gz"),
    (lambda p: make_sdist(p, "calc", "1", PKG), "no test modules"),
    (lambda p: make_sdist(p, "calc", "1", TEST), "no package found"),
    (lambda p: _tar(p, ["a/x.py", "b/y.py"]), "one top directory"),
    (lambda p: _tar(p, ["x-1/../../etc/passwd"]), "member"),
], ids=["missing", "not-a-tar", "zip", "no-tests", "no-package", "two-tops", "escape"])
def test_unusable_input_is_a_usage_error_saying_what_to_give(tmp_path, make, says):
    with pytest.raises(UsageError, match=says) as e:
        read_sdist(make(tmp_path))
    assert "give" in str(e.value) or "pick" in str(e.value) or "factory" in str(e.value)
