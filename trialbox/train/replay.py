"""Self-imitation: judge-verified answers of earlier steps, replayed as positive samples.

GRPO learns only from groups whose samples disagree: when every sample of a task is
right (or every one wrong) the group's advantages are all 0 and the task says nothing to
the update. On a small model the rest of the batch's updates then move the weights under
what it already solved, and a template it got right can drift away (the demo's
`min(x, k)` went 9/14 -> 0/14 on seed 0 in session 4). `[grpo] replay = N` keeps the
judge-passed first-turn answers of earlier steps (training tasks only: the held-out split
is never rolled out) and adds N of them to each update as a likelihood term,
`replay_coef x mean NLL` of their output tokens: self-imitation learning (Oh et al.,
2018), here with the judge as the filter (RAFT/ReST-style: only answers the judge
passed are imitated). A wrong answer never enters the buffer, so the term cannot anchor
a bug the way a KL to the warm start does.

Only episodes whose *first* turn passed are kept: a second-turn pass carries a wrong
first turn in its loss mask. One copy of each distinct (task, answer) pair is kept (a
group of eight right answers is one entry); the buffer is first in, first out. It is not
saved in checkpoints: a resumed run starts with an empty buffer.
"""

from __future__ import annotations

import random
from collections import OrderedDict

from trialbox.types import Outcome, Trajectory


class SuccessReplay:
    """The last `capacity` distinct judge-passed first-turn answers."""

    def __init__(self, capacity: int, seed: int = 0):
        self.capacity = capacity
        self.seed = seed
        self._items: OrderedDict[tuple[str, tuple[int, ...]], Trajectory] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def add(self, trajs: list[Trajectory]) -> int:
        """Keep the trajectories whose first turn the judge passed; returns how many
        entries were new."""
        new = 0
        for t in trajs:
            if not (t.passed and t.reward is not None and len(t.turns) == 1
                    and t.turns[0].outcome is Outcome.PASSED):
                continue
            key = (t.task_id, t.token_ids)
            if key in self._items:
                self._items.move_to_end(key)
                continue
            self._items[key] = t
            new += 1
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)
        return new

    def sample(self, n: int, step: int) -> list[Trajectory]:
        """Up to `n` distinct entries, drawn uniformly; a function of (seed, step) and
        the buffer's content."""
        items = list(self._items.values())
        if len(items) <= n:
            return items
        return random.Random(self.seed * 1_000_003 + step).sample(items, n)
