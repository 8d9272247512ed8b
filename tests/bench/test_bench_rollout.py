"""Smoke test of `trialbox bench rollout`: the CLI knows it, and its body, run on the
test session's pool with a tiny budget, measured both systems on the same episodes —
the batched one with one generate call per turn, the baseline one per episode-turn."""

from __future__ import annotations

import json

import pytest

from trialbox.cli import build_parser
from trialbox.bench import rollout as bench


@pytest.mark.bench_only  # a benchmark run end to end: make bench
def test_bench_rollout_smoke(runner, capsys):
    args = build_parser().parse_args(
        ["bench", "rollout", "--json", "--tasks", "2", "--group", "2", "--turns", "2",
         "--max-new-tokens", "8", "--rounds", "1"])
    res = runner.run(bench._run(bench._check(args), runner.pool), timeout=300)
    b, e = res["systems"]["batched"], res["systems"]["per-episode"]
    assert res["identical"] is True and res["problems"] == []
    # 4 episodes x 2 turns (a random model never passes): 2 calls of 4 vs 8 calls of 1.
    assert (b["gen_calls"], b["mean_batch"]) == (2, 4)
    assert (e["gen_calls"], e["mean_batch"]) == (8, 1)
    assert b["turns"] == e["turns"] == 8 and b["model_tokens"] == e["model_tokens"] == 64
    assert res["ratio_episodes_per_s"] > 0
    res["machine"] = {"nproc": 2, "cpu_model": "x", "memory_gib": 1, "python": "3",
                      "date": "now"}
    table = bench.render_table(json.loads(json.dumps(res)))
    assert "episodes/s" in table and "per-episode" in table
