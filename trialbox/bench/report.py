"""What every `trialbox bench ...` reports, in one shape.

A benchmark logs its progress to stderr (`log`), gathers its figures in one JSON-ready
dict with the machine it ran on (`machine_info`: CPUs, memory, kernel, and the load
average at the start; `load_average` for later readings), prints a table for people and
then, with `--json`, the same results as one compact JSON line (the last line of stdout),
and with `--out FILE` writes them indented to FILE (`add_output_arguments`, `emit`).
Figures with no data are NaN while measured and null in the JSON (`rounded`, `jsonable`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

TABLE_WIDTH = 110
"""A table's lines (not the machine line) fit in this many columns."""


def add_output_arguments(p: argparse.ArgumentParser) -> None:
    """--json and --out, as every benchmark takes them (`emit` honours them)."""
    p.add_argument("--json", action="store_true", help="print results as JSON")
    p.add_argument("--out", help="also write the JSON results to this file")


def log(msg: str) -> None:
    """A progress line on stderr (stdout is the table and the JSON)."""
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def read_text(path: str) -> str:
    """A small file's text (/proc, /sys), or "" when it cannot be read."""
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def load_average() -> float:
    """The 1-minute load average, rounded as the reports show it."""
    return round(os.getloadavg()[0], 1)


def machine_info() -> dict[str, Any]:
    """The machine a benchmark ran on, with its load averages at the start: figures
    from a loaded machine are read beside them (BENCHMARKS.md)."""
    model = ""
    for line in read_text("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem_kb = 0
    for line in read_text("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            mem_kb = int(line.split()[1])
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 0
    return {
        "nproc": usable, "cpu_count": os.cpu_count(), "cpu_model": model,
        "memory_gib": round(mem_kb / (1 << 20), 1),
        "kernel": platform.release(), "os": platform.platform(),
        "python": platform.python_version(),
        "python_impl": platform.python_implementation(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "loadavg_start": list(os.getloadavg()),
        "sched_autogroup": {"1": "on", "0": "off"}.get(
            read_text("/proc/sys/kernel/sched_autogroup_enabled").strip(), "unknown"),
    }


# ------------------------------------------------------------------ figures

def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks;
    NaN without values."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50.0)


def rounded(x: Any, nd: int = 3) -> float | None:
    """Round for JSON; NaN/inf (no data) and non-numbers become null."""
    return round(x, nd) if isinstance(x, (int, float)) and math.isfinite(x) else None


def ratio(a: float, b: float) -> float:
    """a / b, or NaN when either side has no data (or b is not positive)."""
    return a / b if b > 0 and math.isfinite(a) and math.isfinite(b) else math.nan


def jsonable(res: Any, nd: int | None = None) -> Any:
    """The results as plain JSON values: other objects as their str, NaN/inf as null,
    and with `nd` every float rounded to that many digits."""
    clean = json.loads(json.dumps(res, default=str), parse_constant=lambda _c: None)
    return clean if nd is None else _round_floats(clean, nd)


def _round_floats(x: Any, nd: int) -> Any:
    if isinstance(x, float):
        return rounded(x, nd)
    if isinstance(x, dict):
        return {k: _round_floats(v, nd) for k, v in x.items()}
    if isinstance(x, list):
        return [_round_floats(v, nd) for v in x]
    return x


# ------------------------------------------------------------------ text

def fmt(x: Any, nd: int = 2) -> str:
    """A figure in a table cell: "-" when there is none."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:.{nd}f}"


def fmt_x(x: Any) -> str:
    """A ratio in a table cell: `1.23x`, or "-"."""
    return "-" if x is None else f"{x:.2f}x"


def met(goal_met: bool | None, missed: str = "MISSED") -> str:
    """A goal's verdict in words."""
    return "NOT MEASURED" if goal_met is None else "MET" if goal_met else missed


def wrap(text: str, first: str, rest: str) -> list[str]:
    return textwrap.wrap(text, TABLE_WIDTH, initial_indent=first, subsequent_indent=rest,
                         break_on_hyphens=False, break_long_words=False)


def notes_and_problems(res: dict[str, Any]) -> list[str]:
    """The closing lines every benchmark table shares: its notes, then any problems."""
    lines = ["", "Notes:"]
    for n in res["notes"]:
        lines += wrap(n, " - ", "   ")
    if res["problems"]:
        lines += ["", "PROBLEMS:"] + [f" ! {x}" for x in res["problems"]]
    return lines


# ------------------------------------------------------------------ output

def emit(res: Any, args: argparse.Namespace, table: str | None = None, *,
         nd: int | None = None, indent: int = 2) -> Any:
    """Print `table`, then write the results: to `args.out` indented, and with
    `args.json` as one compact line, the only line of stdout (the table then goes to
    stderr, so `trialbox bench X --json | jq` works). Returns what was written
    (`jsonable(res, nd)`)."""
    json_out = getattr(args, "json", False)
    if table is not None:
        print(table, flush=True, file=sys.stderr if json_out else sys.stdout)
    clean = jsonable(res, nd)
    if getattr(args, "out", None):
        with open(args.out, "w") as f:
            f.write(json.dumps(clean, indent=indent) + "\n")
    if json_out:
        print(json.dumps(clean, separators=(",", ":")), flush=True)
    return clean
