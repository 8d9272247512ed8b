"""scripts/gpu_check.py, the trainer's device check, in its CPU mode: every stage but the
end-to-end demo (stage 5 is `trialbox demo --smoke`, which tests/test_demo.py runs) on
the CPU path, with small sizes. On a GPU machine run the script itself with
`--device cuda` (docs/training.md, "GPU")."""

import json
import os
import subprocess
import sys

import pytest
import torch

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "gpu_check.py")


def run_check(out, *args):
    return subprocess.run([sys.executable, SCRIPT, "--out", str(out), "--quick",
                           "--threads", "1", "--skip-demo", *args],
                          capture_output=True, text=True, timeout=110)


@pytest.mark.slow
def test_cpu_mode_runs_every_device_stage(tmp_path):
    p = run_check(tmp_path, "--device", "cpu")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    st = report["stages"]
    for name in ("device", "sft", "generate", "update", "timing"):
        assert st[name]["ok"] is True, (name, st[name])
    assert st["device"]["param_devices"] == ["cpu"]
    assert st["sft"]["loss_last"] < st["sft"]["loss_first"]
    gen = st["generate"]
    assert gen["t1"]["max_abs_logprob_diff"] < 1e-3
    assert gen["greedy"]["max_abs_logprob_diff"] < 1e-3
    assert sum(gen["t1"]["finish"].values()) == gen["batch"]
    for algo in ("grpo", "ppo"):
        u = st["update"][algo]
        assert u["trained_on"] > 0 and u["max_param_change"] > 0
        assert u["loss_device"] == pytest.approx(u["loss_cpu"], abs=1e-4)
    assert [r["device"] for r in st["timing"]["rows"]] == ["cpu"]
    assert st["timing"]["rows"][0]["sft_steps_per_s"] > 0
    # skipped on request, and said so in the report (not silently)
    assert st["demo"] == {"ok": None, "skipped": "--skip-demo"}
    assert "| demo | 0.66M | cpu |" in p.stdout


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error; a GPU is here")
def test_cuda_without_a_gpu_fails_with_the_reason(tmp_path):
    p = run_check(tmp_path, "--device", "cuda")
    assert p.returncode == 1
    st = json.loads((tmp_path / "gpu_check.json").read_text())["stages"]
    assert st["device"]["ok"] is False
    assert "no CUDA GPU is available" in st["device"]["error"]
    assert "sft" not in st  # nothing else ran on a device that is not there
