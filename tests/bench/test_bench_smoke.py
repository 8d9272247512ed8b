"""Smoke test of `trialbox bench sandbox`: tiny parameters, every system (trialbox,
trialbox-1shot, plain, bwrap, forkserver, bwrap-forkserver), sane numbers, ratios against
every baseline; and the fork-server baselines do what they claim (a warm fork per run from
one server per session; no isolation, or bwrap's).

The benchmark runs in a child process, through the same `main` as the CLI: it starts its
own CellPool and swaps asyncio's child watcher, none of which should touch the test
process; its exit status and stdout are checked as a user would see them.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys

import pytest

from trialbox.bench.forkserver import BwrapForkServerSystem, ForkServerSystem
from trialbox.bench.report import TABLE_WIDTH, percentile
from trialbox.bench.sandbox import BASELINES, SYSTEMS, System, parse_levels
from trialbox.errors import UsageError

ARGS = ["bench", "sandbox", "--json", "--runs", "5", "--seconds", "0.5",
        "--concurrency", "1,2"]
CHILD = ("import sys\n"
         "from trialbox.cli import build_parser\n"
         "from trialbox.bench.sandbox import main\n"
         "sys.exit(main(build_parser().parse_args(sys.argv[1:])))\n")


def test_parse_levels_and_percentile() -> None:
    assert parse_levels("1, 2,4,8,2") == [1, 2, 4, 8]
    for bad in ("", "0", "a", "1,-2"):
        with pytest.raises(UsageError):
            parse_levels(bad)
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([1.0, 2.0], 100) == 2.0
    assert math.isnan(percentile([], 50))


@pytest.mark.bench_only  # a benchmark run end to end: make bench
def test_bench_sandbox_smoke(tmp_path) -> None:
    out_file = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-c", CHILD, *ARGS, "--out", str(out_file)],
                          capture_output=True, text=True, timeout=90, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1  # --json: stdout is the JSON object only, the table on stderr
    res = json.loads(lines[-1])
    assert json.loads(out_file.read_text()) == res
    table = proc.stderr.splitlines()
    assert any("Throughput" in ln for ln in table) and any("latency" in ln for ln in table)
    assert any("1shot/plain" in ln for ln in table)
    assert any(ln.strip().startswith("trialbox-1shot ") for ln in table)
    # Readable width: every line of the table but the machine line (CPU model) and
    # any PROBLEMS (error text) fits.
    end = table.index("PROBLEMS:") if "PROBLEMS:" in table else len(table)
    too_wide = [ln for ln in table[1:end] if len(ln) > TABLE_WIDTH]
    assert not too_wide, too_wide

    assert res["ok"] is True and res["failures"] == 0 and res["problems"] == []
    assert res["params"]["concurrency"] == [1, 2]
    m = res["machine"]
    assert m["nproc"] >= 1 and m["kernel"] and m["python"] and m["date"]
    assert m["pool_shared"] is True  # trialbox-1shot draws from trialbox's pool
    assert "trialbox-1shot" in SYSTEMS
    assert {"forkserver", "bwrap-forkserver"} <= set(SYSTEMS)
    assert any(ln.strip().startswith("forkserver ") for ln in table)
    assert any("tb/fork" in ln and "tb/bwrap-fork" in ln for ln in table)
    assert set(res["systems"]) == set(SYSTEMS)
    assert set(res["latency"]) == set(SYSTEMS) == set(res["throughput"])
    for name in SYSTEMS:
        lat = res["latency"][name]
        assert lat["runs"] == 5 and lat["failed"] == 0
        for key in ("p50_ms", "p95_ms", "min_ms", "e2e_p50_ms"):
            assert 0 < lat[key] < 10_000, (name, key, lat)
        assert lat["min_ms"] <= lat["p50_ms"] <= lat["p95_ms"]
        assert lat["p50_ms"] <= lat["e2e_p50_ms"]
        for level in ("1", "2"):
            pt = res["throughput"][name][level]
            assert pt["runs_per_s"] > 0 and pt["ok"] > 0 and pt["failed"] == 0, (name, pt)
            assert len(pt["rounds"]) == 2
    ratios = res["ratios"]
    assert BASELINES == ("plain", "bwrap", "forkserver", "bwrap-forkserver")
    for tb in ("trialbox", "trialbox_1shot"):
        for other in ("plain", "bwrap", "forkserver", "bwrap_forkserver"):
            assert ratios[f"latency_p50_{other}_over_{tb}"] > 0
            assert ratios[f"latency_p95_{other}_over_{tb}"] > 0
            assert ratios[f"e2e_p50_{other}_over_{tb}"] > 0
            by_level = ratios[f"throughput_{tb}_over_{other}"]
            assert set(by_level) == {"1", "2"} and all(x > 0 for x in by_level.values())
    assert res["goals"]["latency_p50"]["target_ms"] == 5.0
    assert res["goals"]["latency_p50"]["system"] == "trialbox"
    assert res["goals"]["throughput_vs_plain"]["system"] == "trialbox"
    assert isinstance(res["goals"]["throughput_vs_plain"]["met"], bool)
    assert isinstance(res["goals"]["latency_p50"]["met"], bool)


PROBE = "import os\nprint(os.getpid(), os.getppid(), os.getuid(), os.getcwd(), os.path.isdir(%r))\n"


async def _probe(system: System, marker: str) -> list[list[str]]:
    await system.start()
    runner = await system.runner()
    try:
        rows = []
        for _ in range(3):
            out = await runner.run(PROBE % marker)
            assert out.ok, out.error
            rows.append(out.stdout.decode().split())
        bad = await runner.run("import sys; print('partial'); sys.exit(3)")
        assert not bad.ok and bad.stdout == b"partial\n" and "exit 3" in bad.error
        boom = await runner.run("raise ValueError('boom')")
        assert not boom.ok and "ValueError: boom" in boom.error
        return rows
    finally:
        await runner.close()
        await system.close()


@pytest.mark.parametrize("system", [ForkServerSystem, BwrapForkServerSystem])
def test_fork_server_baselines(system: type[System], tmp_path) -> None:
    """Per run a fresh process (new pid) forked by the same server (same parent) — the
    pre-fork design; forkserver sees the host (root, the host's directories);
    bwrap-forkserver runs as uid 1000 in /workspace and cannot see the host's /tmp."""
    marker = str(tmp_path)
    rows = asyncio.run(_probe(system(), marker))
    pids, parents = {r[0] for r in rows}, {r[1] for r in rows}
    assert len(pids) == 3 and len(parents) == 1, rows
    if system is ForkServerSystem:
        assert all(r[2] == str(os.getuid()) and r[4] == "True" for r in rows), rows
    else:
        assert all(r[2] == "1000" and r[3] == "/workspace" and r[4] == "False"
                   for r in rows), rows


def test_fork_server_session_ends_after_a_time_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run past the call limit kills the session's server: a late exit status must
    never be read as the next run's."""
    import trialbox.bench.forkserver as fs
    monkeypatch.setattr(fs, "CALL_TIMEOUT_S", 1.0)

    async def go() -> tuple[str, str, int | None]:
        system = ForkServerSystem()
        runner = await system.runner()
        assert isinstance(runner, fs.ForkServerRunner)
        try:
            slow = await runner.run("import time; time.sleep(5); print(1)")
            after = await runner.run("print(1)")
            return slow.error, after.error, await asyncio.wait_for(runner.proc.wait(), 5)
        finally:
            await runner.close()
            await system.close()

    slow, after, rc = asyncio.run(go())
    assert "timed out" in slow and "stopped after a time-out" in after and rc == -9
