"""The demo task family: write a one-line Python function from input/output examples.

Each task hides a program from a small DSL (`x + k`, `x * a + b`, `abs(x - k)`,
`max(x, k)`, `x[::-1]`, `x.upper()`, …). The prompt shows three examples; the reward
comes from the trusted judge running six hidden tests in real sandboxes (the examples
are also the task's visible tests, so special-casing them shows up as a gap):

    def f(x):
        # f(3) == 7; f(-2) == 2; f(0) == 4
        return

and the model completes the line (`x + 4`). Tasks are ordinary `Task`s of kind
FUNCTION, judged like HumanEval: the completion is appended to the prompt.

Splits. A task's split follows a hash of its prompt (its three examples), fixed once and
independent of any seed: ~1/4 of all prompts are held out and never trained on, the
rest are for training. Both draw from every program of the DSL (136), so the held-out
set measures what the policy does on examples it has never seen, of the same family.
The held-out prompts are measured two ways (`heldout_validation`, `heldout_test`): the
*validation* split (500 draws of seed 12345: what every recipe in docs/training.md was
tuned on) and the *test* split (draws of another seed, each prompt once, none of them a
validation prompt, none sharing two of its three examples with a prompt the run trains
on; `HeldOutTest` counts what was removed). That last rule removes every integer task:
their first two examples are always f(0) and f(1), and a run's ~3,000 training prompts
hold every integer program with them, so the test split is the string tasks'. (Until
2026-11-30 the split was by *program*: that taught the model a rule that is not there —
"template T never comes with constant c" — and held-out programs with a constant scored
~0 whatever the training did; docs/training.md.)

The teacher. The supervised warm start imitates an *unverified teacher*
(`sft_pairs(..., teacher_error=p)`): for twelve templates it writes, with probability p,
one of the classic bugs of `TEACHER_BUGS` instead (an index off by one, `[:-1]` for
`[::-1]`, `x ^ 2` for `x * x`, `k - x` for `x - k`, ...). Imitation learns those bugs as
habits; the judge's reward is what can take them out again. Task generation is seeded:
the same seed gives the same tasks, byte for byte.
"""

from __future__ import annotations

import ast
import enum
import functools
import hashlib
import random
import re
import string
from collections.abc import Callable
from dataclasses import dataclass, replace

from trialbox.errors import UsageError
from trialbox.types import Task, TaskKind, TestCase

ENTRY_POINT = "f"
SHOWN = 3
"""Examples shown in the prompt (the task's visible tests)."""
HIDDEN = 6
"""Hidden tests the reward is computed from."""


class Split(enum.Enum):
    TRAIN = "train"
    HELDOUT = "heldout"


@dataclass(frozen=True)
class Program:
    """One hidden program: its source expression and the kind of input it takes."""

    expr: str
    arg: str
    """`int` or `str`: what the inputs are."""
    template: str = ""
    """The DSL template it was made from (`x + {0}`); no `{` means no constant."""

    @property
    def has_constant(self) -> bool:
        return "{" in self.template

    def __call__(self, x: object) -> object:
        return _compiled(self.expr)(x)


@functools.cache
def _compiled(expr: str) -> Callable[[object], object]:
    fn: Callable[[object], object] = eval(f"lambda x: {expr}")  # our own DSL, trusted
    return fn


# template, constants it takes (each a range), argument kind. Ranges are chosen so the
# examples usually identify the program (negative inputs separate max/abs from +).
_INT_TEMPLATES: list[tuple[str, list[range]]] = [
    ("x + {0}", [range(1, 10)]),
    ("x - {0}", [range(1, 10)]),
    ("x * {0}", [range(2, 10)]),
    ("x * {0} + {1}", [range(2, 5), range(1, 6)]),
    ("x % {0}", [range(2, 6)]),
    ("x // {0}", [range(2, 6)]),
    ("abs(x - {0})", [range(1, 6)]),
    ("max(x, {0})", [range(0, 6)]),
    ("min(x, {0})", [range(0, 6)]),
    ("x * x", []),
    ("x * x + {0}", [range(1, 6)]),
    ("-x", []),
]
_STR_TEMPLATES: list[tuple[str, list[range]]] = [
    ("x.upper()", []),
    ("x[::-1]", []),
    ("x * 2", []),
    ("x + x[::-1]", []),
    ("x[0]", []),
    ("x[-1]", []),
    ("len(x)", []),
    ("x[1:]", []),
    ("x[:{0}]", [range(1, 4)]),
    ("x + '{0}'", [range(0, 26)]),
    ("'{0}' + x", [range(0, 26)]),
]


