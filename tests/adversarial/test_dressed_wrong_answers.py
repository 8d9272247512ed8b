"""One wrong answer to HumanEval/2 (`return 0.5`: right for 3.5 only), dressed 52 ways
the way a reward-hacking policy would try to turn its failure into an exclusion or a
pass: killing the cell's init, its own process, its process group; closing, flooding or
forging frames on the judge's channel (fd 3), with the names the static scan looks for
and without them; daemons holding the channel open, descriptor cycles, fork, memory,
thread, disk and output bombs, SIGSTOP, signal tampering, a wrecked workspace,
colliding hashes, oversized and too-deep returns... — all only on the
call it is about to fail (`number == 1.33`).

Graded end to end by `trialbox eval` on the real namespace tier. The guarantee (issue 14
A, DESIGN.md decision 1): every one scores 0 — never None (excluded), never a pass —
and the same on a re-grade. The samples: data/dressed_wrong_answers.jsonl (`attack`
names each)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data" / "dressed_wrong_answers.jsonl"


@pytest.mark.timeout(600)
def test_every_dressed_wrong_answer_scores_zero_and_is_never_excluded(tmp_path):
    out = tmp_path / "graded.jsonl"
    p = subprocess.run([sys.executable, "-m", "trialbox.cli", "eval", "--tasks", "humaneval",
                        "--samples", str(DATA), "--out", str(out), "--repeat", "2",
                        "--workers", "2"], capture_output=True, text=True, timeout=580)
    assert p.returncode == 0, p.stderr[-3000:]
    attacks = [json.loads(line)["attack"] for line in DATA.read_text().splitlines()]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == len(attacks) == 52
    bad = {a: (r["outcome"], r["reward"], r.get("message", "")[:120])
           for a, r in zip(attacks, rows, strict=True)
           if r["reward"] != 0.0 or r["outcome"] in ("passed", "infra", "error")
           or any(x["reward"] != 0.0 for x in r["repeats"])}
    assert bad == {}, bad
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["excluded"] == 0 and summary["pass@1"] == 0.0, summary
