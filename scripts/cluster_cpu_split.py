"""Where the Ray backend's extra CPU per judged attempt goes (issue 18's throughput goal,
docs/cluster.md "Known limits"): per-process CPU deltas (utime+stime, and cutime+cstime
of reaped children) over whole throughput rounds of each backend — every HumanEval
canonical solution and one exploit, 4 in flight, local `Evaluator` and the same on a
one-node Ray cluster alternating — grouped by process name, in ms per attempt. CPU
accounting, not wall time: it reads well even on a busy machine. Not a test.

    .venv/bin/python scripts/cluster_cpu_split.py      # ~2 min; DRIVER is this process
"""
import asyncio
import os
import sys
import time
import collections
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ray
from trialbox.bench.humaneval_mix import EXPLOITS, exploit_completion
from trialbox.store.tasks import load_humaneval, index
from trialbox.types import EvalSample
from trialbox.judge.evaluate import Evaluator
from trialbox.judge.function import judge_pool_config
from trialbox.sandbox.pool import CellPool
from trialbox.cluster.backend import RayBackend, ClusterConfig
from trialbox.cluster.evaljob import ClusterEvaluator

HZ = os.sysconf("SC_CLK_TCK")

def snap():
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                st = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ")[:60].decode(errors="replace")
        except OSError:
            continue
        rp = st.rindex(")")
        comm = st[st.index("(") + 1:rp]
        fields = st[rp + 2:].split()
        ut, stt, cut, cst = (int(fields[i]) for i in (11, 12, 13, 14))
        out[int(pid)] = (comm, cmd, ut + stt, cut + cst)
    return out

def diff(a, b, n):
    g = collections.Counter()
    for pid, (comm, _cmd, own, ch) in b.items():
        o0, c0 = (a[pid][2], a[pid][3]) if pid in a else (0, 0)
        d_own, d_ch = own - o0, ch - c0
        if d_own or d_ch:
            key = comm if pid != os.getpid() else "DRIVER"
            g[key + " (own)"] += d_own
            g[key + " (children)"] += d_ch
    return {k: round(v / HZ / n * 1000, 3) for k, v in g.most_common() if v}

async def main():
    tasks = index(load_humaneval())
    samples = []
    for i, t in enumerate(tasks.values()):
        samples.append(EvalSample(t.task_id, t.canonical_solution))
        samples.append(EvalSample(t.task_id, exploit_completion(EXPLOITS[i % len(EXPLOITS)], t)))
    w = 4
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False, namespace="cpu-split",
             resources={"trialbox_node": 1, "trialbox_slots": w, "trialbox_tier_namespace": 1})
    pool = await CellPool(judge_pool_config(warm=8)).start()
    local = Evaluator(tasks, pool, workers=w)
    await local.start(w)
    async with RayBackend(ClusterConfig(address="auto", warm=8)) as be:
        remote = ClusterEvaluator(tasks, be, "bench", workers=w)
        await remote.start(w)
        async def rnd(ev):
            sem = asyncio.Semaphore(w)
            async def one(s):
                async with sem:
                    await ev.attempt(s)
            await asyncio.gather(*(one(s) for s in samples))
        for ev in (local, remote):
            await rnd(ev)  # warm
        for r in range(3):
            for name, ev in (("local", local), ("ray", remote)):
                await asyncio.sleep(1)
                a = snap()
                t0 = time.perf_counter()
                await rnd(ev)
                wall = time.perf_counter() - t0
                b = snap()
                d = diff(a, b, len(samples))
                print(f"round {r} {name}: {len(samples) / wall:.1f}/s; ms CPU per "
                      f"attempt, total {sum(d.values()):.2f}")
                for k, v in list(d.items())[:14]:
                    print(f"    {k:40s} {v:7.3f}")
    await local.close()
    await pool.close()
    ray.shutdown()

asyncio.run(main())
