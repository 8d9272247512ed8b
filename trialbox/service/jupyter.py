"""SandboxFusion-compatible `POST /run_jupyter`, served on trialbox's own sessions.

Request (SandboxFusion's `RunJupyterRequest`; unknown extra fields are ignored):

    {"cells": ["a = 123", "a", "print(a)"], "cell_timeout": 0, "total_timeout": 45,
     "kernel": "python3", "files": {"name": "<base64>"}, "fetch_files": ["out.txt"]}

Response (`RunJupyterResponse`):

    {"status": "Success" | "Failed" | "SandboxError", "message": "...",
     "driver": CommandRunResult, "cells": [{"stdout", "stderr", "display": [...],
     "error": [...]}], "executor_pod_name": null, "files": {...}}

There is no Jupyter kernel: one sandbox session (a scheduler task's lease, like
`/run_code`) runs a small driver (jupyter_driver.py) under the runtime's python3. The
driver runs no cell: it starts a kernel process that executes the cells in one
namespace, as a kernel does — a cell's last expression is displayed as
`{"text/plain": repr(value)}`, an exception is that cell's `error` (`ename`, `evalue`,
`traceback`) and the next cell still runs — and hands it one cell at a time. The
driver's records reach us on a socket (fd 3) the kernel does not hold and cannot open
(the driver is undumpable), each cell's answer checked against a token the driver sent
with that cell only. So a cell cannot make a cell the kernel never answered appear
run: records written ahead, a kernel that exits or kills the driver stop the notebook
there (`Failed`). `cell_timeout` (0: none) interrupts a cell and stops the notebook
there (a kernel that ignores it is killed); `total_timeout` is the whole run's wall and
CPU limit (the sandbox's, measured outside). `status` is `Success` when every cell was
answered (cells that raised included: their errors are the notebook's output), `Failed`
when a cell or the whole run was stopped (time, memory, the kernel ended), `SandboxError`
when the machinery failed. What a cell writes to the process's fds directly (os.write, a
subprocess) goes to `driver.stdout` / `driver.stderr`, not to the cell.

**The cells' contents are the program's word** (the answer's `trust` field says so):
what a cell printed, displayed or raised is what the kernel process reported, and an
earlier cell can take over the kernel and report anything for later ones, as in any
Jupyter kernel. Grade with `/v1/submissions` (the judge runs the tests outside the
candidate), never with assertion cells appended to a notebook.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from dataclasses import replace
from functools import cache
from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from trialbox.sandbox.base import Sandbox, passes_fds
from trialbox.service.admission import Ticket
from trialbox.service.errors import FieldError
from trialbox.service.execute import guarded, placed_twice
from trialbox.service.fusion import command_result
from trialbox.service.models import decode_b64, encode_b64
from trialbox.service.names import read_all, write_all
from trialbox.service.state import ServiceState
from trialbox.types import ExecResult, ExecStatus

router = APIRouter(tags=["sandboxfusion"])

DRIVER = ".jupyter/driver.py"
CELLS = ".jupyter/cells.json"
CHANNEL_FD = 3
"""The driver's records arrive on this fd of its (a socket whose other end is ours)."""
MAX_CHANNEL = 64 << 20
"""Bytes of records read from the driver; the rest is drained and dropped."""
TRUST = ("the cells' stdout, stderr, display and error are the program's own report (its "
         "kernel process): a cell can answer later cells itself. Grade with "
         "POST /v1/submissions, never with test cells appended to a notebook")
"""The answer's `trust` field."""


@cache
def _driver_source() -> bytes:
    with open(os.path.join(os.path.dirname(__file__), "jupyter_driver.py"), "rb") as f:
        return f.read()


class RunJupyterRequest(BaseModel):
    """SandboxFusion's request, field for field (plus `memory_limit_MB`, as /run_code)."""

    cells: list[str] = Field(description="code blocks run in order in one namespace")
    cell_timeout: float = Field(default=0, ge=0, description="seconds per cell; 0: none")
    total_timeout: float = Field(default=45, gt=0, description="seconds for all cells")
    kernel: Literal["python3"] = "python3"
    files: dict[str, str | None] = Field(default_factory=dict,
                                         description="file name → base64 content")
    fetch_files: list[str] = Field(default_factory=list,
                                   description="files returned (base64) after the run")
    memory_limit_MB: int = Field(default=-1, description="MiB; -1: the server default")


