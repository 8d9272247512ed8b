"""Generation apart from execution (`rollout/fleet.py`), on a real Ray cluster on
this machine: the head offers the namespace tier (sessions, the judge) and no GPU; two
raylets declare one `trialbox_gpu` each (a GPU's stand-in) and no trialbox node. The
policy servers run there and nowhere else; their output is what the same chunks
sampled here with the same seeds give; a server whose node dies has its chunk re-run
with the same result and a replacement starts on a node that joins later; `trialbox
train --backend ray --policy-servers 2` trains with every generate call on them."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")

from ray.cluster_utils import Cluster  # noqa: E402

from tests.conftest import load_scaled  # noqa: E402
from tests.cluster.test_ray_cluster import (  # noqa: E402
    ROOT,
    connected,
    nid,
    remove,
    tiny_train_toml,
)
from trialbox.rollout.fleet import (  # noqa: E402
    GenerationConfig,
    PolicyFleet,
    PolicyServer,
    WeightsMissing,
    chunk_plan,
)
from trialbox.errors import UsageError  # noqa: E402
from trialbox.rollout.hf_policy import HFPolicy  # noqa: E402
from trialbox.rollout.policy import ByteTokenizer, Generation  # noqa: E402
from trialbox.train.model import ModelConfig, build_model  # noqa: E402

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]
GPU_NODE = {"trialbox_gpu": 1}
TOK = ByteTokenizer()
PROMPTS = [TOK.encode(p) for p in ("def f(x):", "print(", "# sum of a list\n",
                                   "import os", "x = [", "while ")]


@pytest.fixture(scope="module")
def cluster(namespace_head: Cluster,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The shared cluster (tests/cluster/conftest.py) and, for this module, two GPU
    nodes (the tests' own: removed again at its end, the replacement one too)."""
    c = namespace_head
    with connected(c, tmp_path_factory):
        c.gpu_nodes = [c.add_node(num_cpus=1, resources=GPU_NODE)  # type: ignore[attr-defined]
                       for _ in range(2)]
        try:
            yield c
        finally:
            for n in c.gpu_nodes:  # type: ignore[attr-defined]
                if n in c.worker_nodes:
                    remove(c, n)
            del c.gpu_nodes  # type: ignore[attr-defined]


def model(seed: int = 3) -> Any:
    return build_model(ModelConfig(n_layer=1, n_embd=32, n_head=2), TOK, seed=seed)


def local(m: Any, seed: int, prompts: list[list[int]], chunks: int,
          **kw: Any) -> list[Generation]:
    """What a `FleetPolicy` seeded `seed` must answer, computed here: its first call's
    seed, the same chunks, chunk i sampled with seed + i."""
    threads = torch.get_num_threads()
    torch.set_num_threads(GenerationConfig().threads)  # the servers' (a float sum split
    try:                                               # otherwise rounds otherwise)
        return _local(m, seed, prompts, chunks, **kw)
    finally:
        torch.set_num_threads(threads)


def _local(m: Any, seed: int, prompts: list[list[int]], chunks: int,
           **kw: Any) -> list[Generation]:
    g = torch.Generator()
    g.manual_seed(seed)
    call_seed = int(torch.randint(0, 2**62, (1,), generator=g).item())
    policy = HFPolicy(copy.deepcopy(m).train(False), TOK)
    out: list[Generation] = []
    for i, (a, b) in enumerate(chunk_plan(len(prompts), chunks)):
        policy.generator.manual_seed(call_seed + i)
        out += policy.sample(prompts[a:b], **kw)
    return out


def ids(gens: list[Generation]) -> list[tuple[tuple[int, ...], tuple[float, ...], str]]:
    return [(g.token_ids, g.logprobs, g.finish_reason) for g in gens]


KW = {"max_new_tokens": 12, "temperature": 1.0, "stop": None}


