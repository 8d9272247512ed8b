#!/usr/bin/env bash
# HumanEval's 164 canonical solutions judged by `trialbox eval` on every isolation tier
# (namespace, gvisor, container), one after another; prints each tier's summary line
# (pass@1, outcomes, wall_s, graded_per_s). Every canonical solution must pass on every
# tier: the script exits 1 otherwise. Too long for `make test` (tests/judge/test_tiers.py
# runs a handful there).
#
#   scripts/eval-tiers.sh [WORKERS] [TIERS]      # default: 4 "namespace gvisor container"
#   KEEP=DIR scripts/eval-tiers.sh ...           # keep each tier's rows as DIR/TIER.jsonl
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
WORKERS=${1:-4}
TIERS=${2:-namespace gvisor container}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
out=${KEEP:-$dir}
mkdir -p "$out"
"$PY" - "$dir/samples.jsonl" <<'EOF'
import json, sys
from trialbox.store.tasks import load_tasks
with open(sys.argv[1], "w") as f:
    for t in load_tasks("humaneval"):
        f.write(json.dumps({"task_id": t.task_id, "completion": t.canonical_solution}) + "\n")
EOF
status=0
for tier in $TIERS; do
    line=$("$PY" -c "from trialbox.cli import main; raise SystemExit(main())" eval --tasks humaneval --samples "$dir/samples.jsonl" \
           --out "$out/$tier.jsonl" --workers "$WORKERS" --tier "$tier" | tail -1)
    echo "{\"tier\": \"$tier\", \"summary\": $line}"
    "$PY" -c 'import json,sys; s=json.loads(sys.argv[1]); sys.exit(0 if s["pass@1"] == 1.0 and s["samples"] == 164 else 1)' "$line" || status=1
done
exit $status
