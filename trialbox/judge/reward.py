"""Rewards: turning a `Grade` (and optional style / efficiency scores) into one number.

Each component is a small pure function with a value in [0, 1]; `reward` combines them
under a `RewardSpec`, chosen once when the trainer or `trialbox eval` is set up, and
`score` is the one composition every caller uses (it measures efficiency and memory
against the reference, and takes the multi-turn penalty off):

    pass rate      grade.pass_rate                       (tests passed / tests)
    all passed     1.0 if grade.passed else 0.0          (a bonus for a full pass)
    style          style_score(style_findings(src), n)  (ruff E/F/W findings per line)
    efficiency     efficiency_score(cand_ms, ref_ms)     (runtime against the reference)
    memory         memory_score(cand_bytes, ref_bytes)   (peak memory against the reference)

Exclusion is not a score: INFRA and ERROR grades get None (never 0.0), whatever the spec.
Everything else the candidate did is scored, and a CHEAT scores 0.0 whatever the tests
said. The style checker cannot be turned against this either: a source that makes ruff
fail or time out gets a `RUFF_FAILED` finding (style 0.0), never an infrastructure error;
an `InfraError` is raised only when ruff also fails on trivial code.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass, fields

from trialbox.errors import InfraError, UsageError
from trialbox.telemetry import traced_reward
from trialbox.types import Grade, Outcome


@dataclass(frozen=True)
class RewardSpec:
    """How a grade becomes a reward. The default is binary: 1.0 for a pass, else 0.0."""

    pass_rate: float = 1.0
    """Weight of the fraction of tests passed (weighted specs only)."""
    all_passed: float = 0.0
    """Weight of a bonus component that is 1.0 only when every test passed."""
    style: float = 0.0
    """Weight of the style score (`style_score`; ruff findings per line)."""
    efficiency: float = 0.0
    """Weight of the efficiency score (`efficiency_score`; runtime against the reference)."""
    memory: float = 0.0
    """Weight of the memory score (`memory_score`; peak memory against the reference)."""
    binary: bool = True
    """1.0 if the grade passed else 0.0 (the usual RL choice); False: weighted mean."""
    turn_penalty: float = 0.0
    """Subtracted from an episode's reward per turn after the first (`score(turns=)`;
    multi-turn agent episodes); 0: no penalty. Not a weight: binary specs take it too."""

    def __post_init__(self) -> None:
        tp = self.turn_penalty
        if isinstance(tp, bool) or not isinstance(tp, (int, float)) or not 0 <= tp <= 1:
            raise UsageError(f"RewardSpec: turn_penalty={tp!r} must be a number in [0, 1]")
        weights = [(f.name, getattr(self, f.name)) for f in fields(self)
                   if f.name not in ("binary", "turn_penalty")]
        for name, w in weights:
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) \
                    or w < 0:
                raise UsageError(f"RewardSpec: {name}={w!r} must be a finite number >= 0")
        if not any(w > 0 for _, w in weights):
            raise UsageError("RewardSpec: every weight is 0; give at least one of "
                             "pass_rate, all_passed, style, efficiency, memory a weight > 0")
        if not self.binary and self.pass_rate + self.all_passed == 0:
            raise UsageError("RewardSpec: a weighted spec must weigh the tests: give "
                             "pass_rate or all_passed a weight > 0 (a reward that weighs "
                             "only style, efficiency or memory ranks wrong answers above "
                             "right ones)")
        if self.binary:
            extra = [f"{name}={w!r}" for name, w in weights if name != "pass_rate" and w != 0]
            if extra:
                raise UsageError(f"RewardSpec: binary=True ignores {', '.join(extra)}; set "
                                 "binary=False for a weighted reward, or set those to 0")


# --------------------------------------------------------------------------- style

RUFF_TIMEOUT_S = 10.0
RUFF_ARGS = ("check", "--stdin-filename", "solution.py", "--output-format", "json",
             "--select", "E,F,W", "--isolated", "-")
RUFF_FAILED = "ruff-failed"
"""The code of the finding reported when ruff cannot check a source (crash, timeout):
`style_score` scores such a source 0.0."""


def ruff_path() -> str:
    """The `ruff` executable of this interpreter's environment (beside `sys.executable`)."""
    return os.path.join(os.path.dirname(sys.executable), "ruff")