def test_servers_sample_on_the_gpu_nodes_as_local_sampling_would(cluster: Cluster) -> None:
    async def go() -> None:
        m = model()
        fleet = await PolicyFleet.start(GenerationConfig(servers=2, keep=2), m, TOK)
        try:
            assert fleet.resource == "trialbox_gpu"  # auto: no GPU in this cluster
            await fleet.publish(m, 0)
            got = await fleet.policy(0, seed=7).generate(PROMPTS, **KW)
            assert ids(got) == ids(local(m, 7, PROMPTS, 2, **KW))
            info = await fleet.servers_info()
            where = {i["node_id"] for i in info}
            assert where == {nid(n) for n in cluster.gpu_nodes}  # type: ignore[attr-defined]
            assert [i["calls"] for i in info] == [1, 1]  # one chunk each
            assert all(i["device"] == "cpu" for i in info)

            # new weights under a new version; the old one still served (keep = 2)
            m2 = model(seed=4)
            await fleet.publish(m2, 1)
            assert ids(await fleet.policy(1, seed=7).generate(PROMPTS, **KW)) == \
                ids(local(m2, 7, PROMPTS, 2, **KW))
            assert ids(await fleet.policy(0, seed=7).generate(PROMPTS, **KW)) == ids(got)
            await fleet.publish(m2, 2)  # version 0 dropped everywhere
            with pytest.raises(WeightsMissing, match="publish"):
                fleet.policy(0, seed=7)
            for server in fleet.live:  # the servers refuse it too (no other weights)
                with pytest.raises(WeightsMissing, match=r"holds weight versions \[1, 2\]"):
                    await server.actor.generate.remote(0, PROMPTS, 4, 1.0, None, 1)
            with pytest.raises(UsageError, match="max_new_tokens"):
                await fleet.policy(2, seed=7).generate(PROMPTS, max_new_tokens=0,
                                                       temperature=1.0, stop=None)
        finally:
            await fleet.close()

        with pytest.raises(UsageError, match="needs 3 unit.*trialbox_gpu.*offers 2"):
            await PolicyFleet.start(GenerationConfig(servers=3), m, TOK)
        with pytest.raises(UsageError, match="'GPU'.*offers 0"):
            await PolicyFleet.start(GenerationConfig(servers=1, resource="GPU"), m, TOK)
    asyncio.run(go())


def test_a_lost_server_costs_nothing_and_a_joining_node_replaces_it(
        cluster: Cluster) -> None:
    gpu = cluster.gpu_nodes  # type: ignore[attr-defined]

    async def go() -> None:
        m = model()
        fleet = await PolicyFleet.start(GenerationConfig(servers=2, replace_timeout_s=90),
                                        m, TOK)
        try:
            await fleet.publish(m, 0)
            want = ids(local(m, 11, PROMPTS, 2, **KW))
            assert ids(await fleet.policy(0, seed=11).generate(PROMPTS, **KW)) == want
            remove(cluster, gpu[0])  # the raylet and the server on it killed
            # every chunk answered, the same as before: the dead server's re-run
            assert ids(await fleet.policy(0, seed=11).generate(PROMPTS, **KW)) == want
            assert fleet.lost == 1 and fleet.chunks_rerun >= 1
            assert len(fleet.live) == 1  # its replacement waits for a free unit
            gpu.append(cluster.add_node(num_cpus=1, resources=GPU_NODE))  # joins
            deadline = time.monotonic() + 90
            while len(fleet.live) < 2:
                assert time.monotonic() < deadline, fleet.status()
                await asyncio.sleep(0.2)
            assert fleet.replaced == 1
            where = {i["node_id"] for i in await fleet.servers_info()}
            assert where == {nid(gpu[1]), nid(gpu[2])}
            # the replacement holds the published weights: same answers again
            assert ids(await fleet.policy(0, seed=11).generate(PROMPTS, **KW)) == want
        finally:
            await fleet.close()
    asyncio.run(go())




