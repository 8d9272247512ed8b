"""End to end in real headless Chromium (Debian's, driven by Playwright) against the real
`trialbox serve` process: the dashboard's numbers move while runs and gradings go on,
and a reviewer's verdict given on the review page is stored in the SQLite queue and
changes the estimated error rate. Screenshots go to .artifacts/."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from tests.service.conftest import Server
from tests.telemetry.serving import make_queue
from trialbox.judge.audit import ReviewQueue

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(__file__).resolve().parents[2] / ".artifacts"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert os.path.exists(CHROMIUM), "Debian's chromium is missing: run scripts/setup-system.sh"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    db = tmp_path_factory.mktemp("review") / "review.db"
    make_queue(db)
    server = Server(env={"TRIALBOX_REVIEW_DB": str(db)})
    try:
        yield server, db
    finally:
        server.stop()


def number(page: Page, testid: str) -> float:
    text = page.get_by_test_id(testid).inner_text().replace(",", "")
    return float(text) if text not in ("–", "") else 0.0


class Load:
    """Runs and gradings sent to the server from a thread until stopped."""

    def __init__(self, url: str):
        self.url, self.stop, self.errors = url, threading.Event(), []
        self.sent = 0
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as c:
            while not self.stop.is_set():
                r1 = c.post("/v1/exec", json={"code": "print(sum(range(100)))"})
                r2 = c.post("/v1/submissions", json={"task_id": "HumanEval/0",
                                                     "completion": "    return False\n"})
                self.sent += 2
                self.errors += [r.text for r in (r1, r2) if r.status_code != 200]

    def __enter__(self) -> Load:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join(60)


def test_dashboard_shows_live_numbers_while_tasks_run(browser: Browser,
                                                      site: tuple[Server, Path]) -> None:
    server, _db = site
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.goto(server.url + "/")
    page.get_by_test_id("executions-total").wait_for()
    runs0, grades0 = number(page, "executions-total"), number(page, "gradings-total")
    stamp0 = page.get_by_test_id("updated-at").inner_text()
    with Load(server.url) as load:
        # No reload: the page polls, and its numbers must move while the load runs.
        page.wait_for_function(
            """([r, g]) => {
                const n = (id) => parseFloat(document.querySelector(`[data-testid=${id}]`)
                                             .innerText.replace(/,/g, "")) || 0;
                return n("executions-total") >= r + 6 && n("gradings-total") >= g + 2;
            }""", arg=[runs0, grades0], timeout=60_000)
        live_runs = number(page, "executions-total")
        assert page.get_by_test_id("updated-at").inner_text() != stamp0
        assert number(page, "exec-per-s") > 0
        assert page.get_by_test_id("outcomes").inner_text().count("failed") == 1
        ARTIFACTS.mkdir(exist_ok=True)
        shot = ARTIFACTS / "dashboard.png"
        page.screenshot(path=str(shot), full_page=True)
    assert not load.errors, load.errors[:3]
    assert live_runs > runs0 and load.sent >= 4
    assert shot.exists() and shot.stat().st_size > 10_000
    # The pool's size is shown as numbers, not placeholders.
    assert page.get_by_test_id("pool-ready").inner_text() != "–"
    page.close()


def test_reviewer_verdict_is_stored_and_changes_the_error_rate(
        browser: Browser, site: tuple[Server, Path]) -> None:
    server, db = site
    with ReviewQueue(db) as q:
        sampled = [i for i in q.pending(100) if "sample" in i.reasons]
        assert q.stats().error_rate is None
    target = sampled[0]
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.goto(server.url + "/review")
    page.get_by_test_id("items").wait_for()
    assert page.get_by_test_id("error-rate").inner_text() == "–"
    page.get_by_test_id(f"item-row-{target.id}").click()
    page.get_by_test_id("item-task").filter(has_text="HumanEval/0").wait_for()
    page.wait_for_function(
        "id => document.querySelector('[data-testid=item]').textContent.includes('Item ' + id)",
        arg=target.id)
    assert "return" in page.get_by_test_id("code-0").inner_text()
    assert "def has_close_elements" in page.get_by_test_id("item-prompt").inner_text()
    page.get_by_test_id("reviewer").fill("ana")
    page.get_by_test_id("note").fill("the hidden test expects the wrong order")
    page.get_by_test_id("verdict-wrong").click()
    page.get_by_test_id("saved").wait_for()
    page.get_by_test_id("error-rate").filter(has_text="100.0%").wait_for()
    assert "Wilson" in page.get_by_test_id("error-ci").inner_text()
    assert page.get_by_test_id("sample-wrong").inner_text() == "1"
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "review.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.exists() and shot.stat().st_size > 10_000

    # Stored in the queue's SQLite file, with the note and the reviewer.
    with ReviewQueue(db) as q:
        v = q.get(target.id).verdict
        assert v is not None and v.correct is False and v.reviewer == "ana"
        assert v.note == "the hidden test expects the wrong order"
        assert q.stats().error_rate == 1.0

    # A second verdict (correct) on another sampled item halves the estimate.
    page.get_by_test_id(f"item-row-{sampled[1].id}").click()
    page.wait_for_function(
        "id => document.querySelector('[data-testid=item]').textContent.includes('Item ' + id)",
        arg=sampled[1].id)
    page.get_by_test_id("verdict-correct").click()
    page.get_by_test_id("error-rate").filter(has_text="50.0%").wait_for()
    with ReviewQueue(db) as q:
        assert q.stats().sample_reviewed == 2 and q.stats().error_rate == 0.5
    page.close()


def test_a_repository_answer_is_reviewed_file_by_file(browser: Browser,
                                                      tmp_path: Path) -> None:
    db = tmp_path / "review.db"
    row = {"task_id": "repo/0", "passed": False, "reward": 0.0, "outcome": "failed",
           "flags": [], "tests": [], "files": {"src/m.py": "x = 2\n", "old.py": None}}
    with ReviewQueue(db) as q:
        q.add("run-r", [row], [(0, ["sample"])])
        (item,) = q.pending(10)
    server = Server(env={"TRIALBOX_REVIEW_DB": str(db)})
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        page.goto(server.url + "/review")
        page.get_by_test_id(f"item-row-{item.id}").click()
        page.get_by_test_id("item-task").filter(has_text="repo/0").wait_for()
        text = page.get_by_test_id("item").inner_text().upper()  # h2 is upper case
        assert "FILE OLD.PY (DELETED)" in text and "FILE SRC/M.PY" in text, text
        assert page.get_by_test_id("code-1").inner_text().strip() == "x = 2"
        page.close()
    finally:
        server.stop()


def test_run_page_draws_the_reward_curve_and_the_trace_page_its_spans(
        browser: Browser) -> None:
    from tests.telemetry.serving import dashboard_app, serve
    from trialbox import telemetry

    app = dashboard_app()  # sets up tracing with the dashboard's span keeper
    with telemetry.use_metrics():
        for step, mean in enumerate((0.1, 0.25, 0.4, 0.7)):
            telemetry.record_train_step("run-b", step, reward_mean=mean, loss=1.0 / (step + 1))
        with telemetry.span("episode"):
            with telemetry.span("judge.grade", {"task.id": "T1"}):
                trace_id = telemetry.current_ids()[0]  # type: ignore[index]
        with serve(app) as url:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.goto(url + "/runs/run-b")
            page.get_by_test_id("last-reward_mean").filter(has_text="0.700").wait_for()
            assert page.get_by_test_id("run-steps").inner_text() == "4"
            # uPlot drew the curve: a canvas with the run's size inside the card
            box = page.locator("[data-testid=curve-reward_mean] canvas").bounding_box()
            assert box is not None and box["width"] > 200 and box["height"] > 100
            page.screenshot(path=str(ARTIFACTS / "run.png"))
            page.goto(f"{url}/traces/{trace_id}")
            spans = page.get_by_test_id("spans")
            spans.filter(has_text="judge.grade").wait_for()
            text = spans.inner_text()
            assert text.index("episode") < text.index("judge.grade")
            assert "task.id=T1" in text
            page.close()
    assert (ARTIFACTS / "run.png").stat().st_size > 5_000
