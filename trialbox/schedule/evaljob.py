"""`trialbox eval --db FILE`: every graded attempt (sample × repeat) is a task of the
journaled scheduler, so an evaluation can be watched (`trialbox tasks status RUN --db
FILE`) and finished after a crash (`--resume`).

* Task ids are `s<sample index>.r<repeat>:<task_id>`; the payload names the sample (its
  index among the samples file's non-blank lines) and the repeat. Samples that cannot be
  graded at all (bad JSON, unknown task) get their error row and no scheduler task.
* One attempt: QUEUED -> GENERATING -> GRADING (the judge runs) -> DONE with the attempt's
  binary reward. Its grade, and the reference measurements it was graded against, are
  journaled (`grades`) before the task is final. An attempt whose verdict is excluded
  (INFRA, or ERROR: the task's own tests failed) returns None and is retried at most
  `max_retries` times, then FAILED; its last grade is still what its row shows.
* Resume: the scheduler's recovery re-queues the attempts that were in flight; an attempt
  whose grade (non-excluded) was journaled before the crash is not graded again: the job
  returns the stored grade's reward. The rows are assembled from the journal's grades
  only, in input order, after every attempt is final: an interrupted run and an
  uninterrupted one give equal rows for deterministic samples (timings aside).
* The run's config records a fingerprint of its inputs (samples file, task ids, repeat,
  reward, time scale, amplified tests); `--resume` with other inputs is refused, naming
  what differs.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from trialbox.errors import UsageError
from trialbox.judge.evaluate import (
    Evaluator,
    Reference,
    as_sample,
    error_row,
    grade_from_json,
    reward_of,
    summarize,
)
from trialbox.schedule.scheduler import Scheduler, SchedulerConfig, TaskContext, TaskSpec
from trialbox.store.journal import MEMORY, Journal
from trialbox.types import EvalSample, Grade, GradedRow, Outcome, Sample

KIND = "eval"


def inputs_fingerprint(samples: bytes, task_ids: Sequence[str],
                       **options: Any) -> dict[str, Any]:
    """What identifies an eval run's inputs: the samples file's content hash, a hash of
    the task set's ids, and the options that change grades or rows."""
    ids = hashlib.sha256("\n".join(sorted(task_ids)).encode()).hexdigest()
    return {"samples_sha256": hashlib.sha256(samples).hexdigest(), "tasks_sha256": ids,
            **options}


def attempt_id(index: int, repeat: int, task_id: str) -> str:
    return f"s{index}.r{repeat}:{task_id}"


@dataclass
class EvalRunInfo:
    run_id: str
    resumed: bool
    graded_now: int = 0
    """Attempts the judge graded in this process."""
    read_back: int = 0
    """Attempts whose grade was read back from the journal (graded before a crash)."""


def open_run(db: str, run_id: str, fingerprint: dict[str, Any],
                  resume: bool) -> Journal:
    """Open the journal for this run, refusing (before anything is written) a run that
    is missing on --resume, present without --resume, or made from other inputs."""
    if resume and not os.path.exists(db):
        raise UsageError(f"--resume: no journal at {db!r}; pass the --db of the eval run "
                         "to finish, or drop --resume to start a new run there")
    journal = Journal(db)
    try:
        config = journal.run_config(run_id)
        if resume and config is None:
            runs = [r[0] for r in journal.conn.execute("SELECT run_id FROM runs")]
            raise UsageError(f"--resume: journal {db!r} has no run {run_id!r} to resume "
                             f"(its runs: {', '.join(runs) or 'none'}); pass --run NAME of "
                             "the run to finish, or drop --resume to start it")
        if config is not None and not resume:
            raise UsageError(f"journal {db!r} already holds run {run_id!r}; pass --resume "
                             "to finish it, or start a new run with --run NAME or "
                             "another --db")
        if config is not None:
            if config.get("kind") != KIND:
                raise UsageError(f"run {run_id!r} in {db!r} is not an eval run (it is "
                                 f"{config.get('kind', 'a scheduler run')!r}); pass the "
                                 "--run of an eval run")
            stored = config.get("inputs", {})
            differ = sorted(k for k in set(stored) | set(fingerprint)
                            if stored.get(k) != fingerprint.get(k))
            if differ:
                raise UsageError(
                    f"--resume: run {run_id!r} in {db!r} was made from other inputs: "
                    f"{', '.join(differ)} differ (stored {[stored.get(k) for k in differ]}, "
                    f"now {[fingerprint.get(k) for k in differ]}); resume with the same "
                    "--tasks, --samples, --repeat, --reward, --time-scale and --amplified, "
                    "or start a new run with --run NAME or another --db")
    except BaseException:
        journal.close()
        raise
    return journal


