"""The integrations need none of their trainer libraries to import: TRL, verl and
gymnasium stay unimported (checked in a fresh interpreter)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_importing_the_integrations_pulls_no_trainer_library() -> None:
    code = ("import sys, json\n"
            "import trialbox.integrations.trl, trialbox.integrations.verl, "
            "trialbox.integrations.gym, trialbox.integrations.trl_env\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('trl', 'verl', 'gymnasium', 'gym', 'datasets'))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert json.loads(out.stdout) == []
