#!/bin/bash
# Fresh-venv check of trialbox's packaging (issue 19): `pip install trialbox` into a new
# venv imports without any optional library; then each extra installs on top and its
# integration imports with the real library. Run by `make bench` (it downloads and
# installs torch & co. into a throwaway venv: minutes, not a unit test).
#   scripts/check-extras.sh [EXTRA ...]     default: trl ray s3 verl e2b
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$(command -v python3)}
extras=("$@")
[ ${#extras[@]} -gt 0 ] || extras=(trl ray s3 verl e2b)
tmp=$(mktemp -d /tmp/trialbox-extras.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
"$python" -m venv "$tmp/venv"
pip() { "$tmp/venv/bin/python" -m pip "$@"; }
t0=$(date +%s)
pip install --quiet "$root" 2>&1 | grep -v '^WARNING' || true
"$tmp/venv/bin/python" - <<'PY'
import json, sys
import trialbox, trialbox.cli, trialbox.judge.evaluate, trialbox.integrations.trl
import trialbox.integrations.verl, trialbox.integrations.gym, trialbox.integrations.trl_env
import trialbox.store.harbor, trialbox.judge.harbor
optional = ("trl", "verl", "ray", "s3fs", "moto", "gymnasium", "datasets")
pulled = sorted(m for m in sys.modules if m.split(".")[0] in optional)
assert not pulled, f"the core's import pulled optional libraries: {pulled}"
print("core: installed and imported; no optional library pulled")
PY
echo "core: $(( $(date +%s) - t0 )) s"
for extra in "${extras[@]}"; do
    t0=$(date +%s)
    pip install --quiet "$root[$extra]" 2>&1 | grep -v '^WARNING' || true
    case $extra in
        trl)  code='import trl, datasets, trialbox.integrations.trl as m; from trl import GRPOTrainer; print("trl", trl.__version__)';;
        ray)  code='import ray, trialbox.cluster as m; print("ray", ray.__version__)';;
        s3)   code='import s3fs, fsspec; fsspec.get_filesystem_class("s3"); print("s3fs", s3fs.__version__)';;
        e2b)  code='import trialbox.service.e2b_envd as m; from importlib.metadata import version; print("e2b", version("e2b"))';;
        verl) code='import verl, trialbox.integrations.verl as m; from verl.trainer.ppo.reward import get_custom_reward_fn; print("verl", verl.__version__)';;
        *)    code="print('$extra: installed (no import check written)')";;
    esac
    "$tmp/venv/bin/python" -c "$code"
    echo "[$extra]: $(( $(date +%s) - t0 )) s"
done
echo "check-extras: every extra installed from a fresh venv and imported"
