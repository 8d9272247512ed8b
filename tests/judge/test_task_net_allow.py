"""`net_allow` declared in a task file (a row, or the task_set line) reaches the
candidate's sandbox: judged for real on the namespace and gvisor tiers, a candidate that
fetches from the allow-listed mirror passes only when its task declares the mirror, and a
malformed or widened allow-list is a UsageError naming the file, line and field."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sandbox.test_network import Mirror
from trialbox.errors import UsageError
from trialbox.judge.function import JudgeConfig, judge_function, judge_pool_config
from trialbox.judge.provider import candidate_limits
from trialbox.sandbox import network as nw
from trialbox.store.tasks import load_tasks
from trialbox.types import Limits, Outcome, Risk

FETCH = {"task_id": "fetch", "prompt": "def fetch():\n",
         "entry_point": "fetch",
         "test": "def check(candidate):\n    assert candidate() == 'allowed'\n"}
ANSWER = ("    import socket\n    s = socket.socket()\n    s.settimeout(5)\n"
          "    try:\n        s.connect(('10.77.0.5', 8080))\n        return s.recv(100).decode()\n"
          "    except OSError as e:\n        return type(e).__name__\n")


def write(tmp_path: Path, *rows: dict[str, object]) -> str:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_rows_and_task_sets_declare_allow_lists(tmp_path: Path) -> None:
    tasks = load_tasks(write(tmp_path, {"task_set": {"risk": "untrusted",
                                                     "net_allow": ["10.77.0.5:8080",
                                                                   "10.1.0.0/24:443"]}},
                             FETCH, {**FETCH, "task_id": "narrow",
                                     "net_allow": ["10.1.0.0/24:443"]}))
    assert [(t.task_id, t.risk, t.net_allow) for t in tasks] == [
        ("fetch", Risk.UNTRUSTED, ("10.77.0.5:8080", "10.1.0.0/24:443")),
        ("narrow", Risk.UNTRUSTED, ("10.1.0.0/24:443",))]
    plain, own = load_tasks(write(tmp_path, {**FETCH, "task_id": "plain"},
                                  {**FETCH, "net_allow": ["10.77.0.5:8080"]}))
    assert plain.net_allow == () and own.net_allow == ("10.77.0.5:8080",)
    lim = Limits(wall_s=3)
    assert candidate_limits(lim, plain) is lim
    assert candidate_limits(lim, own) == lim.with_(net_allow=("10.77.0.5:8080",))


@pytest.mark.parametrize("rows, want", [
    ([{**FETCH, "net_allow": "10.77.0.5:8080"}],
     r"tasks.jsonl:1: task 'fetch': field 'net_allow' must be a list of 'ADDR\[/PREFIX\]:PORT'"),
    ([{**FETCH, "net_allow": ["10.77.0.5"]}], r"tasks.jsonl:1: .*'net_allow'.* has no port"),
    ([{**FETCH, "net_allow": ["mirror.local:80"]}], r"net_allow.*no host names"),
    ([{**FETCH, "net_allow": ["127.0.0.1:80"]}], r"net_allow.*loopback"),
    ([{**FETCH, "net_allow": ["10.0.0.5:99999"]}], r"net_allow.*1 to 65535"),
    ([{"task_set": {"net_allow": [5]}}, FETCH], r"tasks.jsonl:1: task_set: field 'net_allow'.*"
                                               "not a string"),
    ([{"task_set": {"net_allow": ["10.77.0.5:8080"]}}, {**FETCH, "net_allow": ["10.9.9.9:80"]}],
     r"tasks.jsonl:2: .*'10.9.9.9:80' is not in its task set's allow-list.*never widen it"),
])
def test_a_malformed_allow_list_names_what_to_change(tmp_path: Path, rows: list[dict[str, object]],
                                                     want: str) -> None:
    with pytest.raises(UsageError, match=want):
        load_tasks(write(tmp_path, *rows))


@pytest.fixture(scope="module")
def mirror() -> Iterator[Mirror]:
    nw.check_node()
    m = Mirror()
    yield m
    m.close()


def _provider(tier: str, egress: str) -> object:
    if tier == "namespace":
        from trialbox.sandbox.pool import CellPool
        return CellPool(judge_pool_config(warm=1, net_egress=egress))
    from trialbox.sandbox.gvisor import GVisorProvider
    from trialbox.sandbox.oci import OciConfig
    return GVisorProvider(OciConfig(warm=1, net_egress=egress,
                                    preload_sources=judge_pool_config().preload_sources))


@pytest.mark.parametrize("tier", ["namespace", "gvisor"])
def test_a_tasks_allow_list_reaches_the_candidates_sandbox(tier: str, mirror: Mirror,
                                                          tmp_path: Path) -> None:
    """The same answer fetches from the mirror: passed when the task file allows it,
    failed (the connection refused from outside) when it does not."""
    allowed, closed = load_tasks(write(tmp_path, {**FETCH, "net_allow": ["10.77.0.5:8080"]},
                                       {**FETCH, "task_id": "closed"}))
    config = JudgeConfig(candidate_limits=JudgeConfig().candidate_limits.with_(
        wall_s=30, cpu_s=10))  # a connect under gVisor on a loaded host can take seconds

    async def body() -> tuple[object, object]:
        provider = _provider(tier, mirror.path)
        await provider.start()  # type: ignore[attr-defined]
        try:
            g_allowed = await judge_function(allowed, ANSWER, provider, config)  # type: ignore[arg-type]
            g_closed = await judge_function(closed, ANSWER, provider, config)  # type: ignore[arg-type]
            return g_allowed, g_closed
        finally:
            await provider.close()  # type: ignore[attr-defined]

    g_allowed, g_closed = asyncio.run(body())
    assert g_allowed.outcome is Outcome.PASSED, g_allowed  # type: ignore[attr-defined]
    assert g_closed.outcome is Outcome.FAILED, g_closed  # type: ignore[attr-defined]
