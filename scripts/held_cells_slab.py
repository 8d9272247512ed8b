"""Kernel slab and MemAvailable per held session: open N sessions on one pool, each
holding its cell after one run (an import or two through the cell's runtime), and read
/proc/meminfo before and after. `python3 scripts/held_cells_slab.py` (root; run from
the checkout to measure). Issue 28 compared main before and after the per-cell overlays.
"""

import asyncio
import os

from trialbox.sandbox import run_code
from trialbox.sandbox.pool import CellPool, PoolConfig


def mem():
    d = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":")
            d[k] = int(v.split()[0])
    return d["MemAvailable"], d["SUnreclaim"] + d["SReclaimable"]


async def main(n):
    pool = await CellPool(PoolConfig(warm=0, max_warm=1)).start()
    await asyncio.sleep(1)
    a0, s0 = mem()
    held = []
    for _ in range(n):
        sb = await pool.open()
        r = await run_code(sb, "import json, email.parser; print(1)")
        assert r.stdout == b"1\n", r
        held.append(sb)
    await asyncio.sleep(1)
    a1, s1 = mem()
    print(f"{os.getcwd()}: {n} held: MemAvailable -{(a0 - a1) / n / 1024:.3f} MiB/session, "
          f"slab +{(s1 - s0) / n / 1024:.3f} MiB/session, load {os.getloadavg()[0]:.1f}")
    for sb in held:
        await sb.close()
    await pool.close()


if __name__ == "__main__":
    asyncio.run(main(150))
