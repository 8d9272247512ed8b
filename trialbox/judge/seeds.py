"""The seed of a grading: the same code gets the same draws, and no policy can predict them.

A task whose tests draw random inputs (`random` in the trusted harness) is graded with a
seed derived from a secret of the run, the task and the code:

    seed = HMAC-SHA256(secret, domain \\0 task_id \\0 code)[:63 bits]

* **The same code, the same verdict**: re-grading identical code in the run (a retry,
  the service's and eval's repeated submissions, a turn that resubmits its code) draws
  the same inputs, so a rare-wrong answer cannot be re-graded until it is lucky.
* **Unpredictable**: the secret never enters a sandbox, so a policy cannot choose code
  whose draws it knows.
* **Recorded**: every grade carries its seed (`Grade.seed`); re-grading with it gives
  the same draws.
* **Domains keep gradings that must be independent apart**: the agent loop grades its
  turns in the `turn` domain and an episode that stopped on a pass is graded once more
  in the `final` domain, which no turn saw (rollout/agent.py) — so stopping at the first
  pass does not turn the hidden tests into an oracle to sample; `trialbox eval --repeat`
  grades repeat r > 0 in `repeat:r`, so its determinism report still measures how often
  a randomised task disagrees across seeds.

The secret is the process's own (fresh at start), or `TRIALBOX_SEED_SECRET` (hex) where
several processes must agree (a cluster's nodes, a resumed run).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import replace

from trialbox.errors import UsageError
from trialbox.types import Grade, Task, TaskKind

FINAL = "final"
"""The domain of a grading that is the reward (eval's first repeat, the service, the
integrations, an episode's last word)."""
TURN = "turn"
"""The domain of an agent loop's per-turn gradings."""

_ENV = "TRIALBOX_SEED_SECRET"


def _process_secret() -> bytes:
    given = os.environ.get(_ENV)
    if not given:
        return secrets.token_bytes(32)
    try:
        secret = bytes.fromhex(given)
    except ValueError:
        raise UsageError(f"{_ENV} must be hex (e.g. `openssl rand -hex 32`), got "
                         f"{given[:20]!r}") from None
    if len(secret) < 16:
        raise UsageError(f"{_ENV} must hold at least 16 bytes (32 hex digits)")
    return secret


_SECRET: bytes | None = None


def secret() -> bytes:
    """The process's seed secret (read once)."""
    global _SECRET
    if _SECRET is None:
        _SECRET = _process_secret()
    return _SECRET


def derive_seed(task_id: str, code: str, domain: str = FINAL, *,
                key: bytes | None = None) -> int:
    """The 63-bit seed of grading `code` for `task_id` in `domain` (`key`: default the
    process's secret).

    >>> a = derive_seed("T/0", "x", key=b"k" * 16)
    >>> a == derive_seed("T/0", "x", key=b"k" * 16) != derive_seed("T/0", "x ", key=b"k" * 16)
    True
    >>> a != derive_seed("T/0", "x", "turn", key=b"k" * 16)
    True
    """
    msg = b"\0".join((domain.encode(), task_id.encode("utf-8", "surrogatepass"),
                      code.encode("utf-8", "surrogatepass")))
    digest = hmac.new(key if key is not None else secret(), msg, hashlib.sha256).digest()
    return int.from_bytes(digest[:8], "big") >> 1


TURN_PASS_ONLY = "passed-a-turn-only"
"""The flag of a final grade that failed where its turn's grading passed (a randomised
task's draws): the episode ends on it all the same."""


def seed_of(task: Task, code: str, domain: str = FINAL) -> int | None:
    """A function task's seed for `code` in `domain`; None for the other kinds (their
    judges draw nothing at random)."""
    return derive_seed(task.task_id, code, domain) if task.kind is TaskKind.FUNCTION \
        else None


async def turn_grade(judge: Callable[[int | None], Awaitable[Grade]], task: Task,
                     code: str, *, last: bool) -> Grade:
    """The grade of one turn of a multi-turn episode (the agent loop, the gym env, TRL's
    tool env), `judge(seed)` grading `code`. The last turn is graded once in the final
    domain: its grade is the reward whatever it says. An earlier turn is graded in the
    turn domain, and a pass (which ends the episode) once more in the final domain, which
    no turn saw; that grade is the turn's — else stopping at the first pass would sample
    a randomised task's hidden tests until lucky (a deterministic task passes again). A
    final grade that fails carries TURN_PASS_ONLY: the episode ends on it all the same,
    the second grading is the reward, never a second chance."""
    if last:
        return await judge(seed_of(task, code, FINAL))
    grade = await judge(seed_of(task, code, TURN))
    if not (grade.passed and task.kind is TaskKind.FUNCTION):
        return grade
    final = await judge(seed_of(task, code, FINAL))
    return final if final.passed else replace(
        final, flags=tuple(sorted({*final.flags, TURN_PASS_ONLY})))


def ends_episode(grade: Grade) -> bool:
    """Whether a turn's grade ends its episode as a pass would (a pass, or a turn's pass
    that the final grading did not confirm)."""
    return grade.passed or TURN_PASS_ONLY in grade.flags
