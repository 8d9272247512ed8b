"""Bad task files raise UsageError naming the file, the line and the field to fix."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from trialbox.errors import UsageError
from trialbox.store import load_jsonl, load_tasks

GOOD_FN = {"task_id": "f/1", "prompt": "def f(x):\n", "entry_point": "f",
           "test": "def check(candidate):\n    assert candidate(1) == 2\n"}
GOOD_IO = {"task_id": "s/1", "kind": "stdio", "prompt": "echo",
           "tests": [{"stdin": "a", "expected": "a"}]}


def drop(row: dict[str, object], key: str) -> dict[str, object]:
    return {k: v for k, v in row.items() if k != key}


def load_line(tmp_path: Path, line: bytes) -> str:
    """Put `line` on line 3 of a file after two good rows; return the error message."""
    path = tmp_path / "bad.jsonl"
    path.write_bytes(json.dumps(GOOD_FN).encode() + b"\n" + json.dumps(GOOD_IO).encode()
                     + b"\n" + line + b"\n")
    with pytest.raises(UsageError) as e:
        load_jsonl(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}:3: "), msg
    return msg


BAD_ROWS = [
    # (row, words the message must contain)
    ({"prompt": "p", "entry_point": "f", "test": GOOD_FN["test"]},
     ["'task_id'", "non-empty string", "missing"]),
    ({**GOOD_FN, "task_id": ""}, ["'task_id'", "an empty string"]),
    ({**GOOD_FN, "task_id": 7}, ["'task_id'", "a number"]),
    (drop(GOOD_FN, "prompt"), ["task 'f/1'", "'prompt'", "missing"]),
    ({**GOOD_FN, "prompt": "  \n"}, ["'prompt'", "an empty string"]),
    (drop(GOOD_FN, "entry_point"), ["'entry_point'", "missing"]),
    ({**GOOD_FN, "entry_point": "not a name"}, ["'entry_point'", "not a Python identifier"]),
    (drop(GOOD_FN, "test"), ["'test'", "missing"]),
    ({**GOOD_FN, "canonical_solution": ["x"]}, ["'canonical_solution'", "an array"]),
    ({**GOOD_FN, "test": "def check(candidate):\n    assert (\n"},
     ["'test'", "not valid Python", "line 2"]),
    ({**GOOD_FN, "test": "def test(candidate):\n    assert candidate(1)\n"},
     ["'test'", "def check(candidate)"]),
    ({**GOOD_FN, "test": "def check(c):\n    assert c(1)\n"},
     ["'test'", "named `candidate`", "def check(c)"]),
    ({**GOOD_FN, "test": "def check(candidate):\n    pass\ndef check(candidate):\n    pass\n"},
     ["'test'", "2 times", "lines 1, 3"]),
    ({**GOOD_FN, "test": "def check(candidate):\n    candidate(1)\n    assert True\n"},
     ["'test'", "asserts nothing"]),
    ({**GOOD_FN, "kind": "repos"}, ["'kind'", "'repos'", "'function', 'stdio' or 'repo'"]),
    ({**GOOD_IO, "kind": "stdin"}, ["'kind'", "unknown kind 'stdin'"]),
    (drop(GOOD_IO, "tests"), ["task 's/1'", "'tests'", "non-empty array", "missing"]),
    ({**GOOD_IO, "tests": []}, ["'tests'", "an empty array"]),
    ({**GOOD_IO, "tests": {"stdin": "a"}}, ["'tests'", "an object"]),
    ({**GOOD_IO, "tests": [{"stdin": "a", "expected": "a"}, "a"]}, ["'tests[1]'", "a string"]),
    ({**GOOD_IO, "tests": [{"stdin": "a"}]}, ["'tests[0]'", "'expected'", "missing"]),
    ({**GOOD_IO, "tests": [{"stdin": 1, "expected": "1"}]}, ["'tests[0]'", "'stdin'"]),
    ({**GOOD_IO, "tests": [{"stdin": "a", "expected": "a", "hiden": False}]},
     ["'tests[0]'", "unknown field 'hiden'"]),
    ({**GOOD_IO, "tests": [{"stdin": "a", "expected": "a", "hidden": "no"}]},
     ["'hidden'", "true or false"]),
    ({**GOOD_IO, "compare": "fuzzy"}, ["'compare'", "'fuzzy'", "'exact'", "'checker'"]),
    ({**GOOD_IO, "compare": "float", "float_tol": -1}, ["'float_tol'", "-1"]),
    ({**GOOD_IO, "compare": "float", "float_tol": True}, ["'float_tol'"]),
    ({**GOOD_IO, "compare": "checker"}, ["'checker'", "no checker"]),
    ({**GOOD_IO, "checker": "print(1)"}, ["'compare'", "set compare to 'checker'"]),
    ({**GOOD_IO, "compare": "checker", "checker": "def ("},
     ["'checker'", "not valid Python"]),
    ({**GOOD_IO, "compair": "whitespace"}, ["unknown field 'compair'"]),
    ({**GOOD_IO, "task_id": "f/1"}, ["'task_id'", "'f/1'", "already appears on line 1"]),
]


@pytest.mark.parametrize("row,words", BAD_ROWS, ids=[str(i) for i in range(len(BAD_ROWS))])
def test_bad_row(tmp_path, row, words):
    msg = load_line(tmp_path, json.dumps(row).encode())
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"


@pytest.mark.parametrize("line,words", [
    (b'{"task_id": "x", "prompt": ', ["not valid JSON", "column", "one JSON object"]),
    (b"[1, 2]", ["expected a JSON object", "an array"]),
    (b'"just a string"', ["expected a JSON object", "a string"]),
    (b'{"task_id": "caf\xe9"}', ["not valid UTF-8", "byte 17", "save the file as UTF-8"]),
])
def test_bad_line(tmp_path, line, words):
    msg = load_line(tmp_path, line)
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"


def test_missing_file_directory_and_bad_gzip(tmp_path):
    with pytest.raises(UsageError, match="does not exist; check the path") as e:
        load_tasks(str(tmp_path / "nope.jsonl"))
    assert "nope.jsonl" in str(e.value)
    (tmp_path / "dir.jsonl").mkdir()
    with pytest.raises(UsageError, match="is a directory"):
        load_jsonl(tmp_path / "dir.jsonl")
    truncated = gzip.compress(json.dumps(GOOD_FN).encode() * 50)[:40]
    (tmp_path / "cut.jsonl.gz").write_bytes(truncated)
    with pytest.raises(UsageError, match="cannot be decompressed") as e:
        load_tasks(str(tmp_path / "cut.jsonl.gz"))
    assert "cut.jsonl.gz" in str(e.value)


def test_line_numbers_count_blank_lines_and_survive_gzip(tmp_path):
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(gzip.compress(b"\n\n" + json.dumps(drop(GOOD_IO, "prompt")).encode()))
    with pytest.raises(UsageError) as e:
        load_jsonl(path)
    assert str(e.value).startswith(f"{path}:3: task 's/1': field 'prompt'")


def test_unknown_spec():
    with pytest.raises(UsageError) as e:
        load_tasks("mbpp")
    assert "'mbpp'" in str(e.value) and "'humaneval'" in str(e.value) and ".jsonl" in str(
        e.value)
