"""Generation apart from execution: the policy's sampling on the cluster's GPU nodes,
the sandboxes on its CPU nodes, the trainer on the driver (as verl and OpenRLHF split
them).

    fleet = await PolicyFleet.start(GenerationConfig(servers=2), model, tokenizer)
    await fleet.publish(model, version=0)            # after every update: version + 1
    policy = fleet.policy(version=0, seed=1)         # a `Policy` for the agent loop
    gens = await policy.generate(prompts, max_new_tokens=64, temperature=1.0, stop=None)
    await fleet.close()

`trialbox train CONFIG --backend ray --policy-servers N` uses it: the episodes' sessions
and judging go to the trialbox nodes (`cluster/sessions.py`, `cluster/serving.py`),
every `generate` call of the agent loop to the policy servers, and the trainer keeps
the model it updates. (It sits in the rollout layer, beside the other policies: it
serves `Policy`s and samples with `HFPolicy`, which the cluster layer may not import.)

**Where servers run.** One Ray actor per server (`PolicyServer`), each demanding one unit
of a resource: `GPU` (then the server samples on CUDA), or any custom resource a node
declares — `trialbox_gpu` stands in for a GPU on a machine without one (`ray start
--resources '{"trialbox_gpu": 1}'`; the server then samples on the CPU). `resource =
"auto"` takes `GPU` when the cluster has any, else `trialbox_gpu`. A server is refused,
before it loads anything, when it runs other Python, Ray or trialbox code than the
driver (the nodes' check, `versions.software_mismatch`).

**Weights, by version.** `publish(model, version)` copies the trainer's weights once
into Ray's object store (`ray.put`, on the event loop between updates: a consistent
snapshot) and every server loads them; a server keeps the last `keep` versions, so
the batches of an async run (`[rollout] mode = "async"`, up to `max_staleness + 1`
versions in flight) each sample with exactly the weights they were launched with. A
request for a version a server does not hold is refused (`WeightsMissing`), never
served by other weights.

**Deterministic wherever it runs.** A `FleetPolicy` draws one seed per `generate` call
from its own generator (seeded by the trainer per step, as the local policy is), cuts
the batch into `servers` contiguous chunks (`chunk_plan`, a function of the batch size
and the configured count only) and chunk i is sampled with seed + i by
`HFPolicy.sample` — so a chunk's output does not depend on which server ran it, and a
chunk whose server died mid-call is re-run on another with the same result.

**Losing servers.** A server whose actor dies (its node killed or cut off: Ray reports
it) is dropped, its chunk re-run on a live one, and a replacement is asked of Ray at
once with the same resource demand: it starts wherever a unit is free — a node that
joins later included (elastic) — loads the versions held and joins the rotation. With
no server live, a call waits up to `replace_timeout_s` for a replacement and then
raises `GenerationUnavailable` (an `InfraError`: the rollout ends, nothing is graded as
a wrong answer). A server alive but silent past `call_timeout_s` (a wedged device) is
killed and treated as lost.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import RayActorError

from trialbox.errors import InfraError, UsageError
from trialbox.rollout.policy import Generation, Tokenizer, check_generate_args
from trialbox.versions import (
    VersionMismatch,
    code_fingerprint,
    software_mismatch,
    software_versions,
)

log = logging.getLogger(__name__)

GPU = "GPU"
GPU_STANDIN = "trialbox_gpu"
"""The custom resource that stands in for a GPU where a machine has none."""


class GenerationUnavailable(InfraError):
    """No policy server is live and none could be started in time."""


class WeightsMissing(InfraError):
    """A server was asked for a version of the weights it does not hold."""


@dataclass(frozen=True)
class GenerationConfig:
    servers: int = 1
    """Policy servers, one per resource unit; also the number of chunks a batch is cut
    into (chunk i -> seed + i), so the output does not depend on how many are live."""
    resource: str = "auto"
    """"GPU", a custom resource name (e.g. "trialbox_gpu"), or "auto": GPU when the
    cluster has any, else trialbox_gpu."""
    keep: int = 2
    """Weight versions each server holds (an async run needs max_staleness + 1)."""
    start_timeout_s: float = 120.0
    """How long the servers may take to start and load the first weights."""
    replace_timeout_s: float = 60.0
    """How long a call waits for a replacement when no server is live."""
    call_timeout_s: float = 600.0
    """A chunk not answered within this (its wait behind the server's other calls
    included) is its server's failure: the server is killed and replaced, the chunk
    re-run elsewhere — a wedged device does not hold a rollout forever."""
    threads: int = 1
    """Torch threads of a server sampling on the CPU: fixed, because a float reduction
    split over another number of threads rounds differently, and a chunk must give
    the same log-probs on whichever server runs it."""

    def __post_init__(self) -> None:
        if isinstance(self.servers, bool) or not isinstance(self.servers, int) \
                or self.servers < 1:
            raise UsageError(f"--policy-servers must be an int >= 1, got {self.servers!r}")
        if not isinstance(self.resource, str) or not self.resource:
            raise UsageError("--policy-resource must be 'auto', 'GPU' or a custom "
                             "resource name such as 'trialbox_gpu'")
        if isinstance(self.keep, bool) or not isinstance(self.keep, int) or self.keep < 1:
            raise UsageError(f"GenerationConfig.keep must be an int >= 1, got {self.keep!r}")
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) \
                or self.threads < 1:
            raise UsageError(f"GenerationConfig.threads must be an int >= 1, got "
                             f"{self.threads!r}")
        for name in ("start_timeout_s", "replace_timeout_s", "call_timeout_s"):
            if not getattr(self, name) > 0:
                raise UsageError(f"GenerationConfig.{name} must be positive")


def chunk_plan(n: int, chunks: int) -> list[tuple[int, int]]:
    """`n` prompts cut into at most `chunks` contiguous, near-equal (start, end) slices,
    none empty; earlier slices take the remainder.

    >>> chunk_plan(5, 2)
    [(0, 3), (3, 5)]
    >>> chunk_plan(1, 3)
    [(0, 1)]
    """
    k = max(1, min(chunks, n))
    size, extra = divmod(n, k)
    out, start = [], 0
    for i in range(k):
        end = start + size + (1 if i < extra else 0)
        out.append((start, end))
        start = end
    return out


class PolicyServer:
    """The body of one policy-server actor: copies of the policy model by version, each
    sampled by `HFPolicy.sample` (one call at a time: the actor runs its methods in
    order, as one device would)."""

    def __init__(self, template: Any, tokenizer: Any, device: str, keep: int,
                 threads: int):
        self.template, self.tokenizer, self.keep = template, tokenizer, keep
        self.device, self.threads = device, threads
        self.models: OrderedDict[int, Any] = OrderedDict()
        self.calls = 0
        self.prompts = 0

    def versions(self) -> dict[str, Any]:
        return software_versions()

    def start(self) -> dict[str, Any]:
        import torch
        if self.device == "cuda" and not torch.cuda.is_available():
            self.device = "cpu"  # the resource said GPU, torch sees none: say so
            log.warning("policy server: Ray granted a GPU but torch sees no CUDA; "
                        "sampling on the CPU")
        torch.set_num_threads(self.threads)
        return self.info()

    def info(self) -> dict[str, Any]:
        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "device": self.device, "threads": self.threads,
                "versions": list(self.models),
                "calls": self.calls, "prompts": self.prompts}

    def load(self, version: int, state: dict[str, Any]) -> int:
        """Hold `version`'s weights (the oldest held dropped past `keep`)."""
        from trialbox.rollout.hf_policy import HFPolicy
        if version not in self.models:
            model = copy.deepcopy(self.template)
            model.load_state_dict(state)
            model.to(self.device).train(False).requires_grad_(False)
            self.models[version] = HFPolicy(model, self.tokenizer)
        while len(self.models) > self.keep:
            self.models.popitem(last=False)
        return version

    def generate(self, version: int, prompts: list[list[int]], max_new_tokens: int,
                 temperature: float, stop: list[str] | None, seed: int) -> list[Generation]:
        policy = self.models.get(version)
        if policy is None:
            raise WeightsMissing(f"policy server (pid {os.getpid()}) holds weight "
                                 f"versions {list(self.models)}, not {version}; publish "
                                 "it first (PolicyFleet.publish), or raise "
                                 "GenerationConfig.keep to the batches in flight")
        policy.generator.manual_seed(seed)
        self.calls += 1
        self.prompts += len(prompts)
        out: list[Generation] = policy.sample(prompts, max_new_tokens=max_new_tokens,
                                              temperature=temperature, stop=stop)
        return out


