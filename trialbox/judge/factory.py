"""The task factory (issue 29, a first slice): repository tasks built from a project's
source distribution, its own tests and bugs injected by AST mutation, each validated by
trialbox's own repository judge before it is written.

    trialbox tasks from-sdist toolz-1.0.0.tar.gz --out pack/ --mutants 5 --seed 0

For each sdist, top to bottom (`build_project`):

    read       store/sdist.py: the package's sources (`files`) and its tests
    baseline   the unmodified tree graded `baseline_runs` times on `tier`; a test is
               *stable* when it passed every time. The others are taken out of the
               test modules (their `def` renamed `_unstable_…`, so pytest no longer
               collects them; a module with no stable test is left out) and the pruned
               tree is graded once more: every test left must pass (else out it goes
               too, up to 3 rounds). What remains is what the tasks grade.
    mutants    mutate.py's sites over the package's modules, each operator's list
               shuffled by `seed` and the operators interleaved (one of each in turn);
               each mutant tree graded in order: kept when the run finished cleanly,
               every graded test reported, >= 1 failed (FAIL_TO_PASS) and >= 1 passed
               (PASS_TO_PASS), with `MUTANT_CPU` times the baseline's CPU time (a
               mutant that loops forever costs seconds, not the whole limit); then
               graded again as the task itself (hidden tests):
               the failing tests must be exactly FAIL_TO_PASS. `mutants` kept or
               `tries` graded, whichever first.
    write      DIR/tasks.jsonl (repository rows, store/tasks.py: the mutant tree as
               `files`, the pruned tests as `hidden_test_files` in
               DIR/PROJECT-VERSION/tests/, the reverse diff as `canonical_solution`),
               DIR/manifest.json (per task: fail_to_pass, pass_to_pass, the mutation,
               the tier; per project: graded and dropped tests with the reason).

The prompt is what a user would see: the failing tests' names and their assertion lines
(`E   …`), trimmed, with object addresses masked; a line that quotes the original code of
the mutated line is left out. The reference answer is the original file; its tree is the
pruned baseline's byte for byte (checked), which passed `baseline_runs + 1` gradings.

Deterministic: the same sdists, seed and tier give the same files, as long as the
judge's verdicts are (that is what the baseline measures); no time or host detail is
written. What this slice does not do (images, hygiene checks, agent tools, scale) is in
docs/taskpacks.md.
"""

from __future__ import annotations

import asyncio
import difflib
import json
import math
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from trialbox.errors import InfraError, UsageError
from trialbox.judge.mutate import OPERATORS, Mutation, apply_mutation, mutation_sites, \
    still_parses
from trialbox.judge.repo import TIERS, RepoJudgeConfig, judge_repo
from trialbox.sandbox.base import SandboxProvider
from trialbox.store.patches import TreeError, apply_patch, diff_lines
from trialbox.store.sdist import Sdist, is_test_module, read_sdist
from trialbox.types import Grade, Limits, Outcome, Task, TaskKind, TestResult

MUTANT_CPU = 5.0
"""A mutant's run may use this many times the baseline's CPU time (not less than
`MIN_CPU_S`, not more than the config's limit)."""
MIN_CPU_S = 10
UNSTABLE = "_unstable_"
"""Prefix a test function's name gets when the baseline found it unstable on the tier."""


