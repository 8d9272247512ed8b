"""SandboxFusion-compatible `POST /run_jupyter`, served on trialbox's own sessions.

Request (SandboxFusion's `RunJupyterRequest`; unknown extra fields are ignored):

    {"cells": ["a = 123", "a", "print(a)"], "cell_timeout": 0, "total_timeout": 45,
     "kernel": "python3", "files": {"name": "<base64>"}, "fetch_files": ["out.txt"]}

Response (`RunJupyterResponse`):

    {"status": "Success" | "Failed" | "SandboxError", "message": "...",
     "driver": CommandRunResult, "cells": [{"stdout", "stderr", "display": [...],
     "error": [...]}], "executor_pod_name": null, "files": {...}}

There is no Jupyter kernel: one sandbox session (a scheduler task's lease, like
`/run_code`) runs a small driver (jupyter_driver.py) under the runtime's python3 that
executes the cells in one namespace, as a kernel does — a cell's last expression is
displayed as `{"text/plain": repr(value)}`, an exception is that cell's `error`
(`ename`, `evalue`, `traceback`) and the next cell still runs. `cell_timeout` (0: none)
interrupts a cell and stops the notebook there; `total_timeout` is the whole run's wall
and CPU limit (the sandbox's, measured outside). `status` is `Success` when every cell
ran (cells that raised included: their errors are the notebook's output), `Failed` when
a cell or the whole run was stopped (time, memory), `SandboxError` when the machinery
failed. What a cell writes to the process's fds directly (os.write, a subprocess) goes
to `driver.stdout` / `driver.stderr`, not to the cell.
"""

from __future__ import annotations

import json
import os
from functools import cache
from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from trialbox.errors import UsageError
from trialbox.sandbox.base import Sandbox
from trialbox.service.admission import Ticket
from trialbox.service.errors import FieldError
from trialbox.service.execute import guarded, placed_twice
from trialbox.service.fusion import command_result
from trialbox.service.models import decode_b64, encode_b64
from trialbox.service.state import ServiceState
from trialbox.types import ExecResult, ExecStatus

router = APIRouter(tags=["sandboxfusion"])

DRIVER = ".jupyter/driver.py"
CELLS = ".jupyter/cells.json"
RESULTS = ".jupyter/cells.jsonl"


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


def _cells(raw: bytes) -> list[dict[str, Any]]:
    cells = []
    for line in raw.decode("utf-8", errors="replace").splitlines():
        try:
            c = json.loads(line)
        except ValueError:  # the last line of a driver killed while writing it
            continue
        if isinstance(c, dict):
            cells.append(c)
    return cells


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

    async def work(ticket: Ticket) -> tuple[ExecResult, list[dict[str, Any]],
                                            dict[str, str]]:
        ctx = ticket.ctx

        async def attempt() -> tuple[ExecResult, list[dict[str, Any]], dict[str, str]]:
            async with ctx.lease(limits) as sb:
                holder[:] = [sb]
                for path, data in files.items():
                    await sb.write_file(path, data)
                await sb.write_file(DRIVER, _driver_source())
                await sb.write_file(CELLS, json.dumps(body.cells).encode())
                ran = await sb.exec(["python3", DRIVER, CELLS, repr(body.cell_timeout)],
                                    limits=limits)
                try:
                    cells = _cells(await sb.read_file(RESULTS))
                except UsageError:
                    cells = []
                fetched: dict[str, str] = {}
                for path in body.fetch_files:
                    try:
                        fetched[path] = encode_b64(await sb.read_file(path))
                    except UsageError:
                        pass
                await ctx.leaser.end(ctx.task_id)
            return ran, cells, fetched

        # a fresh session per notebook: placed again if its cluster node is lost
        ran, cells, fetched = await placed_twice(state, "the notebook", attempt,
                                                 lambda: ctx.leaser.end(ctx.task_id))
        ctx.observe(ran)
        ticket.reward = 1.0 if ran.ok else 0.0
        return ran, cells, fetched

    async def stop() -> None:
        if holder:
            await holder[0].stop()

    ran, cells, fetched = await guarded(state, request, work, stop, "the notebook",
                                        kind="jupyter")
    state.counters.runs[ran.status.value] += 1
    timed_out = any(c.get("timed_out") for c in cells)
    if ran.status is ExecStatus.INFRA:
        status, message = "SandboxError", ("infrastructure failure (not the program's "
                                           f"fault; retry): {ran.message}")
    elif timed_out:
        status, message = "Failed", f"cell {len(cells) - 1} ran past cell_timeout"
    elif not ran.ok or len(cells) < len(body.cells):
        status = "Failed"
        message = (f"the notebook was stopped after {len(cells)} of {len(body.cells)} "
                   f"cells: {ran.message or ran.status.value}")
    else:
        status, message = "Success", ""
    return {"status": status, "message": message, "driver": command_result(ran),
            "cells": [{"stdout": str(c.get("stdout", "")), "stderr": str(c.get("stderr", "")),
                       "display": list(c.get("display", [])),
                       "error": list(c.get("error", []))} for c in cells],
            "executor_pod_name": None, "files": fetched}