def test_a_wedged_server_is_killed_and_its_chunk_answered_elsewhere(
        cluster: Cluster, tmp_path: Path) -> None:
    """A server alive but never answering (a wedged device): past call_timeout_s its
    chunk is re-run on another server — the same output — and it is killed and
    replaced."""
    flag = str(tmp_path / "wedge")

    class WedgedServer(PolicyServer):  # defined here: Ray ships it by value
        def generate(self, *args: Any) -> Any:
            if os.path.exists(f"{flag}-{os.getpid()}"):
                time.sleep(3600)
            return super().generate(*args)

    async def go() -> None:
        m = model()
        fleet = await PolicyFleet.start(
            GenerationConfig(servers=2, call_timeout_s=3, replace_timeout_s=90), m, TOK,
            server_class=WedgedServer)
        try:
            await fleet.publish(m, 0)
            want = ids(local(m, 5, PROMPTS, 2, **KW))
            assert ids(await fleet.policy(0, seed=5).generate(PROMPTS, **KW)) == want
            wedged = (await fleet.servers_info())[0]
            open(f"{flag}-{wedged['pid']}", "w").close()
            t0 = time.monotonic()
            assert ids(await fleet.policy(0, seed=5).generate(PROMPTS, **KW)) == want
            # its call_timeout_s=3 first; ends at all: a bound, scaled by the host's load
            assert 3 <= time.monotonic() - t0 < load_scaled(60)
            assert fleet.lost == 1 and fleet.chunks_rerun == 1
            deadline = time.monotonic() + 90  # its unit freed by the kill: replaced
            while len(fleet.live) < 2:
                assert time.monotonic() < deadline, fleet.status()
                await asyncio.sleep(0.2)
            pids = {i["pid"] for i in await fleet.servers_info()}
            assert wedged["pid"] not in pids
            assert ids(await fleet.policy(0, seed=5).generate(PROMPTS, **KW)) == want
        finally:
            await fleet.close()
    asyncio.run(go())


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_train_samples_on_the_policy_servers(cluster: Cluster, tmp_path: Path,
                                             mode: str) -> None:
    """`trialbox train --backend ray --policy-servers 2`: SFT here, every generate
    call (pass@1 before and after, two GRPO steps) on the GPU nodes' servers, each
    version of the weights sent to them, the judging on the namespace node."""
    cfg = tmp_path / "t.toml"
    out = tmp_path / "run"
    cfg.write_text(tiny_train_toml(out, steps=2, mode=mode))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def train(*extra: str, timeout: float = 280) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "trialbox.cli", "train", str(cfg),
                               *extra], cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout, env=env)

    if mode == "sync":  # bad input: refused before anything is written
        p = train("--policy-servers", "2")
        assert p.returncode == 2 and "add --backend ray" in p.stderr, p.stderr
        p = train("--backend", "ray", "--address", cluster.address,
                  "--policy-servers", "5", timeout=120)
        assert p.returncode == 2 and "needs 5 unit(s)" in p.stderr, p.stderr[-2000:]
        assert not out.exists()
    p = train("--backend", "ray", "--address", cluster.address, "--policy-servers", "2")
    assert p.returncode == 0, p.stderr[-3000:]
    events = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    gen = next(e for e in events if e["event"] == "generation")
    done = next(e for e in events if e["event"] == "done")
    assert done["steps"] == 2
    assert gen["live"] == 2 and gen["lost"] == 0
    assert gen["versions"][-1] == 2  # the weights of every update were sent
    gpu = {nid(n) for n in cluster.gpu_nodes}  # type: ignore[attr-defined]
    assert {s["node_id"] for s in gen["on"]} <= gpu
    # pass@1 before (2 prompts) and after (2), two steps of 2 x 2 episodes of one turn:
    # every prompt was sampled on a server
    assert sum(s["prompts"] for s in gen["on"]) == 2 + 2 + 2 * 4
    assert all(s["calls"] > 0 for s in gen["on"])
