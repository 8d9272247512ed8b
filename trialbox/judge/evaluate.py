"""`trialbox eval`: grade a file of samples against a task set, one output row per input
row, in input order — nothing is dropped, whatever the input holds.

Each sample row is {"task_id": ..., "completion": ...}: for a function task (HumanEval
style) the completion is appended to the task's prompt; for a stdio task it is the whole
program, and the row may name its "language" (python, the default, c, cpp, bash, sh);
for a repository task it is a unified diff against the starting tree, or the row gives
"files" ({path: text, or null to delete}) instead of a completion.
Each output row: task_id, passed, reward (null when excluded), outcome, message, flags,
per-test results, timings. The summary (returned, and printed last by the CLI) has
pass@1, counts per outcome, and whether repeated gradings agreed (determinism).
"""

from __future__ import annotations

import asyncio
import functools
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from trialbox.errors import UnknownLanguage, UsageError
from trialbox.judge.answer import answer_of
from trialbox.judge.function import JudgeConfig, open_harness
from trialbox.judge.grade import grade
from trialbox.judge.repo import RepoJudgeConfig
from trialbox.judge.seeds import FINAL, derive_seed
from trialbox.judge.repo_tree import candidate_tree
from trialbox.store.patches import TreeError
from trialbox.judge.reward import RewardSpec, reward, score, style_findings, style_score
from trialbox.judge.stdio import StdioJudgeConfig
from trialbox.sandbox.languages import language
from trialbox.sandbox.base import Sandbox, SandboxProvider
from trialbox.types import (EvalSample, Grade, GradedRow, Outcome, Repeat, Sample, SampleError,
                            Scores, Task, TaskKind, TestResult)


@dataclass(frozen=True)
class Reference:
    """What the task's reference solution did, measured once per task: the baseline of
    scaled time limits and of the efficiency and memory scores."""

    times: dict[str, float] = field(default_factory=dict)
    """Per-test times (ms) of a passing reference; empty when it has none or it failed."""
    peak_memory_bytes: int | None = None
    """Peak memory of the reference's sandbox, from its cgroup."""
    cpu_ms: float | None = None
    """CPU time of the reference's sandbox (repository tasks: the efficiency baseline,
    since their per-test times are measured inside the candidate's process)."""


_BINARY = RewardSpec()


def reward_of(grade: Grade) -> float | None:
    """The default reward: 1.0 for a pass, 0.0 for anything the candidate did, None
    (excluded from training) when the machinery or the task's own tests failed."""
    return reward(grade, _BINARY)


def _finding_line(finding: str) -> int:
    """The line of a "CODE LINE: message" finding; findings without one are kept (inf)."""
    try:
        return int(finding.split(" ", 2)[1].rstrip(":"))
    except (IndexError, ValueError):
        return 1 << 30


def read_samples(path: str) -> list[Sample]:
    """The samples file's rows, each a sample or the error variant saying what is wrong
    with that row (it gets an error row; nothing is dropped)."""
    rows: list[Sample] = []
    try:
        with open(path, "rb") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise UsageError(f"cannot read --samples {path}: {e.strerror}") from e
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            rows.append(SampleError(f"{path}:{n}: not a JSON object ({e})"))
            continue
        rows.append(EvalSample.parse(row, f"{path}:{n}"))
    return rows


def as_sample(x: Sample | dict[str, Any] | str) -> Sample:
    """A sample given to `evaluate` as a record, a JSON-like dict (checked against its
    task by `Evaluator.check`, as a samples file's row is) or a message (an error)."""
    if isinstance(x, (EvalSample, SampleError)):
        return x
    if isinstance(x, str):
        return SampleError(x)
    if not isinstance(x, dict) or not isinstance(x.get("task_id"), str):
        return EvalSample.parse(x)
    completion, files = x.get("completion"), x.get("files")
    return EvalSample(x["task_id"], completion if isinstance(completion, str) else None,
                      files if isinstance(files, dict) and "completion" not in x else None,
                      x.get("language", "python"))


