"""The review loop as a user runs it (issue 30): `trialbox eval` rows carry the
completion, `trialbox audit queue` queues them, `trialbox audit list` prints the queue
with item ids, and a real `trialbox serve` (TRIALBOX_REVIEW_DB) shows the task and the
code of an item at /api/review/items/{id} — what /review asks a person to judge — on
a user's own task set."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.service.conftest import Server

TRIALBOX = [sys.executable, "-m", "trialbox.cli"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TRIALBOX, *args], capture_output=True, text=True, timeout=300)


TASKS: list[dict[str, object]] = [  # a user's own task set: function and stdio
    {"task_id": "own/add", "prompt": "def add(a, b):\n    \"\"\"a + b\"\"\"\n",
     "entry_point": "add", "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n"},
    {"task_id": "own/double", "kind": "stdio", "prompt": "Print twice the int on stdin.",
     "tests": [{"stdin": "2\n", "expected": "4\n"}, {"stdin": "5\n", "expected": "10\n"}]},
]


def test_a_graded_run_is_reviewed_with_its_code(tmp_path: Path) -> None:
    samples = [  # a right answer, a wrong one, one fenced in a chat reply
        {"task_id": "own/add", "completion": "    return a + b\n"},
        {"task_id": "own/add", "completion": "    return a - b\n"},
        {"task_id": "own/double",
         "completion": "Here:\n```python\nprint(2 * int(input()))\n```\n"},
    ]
    tasks, s = tmp_path / "own.jsonl", tmp_path / "s.jsonl"
    out, db = tmp_path / "graded.jsonl", tmp_path / "review.db"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    s.write_text("".join(json.dumps(x) + "\n" for x in samples))
    p = _run("eval", "--tasks", str(tasks), "--samples", str(s), "--out", str(out),
             "--workers", "1")
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["passed"] for r in rows] == [True, False, True]
    assert [r["completion"] for r in rows] == [x["completion"] for x in samples]

    p = _run("audit", "queue", "--db", str(db), "--rows", str(out), "--run-id", "r1",
             "--fraction", "1.0", "--tasks", str(tasks))
    assert p.returncode == 0 and json.loads(p.stdout)["added"] == 3, p.stderr
    p = _run("audit", "list", "--db", str(db))
    assert p.returncode == 0, p.stderr
    head, *lines = p.stdout.splitlines()
    assert head.split() == ["id", "run", "row", "task", "outcome", "reward", "reasons",
                            "verdict"]
    listed = [line.split() for line in lines]
    assert [(x[1], x[2], x[3]) for x in listed] == [
        ("r1", str(i), x["task_id"]) for i, x in enumerate(samples)]
    ids = [int(x[0]) for x in listed]
    assert "3 item(s)" in p.stderr and "audit verdict" in p.stderr

    server = Server(env={"TRIALBOX_REVIEW_DB": str(db)})
    try:
        with server.client() as c:
            assert c.get("/review").status_code == 200
            for item_id, sample in zip(ids, samples, strict=True):
                item = c.get(f"/api/review/items/{item_id}").json()
                assert [t["code"] for t in item["turns"]] == [sample["completion"]]
                prompts = {t["task_id"]: t["prompt"] for t in TASKS}
                assert item["prompt"] == prompts[sample["task_id"]]  # audit queue --tasks
            r = c.post(f"/api/review/items/{ids[1]}/verdict",
                       json={"correct": True, "reviewer": "ana"})
            assert r.status_code == 200, r.text
    finally:
        server.stop()

    p = _run("audit", "list", "--db", str(db), "--pending", "--json")
    assert p.returncode == 0, p.stderr
    pending = [json.loads(line) for line in p.stdout.splitlines()]
    assert [x["id"] for x in pending] == [ids[0], ids[2]]
    assert all(x["verdict"] is None and x["run_id"] == "r1" for x in pending)
