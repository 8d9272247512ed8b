"""Repository tasks from JSONL: files inline or from directories, visible and hidden test
sets kept apart, and every mistake a UsageError naming the line and field."""

from __future__ import annotations

import json

import pytest

from trialbox.errors import UsageError
from trialbox.store.tasks import load_jsonl
from trialbox.types import TaskKind

ROW = {"task_id": "calc", "kind": "repo", "prompt": "Fix add.",
       "files": {"calc/ops.py": "def add(a, b):\n    return a - b\n"},
       "test_files": {"tests/test_ops.py": "def test_add():\n    pass\n"},
       "hidden_test_files": {"tests/test_h.py": "def test_h():\n    pass\n"},
       "canonical_solution": "--- a/calc/ops.py\n+++ b/calc/ops.py\n@@ -1,2 +1,2 @@\n"
                             " def add(a, b):\n-    return a - b\n+    return a + b\n"}


def write(tmp_path, *rows):
    p = tmp_path / "tasks.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_inline_repo_row(tmp_path):
    [t] = load_jsonl(write(tmp_path, ROW))
    assert t.kind is TaskKind.REPO and t.test_command == ("pytest",)
    assert dict(t.files) == {"calc/ops.py": b"def add(a, b):\n    return a - b\n"}
    assert [p for p, _ in t.test_files] == ["tests/test_ops.py"]
    assert [p for p, _ in t.hidden_test_files] == ["tests/test_h.py"]
    assert t.canonical_solution.startswith("--- a/calc/ops.py")


def test_directories_relative_to_the_task_file(tmp_path):
    (tmp_path / "src" / "calc").mkdir(parents=True)
    (tmp_path / "src" / "calc" / "ops.py").write_text("def add(a, b):\n    return a - b\n")
    (tmp_path / "hidden" / "tests").mkdir(parents=True)
    (tmp_path / "hidden" / "tests" / "test_h.py").write_text("def test_h():\n    pass\n")
    [t] = load_jsonl(write(tmp_path, {**ROW, "files": "src", "hidden_test_files": "hidden"}))
    assert [p for p, _ in t.files] == ["calc/ops.py"]
    assert [p for p, _ in t.hidden_test_files] == ["tests/test_h.py"]
    (tmp_path / "src" / "link.py").symlink_to("/etc/passwd")
    with pytest.raises(UsageError, match="symbolic link"):
        load_jsonl(write(tmp_path, {**ROW, "files": "src"}))


@pytest.mark.parametrize("change,why", [
    ({"files": {"../x.py": ""}}, "field 'files'"),
    ({"files": "nowhere"}, "not a directory"),
    ({"test_files": {}, "hidden_test_files": {"tests/helper.py": ""}}, "test module"),
    ({"hidden_test_files": {"tests/test_h.py": "def ("}}, "not valid Python"),
    ({"test_command": ["tox"]}, "only"),
    ({"canonical_solution": "--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-a\n+b\n"},
     "does not apply"),
    ({"extra": 1}, "unknown field 'extra'"),
    ({"hidden_test_files": {"tests/test_ops.py": "def test_x():\n    pass\n"}},
     "one set"),
    ({"files": {"a.py": 3}}, "must be a string"),
])
def test_bad_repo_rows_name_the_field(tmp_path, change, why):
    with pytest.raises(UsageError, match=why) as e:
        load_jsonl(write(tmp_path, {**ROW, **change}))
    assert "tasks.jsonl:1" in str(e.value)