def _expand(template: str, ranges: list[range], arg: str) -> list[Program]:
    if not ranges:
        return [Program(template, arg, template)]
    out = []
    for values in _product(ranges):
        shown = [string.ascii_lowercase[v] if "'{" in template else str(v)
                 for v in values]
        out.append(Program(template.format(*shown), arg, template))
    return out


def _product(ranges: list[range]) -> list[tuple[int, ...]]:
    combos: list[tuple[int, ...]] = [()]
    for r in ranges:
        combos = [c + (v,) for c in combos for v in r]
    return combos


def all_programs() -> list[Program]:
    return list(_programs())


@functools.cache
def _programs() -> tuple[Program, ...]:
    progs = [p for t, r in _INT_TEMPLATES for p in _expand(t, r, "int")]
    progs += [p for t, r in _STR_TEMPLATES for p in _expand(t, r, "str")]
    return tuple(progs)


@functools.cache
def _program_index() -> dict[tuple[str, str], Program]:
    return {(p.expr, p.arg): p for p in _programs()}


def split_of(prompt: str) -> Split:
    """A task's split: a hash of its prompt, so a held-out prompt is never trained on
    (whatever the seed, in every process)."""
    h = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:4], "big")
    return Split.HELDOUT if h % 4 == 0 else Split.TRAIN


def _inputs(rng: random.Random, arg: str, n: int) -> list[object]:
    if arg == "int":
        # f(0) and f(1) come first: they show the constants (x + k at 0 is k, x * k at
        # 1 is k) so a byte-level model can copy them instead of doing arithmetic in
        # its head; the third example and the hidden tests are drawn at random.
        picked: list[object] = [0, 1]
        return picked + rng.sample([v for v in range(-5, 10) if v not in (0, 1)], n - 2)
    # A list, not a set: a set's order depends on the process's hash seed, and the
    # tasks must be the same in every process.
    seen: list[str] = []
    while len(seen) < n:
        s = "".join(rng.choice("abcdef") for _ in range(rng.randint(2, 4)))
        if s not in seen:
            seen.append(s)
    return list[object](seen)


def _identifies(program: Program, shown: list[object], hidden: list[object]) -> bool:
    """No other program of the DSL agrees with `program` on the shown examples yet
    differs on a hidden input (the examples pin the answer down)."""
    want = [program(x) for x in shown]
    truth = [program(x) for x in hidden]
    for other in _by_arg(program.arg):
        if other != program and [other(x) for x in shown] == want and \
                [other(x) for x in hidden] != truth:
            return False
    return True


@functools.cache
def _by_arg(arg: str) -> tuple[Program, ...]:
    return tuple(p for p in all_programs() if p.arg == arg)


def make_task(program: Program, rng: random.Random, task_id: str) -> Task:
    """A FUNCTION task for `program` with fresh example inputs drawn from `rng`."""
    for _ in range(50):  # examples that pin the program down (almost always found)
        xs = _inputs(rng, program.arg, SHOWN + HIDDEN)
        shown, hidden = xs[:SHOWN], xs[SHOWN:]
        if _identifies(program, shown, hidden):
            break
    examples = "; ".join(f"f({x!r}) == {program(x)!r}" for x in shown)
    prompt = f"def f(x):\n    # {examples}\n    return "

    def case(i: int, x: object, kind: str) -> TestCase:
        return TestCase(name=f"{kind}{i}", code=f"assert candidate({x!r}) == {program(x)!r}")

    return Task(task_id=task_id, kind=TaskKind.FUNCTION, prompt=prompt,
                entry_point=ENTRY_POINT,
                visible_tests=tuple(case(i, x, "shown") for i, x in enumerate(shown)),
                hidden_tests=tuple(case(i, x, "hidden") for i, x in enumerate(hidden)),
                canonical_solution=program.expr + "\n", source="trialbox-demo")


def make_tasks(split: Split, n: int, seed: int) -> list[Task]:
    """`n` tasks of `split`, programs drawn uniformly per template then per constant
    (so `x + k`, with 9 constants, is not 9 times likelier than `-x`); a draw whose
    prompt belongs to the other split is drawn again (program and examples)."""
    if n < 0:
        raise UsageError(f"number of tasks must be >= 0, got {n}")
    rng = random.Random(f"trialbox-demo/{split.value}/{seed}")
    by_template: dict[str, list[Program]] = {}
    for p in all_programs():
        by_template.setdefault(f"{p.arg}:{p.template}", []).append(p)
    keys = sorted(by_template)
    tasks = []
    for i in range(n):
        task_id = f"demo-{split.value}-{seed}-{i:05d}"
        while True:  # on average 4 draws a held-out task, 4/3 a training one
            program = rng.choice(by_template[rng.choice(keys)])
            task = make_task(program, rng, task_id)
            if split_of(task.prompt) is split:
                break
        tasks.append(task)
    return tasks


