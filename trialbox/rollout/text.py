"""What the model reads and writes, as text: the first prompt, the code in its output,
the feedback after a turn. Pure functions, used by the agent loop (agent.py). The code in
a model's text is read by `trialbox.judge.answer.extract_code`, the one reader every
caller shares (re-exported here).

The one rule here: hidden tests never reach the model. `default_prompt` shows the
VISIBLE tests only; `feedback_report` is built from the model's own run, the visible
tests' results and the outcome — a hidden test is never named, quoted or counted.
"""

from __future__ import annotations

from trialbox.judge.answer import extract_code
from trialbox.types import ExecResult, ExecStatus, Grade, Outcome, Task, TaskKind

__all__ = ["clip", "default_prompt", "extract_code", "feedback_report"]


def clip(text: str, limit: int) -> str:
    """`text` cut to about `limit` characters, keeping the head and (mostly) the tail —
    the end of a traceback says what went wrong.

    >>> clip("a" * 10 + "b" * 10, 12)
    'aaa\\n… 11 characters cut …\\nbbbbbbbbb'
    """
    if len(text) <= limit:
        return text
    head = limit // 4
    tail = limit - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n… {cut + 2} characters cut …\n{text[len(text) - tail + 2:]}" \
        if tail > 2 else text[:limit]


def default_prompt(task: Task) -> str:
    """The first prompt: the task, its VISIBLE tests, and the answer format."""
    if task.kind is TaskKind.FUNCTION:
        parts = ["Complete the Python function below. Answer with the whole function in "
                 "one ```python block.\n\n" + task.prompt.rstrip() + "\n"]
        if task.visible_tests:
            parts.append("Tests it must pass (`candidate` is your function):\n"
                         + "\n".join(t.code.strip() for t in task.visible_tests) + "\n")
    else:
        parts = ["Write a program that reads standard input and writes standard output. "
                 "Answer with the whole program in one ```python block.\n\n"
                 + task.prompt.rstrip() + "\n"]
        for t in task.visible_tests:
            parts.append(f"Example input:\n{t.stdin.decode(errors='replace')}\n"
                         f"Expected output:\n{t.expected.decode(errors='replace')}\n")
    return "\n".join(parts) + "\n"


def wrap_feedback(report: str) -> str:
    """The default framing of a feedback report in the context."""
    return (f"\n\nFeedback:\n{report.rstrip()}\n\nFix the code and answer again with the "
            "whole solution in one ```python block.\n\n")


def exec_summary(r: ExecResult | None) -> str:
    """A compact account of a run: status, exit code, the tail of stderr."""
    if r is None:
        return ""
    head = r.status.value + (f" (exit {r.exit_code})" if r.exit_code not in (None, 0) else "")
    if r.message:
        head += f": {r.message}"
    err = (r.compile.stderr_text if r.compile is not None and not r.compile.ok
           else r.stderr_text).strip()
    return head + (f"\n{clip(err, 600)}" if err else "")


def feedback_report(task: Task, code: str | None, run: ExecResult | None,
                    grade: Grade | None, limit: int) -> str:
    """What the model is told about one turn. Built only from what it may see: its own
    run (status, stderr), the VISIBLE tests (their code and failure messages) and the
    outcome. Hidden tests are never named, quoted or counted one by one; at most the
    model learns that the code "fails tests you cannot see".

    Worked example (a function task whose visible test `assert candidate(2) == 4`
    fails): "Visible tests failed: 1 of 1\\n- assert candidate(2) == 4: assertion failed".
    """
    if code is None:
        return "No code found. Write the solution in one ```python block."
    lines: list[str] = []
    if run is not None and run.status is not ExecStatus.OK:
        lines.append("Running your code: " + exec_summary(run))
    if grade is not None:
        visible = [t for t in grade.tests if not t.hidden]
        failed = [t for t in visible if not t.passed]
        code_of = {t.name: t.code.strip() for t in task.visible_tests}
        if grade.outcome is Outcome.CHEAT:
            lines.append("The solution was rejected: it tampers with the test machinery "
                         f"({', '.join(grade.flags)}).")
        elif failed and not lines:
            lines.append(f"Visible tests failed: {len(failed)} of {len(visible)}")
            messages = {t.message for t in failed}
            if len(failed) > 1 and len(messages) == 1:  # e.g. the solution did not load
                lines.append(f"- all of them: {clip(messages.pop() or 'failed', 600)}")
            else:
                for t in failed[:5]:
                    what = code_of.get(t.name) or t.name
                    lines.append(f"- {clip(what, 200)}: {clip(t.message or 'failed', 300)}")
                if len(failed) > 5:
                    lines.append(f"- … and {len(failed) - 5} more")
        elif failed:
            lines.append(f"Visible tests failed: {len(failed)} of {len(visible)}.")
        elif not grade.passed:
            why = {Outcome.TIMEOUT: " (it ran out of time)",
                   Outcome.MEMORY: " (it ran out of memory)"}.get(grade.outcome, "")
            lines.append(("All visible tests pass, but the" if visible else "The")
                         + f" solution is not accepted{why}: it fails tests you cannot see.")
    return clip("\n".join(lines) or "The solution is not accepted.", limit)
