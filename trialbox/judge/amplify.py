"""Test amplification for function tasks with a reference solution, in the spirit of
EvalPlus (docs/adversary.md, section B): more tests, from the tests' own inputs.

    generate(tasks, pool)          for each task, in a fresh sandbox (amplify_program.py):
      the task's tests run with `candidate` recording the inputs they build; those
      inputs mutated type-aware (ints +-1 / +-small / large / 0 / negated, strings with
      a character dropped / added / swapped, halves, doubled, reversed, lists shuffled /
      truncated / extended with mutated items, nested types kept), mutants of mutants
      too; the reference run on each under a per-call time limit — inputs on which it
      raises, times out, answers non-plain data or answers twice differently are
      dropped; deduplicated; at most `per_task` a task
    save / load                    one JSON file: version, generator, parameters and seed,
                                   the task set's name, the tests, a sha256 of it all
    apply(tasks, amplified)        the tasks with the amplified tests added as hidden
                                   plain-assertion tests ("amplified_<i>"), run by the
                                   same trusted harness as the task's own

A test reads `assert _tb_amp_same(candidate(*ARGS), EXPECTED)`: the candidate's answer
crosses the proxy as plain data and is compared in the trusted harness with the
reference's — floats (anywhere inside the answer) within `FLOAT_TOL` relative or
absolute, everything else with `==` on plain builtin values.

    python -m trialbox.judge.amplify --out humaneval.amplified.json [--limit N]

HumanEval's set ships as `trialbox/judge/data/humaneval.amplified.json` (`load("humaneval")`,
`trialbox eval --tasks humaneval --amplified humaneval`).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from trialbox.errors import UsageError
from trialbox.judge import codec
from trialbox.judge.function import _prompt_setup
from trialbox.sandbox.base import SandboxProvider
from trialbox.sandbox.pool import CellPool
from trialbox.types import Limits, Task, TaskKind, TestCase

VERSION = 1
GENERATOR = "trialbox.judge.amplify/1"
FLOAT_TOL = 1e-6
HERE = os.path.dirname(os.path.abspath(__file__))
HELPER = f'''
def _tb_amp_same(got, want, _tol={FLOAT_TOL!r}):
    """Amplified tests' comparison: floats within a tolerance, the rest with ==."""
    if type(want) is float and type(got) in (int, float) and type(got) is not bool:
        return abs(got - want) <= _tol or abs(got - want) <= _tol * abs(want)
    if type(want) in (list, tuple):
        return type(got) is type(want) and len(got) == len(want) and all(
            _tb_amp_same(g, w) for g, w in zip(got, want))
    if type(want) is dict:
        return type(got) is dict and got.keys() == want.keys() and all(
            _tb_amp_same(got[k], want[k]) for k in want)
    return got == want
