"""The cluster backend on a real multi-node Ray cluster on this machine (Ray's own
`cluster_utils.Cluster`: one GCS, several raylets with distinct resources). One cluster
serves the module (starting Ray is slow on two cores); tests that kill, drain or freeze a
node use a node of their own.

Every scheduler run here journals on the driver; `check_journal` proves each task has
exactly one result and every move was legal."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")  # the dev extra installs it; `pip install trialbox[ray]`

from ray.cluster_utils import Cluster  # noqa: E402

from tests.conftest import eventually, load_scaled  # noqa: E402
from tests.schedule.journal_checks import check_journal  # noqa: E402
from trialbox.cluster.backend import (  # noqa: E402
    ClusterConfig,
    ClusterUnreachable,
    RayBackend,
)
from trialbox.cluster.node import FakeWorkload  # noqa: E402
from trialbox.cluster.placement import TierUnavailable  # noqa: E402
from trialbox.errors import UsageError  # noqa: E402
from trialbox.versions import VersionMismatch  # noqa: E402
from trialbox.schedule.scheduler import Scheduler, SchedulerConfig, TaskSpec  # noqa: E402
from trialbox.store.journal import Journal  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# The module's first test also pays for starting the cluster (one GCS and two raylets:
# ~35 s on a quiet 2-core machine, 95 s at load 200), which pytest-timeout counts in
# that test's time. Nothing timed here is a guarantee; the bound only catches a hang.
pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


def node_resources(slots: int, *tiers: str) -> dict[str, float]:
    return {"trialbox_node": 1, "trialbox_slots": slots,
            **{f"trialbox_tier_{t}": 1 for t in tiers}}


# Ray's GCS learns that a raylet is gone only from its health checks: `remove_node`
# kills the processes without telling it, so until the checks fail the removed node is
# still listed alive (Ray's defaults: a check every 3 s, dead after 5 failures, ~15-18 s)
# and the next test's backend would try to start an actor on it. Checking every 0.2 s,
# dead after 10 failures, a removed node (connection refused at once) is dead within
# ~2 s; a live but slow raylet is still only declared dead after 10 checks in a row
# time out (the checks are sequential, 10 s each by Ray's default): ~100 s without an
# answer, twice Ray's own tolerance (5 x 10 s).
HEALTH_CHECK = {"health_check_period_ms": 200, "health_check_failure_threshold": 10}


def remove(cluster: Cluster, node: Any, allow_graceful: bool = True) -> None:
    """Kill the node's processes and wait until the GCS lists it dead: the next test
    starts on a cluster whose membership is settled."""
    cluster.remove_node(node, allow_graceful=allow_graceful)
    wait_dead(node)


def all_nodes_free() -> float:
    """The trialbox_node resources no actor holds, if that is all of them; else -1."""
    total = ray.cluster_resources().get("trialbox_node", 0)
    free = ray.available_resources().get("trialbox_node", 0)
    return float(free) if free == total else -1.0


def wait_all_nodes_free(timeout: float = 30) -> bool:
    """Whether every trialbox_node resource is free within `timeout`: no node actor
    left (`ray.kill` frees an actor's resources asynchronously, hence the wait; a test
    measuring "free" at its start could see the previous test's actor still there)."""
    deadline = time.monotonic() + timeout
    while all_nodes_free() < 0:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def listed_alive(node: Any) -> bool:
    return any(n["NodeID"] == nid(node) and n["Alive"] for n in ray.nodes())


def wait_dead(node: Any) -> None:
    deadline = time.monotonic() + 60
    while listed_alive(node):
        assert time.monotonic() < deadline, f"node {nid(node)} still listed alive"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # the head is node a too (one raylet fewer to start: ~10 s on two cores)
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "include_dashboard": False, "_system_config": HEALTH_CHECK,
        "resources": node_resources(2, "fake")})
    c.trialbox_nodes = {  # type: ignore[attr-defined]
        "a": c.head_node,
        "b": c.add_node(num_cpus=1, resources=node_resources(2, "fake", "namespace")),
    }
    with driving(c, tmp_path_factory):
        yield c


def head_cluster(*tiers: str, slots: int = 2) -> Cluster:
    """A cluster whose head (one CPU) is a trialbox node offering `tiers`."""
    return Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "include_dashboard": False, "_system_config": HEALTH_CHECK,
        "resources": node_resources(slots, *tiers)})


