"""JSONL task files: both row kinds survive a round trip, gzipped or not."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import pytest

from trialbox.errors import UsageError
from trialbox.store import index, load_jsonl, load_tasks
from trialbox.types import Compare, Task, TaskKind, TestCase

FUNCTION_ROW = {
    "task_id": "demo/add", "prompt": "def add(a, b):\n", "entry_point": "add",
    "canonical_solution": "    return a + b\n",
    "test": ("import math\n\nMETADATA = {'author': 'me'}\n\n\n"
             "def check(candidate):\n"
             "    assert candidate(1, 2) == 3\n"
             "    big = 10 ** 6\n"
             "    for i in range(3):\n"
             "        assert candidate(i, big) == i + big\n"
             "    assert math.isclose(candidate(0.1, 0.2), 0.3)\n"),
    "extra": "ignored: HumanEval-derived sets carry extra keys",
}

STDIO_ROW = {
    "task_id": "demo/sum", "kind": "stdio", "prompt": "Read two ints; print the sum.",
    "tests": [{"stdin": "1 2\n", "expected": "3\n", "hidden": False},
              {"stdin": "5 5\n", "expected": "10\n"},
              {"stdin": "é 1\n", "expected": "ünïcode\n", "hidden": True},
              {"stdin": "", "expected": "0\n", "hidden": False}],
    "compare": "float", "float_tol": 0.01,
    "canonical_solution": "print(sum(map(int, input().split())))\n",
}


def write_jsonl(path: Path, rows: list[object], gz: bool = False) -> Path:
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def check_round_trip(fn: Task, io: Task, source: str) -> None:
    assert fn == Task(
        task_id="demo/add", kind=TaskKind.FUNCTION, prompt="def add(a, b):\n",
        entry_point="add", canonical_solution="    return a + b\n",
        test_setup="import math\n\nMETADATA = {'author': 'me'}",
        hidden_tests=(
            TestCase("test_0", code="assert candidate(1, 2) == 3"),
            TestCase("test_1", code="big = 10 ** 6\nfor i in range(3):\n"
                                    "    assert candidate(i, big) == i + big"),
            TestCase("test_2", code="assert math.isclose(candidate(0.1, 0.2), 0.3)"),
        ),
        source=source)
    assert io == Task(
        task_id="demo/sum", kind=TaskKind.STDIO, prompt="Read two ints; print the sum.",
        visible_tests=(TestCase("test_0", stdin=b"1 2\n", expected=b"3\n"),
                       TestCase("test_3", stdin=b"", expected=b"0\n")),
        hidden_tests=(TestCase("test_1", stdin=b"5 5\n", expected=b"10\n"),
                      TestCase("test_2", stdin="é 1\n".encode(),
                               expected="ünïcode\n".encode())),
        compare=Compare.FLOAT, float_tol=0.01,
        canonical_solution="print(sum(map(int, input().split())))\n", source=source)


@pytest.mark.parametrize("name,gz", [("tasks.jsonl", False), ("tasks.jsonl.gz", True)])
def test_round_trip_both_kinds(tmp_path, name, gz):
    path = write_jsonl(tmp_path / name, [FUNCTION_ROW, STDIO_ROW], gz=gz)
    fn, io = load_tasks(str(path))
    check_round_trip(fn, io, source=str(path))
    assert load_jsonl(path, source="mine") == [replace(t, source="mine") for t in (fn, io)]


def test_split_tests_run_like_check(tmp_path):
    (fn,) = load_jsonl(write_jsonl(tmp_path / "f.jsonl", [FUNCTION_ROW]))
    ns: dict[str, object] = {}
    exec(fn.test_setup, ns)
    exec(fn.prompt + fn.canonical_solution, ns)
    ns["candidate"] = ns["add"]
    for t in fn.hidden_tests:
        exec(t.code, ns)
    ns["candidate"] = lambda a, b: a - b
    with pytest.raises(AssertionError):
        exec(fn.hidden_tests[0].code, ns)


def test_defaults_blank_lines_crlf_and_bom(tmp_path):
    minimal = {"task_id": "m", "kind": "stdio", "prompt": "p",
               "tests": [{"stdin": "x", "expected": "y"}]}
    fn = {k: FUNCTION_ROW[k] for k in ("task_id", "prompt", "entry_point", "test")}
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(minimal).encode() + b"\r\n\r\n   \n"
                     + json.dumps({**fn, "kind": "function"}).encode() + b"\r\n")
    io, f = load_jsonl(path)
    assert (io.compare, io.float_tol, io.checker, io.canonical_solution) == (
        Compare.EXACT, Task.float_tol, "", "")
    assert io.visible_tests == () and io.hidden_tests == (
        TestCase("test_0", stdin=b"x", expected=b"y"),)
    assert f.kind is TaskKind.FUNCTION and f.canonical_solution == ""


def test_checker_task(tmp_path):
    row = {**STDIO_ROW, "compare": "checker", "checker": "import sys\nsys.exit(0)\n"}
    del row["float_tol"]
    (t,) = load_jsonl(write_jsonl(tmp_path / "c.jsonl", [row]))
    assert t.compare is Compare.CHECKER and t.checker == "import sys\nsys.exit(0)\n"


def test_index_rejects_duplicates_across_sets(tmp_path):
    a = load_jsonl(write_jsonl(tmp_path / "a.jsonl", [STDIO_ROW]))
    b = load_jsonl(write_jsonl(tmp_path / "b.jsonl", [STDIO_ROW]))
    assert index(a) == {"demo/sum": a[0]}
    with pytest.raises(UsageError) as e:
        index(a + b)
    msg = str(e.value)
    assert "'demo/sum'" in msg and "a.jsonl" in msg and "b.jsonl" in msg