@dataclass(frozen=True)
class FactoryConfig:
    """How a pack is built."""

    mutants: int = 5
    """Validated tasks wanted per project."""
    tries: int = 0
    """Mutants graded per project at most; 0: ten times `mutants`."""
    seed: int = 0
    """Picks which mutation sites are tried, and in which order."""
    baseline_runs: int = 3
    """Gradings of the unmodified tree; a test passing in all of them is stable."""
    tier: str = "trusted"
    """The repository judge's tier the baseline and the mutants are graded on (and the
    tier the pack's verdicts are guaranteed for): "trusted" or "in-process"."""
    limits: Limits = field(default_factory=lambda: Limits(
        wall_s=120, cpu_s=120, memory_mb=1024, disk_mb=128, pids=64))
    """One grading's sandbox limits (a whole suite in one pytest run)."""
    workers: int = 2
    """Mutants graded at once."""

    def __post_init__(self) -> None:
        for name in ("mutants", "baseline_runs", "workers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(f"FactoryConfig.{name} must be an int >= 1, got {value!r}")
        if isinstance(self.tries, bool) or not isinstance(self.tries, int) or self.tries < 0:
            raise UsageError(f"FactoryConfig.tries must be an int >= 0 (0: ten times "
                             f"mutants), got {self.tries!r}")
        if self.tier not in TIERS:
            raise UsageError(f"FactoryConfig.tier must be one of {', '.join(TIERS)}, got "
                             f"{self.tier!r}")

    @property
    def max_tries(self) -> int:
        return self.tries or 10 * self.mutants

    @property
    def judge(self) -> RepoJudgeConfig:
        return RepoJudgeConfig(limits=self.limits, retries=1, tier=self.tier)


@dataclass(frozen=True)
class Built:
    """One validated task: its JSONL row and its manifest entry."""

    row: dict[str, Any]
    manifest: dict[str, Any]


@dataclass
class ProjectReport:
    """What building one project found (the manifest's `projects` entry, and figures)."""

    project: str
    version: str
    archive: str
    sha256: str
    tier: str
    graded: list[str]
    dropped: dict[str, str]
    tests: tuple[tuple[str, bytes], ...] = ()
    """The pruned test tree every task of the project grades with (hidden)."""
    sites: int = 0
    tried: int = 0
    tasks: list[Built] = field(default_factory=list)
    seconds: float = 0.0
    """Wall time of the build (printed, never written: the pack stays deterministic)."""

    def manifest(self) -> dict[str, Any]:
        return {"project": self.project, "version": self.version, "sdist": self.archive,
                "sdist_sha256": self.sha256, "tier": self.tier,
                "graded_tests": self.graded, "dropped_tests": self.dropped,
                "mutation_sites": self.sites, "mutants_tried": self.tried,
                "tasks": [b.row["task_id"] for b in self.tasks]}


# --------------------------------------------------------------------------- the pack

async def build_pack(sdists: Sequence[str | Path], out: str | Path,
                     provider: SandboxProvider, config: FactoryConfig | None = None,
                     log: Callable[[str], None] = lambda _: None) -> list[ProjectReport]:
    """Build every sdist's tasks and write `out`/tasks.jsonl and `out`/manifest.json.
    `out` must be a new or empty directory."""
    config = config or FactoryConfig()
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {str(out)!r} exists and is not an empty directory; give "
                         "a new one (a pack is written whole, never merged)")
    read = [read_sdist(p) for p in sdists]  # every input checked before any grading
    names = [f"{sd.project}-{sd.version}" for sd in read]
    if len(set(names)) != len(names):
        raise UsageError(f"the same project twice: {sorted(names)}; give each sdist once")
    reports = [await build_project(sd, provider, config, log) for sd in read]
    out.mkdir(parents=True, exist_ok=True)
    for sd, rep in zip(read, reports, strict=True):
        for path, data in rep.tests:
            target = out / f"{sd.project}-{sd.version}" / "tests" / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    with open(out / "tasks.jsonl", "w") as f:
        for rep in reports:
            for b in rep.tasks:
                f.write(json.dumps(b.row, sort_keys=True) + "\n")
    manifest = {"factory": {"seed": config.seed, "tier": config.tier,
                            "mutants": config.mutants, "tries": config.max_tries,
                            "baseline_runs": config.baseline_runs},
                "projects": [r.manifest() for r in reports],
                "tasks": [b.manifest for r in reports for b in r.tasks]}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return reports


# --------------------------------------------------------------------------- a project

