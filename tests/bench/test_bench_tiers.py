"""`trialbox bench sandbox --tiers`: bad input, and a tiny real run of one tier."""

from __future__ import annotations

import json

import pytest

from trialbox.cli import build_parser
from trialbox.errors import UsageError


def _args(*extra: str) -> object:
    return build_parser().parse_args(["bench", "sandbox", "--json", *extra])


def test_unknown_tier_is_a_clear_error() -> None:
    from trialbox.bench.tiers import main
    with pytest.raises(UsageError, match="unknown tier 'vm'; use a comma-separated list"):
        main(_args("--tiers", "namespace,vm"))  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="--runs must be at least 5"):
        main(_args("--tiers", "namespace", "--runs", "2"))  # type: ignore[arg-type]


@pytest.mark.bench_only  # a benchmark run end to end: make bench
def test_one_tier_tiny_run(capsys: pytest.CaptureFixture[str]) -> None:
    from trialbox.bench.sandbox import main
    rc = main(_args("--tiers", "namespace", "--runs", "5", "--seconds", "0.3",  # type: ignore[arg-type]
                    "--concurrency", "1"))
    captured = capsys.readouterr()
    out = captured.out
    assert len(out.strip().splitlines()) == 1  # --json: stdout is the JSON line only
    res = json.loads(out)
    assert rc == 0 and res["ok"], res["problems"]
    ns = res["tiers"]["namespace"]
    assert ns["warm"]["runs"] == 5 and ns["warm"]["start"]["p50_ms"] > 0
    assert ns["cold"]["samples"] == 5
    assert ns["throughput"]["1"]["warm"]["ok"] > 0 and ns["throughput"]["1"]["cold"]["ok"] > 0
    assert res["goal_gvisor_run_p50"]["met"] is None  # gvisor not asked for
    assert "warm run p50 / p95 ms" in captured.err  # the table