def tiny_train_toml(out: Path, steps: int = 1, mode: str = "sync") -> str:
    """A `trialbox train` config that runs in seconds: SFT, `steps` GRPO steps of 2 x 2
    one-turn episodes, pass@1 on 2 tasks before and after."""
    return f"""
[run]
out_dir = "{out}"
seed = 1
[model]
n_layer = 1
n_embd = 32
n_head = 2
[sft]
steps = 2
batch_size = 4
[grpo]
steps = {steps}
tasks_per_step = 2
group_size = 2
micro_batch = 2
[rollout]
max_turns = 1
max_new_tokens = 8
env_workers = 2
mode = "{mode}"
[eval]
tasks = 2
"""


@contextlib.contextmanager
def connected(c: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """This process as the driver of `c` (Ray puts the driver's working directory first
    on its workers' sys.path; from anywhere but a checkout, nodes import the trialbox
    they have installed, as the driver does), disconnected at the end."""
    here = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("driver"))
    try:
        ray.init(address=c.address, namespace="trialbox", log_to_driver=False,
                 configure_logging=False)
    finally:
        os.chdir(here)
    try:
        yield
    finally:
        ray.shutdown()


@contextlib.contextmanager
def driving(c: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """This process as the driver of `c`, then both shut down."""
    try:
        with connected(c, tmp_path_factory):
            yield
    finally:
        c.shutdown()


def nid(node: Any) -> str:
    return str(node.node_id)


def config(cluster: Cluster, **kw: Any) -> ClusterConfig:
    kw.setdefault("poll_s", 0.2)
    kw.setdefault("heartbeat_s", 0.2)
    # Silence is not what most tests here are about: under load (load average 50 on two
    # cores) a ping's round trip took over 5 s and a busy node was presumed dead. That
    # costs a retry, never a second result, but it breaks "the drained node's work was
    # not retried". The tests of silence pass their own short dead_after_s.
    kw.setdefault("dead_after_s", 30.0)
    kw.setdefault("warm", 2)  # warm cells per namespace pool (8 by default)
    return ClusterConfig(address=cluster.address, **kw)


async def run_tasks(backend: RayBackend, db: str, n: int, *, tier: str = "fake",
                    during: Callable[[], Awaitable[None]] | None = None,
                    max_active: int = 16) -> tuple[dict[str, Any], dict[str, Any]]:
    """n scheduler tasks, each one piece of FakeWorkload work on the cluster; returns
    check_journal's {task: (state, reward)} and {task: the answer of its final attempt}
    (the grade journaled by the attempt that finished it)."""
    journal = Journal(db)

    async def job(ctx: Any) -> float | None:
        await ctx.grading()
        out = await backend.run("w", ctx.task_id, tier=tier)
        await ctx.record_grade(out)
        return 1.0

    sc = SchedulerConfig(max_active=max_active, preempt=False, max_retries=5,
                         backoff_s=0.05, backoff_max_s=0.2)
    try:
        async with Scheduler(journal, "r", job, sc) as s:
            await s.submit([TaskSpec(f"t{i}") for i in range(n)])
            if during is not None:
                await during()
            await s.drain()
        finished = journal.results_of("r")
        grades = journal.grades_of("r")
        answers = {t: grades[(t, finished[t][1])] for t in finished}
    finally:
        journal.close()
    return check_journal(db, "r", {f"t{i}" for i in range(n)}), answers


def transitions(db: str, cause: str) -> list[tuple[str, str]]:
    import sqlite3
    c = sqlite3.connect(db)
    try:
        return list(c.execute("SELECT task_id, message FROM transitions WHERE cause=?",
                              (cause,)))
    finally:
        c.close()


# ---------------------------------------------------------------------- bad input
def test_bad_input_is_refused_and_nothing_is_left_started(cluster: Cluster,
                                                          tmp_path: Path) -> None:
    async def body() -> None:
        t0 = time.monotonic()
        with pytest.raises(ClusterUnreachable, match="no Ray cluster at --address "
                           "127.0.0.1:1.*ray start --head"):
            await RayBackend(ClusterConfig(address="127.0.0.1:1")).start()
        assert time.monotonic() - t0 < load_scaled(10)  # a wall bound, load-scaled

        free = all_nodes_free()
        async with RayBackend(config(cluster, min_nodes=2)) as b:
            with pytest.raises(TierUnavailable, match="'gvisor'.*offered: fake, namespace"):
                b.check_tier("gvisor")
        # a trialbox on the nodes that differs from the driver's by one line
        other = tmp_path / "other"
        shutil.copytree(ROOT / "trialbox", other / "trialbox",
                        ignore=shutil.ignore_patterns("__pycache__"))
        init = other / "trialbox" / "__init__.py"
        init.write_text(init.read_text() + "\n# another build\n")
        env = {"env_vars": {"PYTHONPATH": str(other)}}  # what the nodes import
        with pytest.raises(VersionMismatch, match=r"runs other software than the driver: "
                           r"code \w+ \(driver: \w+\).*trialbox there is at "):
            await RayBackend(config(cluster, min_nodes=2, node_runtime_env=env)).start()
        # the refused node actors were killed: their trialbox_node resource is free again
        assert free == 2 and await asyncio.to_thread(wait_all_nodes_free)
    asyncio.run(body())


def test_eval_with_a_tier_no_node_offers_touches_no_journal(cluster: Cluster,
                                                            tmp_path: Path) -> None:
    from trialbox.cluster.evaljob import eval_on_cluster
    from trialbox.store.tasks import index, load_humaneval
    tasks = index(load_humaneval()[:1])
    sample = {"task_id": "HumanEval/0", "completion": "    return False\n"}
    db = tmp_path / "j.db"
    with pytest.raises(TierUnavailable, match="'gvisor'"):
        asyncio.run(eval_on_cluster(
            tasks, [sample], cluster=config(cluster, min_nodes=2), tier="gvisor",
            workers=2, repeat=1, db=str(db), run="eval", resume=False,
            samples_bytes=b"", reward="binary", time_scale=None, amplified=None,
            config=None, stdio_config=None, reward_spec=None))
    assert not db.exists()


def test_node_gone_before_its_actor_ran_is_skipped_not_an_error(cluster: Cluster) -> None:
    """A raylet removed a moment before the driver starts is still listed alive until
    the GCS's health checks fail; its actor then dies unstarted. That is a node that
    left, not a refusal: start succeeds with the others (it used to raise
    VersionMismatch "... failed to start")."""
    z = cluster.add_node(num_cpus=1, resources=node_resources(1, "fake"))
    cluster.remove_node(z, allow_graceful=False)  # the GCS learns it from health checks
    assert listed_alive(z)

    async def body() -> None:
        async with RayBackend(config(cluster, min_nodes=2)) as be:
            assert nid(z) in be.died_joining and nid(z) not in be.members
            assert not be.refused and not be.failed and len(be.members) == 2
            await be.load("w", FakeWorkload())
            assert (await be.run("w", 1, tier="fake"))["payload"] == 1
    try:
        asyncio.run(body())
    finally:
        wait_dead(z)


# ---------------------------------------------------------------------- placement
def test_spread_tier_and_session_affinity(cluster: Cluster, tmp_path: Path) -> None:
    a, b = (nid(n) for n in cluster.trialbox_nodes.values())  # type: ignore[attr-defined]

    async def body() -> None:
        async with RayBackend(config(cluster, min_nodes=2)) as be:
            # work goes over each node's direct channel, not Ray actor calls
            assert all(m.channel is not None and m.info["channel"].startswith("direct")
                       for m in be.members.values())
            await be.load("w", FakeWorkload(seconds=0.2))
            results, answers = await run_tasks(be, str(tmp_path / "spread.db"), 12)
            assert all(s == "done" for s, _ in results.values())
            on = [answers[t]["node"] for t in answers]
            assert on.count(a) >= 3 and on.count(b) >= 3, on  # both nodes took work

            # namespace-tier work: only b offers it (a real sandbox runs the payload)
            await be.load("ns", FakeWorkload(tier="namespace"))
            outs = await asyncio.gather(*(be.run("ns", i, tier="namespace")
                                          for i in range(6)))
            assert {o["node"] for o in outs} == {b}

            # a 3-turn episode stays on its node: its session's files accumulate
            turns = [await be.run("w", f"turn {i}", tier="fake", session="ep1")
                     for i in range(3)]
            assert len({t["node"] for t in turns}) == 1
            assert turns[-1]["files"] == ["turn0", "turn1", "turn2"]
            await be.end_session("ep1")
        for node, report in be.close_reports.items():
            assert report["leaks"] == {"cgroups": [], "state": [], "processes": []}, node
        assert be.close_reports[b]["runs"] >= 6
    asyncio.run(body())


def test_a_node_whose_channel_is_out_of_reach_works_through_ray(
        cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A firewall between driver and node (the connect refused): the node is still
    used, through Ray actor calls, and says so; `channel="ray"` asks for that outright."""
    from trialbox.cluster import backend as backend_mod

    async def refused(*a: Any, **k: Any) -> Any:
        raise ConnectionRefusedError(111, "Connection refused")
    monkeypatch.setattr(backend_mod.ChannelClient, "connect", refused)

    async def body() -> None:
        async with RayBackend(config(cluster, min_nodes=2)) as be:
            assert all(m.channel is None and m.info["channel"].startswith(
                "ray (direct refused") for m in be.members.values())
            await be.load("w", FakeWorkload())
            results, _ = await run_tasks(be, str(tmp_path / "fallback.db"), 4)
            assert all(s == "done" for s, _ in results.values())
        with pytest.raises(UsageError, match="channel 'tcp'"):
            ClusterConfig(channel="tcp")
    asyncio.run(body())


# ---------------------------------------------------------------------- elasticity
def test_drained_node_finishes_its_work_and_leaves(cluster: Cluster,
                                                  tmp_path: Path) -> None:
    d = cluster.add_node(num_cpus=1, resources=node_resources(2, "fake"))

    async def body() -> None:
        async with RayBackend(config(cluster, min_nodes=3)) as be:
            await be.load("w", FakeWorkload(seconds=0.4))
            report: dict[str, Any] = {}
            last_before = [0]

            async def drain() -> None:
                while be.placer.load().get(nid(d), 0) == 0:
                    await asyncio.sleep(0.02)
                # lease ids grow by one per placement: every lease granted before the
                # drain has an id <= placed (be.drain marks d draining before it awaits)
                last_before[0] = be.placer.stats.placed
                report.update(await be.drain(nid(d)))

            db = str(tmp_path / "drain.db")
            results, answers = await run_tasks(be, db, 24, during=drain)
            assert all(s == "done" for s, _ in results.values())
            on_d = [x for x in answers.values() if x["node"] == nid(d)]
            assert on_d and be.placer.stats.placed > last_before[0]
            # d ran only work placed before the drain began, all of it to the end
            assert report["lease_ids"] and max(report["lease_ids"]) <= last_before[0]
            assert not transitions(db, "infra")  # nothing of d's was retried
            assert report["runs"] == len(on_d) == len(report["lease_ids"])
            assert report["leaks"] == {"cgroups": [], "state": [], "processes": []}
            assert nid(d) not in be.members and nid(d) not in be.placer.nodes
    try:
        asyncio.run(body())
    finally:  # (also on failure: the next test starts on the module's two nodes)
        remove(cluster, d)  # the machine goes; nothing of the run depended on it


def test_idle_nodes_are_released_and_admitted_again_when_work_waits(
        cluster: Cluster, tmp_path: Path) -> None:
    """`idle_release_s`: a node with no work and no session for that long is closed
    (pools, actor: its trialbox_node resource is free, the machine holds nothing of
    trialbox's) and dormant; a node holding a session stays; work arriving for the
    dormant nodes' tier admits them again, and every task still has one result."""
    a, b = (nid(n) for n in cluster.trialbox_nodes.values())  # type: ignore[attr-defined]

    async def until(cond: Callable[[], bool], what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, what
            await asyncio.sleep(0.05)

    async def body() -> None:
        async with RayBackend(config(cluster, min_nodes=2, idle_release_s=1.0)) as be:
            await be.load("w", FakeWorkload(seconds=0.05))
            first = str(tmp_path / "first.db")
            results, answers = await run_tasks(be, first, 12, max_active=4)
            assert all(s == "done" for s, _ in results.values())
            assert {x["node"] for x in answers.values()} == {a, b}
            # a session keeps its node: the other one goes, this one stays
            held = (await be.run("w", "turn", tier="fake", session="s1"))["node"]
            other = b if held == a else a
            await until(lambda: other in be.placer.dormant, "the idle node stayed")
            await asyncio.sleep(1.5)  # past idle_release_s again: the session holds it
            assert held in be.members and held not in be.placer.dormant
            assert be.close_reports[other]["leaks"] == {"cgroups": [], "state": [],
                                                        "processes": []}
            await be.end_session("s1")
            await until(lambda: not be.members and not be._releasing,
                        "the session's node stayed after the session ended")
            assert set(be.placer.dormant) == {a, b}
            assert be.placer.stats.nodes_released == 2
            assert await asyncio.to_thread(wait_all_nodes_free)  # no actor holds one
            be.check_tier("fake")  # dormant nodes still count as offering their tiers
            # work for their tier: admitted again (new actors), each task once
            second = str(tmp_path / "second.db")
            results, answers = await run_tasks(be, second, 12, max_active=4)
            assert all(s == "done" for s, _ in results.values())
            assert {x["node"] for x in answers.values()} <= {a, b}
            assert not transitions(second, "infra")
            assert be.placer.stats.nodes_joined >= 3 and not be.placer.gone
    asyncio.run(body())
    assert wait_all_nodes_free()


def test_killed_node_work_finishes_elsewhere_and_joining_node_gets_work(
        cluster: Cluster, tmp_path: Path) -> None:
    k = cluster.add_node(num_cpus=1, resources=node_resources(2, "fake", "namespace"))
    joined: list[Any] = []

    from trialbox.telemetry import use_metrics
    from trialbox.telemetry.alerts import Evaluator

    async def body() -> None:
        async with RayBackend(config(cluster, min_nodes=3)) as be:
            await be.load("w", FakeWorkload(tier="namespace", seconds=0.5))
            assert metrics.value("trialbox_node_up", node=nid(k)) == 1.0  # set on joining
            killed_at = [0.0]

            async def chaos() -> None:
                while be.placer.load().get(nid(k), 0) < 2:  # both its slots busy
                    await asyncio.sleep(0.02)
                killed_at[0] = time.time()
                cluster.remove_node(k, allow_graceful=False)  # raylet and workers die
                # (in the main thread, as Ray wants; the driver's loop stalls meanwhile)
                joined.append(cluster.add_node(num_cpus=1,
                                               resources=node_resources(2, "namespace")))

            db = str(tmp_path / "kill.db")
            results, answers = await run_tasks(be, db, 30, tier="namespace",
                                               during=chaos)
            assert all(s == "done" for s, _ in results.values())
            # every task exactly once (check_journal); the work the dead node held was
            # retried with a NodeLost cause and finished by another node
            lost = transitions(db, "infra")
            assert len(lost) >= 2 and all("lost" in m or "died" in m for _, m in lost), lost
            assert all(answers[t]["node"] != nid(k) for t, _ in lost)
            assert all(x["node"] != nid(k) or x["started"] < killed_at[0]
                       for x in answers.values())
            assert nid(k) in be.lost and be.placer.stats.fenced >= 2
            # the node added mid-run received work without a restart
            assert any(x["node"] == nid(joined[0]) for x in answers.values())
            # the lost node's gauge fell, so the shipped TrialboxNodeDown alert fires
            # for it (after the rule's `for:`), and for no node that still serves
            assert metrics.value("trialbox_node_up", node=nid(k)) == 0.0
            alerts = Evaluator()
            alerts.evaluate(metrics, now=1000.0)
            down = [a for a in alerts.evaluate(metrics, now=1000.0 + 3600)
                    if a.name == "TrialboxNodeDown"]
            assert [(a.state, a.labels["node"]) for a in down] == [("firing", nid(k))]
        assert "error" in be.close_reports.pop(nid(k))  # dead: nothing to close there
        # nodes closed cleanly at the end leave no series: no alert for them
        assert metrics.value("trialbox_node_up", node=nid(joined[0])) == 0.0
        assert not [labels for labels, _ in metrics.samples().get("trialbox_node_up", ())
                    if labels["node"] != nid(k)]
        for node, rep in be.close_reports.items():
            assert rep["leaks"] == {"cgroups": [], "state": [], "processes": []}, node
    try:
        with use_metrics() as metrics:
            asyncio.run(body())
    finally:
        if k in cluster.worker_nodes:  # the run failed before killing it
            cluster.remove_node(k, allow_graceful=False)
        wait_dead(k)
        for j in joined:
            remove(cluster, j)
    # the dead node's pool left cells behind it; the next pool on this host reaps them
    from trialbox.sandbox.cgroups import CgroupDriver
    from trialbox.sandbox.pool import PoolConfig
    from trialbox.sandbox.reaper import reap_orphans
    reap_orphans(PoolConfig().state_dir, CgroupDriver.detect())
    dead = [d for top in CgroupDriver.detect().dirs("trialbox") if os.path.isdir(top)
            for d in os.listdir(top)]
    assert not [x for x in dead if not _alive_owner(x)], dead


def _alive_owner(name: str) -> bool:
    from trialbox.sandbox.reaper import owner_alive
    return owner_alive(name)


def test_cut_off_node_is_fenced_and_its_late_answers_discarded(
        cluster: Cluster, tmp_path: Path) -> None:
    f = cluster.add_node(num_cpus=1, resources=node_resources(2, "fake"))

    async def body() -> None:
        # 5 s of silence: at load 20 plus two busy loops, a 1.5 s threshold presumed the
        # new node dead before the test froze it (a ping's round trip took longer)
        async with RayBackend(config(cluster, min_nodes=3, dead_after_s=5.0)) as be:
            await be.load("w", FakeWorkload(seconds=0.5))
            pid = be.members[nid(f)].info["pid"]
            frozen_at = [0.0]

            async def freeze() -> None:
                while be.placer.load().get(nid(f), 0) < 2:
                    await asyncio.sleep(0.02)
                frozen_at[0] = time.time()
                os.kill(pid, signal.SIGSTOP)  # the host stops answering, work and all
                while nid(f) in be.members:
                    await asyncio.sleep(0.05)
                os.kill(pid, signal.SIGCONT)  # ...and comes back with its answers

            db = str(tmp_path / "cut.db")
            results, answers = await run_tasks(be, db, 24, during=freeze)
            await eventually(lambda: be.placer.stats.late_discarded >= 2, 5)
            assert be.placer.stats.late_discarded >= 2  # they arrived, and were dropped
            assert all(s == "done" for s, _ in results.values())
            assert all(x["node"] != nid(f) or x["started"] < frozen_at[0]
                       for x in answers.values())
            fenced = {t for t, _ in transitions(db, "infra")}
            assert len(fenced) >= 2
            for t in fenced:  # finished by another node
                assert answers[t]["node"] != nid(f)
            # the frozen node ran them to the end: the late answers existed
            ran = await be.lost[nid(f)].lease_ids.remote()
            assert len(ran) >= 2
    try:
        asyncio.run(body())
    finally:
        remove(cluster, f)


# ---------------------------------------------------------------------- serve
def _serve(cluster: Cluster, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "trialbox.cli", "serve", "--port", "0", "--warm", "1",
         "--backend", "ray", "--address", cluster.address, *extra], cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_serve_grades_submissions_on_the_cluster(cluster: Cluster) -> None:
    """`trialbox serve --backend ray`: /v1/submissions judged on a node (the one offering
    the namespace tier), the same verdicts as the local judge; a tier no node offers
    is refused before the port is bound, its node actors gone; shutdown frees them."""
    import urllib.request

    from trialbox.bench.humaneval_mix import exploit_completion
    from trialbox.store.tasks import load_humaneval
    bad = _serve(cluster, "--tier", "gvisor")
    out, err = bad.communicate(timeout=240)
    assert bad.returncode == 2 and "'gvisor'" in err and "listening" not in out, err
    assert "offered: fake, namespace" in err, err
    nowhere = subprocess.run(  # no Ray cluster there: refused before anything starts
        [sys.executable, "-m", "trialbox.cli", "serve", "--port", "0", "--backend", "ray",
         "--address", "127.0.0.1:1"], cwd=ROOT, capture_output=True, text=True,
        timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert nowhere.returncode == 2 and "listening" not in nowhere.stdout
    assert "no Ray cluster at --address 127.0.0.1:1" in nowhere.stderr, nowhere.stderr

    task = load_humaneval()[0]
    p = _serve(cluster)
    try:
        assert p.stdout is not None
        lines = [p.stdout.readline() for _ in range(2)]
        assert "grading on 2 Ray node(s)" in lines[0], (lines, p.stderr)
        url = lines[1].split("listening on ")[1].strip()

        def call(path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
            req = urllib.request.Request(url + path, method="POST" if body else "GET",
                                         data=json.dumps(body).encode() if body else None,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as r:
                return dict(json.loads(r.read()))

        good = call("/v1/submissions", {"task_id": task.task_id,
                                        "completion": task.canonical_solution})
        cheat = call("/v1/submissions", {"task_id": task.task_id, "completion":
                                         exploit_completion("sys-exit", task)})
        status = call("/v1/status")["grading"]
    finally:
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-3000:]
    assert (good["passed"], good["reward"]) == (True, 1.0), good
    assert not cheat["passed"] and cheat["reward"] == 0.0, cheat
    assert status["backend"] == "ray" and status["placed"] == 2 and status["nodes"] == 2
    assert wait_all_nodes_free()  # the server's node actors are gone with it


def test_train_judges_its_episodes_on_the_cluster(cluster: Cluster, tmp_path: Path) -> None:
    """`trialbox train --backend ray`: a tiny run (SFT, one GRPO step, pass@1 before and
    after) whose every judging is placed on the cluster's namespace node."""
    cfg = tmp_path / "t.toml"
    cfg.write_text(tiny_train_toml(tmp_path / "run"))
    nowhere = subprocess.run([sys.executable, "-m", "trialbox.cli", "train", str(cfg),
                              "--backend", "ray", "--address", "127.0.0.1:1"], cwd=ROOT,
                             capture_output=True, text=True, timeout=120,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert nowhere.returncode == 2 and "no Ray cluster at" in nowhere.stderr
    assert not (tmp_path / "run").exists()  # refused before anything was written
    p = subprocess.run([sys.executable, "-m", "trialbox.cli", "train", str(cfg),
                        "--backend", "ray", "--address", cluster.address], cwd=ROOT,
                       capture_output=True, text=True, timeout=280,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr[-3000:]
    events = {e["event"]: e for e in map(json.loads, p.stdout.splitlines())
              if e.get("event") in ("cluster", "done")}
    assert events["done"]["steps"] == 1
    grading = events["cluster"]
    # pass@1 before and after (2 tasks each) and one step's 2 x 2 episodes: 8 gradings
    assert grading["backend"] == "ray" and grading["placed"] == 8, grading
    assert grading["nodes_lost"] == 0
    assert grading["sessions"] == 0  # the demo family is judge-only: no code run in sessions


# ---------------------------------------------------------------------- HumanEval
def test_humaneval_through_ray_same_verdicts_as_local(cluster: Cluster,
                                                      tmp_path: Path) -> None:
    from trialbox.bench.humaneval_mix import EXPLOITS, exploit_completion
    from trialbox.store.tasks import load_humaneval
    tasks = load_humaneval()[:8]
    samples = [{"task_id": t.task_id, "completion": t.canonical_solution} for t in tasks]
    samples += [{"task_id": t.task_id, "completion": exploit_completion(name, t)}
                for t, name in zip(tasks, EXPLOITS, strict=False)]
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in samples))

    def eval_cli(*extra: str) -> list[dict[str, Any]]:
        out = tmp_path / f"out{len(extra)}.jsonl"
        p = subprocess.run([sys.executable, "-m", "trialbox.cli", "eval", "--tasks",
                            "humaneval", "--samples", str(path), "--out", str(out),
                            "--workers", "2", *extra], cwd=ROOT, capture_output=True,
                           text=True, timeout=240, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert p.returncode == 0, p.stderr[-3000:]
        return [json.loads(x) for x in out.read_text().splitlines()]

    ray_rows = eval_cli("--backend", "ray", "--address", cluster.address)
    local = eval_cli()
    verdict = [(r["task_id"], r["outcome"], r["passed"], r["reward"]) for r in local]
    assert [(r["task_id"], r["outcome"], r["passed"], r["reward"])
            for r in ray_rows] == verdict
    assert sum(r["passed"] for r in local) == 8  # canonical pass, exploits do not


@pytest.mark.bench_only
def test_bench_scale_run_smoke(cluster: Cluster) -> None:
    """`trialbox bench cluster`'s scale part, tiny, on this module's cluster."""
    from trialbox.bench.cluster import _scale_run
    r = asyncio.run(_scale_run(cluster.address, 200, 8, 0.005))
    assert r["done"] == r["episodes"] == 200 and r["placed"] >= 200
    assert r["driver_cpu_us_per_episode"] > 0 and r["episodes_per_s"] > 0
