"""`serve --backend ray`'s rules without Ray (< 2 s): the service's app (`create_app`,
its lifespan, admission and routes, over ASGI) with the cluster's `ServingProvider`
over two in-process `Node`s (fake tier) and the real `Placer` — what `RayBackend` does
with them, minus the transport. A node is lost the way the backend loses one: the
placer fences its leases (`Placer.lose`) and the call in flight raises `NodeLost`.
The real thing (Ray, real sandboxes, a raylet killed) is test_serve_cluster.py."""

from __future__ import annotations

import asyncio
import itertools
from types import SimpleNamespace
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

pytest.importorskip("ray")  # cluster/serving.py imports the Ray backend

from trialbox.cluster.node import Node, NodeConfig
from trialbox.cluster.placement import NodeInfo, Placer
from trialbox.errors import NodeLost
from trialbox.cluster.serving import ServingProvider
from trialbox.cluster.sessions import SessionWorkload, workload_name
from trialbox.sandbox.fake import FAKE_RUNTIME
from trialbox.service.app import create_app
from trialbox.service.config import ServiceConfig
from trialbox.types import Grade, Outcome, Task


class Address:
    address = "HEAD:6379"


class InProcess:
    """`RayBackend.run`/`end_session` over in-process nodes and a real `Placer`.
    `doomed[node] = op`: that node is lost at its next call of `op`."""

    def __init__(self, nodes: list[Node]):
        self.placer = Placer()
        self.config = Address()
        self.close_reports: dict[str, Any] = {}
        self.nodes = {n.config.node_id: n for n in nodes}
        self.members = {n.config.node_id: SimpleNamespace(info=n.info()) for n in nodes}
        """What `RayBackend.members` holds of each node: its `Node.info()`."""
        for n in nodes:
            self.placer.add(NodeInfo(n.config.node_id, n.config.slots, n.config.tiers))
        self.doomed: dict[str, str] = {}
        self.ops: list[tuple[str, str]] = []
        """(node, op) of every call a node ran."""
        self.ids = itertools.count(1)

    def lose(self, nid: str) -> None:
        self.placer.lose(nid, "killed (test)")

    async def run(self, name: str, payload: Any, *, tier: str, priority: int = 1,
                  session: str | None = None) -> Any:
        lease = await self.placer.acquire(tier, priority, session)
        op = payload[0]
        if self.doomed.get(lease.node) == op:
            del self.doomed[lease.node]
            self.lose(lease.node)
            raise NodeLost(f"node {lease.node} died while running this work "
                           "(ChannelClosed); retried elsewhere")
        try:
            out = await self.nodes[lease.node].run(lease.lease_id, name, payload, session)
            self.ops.append((lease.node, op))
            return out
        finally:
            self.placer.release(lease)

    async def end_session(self, session: str) -> None:
        nid = self.placer.sessions.get(session)
        self.placer.end_session(session)
        if nid in self.placer.nodes:
            await self.nodes[nid].end_session(session)


class OnceLost:
    """A grader whose first grading's node is lost."""

    def __init__(self) -> None:
        self.calls = 0

    async def grade(self, task: Task, answer: Any, language: str) -> Grade:
        self.calls += 1
        if self.calls == 1:
            raise NodeLost("node n1 died while running this work; retried elsewhere")
        return Grade(task.task_id, Outcome.PASSED)

    def status(self) -> dict[str, Any]:
        return {"backend": "ray"}


@asynccontextmanager
async def served(grader: Any = None) -> AsyncIterator[tuple[httpx.AsyncClient,
                                                             InProcess, ServingProvider]]:
    nodes = [Node(NodeConfig(nid, 2, ("fake",))) for nid in ("n1", "n2")]
    for n in nodes:
        await n.start()
        await n.load(workload_name("fake"), SessionWorkload("fake"))
    backend = InProcess(nodes)
    provider = ServingProvider(backend, "fake", FAKE_RUNTIME, priority=0)  # type: ignore[arg-type]
    app = create_app(ServiceConfig(), provider=provider, grader=grader)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://localhost") as client:
            yield client, backend, provider
    for n in nodes:
        await n.close()