VALIDATION_SEED = 12345
"""The validation split's draws (the held-out tasks every recipe was tuned on)."""
VALIDATION_TASKS = 500
"""How many validation draws were ever looked at while tuning (the test split avoids
all of their prompts, whatever `n` a run asks for)."""
TEST_SEED = 20261201
"""The test split's draws (never used to choose anything)."""


@dataclass(frozen=True)
class HeldOutTest:
    """The test split of one run and what was removed to build it."""

    tasks: list[Task]
    """Distinct held-out prompts, none in the validation split, none sharing two
    examples with a training prompt of the run."""
    drawn: int
    """Held-out draws made to find them."""
    duplicates: int
    """Draws whose prompt was already drawn (each prompt counts once)."""
    in_validation: int
    """Distinct prompts dropped because the validation split (tuning) holds them."""
    shares_examples: int
    """Distinct prompts dropped because two of their examples appear together in a
    prompt the run trains on (SFT or GRPO)."""


def example_pairs(task: Task) -> set[frozenset[str]]:
    """Every pair of a task's shown examples (its visible tests' code): two prompts that
    share a pair show the model the same two input/output facts."""
    shown = [t.code for t in task.visible_tests]
    return {frozenset((a, b)) for i, a in enumerate(shown) for b in shown[i + 1:]}


def heldout_validation(n: int) -> list[Task]:
    """The first `n` validation draws (held-out prompts, seed `VALIDATION_SEED`)."""
    return make_tasks(Split.HELDOUT, n, VALIDATION_SEED)


def heldout_test(n: int, trained_on: list[Task]) -> HeldOutTest:
    """`n` test tasks for a run that trains on `trained_on` (see the module docstring).
    Raises UsageError when `n` such prompts cannot be found."""
    if n < 0:
        raise UsageError(f"number of tasks must be >= 0, got {n}")
    tuned = {t.prompt for t in heldout_validation(max(n, VALIDATION_TASKS))}
    seen_pairs: set[frozenset[str]] = set()
    for task in trained_on:
        seen_pairs |= example_pairs(task)
    kept: list[Task] = []
    prompts: set[str] = set()
    drawn = duplicates = in_validation = shares = 0
    chunk = 0
    while len(kept) < n:
        if drawn > 40 * n + 1000:
            raise UsageError(f"the demo's test split holds only {len(kept)} prompts that "
                             f"no training prompt shares examples with (after {drawn} "
                             f"draws); lower [eval] tasks to {len(kept)} or below")
        # chunks of a fixed size, so the first n tasks do not depend on n
        for task in make_tasks(Split.HELDOUT, 256, TEST_SEED * 1000 + chunk):
            drawn += 1
            if task.prompt in prompts:
                duplicates += 1
                continue
            prompts.add(task.prompt)
            if task.prompt in tuned:
                in_validation += 1
            elif example_pairs(task) & seen_pairs:
                shares += 1
            elif len(kept) < n:
                kept.append(replace(task, task_id=f"demo-test-{len(kept):05d}"))
        chunk += 1
    return HeldOutTest(kept, drawn, duplicates, in_validation, shares)


def solution_of(task: Task) -> str:
    """The completion the model should write (the program's expression and a newline)."""
    return task.canonical_solution


# --------------------------------------------------------------------------- agent I/O

def render_prompt(task: Task) -> str:
    """The demo's first prompt is the task's own prompt: the model continues the
    `return ` line (a raw completion, which the judge appends to the prompt)."""
    return task.prompt


FEEDBACK = "    # wrong\n    return "
"""What the model is told after a failed turn, then a fresh `return ` line to complete."""


def render_feedback(report: str) -> str:
    """The agent's report (compile errors, failing *visible* tests; never hidden ones)
    reduced to one comment line. Why so little: a 0.7M-parameter byte-level model
    learns "the last answer was wrong, write a different one" from a fixed marker in a
    few hundred steps; the report's free text (assertion messages, tracebacks) would
    triple the context and mostly teach it to copy noise. The full report is still what
    a larger model would get with the agent's default `wrap_feedback`."""
    return FEEDBACK


