"""Smoke test of `trialbox bench scheduler` at tiny scale, through the CLI's parser:
every figure present and sane, every episode done in both systems, no priority
inversion by the scheduler."""

from __future__ import annotations

import json

import pytest

from trialbox.bench.scheduler import count_inversions
from trialbox.cli import main as cli_main


def test_count_inversions():
    # (queued_at, dispatched_at, tier)
    events = [(1.0, 5.0, 0), (1.5, 2.0, 2), (0.0, 0.5, 2), (6.0, 7.0, 2)]
    assert count_inversions(events) == 1  # the low one dispatched at 2.0 jumped the high
    assert count_inversions([(0.0, 1.0, 0), (0.0, 2.0, 1)]) == 0


@pytest.mark.bench_only  # a benchmark run end to end: make bench
def test_bench_scheduler_smoke(capsys, tmp_path):
    out_file = tmp_path / "sched.json"
    rc = cli_main(["bench", "scheduler", "--json", "--tasks", "300", "--active", "40",
                   "--turns", "2", "--think-ms", "2", "--exec-ms", "1", "--out",
                   str(out_file)])
    captured = capsys.readouterr()
    out, capsys_err = captured.out, captured.err
    assert rc == 0, out
    assert len(out.strip().splitlines()) == 1  # --json: stdout is the JSON line only
    res = json.loads(out)
    assert json.loads(out_file.read_text())["params"] == res["params"]
    s, b = res["scheduler"], res["baseline"]
    assert s["done"] == b["done"] == 300
    # per task: queued, generating, 2 x (executing, generating), grading, done (pending
    # is written with the submission itself)
    assert s["transitions"] == 300 * 8
    for k in ("dispatch_p50_ms", "dispatch_p99_ms", "idle_fraction"):
        assert s[k] is not None and b[k] is not None and s[k] >= 0 and b[k] >= 0
    assert 0 <= s["idle_fraction"] <= 1 and 0 <= b["idle_fraction"] <= 1
    assert res["memory"]["scheduler_bytes"] > 0 and res["memory"]["baseline_bytes"] > 0
    assert res["priority"]["scheduler"]["inversions"] == 0
    assert res["priority"]["scheduler"]["done"] == (res["priority"]["lows"]
                                                    + res["priority"]["highs"])
    assert res["us_per_transition"] is not None and set(res["goals"]) == {
        "us_per_transition", "bytes_per_queued", "no_inversion", "agent_us_per_transition"}
    # the real agent loop: every episode passed on its second turn in both systems, as
    # scheduler tasks with all their transitions (queued, generating, 2 x (executing,
    # generating), grading, done), the policy's calls batched
    ag = res["agent_loop"]
    assert ag["scheduler"]["done"] == ag["baseline"]["done"] == 300
    assert ag["scheduler"]["transitions"] == 300 * 8
    assert ag["scheduler"]["mean_batch"] > 5 and ag["baseline"]["mean_batch"] > 5
    assert ag["scheduler"]["bytes_per_episode"] > 0 and ag["baseline"]["bytes_per_episode"] > 0
    assert ag["us_per_transition"] is not None
    table = capsys_err  # --json: the table went to stderr
    assert "scheduler" in table and "baseline" in table and "Goals:" in table


def test_bench_scheduler_bad_arguments(capsys):
    assert cli_main(["bench", "scheduler", "--tasks", "0"]) == 2
    assert "--tasks must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["bench", "scheduler", "--tasks", "x"])