async def evaluate_journaled(journal: Journal, run_id: str, evaluator: Evaluator,
                             given: Sequence[Sample | dict[str, Any]], *, repeat: int,
                             fingerprint: dict[str, Any], resume: bool = False,
                             max_retries: int = 2,
                             progress: Callable[[int, int], None] | None = None,
                             ) -> tuple[list[GradedRow], dict[str, Any], EvalRunInfo]:
    """Grade every sample `repeat` times as scheduler tasks journaled under `run_id` in
    `journal` (from `open_run`, which checked the run against the inputs), then assemble
    the rows (input order) and the summary from the journal. `evaluator.workers`
    attempts are in flight at once (the scheduler's slots)."""
    if repeat < 1:
        raise UsageError("--repeat and --workers must be at least 1")
    if not isinstance(run_id, str) or not run_id:
        raise UsageError("--run must be a non-empty name")
    t0 = time.monotonic()
    info = EvalRunInfo(run_id, resume)
    samples = [as_sample(s) for s in given]
    problems = [evaluator.check(s) for s in samples]
    specs = [TaskSpec(attempt_id(i, r, s.task_id),
                      payload={"sample": i, "repeat": r, "task_id": s.task_id})
             for i, s in enumerate(samples)
             if problems[i] is None and isinstance(s, EvalSample)
             for r in range(repeat)]
    journal.add_run(run_id, {"kind": KIND, "inputs": fingerprint,
                             "attempts": len(specs), "repeat": repeat})
    info.read_back = len(journal.results_of(run_id))  # final before this process
    done = 0

    async def job(ctx: TaskContext) -> float | None:
        nonlocal done
        await ctx.grading()
        stored = journal.grades_of(run_id, ctx.task_id)
        if stored:  # graded before a crash that came before its DONE was committed
            last = stored[max(stored)]
            earlier = reward_of(grade_from_json(last["grade"]))
            if earlier is not None:
                info.read_back += 1
                return earlier
        payload: dict[str, Any] = ctx.payload  # type: ignore[assignment]
        sample = samples[payload["sample"]]
        assert isinstance(sample, EvalSample)
        grade, reference = await evaluator.attempt(sample, payload["repeat"])
        await ctx.record_grade({"grade": grade, "reference": reference})
        info.graded_now += 1
        done += 1
        if progress is not None:
            progress(done, len(specs))
        return reward_of(grade)  # None (excluded): retried, then FAILED

    config = SchedulerConfig(max_active=evaluator.workers, preempt=False,
                             max_retries=max_retries, backoff_s=0.2, backoff_max_s=2.0)
    await evaluator.start(len(specs))
    try:
        async with Scheduler(journal, run_id, job, config) as sched:
            await sched.submit(specs)
            await sched.drain()
    finally:
        await evaluator.close()
    finished = journal.results_of(run_id)
    grades = journal.grades_of(run_id)
    rows: list[GradedRow] = []
    for i, sample in enumerate(samples):
        problem = problems[i]
        if problem is not None:
            rows.append(error_row(sample, problem))
            continue
        assert isinstance(sample, EvalSample)
        attempt_grades: list[Grade] = []
        reference: Reference | None = None
        for r in range(repeat):
            tid = attempt_id(i, r, sample.task_id)
            state, attempt, _, cause = finished[tid]
            # its last grade: of its final attempt, or of an earlier one whose DONE a
            # crash cut off (the job then returned that grade's reward)
            mine = [a for (t, a) in grades if t == tid and a <= attempt]
            data = grades[(tid, max(mine))] if mine else None
            if data is None:  # timed out or broke before the judge gave a verdict
                attempt_grades.append(Grade(sample.task_id, Outcome.INFRA,
                                            message=f"attempt {state} ({cause}) "
                                            "without a grade"))
                continue
            attempt_grades.append(grade_from_json(data["grade"]))
            if reference is None:
                reference = Reference(**data["reference"])
        rows.append(await evaluator.row(sample, attempt_grades,
                                        reference or Reference()))
    summary = summarize(evaluator.tasks, rows, repeat, time.monotonic() - t0)
    db = None if journal.path == MEMORY else journal.path  # None: held in memory only
    return rows, {"run": run_id, "db": db, **summary}, info