def answer(task: Task, sample: EvalSample) -> str | dict[str, str | None]:
    """What is graded of `sample`: a function or stdio completion read as every caller
    reads a model's text (`judge.answer.answer_of`: the code of a fenced block, else the
    whole text), a repository answer as given."""
    if sample.completion is not None and task.kind in (TaskKind.FUNCTION, TaskKind.STDIO):
        lang = sample.language if isinstance(sample.language, str) else None
        return answer_of(task, sample.completion, language=lang)
    return sample.answer


def attempt_seed(task: Task, sample: EvalSample, repeat: int) -> int | None:
    """The seed of a function task's attempt (judge/seeds.py): the first repeat in the
    final domain — the same draws as every other grading of this code for the reward —
    and repeat r > 0 in `repeat:r`, so `--repeat`'s determinism report measures how often
    a randomised task disagrees across seeds. Derived where the run is driven (a
    cluster's nodes are sent it), so every node draws alike."""
    if task.kind is not TaskKind.FUNCTION:
        return None
    code = answer(task, sample)
    assert isinstance(code, str)
    return derive_seed(task.task_id, code, FINAL if repeat == 0 else f"repeat:{repeat}")


def _row(sample: EvalSample, grades: list[Grade],
         spec: RewardSpec | None = None, style: tuple[str, ...] | None = None,
         reference: Reference | None = None, lines: int | None = None,
         by_cpu: bool = False) -> GradedRow:
    g = grades[0]
    scores: Scores | None = None
    spec = spec or _BINARY
    if spec.binary:
        rewards = [score(x, spec).reward for x in grades]
    else:  # weighted: style from ruff, efficiency and memory against the reference
        if lines is None:
            lines = max(1, (sample.completion or "").count("\n") + 1)
        s_score = style_score(style, lines) if style is not None else None
        ref = reference or Reference()
        if by_cpu:  # repository tasks: CPU of the whole run, from its cgroup
            ref_ms = ref.cpu_ms if ref.times else None
        else:
            ref_ms = sum(ref.times.values()) if ref.times else None
        ref_mem = ref.peak_memory_bytes if ref.times else None
        scored = [score(x, spec, style=s_score, reference_ms=ref_ms, reference_bytes=ref_mem,
                        by_cpu=by_cpu) for x in grades]
        rewards = [x.reward for x in scored]
        scores = Scores(tuple(style or ()), s_score, scored[0].efficiency, scored[0].memory,
                        ref_mem)
    return GradedRow(
        task_id=sample.task_id, outcome=g.outcome, passed=g.passed, reward=rewards[0],
        message=g.message, flags=g.flags, tests=g.tests, wall_ms=g.wall_ms, scores=scores,
        candidate_cpu_ms=g.candidate_cpu_ms,
        candidate_peak_memory_bytes=g.candidate_peak_memory_bytes, attempts=g.attempts,
        repeats=tuple(Repeat(x.outcome, r)
                      for x, r in zip(grades[1:], rewards[1:], strict=True)),
        deterministic=len({(x.outcome, r) for x, r in zip(grades, rewards,
                                                           strict=True)}) == 1,
        # what a reviewer reads (trialbox audit, /review): the answer as given
        completion=sample.completion,
        files=dict(sample.files) if sample.completion is None and sample.files else None)


def grade_from_json(d: dict[str, Any]) -> Grade:
    """A `Grade` back from its journaled JSON (`store.journal.to_jsonable` of one)."""
    return Grade(task_id=d["task_id"], outcome=Outcome(d["outcome"]),
                 tests=tuple(TestResult(**t) for t in d.get("tests", ())),
                 message=d.get("message", ""), flags=tuple(d.get("flags", ())),
                 wall_ms=d.get("wall_ms", 0.0), candidate_cpu_ms=d.get("candidate_cpu_ms", 0.0),
                 candidate_peak_memory_bytes=d.get("candidate_peak_memory_bytes", 0),
                 attempts=d.get("attempts", 1), seed=d.get("seed"))


def error_row(sample: Sample, message: str) -> GradedRow:
    """The row of a sample that cannot be graded at all (bad JSON, unknown task...)."""
    return GradedRow.error(message, sample.task_id)