async def build_project(sd: Sdist, provider: SandboxProvider, config: FactoryConfig,
                        log: Callable[[str], None] = lambda _: None) -> ProjectReport:
    """Baseline, mutants and validation of one project (module docstring)."""
    t0 = time.monotonic()
    name = f"{sd.project}-{sd.version}"
    log(f"{name}: baseline, {config.baseline_runs} runs on the {config.tier} tier")
    tests, graded, dropped, cpu_s = await _baseline(sd, provider, config)
    # A mutant that loops forever would hold a worker for the whole limit: its CPU
    # limit is the baseline's, times MUTANT_CPU (CPU time does not grow with the load).
    config = replace(config, limits=replace(config.limits, cpu_s=min(
        config.limits.cpu_s, max(MIN_CPU_S, math.ceil(MUTANT_CPU * cpu_s)))))
    rep = ProjectReport(sd.project, sd.version, sd.archive, sd.sha256, config.tier,
                        sorted(graded), dropped)
    rep.tests = tuple(sorted(tests.items()))
    log(f"{name}: {len(graded)} tests graded, {len(dropped)} dropped; mutants get "
        f"{config.limits.cpu_s:g} s of CPU (the baseline used {cpu_s:.1f} s)")
    sites = ordered_sites(sd, config.seed)
    rep.sites = len(sites)
    files = dict(sd.files)
    i = 0
    while len(rep.tasks) < config.mutants and i < min(len(sites), config.max_tries):
        batch = sites[i:min(i + config.workers, len(sites), config.max_tries)]
        found = await asyncio.gather(*(_try(sd, files, tests, graded, m, provider, config)
                                       for m in batch))
        for m, got in zip(batch, found, strict=True):
            i += 1
            if got is None:
                continue
            rep.tasks.append(_task(sd, files, tests, graded, m, got, config,
                                   len(rep.tasks)))
            log(f"{name}: kept {m.describe()} ({len(got[0])} failing)")
            if len(rep.tasks) == config.mutants:
                break
    rep.tried = i
    # the start must fail exactly FAIL_TO_PASS a second time, as the task itself
    confirmed = []
    for b in rep.tasks:
        if await _confirm(b, tests, provider, config):
            confirmed.append(b)
        else:
            log(f"{name}: {b.row['task_id']} failed differently the second time: dropped")
    rep.tasks = [_renumbered(b, k, name) for k, b in enumerate(confirmed)]
    rep.seconds = time.monotonic() - t0
    return rep


def ordered_sites(sd: Sdist, seed: int) -> list[Mutation]:
    """Every mutation site of the package's modules, each operator's shuffled by `seed`
    (and the project), the operators interleaved so each is tried in turn."""
    by_op: dict[str, list[Mutation]] = {op: [] for op in OPERATORS}
    for path, data in sd.files:
        if path.endswith(".py"):
            for m in mutation_sites(path, data, checked=False):  # checked when tried
                by_op[m.operator].append(m)
    rng = random.Random(f"{seed}:{sd.project}:{sd.version}")
    for op in OPERATORS:
        rng.shuffle(by_op[op])
    out: list[Mutation] = []
    for k in range(max(map(len, by_op.values()), default=0)):
        out += [by_op[op][k] for op in OPERATORS if k < len(by_op[op])]
    return out


def _build_task(task_id: str, files: dict[str, bytes], tests: dict[str, bytes],
                hidden: bool, prompt: str = "(built by the task factory)",
                reference: str = "") -> Task:
    test_tree = tuple(sorted(tests.items()))
    return Task(task_id, TaskKind.REPO, prompt=prompt, files=tuple(sorted(files.items())),
                test_files=() if hidden else test_tree,
                hidden_test_files=test_tree if hidden else (), test_command=("pytest",),
                canonical_solution=reference)


