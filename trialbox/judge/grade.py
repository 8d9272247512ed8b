"""The judge's one entry point: `grade(task, answer, provider)` picks the grader for the
task's kind, once, for every caller (eval, the integrations, the agent loop, the service).

    provider = await CellPool(judge_pool_config()).start()   # or any SandboxProvider
    g = await grade(task, completion, provider)               # -> Grade
    r = reward(g, RewardSpec())                               # judge/reward.py

    kind       grader                        the answer
    function   function.judge_function       completion appended to the prompt
    stdio      stdio.judge_stdio             the whole program, in `language`
    repo       repo.judge_repo               a unified diff, or {path: text | None}

A sandbox that cannot be had (the provider raised an `InfraError` on `open`) is an
INFRA grade — excluded, reward None, never 0.0 — except `SandboxUnavailable`: a tier
this node does not offer is the configuration's problem and is raised, so a run fails
at once instead of excluding every attempt. Caller mistakes raise `UsageError`.

An answer that is not text (a lone surrogate such as "\\ud800" cannot be written as
UTF-8, so no interpreter or compiler can read it) is that answer's failure: FAILED,
with the position in the message — never an exception that loses the other samples of
a batch, and never an exclusion.
"""

from __future__ import annotations

from collections.abc import Mapping

from trialbox.errors import InfraError, SandboxUnavailable, UsageError
from trialbox.judge.function import JudgeConfig, judge_function
from trialbox.judge.repo import Answer, RepoJudgeConfig, judge_repo
from trialbox.judge.stdio import StdioJudgeConfig, judge_stdio
from trialbox.sandbox.base import Sandbox, SandboxProvider
from trialbox.types import Grade, Outcome, Task, TaskKind

__all__ = ["grade"]


async def grade(task: Task, answer: Answer,
                provider: SandboxProvider, *,
                config: JudgeConfig | None = None,
                stdio_config: StdioJudgeConfig | None = None,
                repo_config: RepoJudgeConfig | None = None,
                language: str = "python",
                harness: Sandbox | None = None,
                reference: Mapping[str, float] | None = None,
                seed: int | None = None) -> Grade:
    """The trusted grade of `answer` to `task`, judged in sandboxes from `provider`.

    `config` / `stdio_config` / `repo_config`: the settings of the function, stdio and
    repository judges (each judge's defaults when None; only the one of the task's kind
    is used). `language`: a stdio program's language. `harness`: a function task's
    shared trusted harness session (`function.open_harness`), saving a sandbox per
    attempt. `reference`: per-test times of the reference solution, for a scaled time
    limit (`time_scale`; function and stdio tasks). `seed`: the function harness's
    `random` seed (re-grading a grade with its `Grade.seed`)."""
    if not isinstance(task, Task):
        raise UsageError(f"grade needs a trialbox.types.Task, got {type(task).__name__}")
    times = dict(reference) if reference else None
    if (why := _not_text(answer)) is not None:  # the sample's own failure, graded
        return Grade(task.task_id, Outcome.FAILED, message=why)
    try:
        if task.kind is TaskKind.FUNCTION:
            if not isinstance(answer, str):
                raise UsageError(f"{task.task_id}: a function task's answer is the "
                                 f"completion (a str), got {type(answer).__name__}")
            return await judge_function(task, answer, provider, config, harness, times,
                                        seed)
        if task.kind is TaskKind.STDIO:
            if not isinstance(answer, str):
                raise UsageError(f"{task.task_id}: a stdio task's answer is the program "
                                 f"(a str), got {type(answer).__name__}")
            return await judge_stdio(task, answer, provider, stdio_config, language, times)
        if task.kind is TaskKind.REPO:
            return await judge_repo(task, answer, provider, repo_config)
    except SandboxUnavailable:
        raise
    except InfraError as e:
        return Grade(task.task_id, Outcome.INFRA, message=f"the judge's sandbox: {e}")
    raise UsageError(f"{task.task_id}: no grader for task kind {task.kind.value!r}")


def _not_text(answer: object) -> str | None:
    """Why `answer` (a str, or a repository overlay's paths and texts) cannot be written
    as UTF-8, or None."""
    texts = [answer] if isinstance(answer, str) else [
        x for kv in answer.items() for x in kv if isinstance(x, str)] \
        if isinstance(answer, dict) else []
    for text in texts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            return (f"the answer is not valid text: {text[e.start]!r} at character "
                    f"{e.start} is a lone surrogate, which UTF-8 cannot encode (no "
                    "interpreter or compiler can read it; the answer fails)")
    return None