class Evaluator:
    """Grades one attempt of one sample at a time, and assembles a sample's row from its
    attempts' grades: what `evaluate` runs `repeat` times per sample, and what a journaled
    run (`trialbox.schedule.evaljob`) runs once per scheduler task.

    Function attempts share `workers` trusted harness sessions (opened by `start`); stdio
    and repository attempts are bounded by `workers` slots. Each candidate attempt gets a
    fresh sandbox of its own. A task's reference solution is measured once per Evaluator,
    when something uses it (scaled time limits, efficiency or memory scores)."""

    def __init__(self, tasks: dict[str, Task], pool: SandboxProvider, *, workers: int = 4,
                 config: JudgeConfig | None = None,
                 stdio_config: StdioJudgeConfig | None = None,
                 repo_config: RepoJudgeConfig | None = None,
                 reward_spec: RewardSpec | None = None):
        if workers < 1:
            raise UsageError("--repeat and --workers must be at least 1")
        self.tasks, self.pool, self.workers = tasks, pool, workers
        self.config, self.stdio_config, self.repo_config = config, stdio_config, repo_config
        self.reward_spec = reward_spec
        self.weighted = reward_spec is not None and not reward_spec.binary
        self.harnesses: asyncio.Queue[Sandbox] = asyncio.Queue()
        self.slots = asyncio.Semaphore(workers)  # stdio and repo attempts need no harness
        self.references: dict[str, asyncio.Future[Reference]] = {}

    async def start(self, attempts: int) -> None:
        """Open the trusted harness sessions (one per worker, at most one per attempt)."""
        if any(t.kind is TaskKind.FUNCTION for t in self.tasks.values()):
            for _ in range(min(self.workers, attempts) or 1):
                self.harnesses.put_nowait(await open_harness(self.pool, self.config))

    async def close(self) -> None:
        while not self.harnesses.empty():
            await self.harnesses.get_nowait().close()

    def check(self, sample: Sample) -> str | None:
        """Why `sample` cannot be graded (it then gets an error row), or None."""
        if isinstance(sample, SampleError):
            return sample.message
        task = self.tasks.get(sample.task_id)
        if task is None:
            return f"unknown task_id {sample.task_id!r}"
        from trialbox.sandbox.image_verify import environment_mismatch
        if why := environment_mismatch(task.image, self.pool.runtime):
            return f"task {sample.task_id!r}: {why}"
        if task.kind is TaskKind.STDIO:
            lang = sample.language
            try:
                if not isinstance(lang, str):
                    raise UnknownLanguage(f"language must be a string, got {lang!r}")
                language(lang)
                if sample.completion is None:
                    raise UsageError("a stdio task's sample needs a \"completion\" string "
                                     "(the program)")
            except UsageError as e:
                return f"task {sample.task_id!r}: {e}"
        elif task.kind is TaskKind.FUNCTION and sample.completion is None:
            return (f"task {sample.task_id!r} is a function task: the sample needs a "
                    "\"completion\" string")
        return None

    async def _style_of(self, completion: str, prompt: str) -> tuple[str, ...] | None:
        """ruff's findings on the completion's own lines (the prompt is the task's), when
        the reward weighs style; ruff parses, never runs, the code (in a thread)."""
        if not self.weighted or self.reward_spec is None or self.reward_spec.style == 0:
            return None
        findings = await asyncio.get_running_loop().run_in_executor(
            None, style_findings, prompt + completion)
        first = prompt.count("\n")
        return tuple(f for f in findings if _finding_line(f) > first)

    def _wants_reference(self, task: Task) -> bool:
        config, stdio_config, spec = self.config, self.stdio_config, self.reward_spec
        scaled = (task.kind is TaskKind.FUNCTION and config is not None
                  and config.time_scale is not None) or (
            task.kind is TaskKind.STDIO and stdio_config is not None
            and stdio_config.time_scale is not None)
        return scaled or (self.weighted and spec is not None
                          and (spec.efficiency > 0 or spec.memory > 0))

    async def _measure(self, task: Task, harness: Sandbox | None) -> Reference:
        """Grade the reference solution once (unscaled limits for stdio)."""
        stdio_config = self.stdio_config
        unscaled = replace(stdio_config, time_scale=None) if stdio_config else None
        g = await grade(task, task.canonical_solution, self.pool, config=self.config,
                        stdio_config=unscaled, repo_config=self.repo_config,
                        harness=harness)
        if not g.passed:
            return Reference()
        return Reference({t.name: t.ms for t in g.tests}, g.candidate_peak_memory_bytes,
                         g.candidate_cpu_ms)

    async def reference_for(self, task: Task,
                            harness: Sandbox | None = None) -> Reference:
        """The reference solution's measurements, once per task, when something uses
        them (scaled time limits, efficiency or memory scores)."""
        if not task.canonical_solution or not self._wants_reference(task):
            return Reference()
        references = self.references
        if task.task_id not in references:
            future = references[task.task_id] = asyncio.get_running_loop().create_future()
            try:
                future.set_result(await self._measure(task, harness))
            except BaseException as e:  # waiters on this task learn it too
                future.set_exception(e)
        return await references[task.task_id]

    async def attempt(self, sample: EvalSample, repeat: int = 0,
                      seed: int | None = None) -> tuple[Grade, Reference]:
        """Grade one attempt (`repeat`) of a sample that `check` accepted; with the
        reference measurements the grade was made against (the row's efficiency and
        memory scores need them again). `seed`: default `attempt_seed`."""
        task = self.tasks[sample.task_id]
        if seed is None:
            seed = attempt_seed(task, sample, repeat)
        judge = functools.partial(grade, task, answer(task, sample), self.pool,
                                  config=self.config, stdio_config=self.stdio_config,
                                  repo_config=self.repo_config,
                                  language=sample.language, seed=seed)
        if task.kind is TaskKind.FUNCTION:  # a shared trusted harness session
            harness = await self.harnesses.get()
            try:
                reference = await self.reference_for(task, harness)
                g = await judge(harness=harness, reference=reference.times)
            finally:
                self.harnesses.put_nowait(harness)
            return g, reference
        async with self.slots:
            reference = await self.reference_for(task)
            g = await judge(reference=reference.times)
        return g, reference

    async def row(self, sample: EvalSample, grades: list[Grade],
                  reference: Reference) -> GradedRow:
        """The output row of a sample from its attempts' grades (in repeat order), with
        the environment (`Runtime.id`) it ran in."""
        return replace(await self._sample_row(sample, grades, reference),
                       environment=self.pool.runtime.id)

    async def _sample_row(self, sample: EvalSample, grades: list[Grade],
                          reference: Reference) -> GradedRow:
        task = self.tasks[sample.task_id]
        spec = self.reward_spec
        completion = answer(task, sample) if sample.completion is not None else ""
        assert isinstance(completion, str)  # function and stdio samples: checked
        if task.kind is TaskKind.FUNCTION:
            return _row(sample, grades, spec,
                        await self._style_of(completion, task.prompt), reference)
        if task.kind is TaskKind.STDIO:
            python = sample.language in ("python", "python3", "py")
            return _row(sample, grades, spec,
                        await self._style_of(completion, "") if python else None,
                        reference)
        style, lines = await self._repo_style(task, sample.answer)
        return _row(sample, grades, spec, style, reference, lines, by_cpu=True)

    async def _repo_style(self, task: Task,
                          answer: Any) -> tuple[tuple[str, ...] | None, int]:
        """ruff's findings on the Python lines the candidate wrote, and how many it wrote."""
        if not self.weighted or self.reward_spec is None or self.reward_spec.style == 0:
            return None, 1
        try:
            tree = (candidate_tree(task, patch=answer) if isinstance(answer, str)
                    else candidate_tree(task, files=answer))
        except TreeError:
            return None, 1  # graded FAILED; its style does not matter
        findings: list[str] = []
        for path, changed in sorted(tree.changed.items()):
            found = await asyncio.get_running_loop().run_in_executor(
                None, style_findings, tree.files[path].decode("utf-8", "replace"))
            findings += [f"{path}: {f}" for f in found if _finding_line(f) in changed]
        return tuple(findings), max(1, sum(len(c) for c in tree.changed.values()))