async def _grade(task: Task, provider: SandboxProvider, config: FactoryConfig,
                 answer: str | dict[str, bytes | str | None] | None = None) -> Grade:
    g = await judge_repo(task, answer if answer is not None else {}, provider,
                         config.judge)
    if g.outcome is Outcome.INFRA:
        raise InfraError(f"{task.task_id}: the sandbox machinery failed while building "
                         f"the pack: {g.message}")
    return g


async def _baseline(sd: Sdist, provider: SandboxProvider, config: FactoryConfig
                    ) -> tuple[dict[str, bytes], set[str], dict[str, str], float]:
    """(the pruned test tree, the graded test ids, {dropped test: why}, the most CPU
    seconds a run's candidate sandbox used)."""
    name = f"{sd.project}-{sd.version}"
    files, tests = dict(sd.files), dict(sd.tests)
    dropped: dict[str, str] = {}
    runs = [await _grade(_build_task(f"{name}/baseline", files, tests, False), provider,
                         config) for _ in range(config.baseline_runs)]
    for g in runs:
        if g.outcome is Outcome.ERROR:
            raise UsageError(f"{sd.archive}: the test runner could not run the project's "
                             f"tests on the {config.tier} tier: {g.message[:500]}")
    for r in runs:
        for t in r.tests:
            if not t.passed:
                dropped.setdefault(t.name, _why(t))
    reported = {t.name for r in runs for t in r.tests}
    stable = reported - set(dropped)
    for _round in range(3):
        tests, out = _pruned(tests, stable, reported)
        for n in out:
            dropped.setdefault(n, "left out with its module or function")
        if not stable or not any(is_test_module(p) for p in tests):
            break
        check = await _grade(_build_task(f"{name}/baseline", files, tests, False),
                             provider, config)
        failing = {t.name: _why(t) for t in check.tests if not t.passed}
        if not failing and check.passed:
            graded = {t.name for t in check.tests}
            for n in sorted(stable - graded):  # a passing case of a function left out
                dropped.setdefault(n, "left out with its function: another case failed")
            cpu_s = max(g.candidate_cpu_ms for g in [*runs, check]) / 1e3
            return tests, graded, dropped, cpu_s
        reported |= {t.name for t in check.tests}
        dropped.update({n: f"unstable: {w}" for n, w in failing.items()})
        stable -= set(failing)
        if check.outcome is not Outcome.FAILED:  # the whole run broke: nothing to keep
            stable = set()
    first = next(iter(dropped.items()), ("", "no test reported"))
    raise UsageError(f"{sd.archive}: no test of {name} passes steadily on the "
                     f"{config.tier} tier (e.g. {first[0]}: {first[1][:300]}); try "
                     "--tier in-process, or another project")


def _why(t: TestResult) -> str:
    """A dropped test's reason: the judge's head (`failed`, `not run: …`) and the first
    assertion line."""
    head = t.message.split(":", 1)[0] if t.message else "failed"
    if head.startswith(("not run", "passed, but")):
        return _mask(t.message.splitlines()[0])[:300]
    lines = _assertion_lines(t.message, most=1)
    return f"{head}: {lines[0] if lines else ''}"[:300]


def _base(test_id: str) -> str:
    """A test id without its parameters: `f.py::test_x[1-2]` -> `f.py::test_x`."""
    return test_id.split("[", 1)[0]


