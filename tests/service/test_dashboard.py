"""The dashboard's pages and JSON endpoints over real HTTP (uvicorn on a free loopback
port): live numbers, runs, traces, and the review API on a real SQLite review queue."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.telemetry.serving import dashboard_app, make_queue, serve
from trialbox import telemetry
from trialbox.errors import UsageError
from trialbox.service.dashboard import DashboardConfig
from trialbox.types import Grade, Outcome


@pytest.fixture
def client(tmp_path: Path) -> Iterator[httpx.Client]:
    make_queue(tmp_path / "review.db")
    app = dashboard_app(DashboardConfig(review_db=str(tmp_path / "review.db")))
    with telemetry.use_metrics(), serve(app) as url, httpx.Client(base_url=url) as c:
        yield c


def test_pages_and_vendored_assets_are_served(client: httpx.Client) -> None:
    for page, script in (("/", "dashboard.js"), ("/review", "review.js"),
                         ("/runs/r1", "run.js"), ("/traces/" + "a" * 32, "trace.js")):
        r = client.get(page)
        assert r.status_code == 200 and f'src="/static/{script}"' in r.text, page
    for asset in ("vendor/htm-preact-standalone.module.js", "vendor/uPlot.iife.min.js",
                  "vendor/uPlot.min.css", "dashboard.js", "common.js", "review.js"):
        r = client.get(f"/static/{asset}")
        assert r.status_code == 200 and len(r.content) > 500, asset
    # No page or script refers to anything off this server.
    for asset in ("index.html", "dashboard.js", "common.js", "review.js", "run.js",
                  "trace.js"):
        text = client.get(f"/static/{asset}").text
        assert "http://" not in text and "https://" not in text, asset


def test_live_numbers_failures_flags_and_runs(client: httpx.Client) -> None:
    telemetry.task_moved(None, "queued")
    telemetry.task_moved(None, "running")
    with telemetry.capture():
        with telemetry.span("grading"):
            telemetry.record_grade(Grade("T1", Outcome.INFRA, message="node lost"),
                                   "function", 0.2)
            trace_id = telemetry.current_ids()[0]  # type: ignore[index]
    telemetry.record_grade(Grade("T2", Outcome.PASSED, flags=("gc-walk",)), "function", 0.1)
    for r in (1.0, 0.0, 1.0, 0.55):
        telemetry.record_reward(r)
    for step, mean in enumerate((0.1, 0.3, 0.5)):
        telemetry.record_train_step("run-x", step, reward_mean=mean, loss=2.0 - step)

    d = client.get("/api/dashboard").json()
    assert d["tasks"] == {"queued": 1, "running": 1}
    assert d["totals"]["gradings"] == 2 and d["totals"]["infra_failures"] == 1
    assert d["totals"]["outcomes"] == {"infra": 1.0, "passed": 1.0}
    assert d["infra_failure_rate"] == pytest.approx(0.5)
    assert d["reward_histogram"] == [1, 0, 0, 0, 0, 1, 0, 0, 0, 2]
    assert d["totals"]["flags"] == {"gc-walk": 1.0}
    kinds = [(e["kind"], e.get("trace_id")) for e in d["events"]]
    assert kinds == [("flag", None), ("infra", trace_id)]  # newest first
    assert d["runs"] == [{"run_id": "run-x", "steps": 3, "last_step": 2, "reward_mean": 0.5}]
    assert sum(x for x in d["series"]["grade_per_s"] if x) == pytest.approx(2 / 5)

    run = client.get("/api/runs/run-x").json()
    assert run["steps"] == [0, 1, 2]
    assert run["scalars"]["reward_mean"] == [0.1, 0.3, 0.5]
    assert run["scalars"]["loss"] == [2.0, 1.0, 0.0]
    missing = client.get("/api/runs/nope")
    assert missing.status_code == 404 and "run-x" in missing.json()["detail"]

    t = client.get(f"/api/traces/{trace_id}").json()
    assert [s["name"] for s in t["spans"]] == ["grading"]
    bad = client.get("/api/traces/not-hex")
    assert bad.status_code == 422 and "32 lowercase hex" in bad.json()["detail"]


def test_review_api_stores_verdicts_and_updates_the_error_rate(client: httpx.Client) -> None:
    listed = client.get("/api/review/items").json()
    items, stats = listed["items"], listed["stats"]
    assert stats["queued"] == len(items) >= 5 and stats["error_rate"] is None
    sampled = [i for i in items if "sample" in i["reasons"]]
    assert len(sampled) == 5

    detail = client.get(f"/api/review/items/{sampled[0]['id']}").json()
    assert detail["task_id"] == "HumanEval/0"
    assert detail["prompt"].startswith("from typing import List")  # bundled HumanEval
    assert detail["turns"][0]["code"].startswith("    return ")
    assert detail["tests"][0]["name"] == "test 1"

    r = client.post(f"/api/review/items/{sampled[0]['id']}/verdict",
                    json={"correct": False, "note": "test 1 is wrong", "reviewer": "ana"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["verdict"]["correct"] is False and body["replaced"] is None
    assert body["stats"]["error_rate"] == 1.0 and body["stats"]["sample_reviewed"] == 1
    lo, hi = body["stats"]["error_rate_ci"]
    assert 0 < lo < 1.0 == hi
    r = client.post(f"/api/review/items/{sampled[1]['id']}/verdict",
                    json={"correct": True, "reviewer": "ana"})
    assert r.json()["stats"]["error_rate"] == 0.5

    # Stored in the SQLite file, not just in the server.
    path = client.get("/api/review/stats").json()
    assert path["sample_reviewed"] == 2 and path["runs"] == ["run-a"]
    reviewed = client.get("/api/review/items", params={"state": "reviewed"}).json()["items"]
    notes = {i["id"]: (i["verdict"]["correct"], i["verdict"]["note"]) for i in reviewed}
    assert notes == {sampled[0]["id"]: (False, "test 1 is wrong"),
                     sampled[1]["id"]: (True, "")}


@pytest.mark.parametrize("body, field", [
    ({"note": "x"}, "correct"),
    ({"correct": "yes"}, "correct"),
    ({"correct": True, "note": 5}, "note"),
    ({"correct": True, "verdict": 1}, "verdict"),
])
def test_bad_verdicts_are_422_naming_the_field(client: httpx.Client, body: dict[str, Any],
                                               field: str) -> None:
    item = client.get("/api/review/items").json()["items"][0]["id"]
    r = client.post(f"/api/review/items/{item}/verdict", json=body)
    assert r.status_code == 422
    assert any(field in err["loc"] for err in r.json()["detail"]), r.json()
    assert client.get(f"/api/review/items/{item}").json()["verdict"] is None


def test_unknown_item_and_missing_queue(client: httpx.Client) -> None:
    r = client.post("/api/review/items/99999/verdict", json={"correct": True})
    assert r.status_code == 404 and "99999" in r.json()["detail"]
    with serve(dashboard_app(DashboardConfig(review_db=None))) as url:
        r = httpx.get(f"{url}/api/review/stats")
    assert r.status_code == 409 and "TRIALBOX_REVIEW_DB" in r.json()["detail"]


def test_a_repository_answer_is_shown_file_by_file(tmp_path: Path) -> None:
    """A repository answer given as files (a `trialbox eval` row's `files`): one turn per
    file, its path named, a deleted file's code null."""
    from trialbox.judge.audit import ReviewQueue
    row = {"task_id": "repo/0", "passed": False, "reward": 0.0, "outcome": "failed",
           "flags": [], "tests": [], "files": {"src/m.py": "x = 2\n", "old.py": None}}
    with ReviewQueue(tmp_path / "review.db") as q:
        q.add("run-r", [row], [(0, ["sample"])])
    app = dashboard_app(DashboardConfig(review_db=str(tmp_path / "review.db")))
    with serve(app) as url:
        item = httpx.get(f"{url}/api/review/items").json()["items"][0]["id"]
        got = httpx.get(f"{url}/api/review/items/{item}").json()
    assert got["turns"] == [{"path": "old.py", "code": None},
                            {"path": "src/m.py", "code": "x = 2\n"}]


def test_not_a_review_queue_is_a_clear_error(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    other.write_bytes(b"this is not sqlite" * 100)
    with serve(dashboard_app(DashboardConfig(review_db=str(other)))) as url:
        r = httpx.get(f"{url}/api/review/items")
    assert r.status_code == 409 and "not a usable review queue" in r.json()["detail"]


def test_dashboard_config_says_what_to_change() -> None:
    with pytest.raises(UsageError, match="trace_id"):
        DashboardConfig(trace_url="http://jaeger/trace/")
    with pytest.raises(UsageError, match="poll_ms"):
        DashboardConfig(poll_ms=5)