async def evaluate(tasks: dict[str, Task],
                   samples: Sequence[Sample | dict[str, Any] | str],
                   pool: SandboxProvider, *, repeat: int = 1, workers: int = 4,
                   config: JudgeConfig | None = None,
                   stdio_config: StdioJudgeConfig | None = None,
                   repo_config: RepoJudgeConfig | None = None,
                   reward_spec: RewardSpec | None = None,
                   progress: Callable[[int, int], None] | None = None,
                   ) -> tuple[list[GradedRow], dict[str, Any]]:
    """Grade every sample `repeat` times with `workers` attempts in flight; one row per
    sample, in order (`as_sample` says what a sample may be given as).

    `reward_spec`: binary by default; a weighted spec also runs ruff on each completion
    (style; for repository tasks on the Python lines the candidate wrote), compares a
    passing attempt's time and peak memory with the reference solution's (efficiency,
    memory; measured once per task), and the rows carry those scores."""
    if repeat < 1 or workers < 1:
        raise UsageError("--repeat and --workers must be at least 1")
    ev = Evaluator(tasks, pool, workers=workers, config=config, stdio_config=stdio_config,
                   repo_config=repo_config, reward_spec=reward_spec)
    done = 0
    t0 = time.monotonic()

    async def grade_one(sample: Sample) -> GradedRow:
        nonlocal done
        problem = ev.check(sample)
        if problem is not None:
            row = error_row(sample, problem)
        else:
            assert isinstance(sample, EvalSample)
            grades = []
            reference = Reference()
            for r in range(repeat):
                grade, reference = await ev.attempt(sample, r)
                grades.append(grade)
            row = await ev.row(sample, grades, reference)
        done += 1
        if progress is not None:
            progress(done, len(samples))
        return row

    try:
        await ev.start(len(samples))
        rows = await asyncio.gather(*(grade_one(as_sample(s)) for s in samples))
    finally:
        await ev.close()
    return list(rows), summarize(tasks, list(rows), repeat, time.monotonic() - t0)


