"""An episode's own sandbox sessions on cluster nodes (`cluster/sessions.py`), on a real
Ray cluster on this machine (`ray.cluster_utils.Cluster`): the session lives on one node
across turns, its runs give what a local session gives, a node lost mid-episode makes the
episode infra (excluded) — never a wrong answer — and nothing is left on the nodes.

The head offers the namespace tier (real sessions, the judge); the test of a lost node
adds a node of its own offering the fake tier only, so the episode's session is there
and the judge on the head: killing that node takes the session and nothing else."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

from tests.cluster.test_ray_cluster import (  # noqa: E402
    config,
    nid,
    node_resources,
    wait_all_nodes_free,
    wait_dead,
)
from tests.rollout.test_agent_fake import RIGHT, SQUARE, WRONG  # noqa: E402
from trialbox.cluster.backend import RayBackend  # noqa: E402
from trialbox.cluster.node import JudgeWorkload  # noqa: E402
from trialbox.errors import NodeLost  # noqa: E402
from trialbox.cluster.sessions import RemoteProvider, RemoteSandbox  # noqa: E402
from trialbox.errors import SandboxUnavailable, UsageError  # noqa: E402
from trialbox.rollout.agent import AgentConfig, rollout  # noqa: E402
from trialbox.rollout.policy import ScriptedPolicy  # noqa: E402
from trialbox.sandbox.base import Sandbox  # noqa: E402
from trialbox.sandbox.mounts import PathObstructed  # noqa: E402
from trialbox.sandbox.pool import CellPool, PoolConfig  # noqa: E402
from trialbox.store.artifacts import ArtifactStore  # noqa: E402
from trialbox.types import (  # noqa: E402
    ExecResult,
    ExecStatus,
    Grade,
    Limits,
    Outcome,
    Task,
)

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]
# `cluster`: the shared one (tests/cluster/conftest.py), its head offering namespace
NO_LEAKS: dict[str, list[str]] = {"cgroups": [], "state": [], "processes": []}

AGENT = AgentConfig(max_new_tokens=200, max_turns=2)


def seen(r: ExecResult) -> tuple[Any, ...]:
    """What a run did, less its timings (which differ run to run)."""
    return (r.status, r.exit_code, r.signal, r.stdout, r.stderr, r.truncated, r.message,
            r.tier, r.runtime)


PROGRAMS: list[tuple[str, bytes, Limits | None]] = [
    ("print(input()[::-1])", b"hello\n", None),                        # ok
    ("import sys; sys.stderr.write('bad\\n'); sys.exit(3)", b"", None),  # exit 3
    ("while True: pass", b"", Limits(wall_s=1, cpu_s=5)),              # timeout
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", b"", None),  # signal
]


async def one_session(sb: Sandbox) -> list[Any]:
    """The same turns in any session: runs, and files kept across them (parked between
    turns, as the agent loop does while the model thinks)."""
    out: list[Any] = []
    for code, stdin, limits in PROGRAMS:
        out.append(seen(await sb.exec(["python3", "-c", code], stdin=stdin,
                                      limits=limits)))
    await sb.write_file("turn1.py", b"open('state.txt', 'w').write('kept')\n")
    out.append(seen(await sb.exec(["python3", "turn1.py"])))
    await sb.park()  # the model thinks; the session keeps its files, not its compute
    out.append(seen(await sb.exec(["cat", "state.txt"])))
    out.append(await sb.list_files())
    out.append(await sb.read_file("state.txt"))
    await sb.exec(["mkdir", "solution.py"])  # the candidate's doing: a directory there
    with pytest.raises(PathObstructed):  # raised on the node, arrives as raised there
        await sb.write_file("solution.py", b"x = 1\n")
    return out


# ---------------------------------------------------------------------- on a node
def test_an_episodes_session_runs_on_its_node_as_it_would_locally(cluster: Cluster) -> None:
    head = nid(cluster.head_node)
    assert wait_all_nodes_free()

    async def body() -> None:
        pool = await CellPool(PoolConfig(warm=1)).start()
        try:
            async with await pool.open() as local:
                want = await one_session(local)
        finally:
            await pool.close()
        async with RayBackend(config(cluster, min_nodes=1)) as be:
            provider = await RemoteProvider.start(be, "namespace")
            assert provider.passes_fds is False
            assert provider.runtime == be.members[head].info["runtimes"]["namespace"]
            t0 = time.monotonic()
            sb = await provider.open()
            assert isinstance(sb, RemoteSandbox) and isinstance(sb, Sandbox)
            # the session is the node's: placed there, its process is the node actor's
            assert sb.node == head and be.placer.sessions[sb.session] == head
            assert sb.where["pid"] == be.members[head].info["pid"] != os.getpid()
            got = await one_session(sb)
            assert got == want  # every result and file as in a local session
            # (and those are the runs meant: not, say, every one infra)
            assert [g[0] for g in got[:4]] == [ExecStatus.OK, ExecStatus.EXIT,
                                               ExecStatus.TIMEOUT, ExecStatus.SIGNAL]
            assert got[0][3] == b"olleh\n" and got[1][1:2] == (3,)
            assert got[5][:4] == (ExecStatus.OK, 0, None, b"kept")  # turn 2 read turn 1's
            assert got[6:] == [["state.txt", "turn1.py"], b"kept"]
            with pytest.raises(SandboxUnavailable, match="another machine"):
                r, w = os.pipe()
                os.close(r)
                await sb.exec(["true"], pass_fds={3: w})
            await sb.close()
            await sb.close()  # idempotent
            assert sb.session not in be.placer.sessions and not provider.live
            print(f"session on a node: {time.monotonic() - t0:.2f} s")

            # a two-turn episode through the unchanged agent loop: one session on the
            # node for both turns, judged there too, closed at the end
            await be.load("judge", JudgeWorkload("namespace"))

            async def grader(task: Task, completion: str, seed: int | None = None) -> Grade:
                out: Grade = await be.run("judge", (task, completion, "python"),
                                          tier="namespace")
                return out
            opened: list[RemoteSandbox] = []
            open_remote = provider.open

            async def recording(limits: Limits | None = None) -> RemoteSandbox:
                opened.append(await open_remote(limits))
                return opened[-1]
            provider.open = recording  # type: ignore[method-assign]
            [tr] = (await rollout(ScriptedPolicy([WRONG, RIGHT]), [SQUARE], config=AGENT,
                                  pool=provider, grader=grader)).trajectories
            assert [t.exec_status for t in tr.turns] == [ExecStatus.OK, ExecStatus.OK]
            assert [t.outcome for t in tr.turns] == [Outcome.FAILED, Outcome.PASSED]
            assert tr.reward == 1.0 and tr.environment == provider.runtime.id
            assert len(opened) == 1 and opened[0].node == head and opened[0].closed
            assert not provider.live and not be.placer.sessions
        assert be.close_reports[head]["leaks"] == NO_LEAKS
    asyncio.run(body())


# ---------------------------------------------------------------------- node lost
def test_a_node_lost_mid_episode_makes_it_infra_never_a_wrong_answer(
        cluster: Cluster) -> None:
    head = nid(cluster.head_node)
    assert wait_all_nodes_free()
    k = cluster.add_node(num_cpus=1, resources=node_resources(2, "fake"))
    killed: list[float] = []

    def kill() -> None:
        if not killed:
            killed.append(time.monotonic())
            cluster.remove_node(k, allow_graceful=False)  # raylet and workers die

    async def body() -> None:
        async with RayBackend(config(cluster, min_nodes=2)) as be:
            provider = await RemoteProvider.start(be, "fake")  # k's tier only
            await be.load("judge", JudgeWorkload("namespace"))  # the head's

            async def grader(task: Task, completion: str, seed: int | None = None) -> Grade:
                out: Grade = await be.run("judge", (task, completion, "python"),
                                          tier="namespace")
                return out
            sb = await provider.open()  # a session of its own, on k too
            assert sb.node == nid(k)
            await sb.write_file("a.txt", b"1")
            assert await sb.list_files() == ["a.txt"]

            # the episode: turn 1 runs on k and is judged on the head (FAILED); while
            # the model writes turn 2, k dies with the session (its worker processes
            # outlive the raylet briefly: the model thinks until the driver knows)
            async def on_generate(prompts: list[list[int]]) -> None:
                if len(policy.calls) == 2:
                    kill()
                    while nid(k) not in be.lost:
                        await asyncio.sleep(0.05)
            policy = ScriptedPolicy([WRONG, WRONG], on_generate=on_generate)
            [tr] = (await asyncio.wait_for(rollout(
                policy, [SQUARE], config=AGENT, pool=provider, grader=grader),
                60)).trajectories
            assert killed
            assert [t.outcome for t in tr.turns] == [Outcome.FAILED, Outcome.FAILED]
            assert [t.exec_status for t in tr.turns] == [ExecStatus.OK, ExecStatus.INFRA]
            assert "lost" in tr.turns[1].exec_summary or "died" in tr.turns[1].exec_summary
            # the judge failed the code, but the episode's session went with its node:
            # excluded (reward None), not a wrong answer and not "session_broken"
            assert tr.reward is None and tr.stop_reason == "infra", tr.stop_reason

            # the other session on k: its next call raises NodeLost, park and close
            # are quiet, and nothing of it stays on the driver
            with pytest.raises(NodeLost):
                await sb.exec(["true"])
            await sb.park()
            await sb.close()
            assert not provider.live and not be.placer.sessions
            assert not be.placer.orphaned  # ended sessions are forgotten
            assert nid(k) in be.lost
        assert "error" in be.close_reports.pop(nid(k))  # dead: nothing to close there
        assert be.close_reports[head]["leaks"] == NO_LEAKS
    try:
        asyncio.run(body())
    finally:
        if k in cluster.worker_nodes:  # the run failed before killing it
            cluster.remove_node(k, allow_graceful=False)
        wait_dead(k)


def test_a_checkpointed_session_moves_when_its_node_is_lost(
        cluster: Cluster, tmp_path: Path) -> None:
    """RemoteProvider(checkpoints=URL): after each command the node saves the session's
    files to the store; when the node dies, the next call opens the session again on
    another node from that checkpoint, replays the writes made since, and runs — the
    episode goes on with every file it had, and nothing is left in the store."""
    head = nid(cluster.head_node)
    assert wait_all_nodes_free()
    k = cluster.add_node(num_cpus=1, resources=node_resources(2, "namespace"))
    store_url = str(tmp_path / "checkpoints")  # every node of this cluster reaches it

    async def body() -> None:
        async with RayBackend(config(cluster, min_nodes=2)) as be:
            with pytest.raises(UsageError, match="namespace tier"):
                await RemoteProvider.start(be, "fake", checkpoints=store_url)
            provider = await RemoteProvider.start(be, "namespace", checkpoints=store_url)
            others = []
            sb = await provider.open(Limits(wall_s=20))
            while sb.node != nid(k):  # placement alternates: take one on k
                others.append(sb)
                sb = await provider.open(Limits(wall_s=20))
            for o in others:
                await o.close()
            await sb.write_file("a.txt", b"1")
            r = await sb.exec(["sh", "-c", "echo 2 > b.txt; cat a.txt"])
            assert r.status is ExecStatus.OK and r.stdout == b"1"
            await sb.write_file("c.txt", b"3")  # after the checkpoint: replayed
            cluster.remove_node(k, allow_graceful=False)
            while nid(k) not in be.lost:
                await asyncio.sleep(0.05)
            r = await sb.exec(["sh", "-c", "cat a.txt b.txt c.txt; echo; hostname"])
            assert r.status is ExecStatus.OK, r
            assert r.stdout.startswith(b"12\n3\n"), r.stdout
            assert sb.node == head and sb.moves == 1 and provider.moves == 1
            r = await sb.exec(["sh", "-c", "echo 4 >> c.txt; cat c.txt"])  # goes on
            assert r.stdout == b"34\n"
            assert sorted(await sb.list_files()) == ["a.txt", "b.txt", "c.txt"]
            await sb.close()
            assert not provider.live and not be.placer.sessions
            left = [f for f in ArtifactStore(store_url).list() if "/" in f]
            assert left == [], left  # each checkpoint replaced the last; close ends both
        assert be.close_reports[head]["leaks"] == NO_LEAKS
    try:
        asyncio.run(body())
    finally:
        if k in cluster.worker_nodes:
            cluster.remove_node(k, allow_graceful=False)
        wait_dead(k)


# ---------------------------------------------------------------------- train wiring
def test_train_backend_ray_gives_the_episodes_sessions_on_the_nodes(
        cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`trialbox train --backend ray` (`cli/train.py`) hands the trainer a provider whose
    sessions are on the nodes, and the cluster judge: a rollout the trainer would run
    with them executes and is judged there. (The full train run through the CLI is
    test_ray_cluster.py's; its demo tasks run no code in sessions.)"""
    from trialbox.cli import train as train_cli
    from trialbox.train import trainer
    from trialbox.train.config import load_config
    head = nid(cluster.head_node)
    assert wait_all_nodes_free()
    toml = tmp_path / "t.toml"
    toml.write_text(f'[run]\nout_dir = "{tmp_path / "run"}"\n')
    got: dict[str, Any] = {}

    async def train(config: Any, pool: Any = None, progress: Any = None,
                    grader: Any = None, generation: Any = None) -> str:
        assert generation is None  # no --policy-servers: the policy samples here
        got["pool"] = pool
        [tr] = (await rollout(ScriptedPolicy([RIGHT]), [SQUARE], config=AGENT,
                              pool=pool, grader=grader)).trajectories
        got["trajectory"] = tr
        return "trained"
    monkeypatch.setattr(trainer, "train", train)
    events: list[tuple[str, dict[str, Any]]] = []
    out = asyncio.run(train_cli._train_on_cluster(
        load_config(str(toml)), config(cluster, min_nodes=1),
        lambda event, record: events.append((event, record))))
    assert out == "trained"
    assert isinstance(got["pool"], RemoteProvider) and not got["pool"].live
    tr = got["trajectory"]
    assert tr.passed and tr.turns[0].exec_status is ExecStatus.OK
    [(event, status)] = events
    assert event == "cluster" and status["sessions"] == 1 and status["nodes"] == 1
    # one session open, its run and park, one judging: all placed on the head
    assert status["placed"] >= 4 and status["nodes_lost"] == 0
    assert got["pool"].backend.close_reports[head]["leaks"] == NO_LEAKS
