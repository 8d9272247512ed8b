"""Smoke run of `trialbox bench service` (8 clients x 3 s per system instead of 64 x 60),
through the CLI in a child process, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from trialbox.bench.service import MIX


def test_bench_service_smoke(tmp_path: Path) -> None:
    out = tmp_path / "service.json"
    p = subprocess.run([sys.executable, "-m", "trialbox.cli", "bench", "service",
                        "--clients", "8", "--seconds", "3", "--json", "--out", str(out)],
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert json.loads(out.read_text()) == res
    assert "trialbox bench service" in p.stdout and "trialbox / plain" in p.stdout
    tb, plain = res["systems"]["trialbox"], res["systems"]["plain"]
    # Every hostile program in the mix came up at least once; trialbox answered every
    # request with a reason and judged every program right.
    assert tb["answered"] >= len(MIX), tb
    assert tb["dropped"] == 0 and tb["unexplained_5xx"] == 0 and tb["sandbox_errors"] == 0
    assert tb["verdicts_wrong"] == {}, tb
    assert tb["verdicts_right"] + tb["refused_retry_after"] == tb["answered"]
    assert 0 < tb["p50_ms"] <= tb["p99_ms"] and tb["server_peak_rss_mib"] > 10
    assert tb["tree_peak_pss_mib"] > 10
    assert plain["answered"] > 0 and plain["server_peak_rss_mib"] > 10
    assert res["ratios"]["per_s"] > 0