def summarize(tasks: dict[str, Task], rows: list[GradedRow], repeat: int,
              wall: float) -> dict[str, Any]:
    """The run's summary from its rows (pass@1 over the graded ones, counts, determinism,
    the visible/hidden gap, canaries); `wall_s` and `graded_per_s` from `wall`."""
    graded = [r for r in rows if r.reward is not None]
    return {
        "samples": len(rows),
        "pass@1": round(sum(r.passed for r in graded) / len(graded), 6) if graded else None,
        "outcomes": dict(Counter(r.outcome.value for r in rows)),
        "outcomes_by_environment": {
            env: dict(Counter(r.outcome.value for r in rows
                              if (r.environment or "") == env))
            for env in sorted({r.environment or "" for r in rows})},
        "excluded": len(rows) - len(graded),
        "flags": dict(Counter(f for r in rows for f in r.flags)),
        "repeat": repeat,
        "deterministic": all(r.deterministic for r in rows),
        "nondeterministic_task_ids": [r.task_id for r in rows if not r.deterministic],
        **_gap(graded),
        "canary_tasks": sum(1 for r in rows if r.task_id in tasks
                            and tasks[r.task_id].canary),
        "canary_passes": sum(1 for r in rows if "canary-passed" in r.flags),
        "wall_s": round(wall, 3),
        "graded_per_s": round(len(rows) * repeat / wall, 2) if wall > 0 else None,
    }


def _gap(graded: list[GradedRow]) -> dict[str, float | None]:
    """Pass rates on visible and hidden tests over the graded rows, and the gap: a policy
    that special-cases the tests it can see passes those and fails the hidden ones."""
    def rate(hidden: bool) -> float | None:
        results = [t.passed for r in graded for t in r.tests if t.hidden is hidden]
        return round(sum(results) / len(results), 6) if results else None
    visible, hidden = rate(False), rate(True)
    gap = round(visible - hidden, 6) if visible is not None and hidden is not None else None
    return {"visible_pass_rate": visible, "hidden_pass_rate": hidden,
            "visible_hidden_gap": gap}


def progress_bar(done: int, total: int) -> None:
    """A one-line progress bar on stderr, only when stderr is a terminal."""
    if not sys.stderr.isatty():
        return
    width = 30
    filled = int(width * done / max(total, 1))
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()