@dataclass
class _Server:
    actor: Any
    info: dict[str, Any]
    in_flight: int = 0


class PolicyFleet:
    """The driver's side: the servers, the versions published, the chunks' dispatch."""

    def __init__(self, config: GenerationConfig, resource: str, template_ref: Any,
                 tokenizer: Tokenizer, server_class: type[PolicyServer] = PolicyServer):
        self.config, self.resource = config, resource
        self.server_class = server_class
        self.template_ref, self.tokenizer = template_ref, tokenizer
        self.live: list[_Server] = []
        self.pending: set[asyncio.Task[None]] = set()
        self.published: OrderedDict[int, Any] = OrderedDict()
        """version -> the object ref of its weights (kept for replacements to load)."""
        self.lost = 0
        self.replaced = 0
        self.chunks_rerun = 0
        self._fingerprint = code_fingerprint()
        self._joined = asyncio.Event()
        self._closed = False
        self._dead: list[Any] = []

    # ------------------------------------------------------------------ lifecycle
    @staticmethod
    async def check(config: GenerationConfig) -> str:
        """The resource the servers will hold; refuses a cluster with fewer units of it
        than `config.servers` (nothing started)."""
        if not ray.is_initialized():
            raise UsageError("PolicyFleet: join the Ray cluster first (RayBackend)")
        cluster = await asyncio.to_thread(ray.cluster_resources)
        resource = resolve_resource(config.resource, cluster)
        total = cluster.get(resource, 0)
        if total < config.servers:
            raise UsageError(
                f"--policy-servers {config.servers} needs {config.servers} unit(s) of the "
                f"Ray resource {resource!r}; the cluster offers {total:g}. Start "
                "generation nodes with `ray start --address HEAD:6379 --num-gpus 1`, or "
                f"where there is no GPU `--resources '{{\"{GPU_STANDIN}\": 1}}'`, or ask "
                "for fewer servers")
        return resource

    @classmethod
    async def start(cls, config: GenerationConfig, model: Any, tokenizer: Tokenizer, *,
                    server_class: type[PolicyServer] = PolicyServer) -> PolicyFleet:
        """Start `config.servers` servers; refuses (nothing left running) a cluster
        without that many units of the resource, or servers running other code.
        `server_class`: the actor body (a `PolicyServer` subclass: tests, another
        sampler)."""
        resource = await cls.check(config)
        template = copy.deepcopy(model).cpu().train(False)
        fleet = cls(config, resource, ray.put(template), tokenizer, server_class)
        try:
            first = await asyncio.wait_for(asyncio.gather(
                *(fleet._start_one() for _ in range(config.servers))),
                config.start_timeout_s)
            problems = [p for p in first if p]
            if problems:
                raise VersionMismatch("policy server " + problems[0])
        except TimeoutError:
            await fleet.close()
            raise UsageError(
                f"{config.servers} policy server(s) on resource {resource!r} did not "
                f"start within {config.start_timeout_s:g} s (are the units held by "
                "another job? `ray status` shows who holds them)") from None
        except BaseException:
            await fleet.close()
            raise
        return fleet

    def _actor(self) -> Any:
        options: dict[str, Any] = {"num_cpus": 0, "max_restarts": 0,
                                   "max_concurrency": 1}
        if self.resource == GPU:
            options["num_gpus"] = 1
        else:
            options["resources"] = {self.resource: 1}
        device = "cuda" if self.resource == GPU else "cpu"
        remote: Any = ray.remote(self.server_class)
        return remote.options(**options).remote(self.template_ref, self.tokenizer,
                                                device, self.config.keep,
                                                self.config.threads)

    async def _start_one(self) -> str:
        """One server, checked and loaded with every version held; '' when it joined,
        else why not (it is killed)."""
        actor = self._actor()
        try:
            problem = software_mismatch(await actor.versions.remote(), self._fingerprint)
            if problem:
                _kill(actor)
                return problem
            info = await actor.start.remote()
            loaded: set[int] = set()
            while True:  # until no version was published meanwhile: it joins holding all
                todo = [(v, r) for v, r in self.published.items() if v not in loaded]
                if not todo:
                    break
                for version, ref in todo:
                    await actor.load.remote(version, ref)
                    loaded.add(version)
        except BaseException:
            _kill(actor)
            raise
        if self._closed:
            _kill(actor)
            return ""
        self.live.append(_Server(actor, info))
        self._joined.set()
        log.info("policy server on node %s (%s) joined", info["node_id"], info["device"])
        return ""

    def _replace(self) -> None:
        """Ask Ray for a server in place of a lost one (placed wherever a unit is free,
        now or when a node joins)."""
        async def run() -> None:
            while not self._closed:
                try:
                    problem = await self._start_one()
                except Exception as e:  # its node died while it started: ask again
                    log.warning("replacement policy server failed (%s); asking again",
                                type(e).__name__)
                    await asyncio.sleep(1.0)
                    continue
                if problem:  # a node with other software: say so, do not loop on it
                    log.error("replacement policy server refused: %s", problem)
                else:
                    self.replaced += 1
                return
        task = asyncio.get_running_loop().create_task(run())
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    def _lose(self, server: _Server, why: BaseException) -> None:
        if server in self.live:
            self.live.remove(server)
            self.lost += 1
            self._dead.append(server.actor)
            if not self.live:
                self._joined.clear()
            log.warning("policy server on node %s lost (%s); asking for a replacement",
                        server.info.get("node_id"), type(why).__name__)
            if not self._closed:
                self._replace()

    async def close(self) -> None:
        self._closed = True
        for t in list(self.pending):
            t.cancel()
        await asyncio.gather(*self.pending, return_exceptions=True)
        for s in self.live:
            _kill(s.actor)
        for a in self._dead:
            _kill(a)
        self.live.clear()

    # ------------------------------------------------------------------ weights
    async def publish(self, model: Any, version: int) -> None:
        """Every live server holds `version` = `model`'s weights now (called on the event
        loop between updates); kept for replacements while among the last `keep`."""
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        ref = ray.put(state)  # copied into the object store now: a consistent snapshot
        self.published[version] = ref
        while len(self.published) > self.config.keep:
            self.published.popitem(last=False)
        servers = list(self.live)
        results = await asyncio.gather(*(s.actor.load.remote(version, ref)
                                         for s in servers), return_exceptions=True)
        for s, r in zip(servers, results, strict=True):
            if isinstance(r, RayActorError):
                self._lose(s, r)
            elif isinstance(r, BaseException):
                raise r

    def policy(self, version: int, seed: int) -> FleetPolicy:
        """A `Policy` sampling with `version`'s weights; its calls draw their seeds from
        a generator seeded with `seed`."""
        if version not in self.published:
            raise WeightsMissing(f"version {version} was not published (held: "
                                 f"{list(self.published)}); publish(model, {version}) first")
        return FleetPolicy(self, version, seed)

    # ------------------------------------------------------------------ dispatch
    async def _server(self) -> _Server:
        if not self.live:
            try:
                await asyncio.wait_for(self._joined.wait(), self.config.replace_timeout_s)
            except TimeoutError:
                raise GenerationUnavailable(
                    f"every policy server is lost ({self.lost} lost, none started within "
                    f"{self.config.replace_timeout_s:g} s on resource {self.resource!r}); "
                    "add a generation node (`ray start ... --resources "
                    f"'{{\"{self.resource}\": 1}}'`) and resume the run") from None
        return min(self.live, key=lambda s: s.in_flight)

    async def run_chunk(self, version: int, prompts: list[list[int]],
                        max_new_tokens: int, temperature: float,
                        stop: list[str] | None, seed: int) -> list[Generation]:
        tries = 0
        while True:
            server = await self._server()
            server.in_flight += 1
            try:
                out: list[Generation] = await asyncio.wait_for(_get(
                    server.actor.generate.remote(version, prompts, max_new_tokens,
                                                 temperature, stop, seed)),
                    self.config.call_timeout_s)
                return out
            except (RayActorError, TimeoutError) as e:
                if isinstance(e, TimeoutError):  # alive but wedged: it goes too
                    e = TimeoutError(f"no answer within {self.config.call_timeout_s:g} s")
                    _kill(server.actor)
                self._lose(server, e)
                self.chunks_rerun += 1
                tries += 1
                if tries > 2 * self.config.servers + 2:
                    raise GenerationUnavailable(
                        f"a generate chunk failed on {tries} policy servers in a row "
                        f"(last: {e}); see the servers' nodes") from e
            finally:
                server.in_flight -= 1

    def status(self) -> dict[str, Any]:
        """Where generation ran: per live server its node, device and calls."""
        return {"resource": self.resource, "servers": self.config.servers,
                "live": len(self.live), "lost": self.lost, "replaced": self.replaced,
                "chunks_rerun": self.chunks_rerun, "versions": list(self.published)}

    async def servers_info(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for s in list(self.live):
            try:
                out.append(await s.actor.info.remote())
            except RayActorError as e:
                self._lose(s, e)
        return out


class FleetPolicy:
    """A `Policy` whose generate calls run on the fleet with one version's weights."""

    def __init__(self, fleet: PolicyFleet, version: int, seed: int):
        import torch
        self.fleet, self.version = fleet, version
        self.tokenizer: Tokenizer = fleet.tokenizer
        self.generator = torch.Generator()
        self.generator.manual_seed(seed)
        self.calls = 0

    def next_seed(self) -> int:
        """The seed of the next call (chunk i samples with it + i)."""
        import torch
        return int(torch.randint(0, 2**62, (1,), generator=self.generator).item())

    async def generate(self, prompts: list[list[int]], *, max_new_tokens: int,
                       temperature: float = 1.0,
                       stop: list[str] | None = None) -> list[Generation]:
        check_generate_args(prompts, max_new_tokens, temperature, stop)
        if not prompts:
            return []
        self.calls += 1
        seed = self.next_seed()
        plan = chunk_plan(len(prompts), self.fleet.config.servers)
        parts = await asyncio.gather(*(
            self.fleet.run_chunk(self.version, prompts[a:b], max_new_tokens,
                                 float(temperature), stop, seed + i)
            for i, (a, b) in enumerate(plan)))
        return [g for part in parts for g in part]


def resolve_resource(name: str, cluster: dict[str, float]) -> str:
    """The resource servers demand: `name`, or for "auto" GPU when the cluster has any,
    else trialbox_gpu.

    >>> resolve_resource("auto", {"CPU": 4.0})
    'trialbox_gpu'
    >>> resolve_resource("auto", {"GPU": 1.0})
    'GPU'
    """
    if name != "auto":
        return name
    return GPU if cluster.get(GPU, 0) >= 1 else GPU_STANDIN


async def _get(ref: Any) -> Any:
    return await ref


def _kill(actor: Any) -> None:
    try:
        ray.kill(actor)
    except Exception:  # already gone
        pass


__all__ = ["GPU", "GPU_STANDIN", "FleetPolicy", "GenerationConfig",
           "GenerationUnavailable", "PolicyFleet", "PolicyServer", "WeightsMissing",
           "chunk_plan", "resolve_resource"]