RUN = {"code": "print(1)", "language": "python"}


def test_a_one_shot_whose_node_is_lost_is_placed_once_more() -> None:
    async def body() -> None:
        async with served() as (client, backend, provider):
            backend.doomed["n1"] = "exec"  # the first placement: n1 (ties: first added)
            r = await client.post("/run_code", json=RUN)
            assert r.status_code == 200 and r.json()["status"] == "Success", r.text
            # n1 lost mid-run; the run was made again, whole, on n2 (open, write, exec)
            assert ("n2", "exec") in backend.ops and ("n1", "exec") not in backend.ops
            assert list(backend.placer.nodes) == ["n2"] and backend.placer.stats.fenced == 1
            assert not provider.live and not backend.placer.sessions
            assert not backend.placer.orphaned  # the lost session forgotten too
            s = (await client.get("/v1/status")).json()
            assert s["counters"]["replaced"] == 1 and s["counters"]["runs"] == {"ok": 1}
            assert s["pool"]["backend"] == "ray" and list(s["pool"]["nodes"]) == ["n2"]
            # a second loss under the same request: infrastructure, never a verdict
            backend.doomed["n2"] = "exec"
            backend.placer.add(NodeInfo("n3", 2, ("fake",)))
            backend.nodes["n3"] = backend.nodes["n1"]  # (the same Node object serves)
            backend.doomed["n3"] = "exec"
            r = await client.post("/run_code", json=RUN)
            assert r.status_code == 503 and r.json()["error"] == "infra", r.text
            assert "second node was lost too" in r.json()["message"]
            assert r.headers["retry-after"] == "1"
            # no node left: said at once, not a wait until the deadline
            r = await client.post("/run_code", json=RUN)
            assert r.status_code == 503 and r.json()["error"] == "infra", r.text
            assert "no live cluster node offers the 'fake' tier" in r.json()["message"]
            assert "ray start --address HEAD:6379" in r.json()["message"]
            r = await client.post("/v1/sessions", json={})
            assert r.status_code == 503 and "no live cluster node" in r.json()["message"]
            ready = await client.get("/readyz")
            assert ready.status_code == 503 and "no live cluster node" in ready.json()["reason"]
            s = (await client.get("/v1/status")).json()
            assert s["pool"]["nodes"] == {} and s["counters"]["runs"] == {"ok": 1}
            assert sorted(s["pool"]["nodes_lost"]) == ["n1", "n2", "n3"]
            assert not provider.live and not backend.placer.sessions
    asyncio.run(body())


def test_a_session_whose_node_is_lost_says_so_on_every_call() -> None:
    async def body() -> None:
        async with served() as (client, backend, provider):
            sid = (await client.post("/v1/sessions", json={})).json()["session_id"]
            r = await client.put(f"/v1/sessions/{sid}/files",
                                 json={"files": {"a.txt": "YQ=="}})
            assert r.status_code == 200, r.text
            got = (await client.get(f"/v1/sessions/{sid}")).json()
            node = got["node"]
            assert got["files"] == ["a.txt"] and node in ("n1", "n2")
            s = (await client.get("/v1/status")).json()["pool"]
            assert s["nodes"][node]["sessions"] == 1 and s["sessions_open"] == 1
            other = ({"n1", "n2"} - {node}).pop()
            backend.lose(node)  # as the backend does when its actor dies
            for method, path, body_ in [
                    ("POST", f"/v1/sessions/{sid}/run", RUN),
                    ("GET", f"/v1/sessions/{sid}", None),
                    ("POST", f"/v1/sessions/{sid}/exec", {"argv": ["true"]}),
                    ("PUT", f"/v1/sessions/{sid}/files", {"files": {"b": "YQ=="}}),
                    ("GET", f"/v1/sessions/{sid}/files/a.txt", None)]:
                r = await client.request(method, path, json=body_)
                assert r.status_code == 503 and r.json()["error"] == "infra", (path, r.text)
                msg = r.json()["message"]
                assert f"session {sid} lived on cluster node {node}, which was lost" in msg
                assert "Open a new session (POST /v1/sessions)" in msg, msg
            c = (await client.get("/v1/status")).json()["counters"]
            assert c["sessions_lost"] == 1 and c["runs"] == {}  # no run's outcome made up
            assert (await client.delete(f"/v1/sessions/{sid}")).json()["closed"] is True
            assert not provider.live and not backend.placer.orphaned
            # a new session: on the node left, and it works
            sid = (await client.post("/v1/sessions", json={})).json()["session_id"]
            r = await client.post(f"/v1/sessions/{sid}/run", json=RUN)
            assert r.status_code == 200 and r.json()["status"] == "ok", r.text
            assert (await client.get(f"/v1/sessions/{sid}")).json()["node"] == other
    asyncio.run(body())