'''


@dataclass(frozen=True)
class AmplifyConfig:
    """How the amplified tests are generated (all recorded in the file)."""

    seed: int = 20261201
    """The RNG seed; each task's generator is seeded with (seed, task_id)."""
    per_task: int = 40
    """At most this many amplified tests a task."""
    max_tries: int = 1500
    """Mutants tried a task at most (duplicates and rejected ones included)."""
    call_limit_s: float = 0.2
    """The reference's time limit on one input: slower inputs are dropped."""
    task_budget_s: float = 3.0
    """Time a task's generation may take in its sandbox; what was found by then is kept."""
    max_size: int = 200
    """An input or output larger than this (items, ~8 characters each) is dropped."""
    workers: int = 2
    """Sandboxes generating at once."""

    def __post_init__(self) -> None:
        for name in ("per_task", "max_tries", "max_size", "workers"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UsageError(f"AmplifyConfig.{name} must be an int >= 1, got {v!r}")
        for name in ("call_limit_s", "task_budget_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise UsageError(f"AmplifyConfig.{name} must be a number > 0, got {v!r}")


@dataclass(frozen=True)
class Amplified:
    """A stored, versioned set of amplified tests for one task set."""

    task_set: str
    params: dict[str, Any]
    tests: dict[str, tuple[tuple[tuple[Any, ...], Any], ...]]
    """task_id -> ((args, expected), ...)"""
    errors: dict[str, str] = field(default_factory=dict)
    """task_id -> why its reference could not be run (no amplified tests for it)."""

    def counts(self) -> dict[str, int]:
        return {k: len(v) for k, v in self.tests.items()}


def _body(a: Amplified) -> dict[str, Any]:
    return {"version": VERSION, "generator": GENERATOR, "task_set": a.task_set,
            "params": a.params,
            "tasks": {k: [codec.encode([list(args), want]).decode("ascii")
                          for args, want in v] for k, v in sorted(a.tests.items())},
            "errors": dict(sorted(a.errors.items()))}


def _digest(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"))
                          .encode()).hexdigest()


def save(a: Amplified, path: str) -> str:
    """Write `a` to `path` with its content hash; returns the hash."""
    body = _body(a)
    digest = _digest(body)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({**body, "sha256": digest}, f, sort_keys=True, indent=1)
        f.write("\n")
    return digest


PACKAGED = {"humaneval": os.path.join(HERE, "data", "humaneval.amplified.json")}
"""Amplified sets shipped with trialbox, by name (generated by `main` with the defaults;
the figures are in docs/adversary.md, section B)."""


def load(path: str) -> Amplified:
    """Read a file `save` wrote (or a name in PACKAGED), checking its version and content
    hash."""
    path = PACKAGED.get(path, path)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: not an amplified test file ({e})") from None
    version = data.get("version") if isinstance(data, dict) else None
    if version != VERSION:
        raise UsageError(f"{path}: version {version!r}, this trialbox reads version "
                         f"{VERSION}; regenerate it "
                         "(python -m trialbox.judge.amplify)")
    digest = data.pop("sha256", None)
    if digest != _digest(data):
        raise UsageError(f"{path}: its sha256 does not match its content (edited or "
                         "truncated); regenerate it")
    tests: dict[str, tuple[tuple[tuple[Any, ...], Any], ...]] = {}
    for task_id, pairs in data["tasks"].items():
        decoded = []
        for p in pairs:
            args, want = codec.decode(p.encode("ascii"))
            decoded.append((tuple(args), want))
        tests[task_id] = tuple(decoded)
    return Amplified(data["task_set"], data["params"], tests, data.get("errors", {}))


def apply(tasks: Iterable[Task], amplified: Amplified) -> list[Task]:
    """The tasks with their amplified tests added to the hidden tests (opt-in: grade
    these instead of the originals); tasks without any are returned unchanged."""
    out = []
    for task in tasks:
        pairs = amplified.tests.get(task.task_id)
        if not pairs:
            out.append(task)
            continue
        extra = tuple(TestCase(f"amplified_{i}",
                               code=f"assert _tb_amp_same(candidate(*{args!r}), {want!r})")
                      for i, (args, want) in enumerate(pairs))
        out.append(replace(task, hidden_tests=task.hidden_tests + extra,
                           test_setup=task.test_setup + "\n" + HELPER))
    return out


# --------------------------------------------------------------------------- generation

def _job_task(task: Task) -> dict[str, Any]:
    return {"task_id": task.task_id, "prompt": task.prompt,
            "canonical_solution": task.canonical_solution, "entry_point": task.entry_point,
            "setup": _prompt_setup(task.prompt, task.entry_point) + "\n" + task.test_setup,
            "tests": [t.code for t in (*task.hidden_tests, *task.visible_tests)]}


async def _batch(pool: SandboxProvider, tasks: Sequence[Task], config: AmplifyConfig,
                 params: dict[str, Any]) -> list[dict[str, Any]]:
    budget = config.task_budget_s * 2 * len(tasks) + 30
    limits = Limits(wall_s=budget, cpu_s=budget, memory_mb=1024, disk_mb=16,
                    output_bytes=64 << 20)
    sb = await pool.open(limits)
    try:
        for name, src in (("_trialbox_amplify.py", "amplify_program.py"),
                          ("_trialbox_codec.py", "codec.py")):
            with open(os.path.join(HERE, src), "rb") as f:
                await sb.write_file(name, f.read())
        job = {"params": params, "tasks": [_job_task(t) for t in tasks]}
        r = await sb.exec(["python3", "_trialbox_amplify.py"], stdin=json.dumps(job).encode())
    finally:
        await sb.close()
    lines = [json.loads(x) for x in r.stdout.decode().splitlines() if x.strip()]
    done = {x["task_id"] for x in lines}
    lines += [{"task_id": t.task_id, "tests": [], "error": f"generator run ended "
               f"{r.status.value}: {r.message}"} for t in tasks if t.task_id not in done]
    return lines


async def generate(tasks: Sequence[Task], pool: SandboxProvider, task_set: str,
                   config: AmplifyConfig | None = None) -> Amplified:
    """Amplified tests for the function tasks in `tasks` that have a reference."""
    config = config or AmplifyConfig()
    todo = [t for t in tasks if t.kind is TaskKind.FUNCTION and t.canonical_solution]
    if not todo:
        raise UsageError("no function task with a canonical_solution to amplify")
    params = {k: v for k, v in asdict(config).items() if k != "workers"}
    size = max(1, -(-len(todo) // (config.workers * 4)))
    batches = [todo[i:i + size] for i in range(0, len(todo), size)]
    sem = asyncio.Semaphore(config.workers)

    async def one(batch: Sequence[Task]) -> list[dict[str, Any]]:
        async with sem:
            return await _batch(pool, batch, config, params)

    tests: dict[str, tuple[tuple[tuple[Any, ...], Any], ...]] = {}
    errors: dict[str, str] = {}
    for lines in await asyncio.gather(*(one(b) for b in batches)):
        for line in lines:
            pairs = []
            for p in line["tests"]:
                args, want = codec.decode(p.encode("ascii"))  # strict: plain data only
                pairs.append((tuple(args), want))
            tests[line["task_id"]] = tuple(pairs)
            if line.get("error"):
                errors[line["task_id"]] = str(line["error"])[:500]
    return Amplified(task_set, params, tests, errors)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trialbox.judge.amplify",
                                 description="Generate HumanEval's amplified tests.")
    ap.add_argument("--out", required=True, help="the JSON file to write")
    ap.add_argument("--limit", type=int, default=0, help="only the first N tasks")
    ap.add_argument("--seed", type=int, default=AmplifyConfig.seed)
    ap.add_argument("--per-task", type=int, default=AmplifyConfig.per_task)
    ap.add_argument("--workers", type=int, default=AmplifyConfig.workers)
    a = ap.parse_args(argv)
    from trialbox.judge.function import judge_pool_config
    from trialbox.store.tasks import load_humaneval
    tasks = load_humaneval()[: a.limit or None]
    config = AmplifyConfig(seed=a.seed, per_task=a.per_task, workers=a.workers)

    async def run() -> Amplified:
        pool = await CellPool(judge_pool_config(warm=config.workers)).start()
        try:
            return await generate(tasks, pool, "humaneval", config)
        finally:
            await pool.close()

    amplified = asyncio.run(run())
    digest = save(amplified, a.out)
    counts = sorted(amplified.counts().values())
    print(f"{a.out}: {sum(counts)} tests for {len(counts)} tasks (min {counts[0]}, "
          f"median {counts[len(counts) // 2]}, max {counts[-1]}); "
          f"{len(amplified.errors)} without; sha256 {digest}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
