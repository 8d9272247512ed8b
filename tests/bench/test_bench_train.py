"""Smoke test of `trialbox bench train` at a tiny budget, through the real CLI in a
subprocess (TRL, torch threads and the judge's pools stay out of the test process): both
systems (trialbox sync and async, TRL) ran every step, every completion was graded by
the judge in real sandboxes, every figure is a number, and the async run kept its
staleness bound. Plus: the TRL tokenizer has exactly the byte ids of trialbox's
ByteTokenizer (otherwise the two systems would not be running the same model), and a
bad flag is a usage error."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trialbox.bench.train import byte_tokenizer_fast
from trialbox.cli import main as cli_main
from trialbox.rollout.policy import ByteTokenizer


def test_tokenizer_has_the_byte_ids():
    fast, bt = byte_tokenizer_fast(), ByteTokenizer()
    text = "def f(x):\n    # f(0) == 'é'\n    return x + 1\n"
    ids = fast(text=[text])["input_ids"][0]
    assert ids == list(text.encode()) == list(bt.encode(text))
    assert fast.decode(ids) == text
    assert fast.eos_token_id == bt.eos_id and fast.pad_token_id == bt.pad_id
    assert fast.decode(ids + [bt.eos_id], skip_special_tokens=True) == text


def test_bad_flag_is_a_usage_error(capsys):
    assert cli_main(["bench", "train", "--group", "1"]) == 2
    assert "--group" in capsys.readouterr().err


@pytest.mark.bench_only  # a benchmark run end to end: make bench
@pytest.mark.timeout(180)
def test_bench_train_smoke(tmp_path):
    out_file = tmp_path / "train.json"
    proc = subprocess.run(
        [sys.executable, "-m", "trialbox.cli", "bench", "train", "--json", "--steps", "2",
         "--prompts", "2", "--group", "2", "--max-new-tokens", "8", "--sft-steps", "2",
         "--threads", "1", "--out", str(out_file)],
        capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert json.loads(out_file.read_text()) == res
    assert res["problems"] == []
    for name in ("trialbox", "trialbox_direct", "trialbox_async", "trl"):
        s = res["systems"][name]
        assert s["steps"] == 2, (name, s)
        assert s["episodes"] == s["graded"] == 2 * 2 * 2, (name, s)
        assert 0 < s["tokens"] <= 2 * 2 * 2 * 8, (name, s)
        for key in ("wall_s", "episodes_per_s", "tokens_per_s", "median_step_s"):
            assert isinstance(s[key], float) and s[key] > 0, (name, key, s)
        assert 0 < s["gen_share"] < 1 and 0 < s["env_share"] < 1, (name, s)
        assert 0 <= s["mean_reward"] <= 1
        assert 0 < s["policy_wait_share"] < 1 and 0 < s["loop_s"] <= s["wall_s"], (name, s)
    assert res["systems"]["trialbox"]["max_staleness_seen"] == 0
    assert res["systems"]["trialbox_direct"]["max_staleness_seen"] == 0
    assert res["ratio_sync_direct_episodes_per_s"] > 0
    again = res["systems_second_pair"]  # the reverse-order pair (ABBA) ran and graded
    assert again["trialbox"]["graded"] == again["trialbox_direct"]["graded"] == 8, again
    assert len(res["ratio_sync_direct_pairs"]) == 2 and res["ratio_sync_direct_cpu"] > 0
    assert res["systems"]["trialbox_async"]["max_staleness_seen"] == 1
    assert res["ratio_episodes_per_s"] > 0 and res["ratio_async_sync_episodes_per_s"] > 0