def test_a_grading_whose_node_is_lost_is_placed_once_more() -> None:
    async def body() -> None:
        grader = OnceLost()
        async with served(grader) as (client, backend, provider):
            r = await client.post("/v1/submissions", json={"task_id": "HumanEval/0",
                                                           "completion": "pass"})
            assert r.status_code == 200 and r.json()["outcome"] == "passed", r.text
            assert grader.calls == 2
            s = (await client.get("/v1/status")).json()
            assert s["counters"]["replaced"] == 1 and s["counters"]["grades"] == {
                "passed": 1}
    asyncio.run(body())


def test_languages_are_the_nodes_not_the_servers() -> None:
    """/v1/languages and every run's check ask the nodes (what each one's `Node.info`
    and session say it runs), not the server's machine: a language one node lacks is
    neither listed nor accepted for a one-shot (it may land there), a session on a node
    that has it runs it, and with no node live nothing is blamed on the caller."""
    async def body() -> None:
        async with served() as (client, backend, provider):
            everything = (await client.get("/v1/languages")).json()
            assert everything["where"] == "the cluster's nodes"
            assert "python" in everything["languages"]
            # n2 as if its machine had no C compiler: C is not offered any more
            backend.members["n2"].info = dict(backend.members["n2"].info, languages=[
                x for x in everything["languages"] if x not in ("c", "cpp")])
            listed = (await client.get("/v1/languages")).json()
            assert "c" not in listed["languages"] and "python" in listed["languages"]
            assert listed["declared"]["c"]["available"] is False
            r = await client.post("/run_code", json={"code": "int main(){}",
                                                     "language": "c"})
            assert r.status_code == 400, r.text
            assert "not offered by the cluster's nodes" in r.json()["message"]
            assert not backend.ops  # refused before anything was placed
            r = await client.post("/v1/exec", json={"code": "x", "language": "cobol"})
            assert r.status_code == 400 and "unknown language 'cobol'" in r.json()["message"]
            # a session checks against its own node's answer to open
            sid = (await client.post("/v1/sessions", json={})).json()["session_id"]
            sb = provider.live[next(iter(provider.live))]
            sb.languages = ["python"]
            r = await client.post(f"/v1/sessions/{sid}/run",
                                  json={"code": "int main(){}", "language": "c"})
            assert r.status_code == 400 and "use one of python" in r.json()["message"]
            await client.delete(f"/v1/sessions/{sid}")
            # no node left: the listing says so, a run is 503 infra (never a 400)
            backend.lose("n1")
            backend.lose("n2")
            listed = (await client.get("/v1/languages")).json()
            assert listed["languages"] == [] and "none live" in listed["where"]
            r = await client.post("/run_code", json={"code": "int main(){}",
                                                     "language": "c"})
            assert r.status_code == 503 and r.json()["error"] == "infra", r.text
    asyncio.run(body())