def _pruned(tests: dict[str, bytes], stable: set[str], reported: set[str]
            ) -> tuple[dict[str, bytes], list[str]]:
    """`tests` with every reported test function that is not wholly stable renamed out of
    pytest's sight, and test modules with no stable test left out. (tree, ids left out)

    A test reported through a class that inherits it (`AddCases::test_x`, defined in a
    mixin `Checks`) is renamed where the module defines a method of that name: its other
    subclasses lose it too, and the next grading shows which tests remain. A function
    never reported (a mixin's own method, a helper) is left alone."""
    keep_bases = {_base(n) for n in stable}
    bad_bases = {_base(n) for n in reported} - keep_bases
    out: dict[str, bytes] = {}
    gone: list[str] = []
    for path, data in tests.items():
        if not is_test_module(path):
            out[path] = data
            continue
        if not any(b.startswith(path + "::") for b in keep_bases):
            gone += sorted(n for n in reported if n.startswith(path + "::"))
            continue
        defs = _defs(path, data)
        ids = {i for i, _ in defs}
        bad_here = {b for b in bad_bases if b.startswith(path + "::")}
        inherited = {b.rsplit("::", 1)[1] for b in bad_here
                     if b not in ids and b.count("::") == 2}
        lines = data.split(b"\n")
        for test_id, line in defs:
            fn = test_id.rsplit("::", 1)[1]
            if test_id in bad_here or (test_id.count("::") == 2 and fn in inherited):
                lines[line - 1] = re.sub(rb"\bdef\s+" + re.escape(fn.encode()) + rb"\b",
                                         b"def " + UNSTABLE.encode() + fn.encode(),
                                         lines[line - 1], count=1)
        out[path] = b"\n".join(lines)
    return out, gone


def _defs(path: str, source: bytes) -> list[tuple[str, int]]:
    """(test id, line of its `def`) for the module's test functions and methods."""
    import ast
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    found = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                node.name.startswith("test"):
            found.append((f"{path}::{node.name}", node.lineno))
        elif isinstance(node, ast.ClassDef):  # Test* or unittest.TestCase subclasses
            found += [(f"{path}::{node.name}::{s.name}", s.lineno) for s in node.body
                      if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
                      and s.name.startswith("test")]
    return found


# --------------------------------------------------------------------------- mutants

async def _try(sd: Sdist, files: dict[str, bytes], tests: dict[str, bytes],
               graded: set[str], m: Mutation, provider: SandboxProvider,
               config: FactoryConfig) -> tuple[list[str], dict[str, str]] | None:
    """(FAIL_TO_PASS, {test: its message}) when the mutant is a task, else None."""
    if not still_parses(files[m.path], m):
        return None
    mutant = {**files, m.path: apply_mutation(files[m.path], m)}
    g = await _grade(_build_task(f"{sd.project}-{sd.version}/mutant", mutant, tests, False),
                     provider, config)
    if g.outcome is not Outcome.FAILED or "did not finish cleanly" in g.message:
        return None  # a hang, a crash of the run, memory: not a clean bug
    names = {t.name for t in g.tests}
    failing = {t.name: t.message for t in g.tests if not t.passed}
    if names != graded or not failing or len(failing) == len(graded):
        return None
    if any(msg.startswith(("not run", "its file did not collect"))
           for msg in failing.values()):
        return None  # the module no longer imports: every test of it fails at once
    return sorted(failing), failing


def _task(sd: Sdist, files: dict[str, bytes], tests: dict[str, bytes], graded: set[str],
          m: Mutation, got: tuple[list[str], dict[str, str]], config: FactoryConfig,
          k: int) -> Built:
    f2p, messages = got
    mutant = {**files, m.path: apply_mutation(files[m.path], m)}
    reference = reverse_diff(m.path, mutant[m.path], files[m.path])
    try:
        fixed = apply_patch(mutant, reference)
    except TreeError as e:  # cannot happen for a diff difflib wrote; refuse if it does
        raise UsageError(f"{m.describe()}: the reference diff does not apply: {e}") from None
    if fixed != files:
        raise UsageError(f"{m.describe()}: the reference diff does not restore the file")
    name = f"{sd.project}-{sd.version}"
    task_id = f"{name}/{k:03d}"
    p2p = sorted(graded - set(f2p))
    prompt = problem_statement(sd, f2p, messages, files[m.path], m)
    row = {"task_id": task_id, "kind": "repo", "prompt": prompt,
           "files": {p: d.decode("utf-8", "surrogateescape")
                     for p, d in sorted(mutant.items())},
           "hidden_test_files": f"{name}/tests", "test_command": ["pytest"],
           "canonical_solution": reference}
    entry = {"task_id": task_id, "project": sd.project, "version": sd.version,
             "mutated_files": [m.path], "fail_to_pass": f2p, "pass_to_pass": p2p,
             "mutation": {"operator": m.operator, "path": m.path, "line": m.line,
                          "before": m.before.decode("utf-8", "replace"),
                          "after": m.after.decode("utf-8", "replace")},
             "tier": config.tier}
    return Built(row, entry)