TEACHER_BUGS: dict[str, str] = {
    "x[0]": "x[1]",                  # an index off by one
    "x[-1]": "x[-2]",
    "x[1:]": "x[2:]",
    "len(x)": "len(x) - 1",
    "x[::-1]": "x[:-1]",             # reversed vs all but the last
    "x.upper()": "x.capitalize()",
    "x * x": "x ^ 2",                # XOR for a power
    "x * x + {0}": "x ^ 2 + {0}",
    "-x": "~x",                      # negation vs bitwise not (-x - 1)
    "abs(x - {0})": "abs(x) - {0}",  # a parenthesis misplaced
    "x // {0}": "x / {0}",           # true division for floor division
    "x - {0}": "{0} - x",            # operands swapped
}
"""The unverified teacher's habits: template -> the bug it writes instead (same
constants). Each bug fails the task's hidden tests, each is a mistake people make, and
none is itself a program of the DSL: unlearning a bug that is another task's right
answer (`x * 2` for `x * x`, `x - k` for `abs(x - k)` — tried first) also unlearned
that answer where it was right (`x - k` tasks 10/14 -> 0/14, seed 2)."""


def teacher_bug(task: Task) -> str | None:
    """The bug the unverified teacher writes for `task` (`TEACHER_BUGS`, the task's own
    constants, a newline), or None for a template it always gets right."""
    program = _program_of(task)
    if program is None or program.template not in TEACHER_BUGS:
        return None
    constants = re.findall(r"\d+", program.expr) if program.has_constant else []
    return TEACHER_BUGS[program.template].format(*constants) + "\n"


def teacher_answer(task: Task, rng: random.Random, teacher_error: float) -> str:
    """What the unverified teacher writes for `task`: with probability `teacher_error`
    its bug (`teacher_bug`) where it has one, else the solution."""
    bug = teacher_bug(task)
    return bug if bug is not None and rng.random() < teacher_error else solution_of(task)


def template_of(task: Task) -> str:
    """The DSL template of a task's program (`x + {0}` for `x + 4`)."""
    program = _program_of(task)
    return program.template if program is not None else task.canonical_solution.strip()


def sft_pairs(tasks: list[Task], seed: int, retry_share: float = 0.25,
              teacher_error: float = 0.0) -> list[tuple[str, str]]:
    """(context, completion) pairs for the warm start, the completion written by the
    teacher (`teacher_answer`: with `teacher_error` > 0 it has bugs). A `retry_share`
    of them are second turns: the prompt, a wrong answer (another program's expression,
    one that fails a shown example), the feedback marker, then the teacher's answer, so
    the model has seen the two-turn format before GRPO uses it. The loss is on the
    teacher's answer only (the wrong one is context, never a target)."""
    if not 0.0 <= teacher_error <= 1.0 or not 0.0 <= retry_share <= 1.0:
        raise UsageError(f"teacher_error and retry_share must be in [0, 1], got "
                         f"{teacher_error!r}, {retry_share!r}")
    rng = random.Random(f"trialbox-demo/sft/{seed}")
    pairs = []
    for task in tasks:
        program = _program_of(task)
        answer = teacher_answer(task, rng, teacher_error)
        if program is not None and rng.random() < retry_share:
            wrong = _wrong_for(program, task, rng)
            if wrong is not None:
                pairs.append((task.prompt + wrong.expr + "\n" + FEEDBACK, answer))
                continue
        pairs.append((task.prompt, answer))
    return pairs


def _shown_inputs(task: Task) -> list[object]:
    return [ast.literal_eval(t.code.split("candidate(", 1)[1].split(") == ", 1)[0])
            for t in task.visible_tests]


def _program_of(task: Task) -> Program | None:
    expr = task.canonical_solution.strip()
    shown = _shown_inputs(task)
    arg = "str" if shown and isinstance(shown[0], str) else "int"
    return _program_index().get((expr, arg))


def _wrong_for(program: Program, task: Task, rng: random.Random) -> Program | None:
    shown = _shown_inputs(task)
    want = [program(x) for x in shown]
    others = [p for p in _by_arg(program.arg)
              if p != program and [p(x) for x in shown] != want]
    near = [p for p in others if _shape(p.expr) == _shape(program.expr)]
    if near and rng.random() < 0.5:  # the usual mistake: the right template, a wrong constant
        return rng.choice(near)
    return rng.choice(others) if others else None


def _shape(expr: str) -> str:
    """The template of an expression: `x * 3 + 1` -> `x * # + #`, `x + 'q'` -> `x + #`."""
    return re.sub(r"\d+|'[a-z]'", "#", expr)
