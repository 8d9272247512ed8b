"""`trialbox tasks status RUN` and `trialbox tasks show TASK`: a journal's view of a run.

    trialbox tasks status [run-1] --db run.db [--json]  counts by state, infra-failure
                                                        rate, slowest tasks
    trialbox tasks show HumanEval/0 --db run.db [--run run-1] [--json]
                                                        every transition, turn, grade and
                                                        the result of that task
    trialbox tasks export run-1 --db run.db --to DIR_OR_URL [--format jsonl|parquet]
    trialbox tasks from-sdist toolz-1.0.0.tar.gz --out pack/ [--mutants N] [--seed S]
                  [--tier trusted|in-process]   repository tasks from a project's sdist:
                                                its tests, AST mutants, validated
                                                (judge/factory.py, docs/taskpacks.md)

`--db` defaults to $TRIALBOX_JOURNAL, then `trialbox.db`. Unknown runs or tasks, a
missing or corrupt journal: a one-line error saying what to change (exit 2 for a wrong
argument, 3 for a journal that cannot be read); nothing is ever written to the journal.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
from typing import Any


def add_parser(sub: Any) -> None:
    t = sub.add_parser("tasks", help="a run's tasks from the scheduler's journal; validate "
                       "a task set",
                       description="Read the scheduler's journal (read-only): counts by "
                       "state, one task's full history, export of a run's trajectories; "
                       "and `check`: validate a task set before trusting it.")
    tsub = t.add_subparsers(dest="tasks", required=True)
    default_db = os.environ.get("TRIALBOX_JOURNAL", "trialbox.db")
    st = tsub.add_parser("status", help="counts by state, infra-failure rate, slowest tasks")
    st.add_argument("run", nargs="?", default=None,
                    help="run id (default: the journal's only run, e.g. a training run's "
                    "out_dir/journal.db)")
    sh = tsub.add_parser("show", help="one task's transitions, turns, grades and result")
    sh.add_argument("task", help="task id")
    sh.add_argument("--run", default=None, help="only this run (default: every run)")
    ex = tsub.add_parser("export", help="a run's trajectories as JSONL or Parquet")
    ex.add_argument("run", help="run id")
    ex.add_argument("--to", required=True, help="directory or fsspec URL (s3://…)")
    ex.add_argument("--format", choices=["jsonl", "parquet"], default="jsonl")
    for p in (st, sh, ex):
        p.add_argument("--db", default=default_db,
                       help=f"journal file (default $TRIALBOX_JOURNAL or {default_db})")
        p.add_argument("--json", action="store_true", help="print JSON")
        p.set_defaults(handler=main)
    ck = tsub.add_parser(
        "check", help="validate a task set before trusting it (exit 1: a task is broken)",
        description="Validate every task (judge/taskcheck.py): the prompt defines the entry "
        "point, the tests call it as declared, the reference passes with several seeds, a "
        "trivial answer fails, a stdio comparison or checker accepts the expected output "
        "and rejects an empty, a perturbed and a nan one. Prints each problem with the "
        "field to change; exit 1 when any task has one.")
    ck.add_argument("task_set", help="humaneval, or a .jsonl / .parquet task file or URL")
    ck.add_argument("--repeats", type=int, default=3,
                    help="gradings of each reference, each with its own seed (default 3)")
    ck.add_argument("--workers", type=int, default=4, help="tasks checked at once")
    ck.add_argument("--json", action="store_true", help="one JSON object per task")
    ck.set_defaults(handler=check_main)
    fs = tsub.add_parser(
        "from-sdist", help="build repository tasks from source distributions (a project's "
        "own tests, bugs injected by AST mutation, each validated by the judge)",
        description="For each SDIST (a .tar.gz as `pip download --no-binary :all: "
        "--no-deps NAME==VERSION` writes it): grade the unmodified project's own tests "
        "--baseline-runs times on --tier and keep the tests that pass every time; inject "
        "bugs by AST mutation (comparison and operator swaps, off-by-one, a dropped "
        "statement, swapped arguments, return None), deterministic from --seed; keep a "
        "mutant when >= 1 graded test fails and >= 1 still passes, and it fails the same "
        "tests a second time. Writes OUT/tasks.jsonl (repository rows `trialbox eval "
        "--tasks` loads) and OUT/manifest.json (fail_to_pass, pass_to_pass, the "
        "mutation, the tier, the dropped tests and why). What it does not do yet: "
        "docs/taskpacks.md.")
    fs.add_argument("sdist", nargs="+", help="source distribution(s), .tar.gz")
    fs.add_argument("--out", required=True, help="a new or empty directory for the pack")
    fs.add_argument("--mutants", type=int, default=5,
                    help="validated tasks wanted per project (default 5)")
    fs.add_argument("--tries", type=int, default=0,
                    help="mutants graded per project at most (default 10 x --mutants)")
    fs.add_argument("--seed", type=int, default=0, help="picks the mutants (default 0)")
    fs.add_argument("--tier", choices=["trusted", "in-process"], default="trusted",
                    help="the repository judge's tier the tests are graded on (default "
                    "trusted, the tier `trialbox eval` grades on)")
    fs.add_argument("--baseline-runs", type=int, default=3,
                    help="gradings of the unmodified project; a test passing in all is "
                    "graded (default 3)")
    fs.add_argument("--workers", type=int, default=2, help="mutants graded at once")
    fs.set_defaults(handler=from_sdist_main)


def from_sdist_main(args: argparse.Namespace) -> int:
    """`trialbox tasks from-sdist`: a pack; prints one JSON line per project (figures),
    exit 1 when no task could be built."""
    import asyncio
    import sys
    import time

    from trialbox.judge.factory import FactoryConfig, build_pack
    from trialbox.judge.provider import judge_provider
    config = FactoryConfig(mutants=args.mutants, tries=args.tries, seed=args.seed,
                           tier=args.tier, baseline_runs=args.baseline_runs,
                           workers=args.workers)

    def log(line: str) -> None:
        print(f"trialbox: {time.strftime('%H:%M:%S')} {line}", file=sys.stderr, flush=True)

    async def run() -> Any:
        async with judge_provider("namespace", warm=2 * config.workers) as pool:
            return await build_pack(args.sdist, args.out, pool, config, log)
    reports = asyncio.run(run())
    for r in reports:
        print(json.dumps({"project": r.project, "version": r.version, "tier": r.tier,
                          "graded_tests": len(r.graded), "dropped_tests": len(r.dropped),
                          "mutation_sites": r.sites, "mutants_tried": r.tried,
                          "tasks": len(r.tasks), "build_s": round(r.seconds, 1),
                          "s_per_task": round(r.seconds / len(r.tasks), 1)
                          if r.tasks else None, "load_avg_1m": os.getloadavg()[0]}))
    return 0 if any(r.tasks for r in reports) else 1


def check_main(args: argparse.Namespace) -> int:
    """`trialbox tasks check`: every problem of every task; exit 1 when there is one."""
    import asyncio

    from trialbox.errors import UsageError
    from trialbox.judge.function import judge_pool_config
    from trialbox.judge.taskcheck import TaskCheckConfig, check_tasks
    from trialbox.sandbox.pool import CellPool
    from trialbox.store.tasks import load_tasks
    if args.workers < 1:
        raise UsageError("--workers must be at least 1")
    tasks = load_tasks(args.task_set)
    config = TaskCheckConfig(repeats=args.repeats)

    async def run() -> dict[str, Any]:
        pool = await CellPool(judge_pool_config(warm=2)).start()
        try:
            return await check_tasks(tasks, pool, config=config, workers=args.workers)
        finally:
            await pool.close()
    found = asyncio.run(run())
    broken = {tid: ps for tid, ps in found.items() if ps}
    for tid, ps in found.items():
        if args.json:
            print(json.dumps({"task_id": tid, "ok": not ps,
                              "problems": [{"field": p.field, "message": p.message}
                                           for p in ps]}))
        else:
            for p in ps:
                print(f"{tid}: {p.field}: {p.message}")
    summary = {"tasks": len(found), "ok": len(found) - len(broken), "broken": len(broken)}
    print(json.dumps(summary) if args.json else
          f"{summary['ok']} of {summary['tasks']} tasks ok, {summary['broken']} broken")
    return 1 if broken else 0


def _ts(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%H:%M:%S.%f")[:-3]


def main(args: argparse.Namespace) -> int:
    from trialbox.store.records import Records
    if args.tasks == "export":
        from trialbox.store.artifacts import ArtifactStore
        from trialbox.store.export import export_run
        out = export_run(args.db, args.run, ArtifactStore(args.to), args.format)
        print(json.dumps(out))
        return 0
    with Records(args.db) as rec:
        if args.tasks == "status":
            if args.run is None:
                runs = rec.runs()
                if len(runs) != 1:
                    from trialbox.errors import UsageError
                    raise UsageError(f"journal {args.db!r} holds {len(runs)} runs "
                                     f"({', '.join(runs) or 'none'}); name one: trialbox "
                                     "tasks status RUN --db FILE")
                args.run = runs[0]
            summary = rec.summary(args.run)
            if args.json:
                print(json.dumps(summary))
                return 0
            print(f"run {args.run}: {summary['tasks']} tasks, {summary['final']} final")
            for state, n in summary["counts"].items():
                print(f"  {state:<11} {n}")
            mean = summary["mean_reward"]
            print(f"rewarded {summary['rewarded']}, mean reward "
                  f"{'-' if mean is None else f'{mean:.3f}'}, infra-failure rate "
                  f"{summary['infra_failure_rate']:.3f}")
            if summary["slowest"]:
                print("slowest: " + ", ".join(f"{t} {s:.2f}s" for t, s in summary["slowest"]))
            return 0
        histories = rec.history(args.task, args.run)
        if args.json:
            print(json.dumps([h.to_json() for h in histories]))
            return 0
        for h in histories:
            print(f"{h.task_id} in run {h.run_id}: {h.state}, attempt {h.attempt}, "
                  f"priority {h.priority}, {h.infra_failures} infra failures, "
                  f"{h.preemptions} preemptions, trace {h.trace_id}")
            for t in h.transitions:
                extra = " ".join(x for x in (t.cause and f"[{t.cause}]", t.message,
                                             t.sandbox and f"sandbox={t.sandbox}",
                                             t.runtime and f"runtime={t.runtime}") if x)
                print(f"  {_ts(t.at)}  #{t.attempt}  {t.old or '-':>10} -> {t.new:<10} "
                      f"{extra}")
            print(f"  turns: {len(h.turns)}; grades: {len(h.grades)}; result: "
                  f"{json.dumps(h.result)}")
    return 0
