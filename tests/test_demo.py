"""`make demo` end to end: every program gets the status it earned, nothing is left."""

import subprocess
import sys


def test_demo_runs_clean():
    p = subprocess.run([sys.executable, "-m", "trialbox.cli", "demo"], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert "every program got the status it earned" in p.stdout
    assert "0 sandbox processes left on the host" in p.stdout
    assert "the trusted judge on HumanEval/0" in p.stdout