def _records(raw: bytes, n: int) -> tuple[list[dict[str, Any]], str]:
    """The driver's records, in order: (the cells the kernel answered, why the notebook
    stopped early — "" when the driver said it was done with every cell answered).
    Only a record for the next cell counts; anything after a gap is dropped."""
    cells: list[dict[str, Any]] = []
    done: int | None = None
    lost = ""
    for line in raw.decode("utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:  # the last line of a driver killed while writing it
            break
        if not isinstance(rec, dict):
            break
        if "done" in rec:
            done = rec["done"]
            break
        if rec.get("cell") != len(cells):
            break
        if "lost" in rec:
            lost = f"the kernel stopped answering at cell {len(cells)}: {rec['lost']}"
            break
        cells.append(rec)
    if not lost and done is None:
        lost = "the driver ended before it was done"
    elif not lost and (done != len(cells) or (len(cells) < n and not (
            cells and cells[-1].get("timed_out")))):
        lost = "the driver's records do not add up"
    return cells, lost


async def _drain(sock: socket.socket) -> bytes:
    """Everything the driver sends until its end closes (capped at MAX_CHANNEL)."""
    loop = asyncio.get_running_loop()
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await loop.sock_recv(sock, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        if size < MAX_CHANNEL:
            chunks.append(chunk[:MAX_CHANNEL - size])
        size += len(chunk)


async def _run_driver(sb: Sandbox, cell_timeout: float, limits: Any,
                      provider: Any) -> tuple[ExecResult, bytes]:
    """Run the driver; its records from the socket on fd 3, or — where no fd can be
    handed into the sandbox (a cluster node) — from its stdout."""
    if not passes_fds(provider):
        ran = await sb.exec(["python3", "-I", "-S", DRIVER, "driver", "1",
                             repr(cell_timeout)], limits=limits)
        return replace(ran, stdout=b""), ran.stdout  # the cells' own: driver.stderr
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    try:
        reader = asyncio.ensure_future(_drain(ours))
        try:
            ran = await sb.exec(["python3", "-I", "-S", DRIVER, "driver", str(CHANNEL_FD),
                                 repr(cell_timeout)], limits=limits,
                                pass_fds={CHANNEL_FD: theirs.detach()})
        finally:
            raw = await reader
    finally:
        ours.close()
        theirs.close()
    return ran, raw


@router.post("/run_jupyter")
async def run_jupyter(body: RunJupyterRequest, request: Request) -> dict[str, Any]:
    """Run notebook cells in a fresh sandbox session, SandboxFusion style."""
    state: ServiceState = request.app.state.service
    config = state.config
    if body.total_timeout > config.max_limits.wall_s:
        raise FieldError("total_timeout", f"{body.total_timeout} s is above this server's "
                         f"maximum {config.max_limits.wall_s} s")
    memory = body.memory_limit_MB if body.memory_limit_MB > 0 else None
    if body.memory_limit_MB == 0 or body.memory_limit_MB < -1:
        raise FieldError("memory_limit_MB", f"must be a positive number of MiB or -1 (the "
                         f"server's default), got {body.memory_limit_MB}")
    if memory is not None and memory > config.max_limits.memory_mb:
        raise FieldError("memory_limit_MB", f"{memory} MiB is above this server's cap of "
                         f"{config.max_limits.memory_mb} MiB (trialbox serve "
                         "--max-memory-mb); ask for less")
    files = {name: decode_b64(data, f"files.{name}")
             for name, data in body.files.items() if data is not None}
    limits = config.default_limits.with_(wall_s=body.total_timeout, cpu_s=body.total_timeout,
                                         **({"memory_mb": memory} if memory else {}))
    state.require_provider()
    holder: list[Sandbox] = []

    async def work(ticket: Ticket) -> tuple[ExecResult, bytes, dict[str, str]]:
        ctx = ticket.ctx

        async def attempt() -> tuple[ExecResult, bytes, dict[str, str]]:
            async with ctx.lease(limits) as sb:
                holder[:] = [sb]
                await write_all(sb, files)  # absolute paths: names.py
                await sb.write_file(DRIVER, _driver_source())
                await sb.write_file(CELLS, json.dumps(body.cells).encode())
                ran, raw = await _run_driver(sb, body.cell_timeout, limits,
                                             state.provider)
                fetched = {path: encode_b64(data) for path, data
                           in (await read_all(sb, body.fetch_files)).items()
                           if data is not None}
                await ctx.leaser.end(ctx.task_id)
            return ran, raw, fetched

        # a fresh session per notebook: placed again if its cluster node is lost
        ran, raw, fetched = await placed_twice(state, "the notebook", attempt,
                                                 lambda: ctx.leaser.end(ctx.task_id))
        ctx.observe(ran)
        ticket.reward = 1.0 if ran.ok else 0.0
        return ran, raw, fetched

    async def stop() -> None:
        if holder:
            await holder[0].stop()

    ran, raw, fetched = await guarded(state, request, work, stop, "the notebook",
                                      kind="jupyter")
    state.counters.runs[ran.status.value] += 1
    cells, lost = _records(raw, len(body.cells))
    timed_out = any(c.get("timed_out") for c in cells)
    if ran.status is ExecStatus.INFRA:
        status, message = "SandboxError", ("infrastructure failure (not the program's "
                                           f"fault; retry): {ran.message}")
    elif timed_out:
        status, message = "Failed", f"cell {len(cells) - 1} ran past cell_timeout"
    elif not ran.ok or lost or len(cells) < len(body.cells):
        status = "Failed"
        why = ran.message or ran.status.value if not ran.ok else lost
        message = (f"the notebook was stopped after {len(cells)} of {len(body.cells)} "
                   f"cells: {why}")
    else:
        status, message = "Success", ""
    return {"status": status, "message": message, "driver": command_result(ran),
            "cells": [{"stdout": str(c.get("stdout", "")), "stderr": str(c.get("stderr", "")),
                       "display": list(c.get("display", [])),
                       "error": list(c.get("error", []))} for c in cells],
            "executor_pod_name": None, "files": fetched, "trust": TRUST}