def _renumbered(b: Built, k: int, name: str) -> Built:
    task_id = f"{name}/{k:03d}"
    return Built({**b.row, "task_id": task_id}, {**b.manifest, "task_id": task_id})


async def _confirm(b: Built, tests: dict[str, bytes], provider: SandboxProvider,
                   config: FactoryConfig) -> bool:
    files = {p: t.encode("utf-8", "surrogateescape") for p, t in b.row["files"].items()}
    task = _build_task(b.row["task_id"], files, tests, True,
                       reference=b.row["canonical_solution"])
    g = await _grade(task, provider, config)
    failing = sorted(t.name for t in g.tests if not t.passed)
    return g.outcome is Outcome.FAILED and failing == b.manifest["fail_to_pass"]


def reverse_diff(path: str, mutant: bytes, original: bytes) -> str:
    """The unified diff that takes `mutant` back to `original` (the reference answer)."""
    a = diff_lines(mutant.decode("utf-8", "surrogateescape"))
    b = diff_lines(original.decode("utf-8", "surrogateescape"))
    return "".join(difflib.unified_diff(a, b, f"a/{path}", f"b/{path}", n=3))


# --------------------------------------------------------------------------- the prompt

_ADDRESS = re.compile(r"0x[0-9a-fA-F]{4,}|(?<=\.\.\.)[0-9a-fA-F]{4,}(?=>)")
"""An object's address, whole or as pytest's truncated repr ends it (`...f8becc87050>`)."""
MAX_SHOWN = 10
"""Failing tests named in a prompt (the rest are counted)."""


def _mask(text: str) -> str:
    """Object addresses change from run to run: masked, so the pack is deterministic."""
    return _ADDRESS.sub("…", text)


def problem_statement(sd: Sdist, f2p: list[str], messages: dict[str, str],
                      original: bytes, m: Mutation) -> str:
    """What a user would report: the failing tests and their assertion lines, never the
    original code (a line quoting the mutated line's original text is left out)."""
    first = original.rfind(b"\n", 0, m.start) + 1
    last = original.find(b"\n", m.end)
    secret = [ln.strip() for ln in original[first:last if last >= 0 else None]
              .decode("utf-8", "replace").splitlines() if len(ln.strip()) >= 8]
    out = [f"After a recent change to {sd.project} {sd.version}, {len(f2p)} of its tests "
           "fail. Fix the package's code (not the tests) so that they pass again, "
           "without breaking the tests that pass now.", "", "Failing tests:"]
    for name in f2p[:MAX_SHOWN]:
        out.append(f"- {name}")
        for line in _assertion_lines(messages.get(name, "")):
            if not any(s in line for s in secret):
                out.append(f"    {line}")
    if len(f2p) > MAX_SHOWN:
        out.append(f"- … and {len(f2p) - MAX_SHOWN} more")
    return "\n".join(out) + "\n"


def _assertion_lines(message: str, most: int = 4, width: int = 160) -> list[str]:
    """pytest's `E   …` lines of a failure, trimmed; else its last line."""
    lines = [ln[1:].strip() for ln in message.splitlines() if ln.startswith("E ")]
    if not lines:
        tail = [ln.strip() for ln in message.splitlines() if ln.strip()]
        lines = tail[-1:]
    return [_mask(ln)[:width] for ln in lines[:most] if ln]
