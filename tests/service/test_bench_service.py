"""Smoke run of `trialbox bench service` (8 clients x 3 s per system instead of 64 x 60),
through the CLI in a child process, as a user runs it; and the plain baseline's
best-effort design: a bounded pool with a queue that refuses beyond it (counted as
refused, not answered), and a worker slot left clean after a fork bomb."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import load_scaled
from trialbox.bench.service import (
    BASELINE_UID,
    MIX,
    ServerProcess,
    drive,
    run_program,
)
from trialbox.service.config import ServiceConfig


def test_bench_service_smoke(tmp_path: Path) -> None:
    out = tmp_path / "service.json"
    p = subprocess.run([sys.executable, "-m", "trialbox.cli", "bench", "service",
                        "--clients", "8", "--seconds", "3", "--json", "--out", str(out)],
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert json.loads(out.read_text()) == res
    assert len(p.stdout.strip().splitlines()) == 1  # --json: the table is on stderr
    assert "trialbox bench service" in p.stderr and "trialbox / plain" in p.stderr
    assert "refused" in p.stderr and "no per-request guard preamble" in p.stderr
    tb, plain = res["systems"]["trialbox"], res["systems"]["plain"]
    # Every hostile program in the mix came up at least once; trialbox answered every
    # request with a reason and judged every program right.
    assert tb["answered"] >= len(MIX), tb
    assert tb["dropped"] == 0 and tb["unexplained_5xx"] == 0 and tb["sandbox_errors"] == 0
    assert tb["verdicts_wrong"] == {}, tb
    assert tb["verdicts_right"] == tb["answered"]  # refusals are not answers
    assert 0 < tb["p50_ms"] <= tb["p99_ms"] and tb["server_peak_rss_mib"] > 10
    assert tb["tree_peak_pss_mib"] > 10
    # The best-effort baseline answers, and no fork bomb leaves it unable to start a
    # program (that would be a SandboxError); its verdicts, like trialbox's, depend on
    # the machine's load (a good program can hit its 2 s limit), so they are not asserted.
    assert plain["answered"] > 0 and plain["server_peak_rss_mib"] > 10
    assert plain["sandbox_errors"] == 0 and plain["dropped"] == 0, plain
    assert res["params"]["plain_workers"] == ServiceConfig().max_running  # same bound
    assert res["ratios"]["per_s"] > 0


def test_plain_baseline_refuses_beyond_its_queue() -> None:
    """One worker, no queue: with 4 clients most requests are refused (503 +
    Retry-After), and the load counts them as refused, never as answered."""
    server = ServerProcess([sys.executable, "-m", "trialbox.bench.service",
                            "--baseline-server", "1", "0"])
    try:
        r = asyncio.run(drive(server, clients=4, seconds=2.0))
    finally:
        server.stop()
    assert r["refused_retry_after"] > 0 and r["http"].get("503") == r["refused_retry_after"]
    assert r["answered"] == sum(r["http"].values()) - r["refused_retry_after"] > 0
    assert r["verdicts_right"] + sum(r["verdicts_wrong"].values()) == r["answered"]
    assert r["dropped"] == 0 and r["unexplained_5xx"] == 0


def _processes_of(uid: int) -> list[int]:
    """Live processes of `uid` (zombies, already dead and waiting for init, left out)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                status = Path(f"/proc/{name}/status").read_text()
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if int(fields["Uid"].split()[0]) == uid and not fields["State"].strip().startswith("Z"):
                found.append(int(name))
    return found


def test_fork_bomb_leaves_its_slot_clean(tmp_path: Path) -> None:
    """A fork bomb that escapes its process group (setsid in each child) is killed with
    every process of its slot's uid; the slot then runs a good program at once."""
    slot = 7
    uid = BASELINE_UID + slot
    os.chown(tmp_path, uid, uid)
    bomb = ("import os\nwhile True:\n    try:\n        if os.fork() == 0:\n"
            "            os.setsid()\n    except OSError:\n        pass")
    t0 = time.monotonic()
    r = asyncio.run(run_program(slot, str(tmp_path), {"code": bomb, "run_timeout": 1.0,
                                                      "memory_limit_MB": 256}))
    # (the bench's plain baseline server, not trialbox's sandbox: killing a bomb whose
    # children setsid took 13.2 s once on an idle machine, 2026-12-02 — to look at)
    assert r["status"] == "Failed", r
    assert time.monotonic() - t0 < load_scaled(30), r  # ends at all: a bound, load-scaled
    assert _processes_of(uid) == []
    ok = asyncio.run(run_program(slot, str(tmp_path), {"code": "print(6 * 7)",
                                                       "run_timeout": 5.0}))
    assert ok["status"] == "Success" and ok["run_result"]["stdout"] == "42\n", ok
