"""Figures for HumanEval's amplified tests (docs/adversary.md, section B), every grade
by the real judge on the namespace tier:

    PYTHONPATH=. python scripts/amplify_figures.py humaneval.amplified.json

* the 164 canonical solutions graded with the amplified tests;
* wrong-but-plausible solutions — one hard-coded to the original tests' inputs per task
  (answers from a table built with the reference, anything else None), and up to
  `--mutants` single-point mutants of each canonical solution (a comparison swapped,
  `<` for `<=`, an integer constant off by one, `+` for `-`) — graded with the original
  tests and with the amplified ones: of those the original tests pass, how many the
  amplified tests catch.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import random
import sys
import time
from typing import Any

from trialbox.judge import amplify
from trialbox.judge.function import judge_function, judge_pool_config
from trialbox.sandbox import CellPool
from trialbox.store.tasks import load_humaneval
from trialbox.types import Outcome, Task

_SWAP: dict[type, type] = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE,
                           ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
                           ast.Add: ast.Sub, ast.Sub: ast.Add}


def mutants(task: Task, limit: int, rng: random.Random) -> list[str]:
    """Single-point mutants of the canonical solution's body, as completions."""
    src = task.prompt + task.canonical_solution
    tree = ast.parse(src)
    start = len(task.prompt.splitlines())
    sites = [n for n in ast.walk(tree) if getattr(n, "lineno", 0) > start and (
        isinstance(n, (ast.Compare, ast.BinOp)) or
        isinstance(n, ast.Constant) and type(n.value) is int)]
    out: list[str] = []
    rng.shuffle(sites)
    for node in sites:
        if len(out) >= limit:
            break
        if isinstance(node, ast.Compare) and type(node.ops[0]) in _SWAP:
            old = node.ops[0]
            node.ops[0] = _SWAP[type(old)]()
        elif isinstance(node, ast.BinOp) and type(node.op) in _SWAP:
            old = node.op
            node.op = _SWAP[type(old)]()
        elif isinstance(node, ast.Constant):
            old = node.value
            node.value = old + rng.choice([-1, 1])
        else:
            continue
        text = ast.unparse(tree)
        if isinstance(node, ast.Compare):
            node.ops[0] = old
        elif isinstance(node, ast.BinOp):
            node.op = old
        else:
            node.value = old
        out.append("\n" + text + "\n")  # the whole module again: it redefines the function
    return out


def hard_coded(task: Task) -> str:
    ns: dict[str, Any] = {}
    exec(task.prompt + task.canonical_solution, ns)
    ref, table = ns[task.entry_point], {}

    def record(*args: Any) -> Any:
        table[repr(args)] = ref(*args)
        return table[repr(args)]
    env: dict[str, Any] = {"candidate": record, task.entry_point: record}
    setup = task.test_setup
    exec(setup, env)
    for t in (*task.hidden_tests, *task.visible_tests):
        try:
            exec(t.code, env)
        except Exception:
            pass
    return (f"    return _T.get(repr(tuple(locals().values())))\n\n\n_T = {table!r}\n")


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("amplified")
    ap.add_argument("--mutants", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--concurrency", type=int, default=4)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    amp = amplify.load(a.amplified)
    tasks = load_humaneval()
    amped = {t.task_id: t for t in amplify.apply(tasks, amp)}
    pool = await CellPool(judge_pool_config(warm=a.concurrency)).start()
    sem = asyncio.Semaphore(a.concurrency)

    async def grade(task: Task, completion: str) -> Outcome:
        async with sem:
            return (await judge_function(task, completion, pool)).outcome

    t0 = time.monotonic()
    try:
        canon = await asyncio.gather(*(grade(amped[t.task_id], t.canonical_solution)
                                       for t in tasks))
        bad_canon = [t.task_id for t, o in zip(tasks, canon, strict=True)
                     if o is not Outcome.PASSED]
        wrong: list[tuple[str, Task, str]] = []
        for t in tasks:
            try:
                wrong.append(("hard-coded", t, hard_coded(t)))
            except Exception as e:  # a table we cannot build: skipped
                print(f"{t.task_id}: no hard-coded variant ({e})", file=sys.stderr)
            wrong += [("mutant", t, m) for m in mutants(t, a.mutants, rng)]
        before = await asyncio.gather(*(grade(t, c) for _, t, c in wrong))
        plausible = [(k, t, c) for (k, t, c), o in zip(wrong, before, strict=True)
                     if o is Outcome.PASSED]
        after = await asyncio.gather(*(grade(amped[t.task_id], c) for _, t, c in plausible))
    finally:
        await pool.close()
    counts = amp.counts()
    n = sorted(counts.values())
    print(f"amplified tests: {sum(n)} for {len(n)} tasks, per task min {n[0]} median "
          f"{n[len(n) // 2]} max {n[-1]} (original hidden tests: "
          f"{sum(len(t.hidden_tests) for t in tasks)})")
    print(f"canonical solutions passing the amplified set: {len(tasks) - len(bad_canon)}"
          f"/{len(tasks)} {bad_canon or ''}")
    for kind in ("hard-coded", "mutant"):
        tried = [w for w in wrong if w[0] == kind]
        pl = [i for i, w in enumerate(plausible) if w[0] == kind]
        caught = sum(1 for i in pl if after[i] is not Outcome.PASSED)
        print(f"{kind}: {len(tried)} wrong solutions; the original tests pass "
              f"{len(pl)} of them (catch {len(tried) - len(pl)}); the amplified tests "
              f"catch {caught} of those {len(pl)}")
    print(f"({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