def _run_ruff(source: str) -> list[dict[str, object]] | str:
    """ruff's findings for `source`, or a string saying why there are none (ruff only
    parses the code; it never runs it)."""
    exe = ruff_path()
    if not os.access(exe, os.X_OK):
        raise UsageError(f"style findings need ruff, and {exe} is missing: install it into "
                         f"this environment ({os.path.dirname(exe)}/pip install ruff)")
    # ruff refuses invalid UTF-8 outright; replace such bytes so only the candidate's
    # code, not its encoding, decides the findings.
    data = source.encode("utf-8", errors="replace")
    try:
        p = subprocess.run([exe, *RUFF_ARGS], input=data, capture_output=True,
                           timeout=RUFF_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return f"ruff did not finish in {RUFF_TIMEOUT_S:g} s"
    except OSError as e:
        return f"ruff could not start: {e}"
    if p.returncode not in (0, 1):  # 0: clean, 1: findings, 2: ruff itself failed
        return f"ruff exited {p.returncode}: {p.stderr.decode(errors='replace').strip()}"
    try:
        found = json.loads(p.stdout)
    except ValueError:
        return "ruff printed something other than JSON"
    if not isinstance(found, list) or not all(isinstance(d, dict) for d in found):
        return "ruff printed JSON of an unexpected shape"
    return found


def style_findings(source: str) -> tuple[str, ...]:
    """Ruff's pycodestyle/pyflakes findings (E, F, W; default settings, line length 88)
    for `source`, as "CODE line: message" strings in source order.

    >>> style_findings("import os\\n")
    ('F401 1: `os` imported but unused',)

    A source ruff cannot check (it crashes or takes over `RUFF_TIMEOUT_S`) gets one
    `RUFF_FAILED` finding, unless ruff also fails on trivial code: then the machinery is
    broken and `InfraError` is raised. A missing ruff is a `UsageError` naming the fix."""
    found = _run_ruff(source)
    if isinstance(found, str):
        if isinstance(_run_ruff("x = 1\n"), str):
            raise InfraError(f"ruff fails even on trivial code: {found}")
        return (f"{RUFF_FAILED} 0: {found}",)
    out = []
    for d in found:
        loc = d.get("location")
        row = loc.get("row") if isinstance(loc, dict) else None
        out.append(f"{d.get('code')} {row if isinstance(row, int) else 0}: {d.get('message')}")
    return tuple(out)


def style_score(findings: tuple[str, ...] | list[str], lines: int) -> float:
    """1 - findings per 10 lines, clamped to [0, 1]; 0.0 if ruff could not check the
    source. `lines`: the source's line count (`len(source.splitlines())`).

    >>> style_score(("F401 1: `os` imported but unused",), 20)  # 0.5 per 10 lines
    0.5"""
    if any(f.startswith(RUFF_FAILED + " ") for f in findings):
        return 0.0
    return min(1.0, max(0.0, 1.0 - 10.0 * len(findings) / max(lines, 1)))


# --------------------------------------------------------------------------- efficiency

def efficiency_score(candidate_ms: float, reference_ms: float | None) -> float | None:
    """1.0 when the candidate is at least as fast as the reference, else
    reference_ms / candidate_ms (twice as slow: 0.5); None when there is no reference.

    >>> efficiency_score(40.0, 10.0)
    0.25"""
    if reference_ms is None:
        return None
    if math.isnan(candidate_ms) or candidate_ms < 0:
        raise UsageError(f"efficiency_score: candidate_ms={candidate_ms!r} must be >= 0")
    if not math.isfinite(reference_ms) or reference_ms < 0:
        raise UsageError(f"efficiency_score: reference_ms={reference_ms!r} must be finite "
                         "and >= 0")
    if candidate_ms <= reference_ms:
        return 1.0
    return reference_ms / candidate_ms  # candidate_ms > reference_ms >= 0; inf → 0.0


def memory_score(candidate_bytes: int, reference_bytes: int | None) -> float | None:
    """1.0 when the candidate's peak memory is at most the reference's, else
    reference_bytes / candidate_bytes (twice the memory: 0.5); None when there is no
    reference. Both are the peak of the run's cgroup, measured from outside, so they
    include the interpreter's own footprint: only real excess lowers the score.

    >>> memory_score(64 << 20, 16 << 20)
    0.25"""
    if reference_bytes is None:
        return None
    for name, v in (("candidate_bytes", candidate_bytes), ("reference_bytes",
                                                            reference_bytes)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise UsageError(f"memory_score: {name}={v!r} must be an int >= 0")
    if candidate_bytes <= reference_bytes:
        return 1.0
    return reference_bytes / candidate_bytes


# --------------------------------------------------------------------------- reward

@traced_reward  # span judge.reward, reward histogram (telemetry)
def reward(grade: Grade, spec: RewardSpec, *, style: float | None = None,
           efficiency: float | None = None, memory: float | None = None) -> float | None:
    """The reward for `grade` under `spec`, in [0, 1], or None when the grade is excluded.

    * INFRA or ERROR (the machinery, or the task's own tests, failed): None, never 0.0.
    * CHEAT: 0.0, whatever the tests, the style or the efficiency said.
    * binary spec: 1.0 if the grade passed, else 0.0.
    * weighted spec, a pass: the weighted mean of the components present — pass rate
      (1.0), all passed (1.0), `style`, `efficiency`, `memory`. A component whose weight
      is > 0 but whose value is None (not measured, or no reference runtime) is dropped
      from the mean, weight and all, so a missing score neither helps nor hurts. The
      least a pass can score is therefore FLOOR = (pass_rate + all_passed weights) /
      (all the weights): every other component at 0.
    * weighted spec, not a pass: partial credit strictly below FLOOR — FLOOR times the
      weighted mean of its pass rate, all passed (0.0) and `style`, where a pass rate
      of 1.0 without a pass (every test passed but the run did not end cleanly) counts
      as (n-1)/n. Efficiency and memory are a pass's alone. So **every answer that
      passes scores above every answer that does not**: a 12-of-13 wrong answer never
      outranks a slow correct one (before, failing exempted an answer from the
      efficiency and memory terms, and it did).

    Worked example: spec = RewardSpec(pass_rate=2, all_passed=1, style=0.5,
    efficiency=0.5, binary=False), so FLOOR = (2 + 1) / 4 = 0.75. A PASSED grade with
    style=0.8, efficiency=0.2: (2 + 1 + 0.4 + 0.1) / 4 = 0.875. A FAILED grade with 3
    of 4 tests passed and style=0.8: 0.75 * (2 * 0.75 + 0 + 0.5 * 0.8) / 3.5 = 0.4071...
    """
    if grade.outcome in (Outcome.INFRA, Outcome.ERROR):
        return None
    if grade.outcome is Outcome.CHEAT:
        return 0.0
    if spec.binary:
        return 1.0 if grade.passed else 0.0
    for name, v in (("style", style), ("efficiency", efficiency), ("memory", memory)):
        if v is not None and not 0.0 <= v <= 1.0:
            raise UsageError(f"reward: {name}={v!r} must be in [0, 1] (or None)")
    total: float = sum(getattr(spec, f) for f in _WEIGHTS)
    floor = (spec.pass_rate + spec.all_passed) / total  # > 0: __post_init__
    if grade.passed:
        parts = [(spec.pass_rate, 1.0), (spec.all_passed, 1.0), (spec.style, style),
                 (spec.efficiency, efficiency), (spec.memory, memory)]
        present = [(w, v) for w, v in parts if w > 0 and v is not None]
        return min(1.0, sum(w * v for w, v in present) / sum(w for w, _ in present))
    n = len(grade.tests)
    rate = min(grade.pass_rate or 0.0, (n - 1) / n if n else 0.0)
    parts = [(spec.pass_rate, rate), (spec.all_passed, 0.0), (spec.style, style)]
    present = [(w, v) for w, v in parts if w > 0 and v is not None]
    mean = sum(w * v for w, v in present) / sum(w for w, _ in present)
    return floor * mean


_WEIGHTS = ("pass_rate", "all_passed", "style", "efficiency", "memory")
"""RewardSpec's weight fields."""


@dataclass(frozen=True)
class Scored:
    """A grade's reward under a spec, with the components it was composed from (None:
    not measured — binary specs, a failed attempt, no reference)."""

    reward: float | None
    """The reward; None when the grade is excluded (INFRA, ERROR)."""
    style: float | None
    """The style score given to `score`."""
    efficiency: float | None
    """Efficiency against the reference (weighted specs, passing attempts)."""
    memory: float | None
    """Peak memory against the reference (weighted specs, passing attempts)."""


def score(grade: Grade, spec: RewardSpec, *, style: float | None = None,
          reference_ms: float | None = None, reference_bytes: int | None = None,
          by_cpu: bool = False, turns: int = 1) -> Scored:
    """The reward of `grade` under `spec`: the one place rewards are composed.

    Weighted specs: a passing attempt's efficiency is its time against `reference_ms`
    (the sum of its per-test times; `by_cpu`: its sandbox's CPU time, for repository
    tasks whose per-test times come from inside the candidate), its memory score its
    sandbox's peak against `reference_bytes`; `style` is given (`style_score`). Then
    `spec.turn_penalty` per turn after the first comes off a reward that is not None.

    >>> score(Grade("t", Outcome.PASSED), RewardSpec(turn_penalty=0.25), turns=3).reward
    0.5"""
    if isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
        raise UsageError(f"score: turns={turns!r} must be an int >= 1")
    eff = mem = None
    if spec.binary:
        r = reward(grade, spec)
    else:
        if grade.passed:
            cand_ms = grade.candidate_cpu_ms if by_cpu else sum(t.ms for t in grade.tests)
            eff = efficiency_score(cand_ms, reference_ms)
            mem = memory_score(grade.candidate_peak_memory_bytes, reference_bytes)
        r = reward(grade, spec, style=style, efficiency=eff, memory=mem)
    if r is not None and turns > 1:
        r -= spec.turn_penalty * (turns - 1)
    return Scored(r, style, eff, mem)
