"""SandboxFusion-compatible `POST /run_code`: a trainer that calls SandboxFusion (verl's
`sandbox_fusion` reward, and others) works against trialbox with only the URL changed.

Request (SandboxFusion's `RunCodeRequest`; unknown extra fields are ignored, as there):

    {"code": "...", "language": "python", "compile_timeout": 10, "run_timeout": 10,
     "memory_limit_MB": -1, "stdin": "...", "files": {"name": "<base64>"},
     "fetch_files": ["out.txt"]}

Response (`RunCodeResponse`):

    {"status": "Success" | "Failed" | "SandboxError", "message": "...",
     "compile_result": null | CommandRunResult, "run_result": null | CommandRunResult,
     "executor_pod_name": null, "files": {"out.txt": "<base64>"}}

    CommandRunResult = {"status": "Finished" | "TimeLimitExceeded" | "Error",
                        "execution_time": seconds, "return_code": int | null,
                        "stdout": str, "stderr": str,
                        "trialbox_status": ok|exit|signal|timeout|memory|output|disk|infra,
                        "message": why, "peak_memory_bytes": int}

`status` values stay inside SandboxFusion's enums, so typed clients (whose enums would
reject a new value) keep working. A program a limit stopped — memory, an output flood, a
full disk — is reported as SandboxFusion reports its own memory kills: `Finished` with a
return code (−9 when the limit killed it) and the reason on the last line of `stderr`,
where its clients read (`trialbox: memory limit: …`), besides `trialbox_status` and
`message`. The mapping is in docs/service.md. A failure of the machinery is never a
wrong answer: the top-level status is `SandboxError` and `trialbox_status` is `infra`.

`files` and `fetch_files` may name absolute paths, as SandboxFusion's do: under
/workspace/ (where the code runs, the base of relative names), /tmp/ or /dev/shm/
(names.py places and fetches them).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from trialbox.sandbox.languages import compile_limits_for, language
from trialbox.service.errors import FieldError
from trialbox.service.models import LimitsIn, OneShotIn, decode_b64
from trialbox.service.state import ServiceState
from trialbox.types import ExecResult, ExecStatus

router = APIRouter(tags=["sandboxfusion"])

RUN_STATUS = {ExecStatus.OK: "Finished", ExecStatus.EXIT: "Finished",
              ExecStatus.SIGNAL: "Finished", ExecStatus.TIMEOUT: "TimeLimitExceeded",
              ExecStatus.MEMORY: "Finished", ExecStatus.OUTPUT: "Finished",
              ExecStatus.DISK: "Finished", ExecStatus.INFRA: "Error"}
"""Our outcome → SandboxFusion's `CommandRunStatus`. A program that ran to its end,
crashed by itself, or was stopped by a limit other than time `Finished` with a return
code, as SandboxFusion's own runs end (its memory limit is the kernel's: the program
fails or is killed); ours killed it for time: `TimeLimitExceeded`; the machinery
failed: `Error`."""

LIMITS = frozenset({ExecStatus.MEMORY, ExecStatus.OUTPUT, ExecStatus.DISK})
"""Stopped by a limit: the reason is added to `stderr` (SandboxFusion's clients read
`stderr`; typed ones drop `trialbox_status` and `message`)."""
SIGKILL = 9


class RunCodeRequest(BaseModel):
    """SandboxFusion's request, field for field."""

    code: str
    language: str
    compile_timeout: float = Field(default=10, gt=0, description="seconds for compilation")
    run_timeout: float = Field(default=10, gt=0, description="seconds for the run")
    memory_limit_MB: int = Field(default=-1,
                                 description="MiB for the run; -1: the server default")
    stdin: str | None = None
    files: dict[str, str | None] = Field(default_factory=dict,
                                         description="file name → base64 content")
    fetch_files: list[str] = Field(default_factory=list,
                                   description="files returned (base64) after the run")


def return_code(r: ExecResult) -> int | None:
    """The exit code, else −signal (as Python's subprocess gives it, which SandboxFusion
    passes on); a limit's kill with no signal recorded is −9 (SIGKILL); None for a
    run stopped for time or lost to the machinery, as there."""
    if r.status in (ExecStatus.TIMEOUT, ExecStatus.INFRA):
        return None
    if r.exit_code is not None:
        return r.exit_code
    return -(r.signal or SIGKILL) if r.signal is not None or r.status in LIMITS else None


def stderr_of(r: ExecResult) -> str:
    """The program's stderr, and for a limit's stop a last line saying which."""
    text = r.stderr_text
    if r.status not in LIMITS:
        return text
    sep = "\n" if text and not text.endswith("\n") else ""
    return f"{text}{sep}trialbox: {r.status.value} limit: {r.message or 'reached'}\n"


def command_result(r: ExecResult) -> dict[str, Any]:
    return {"status": RUN_STATUS[r.status], "execution_time": round(r.wall_ms / 1000, 6),
            "cpu_time": round(r.cpu_ms / 1000, 6), "return_code": return_code(r),
            "stdout": r.stdout_text, "stderr": stderr_of(r),
            "trialbox_status": r.status.value, "message": r.message,
            "peak_memory_bytes": r.peak_memory_bytes}


def fusion_response(result: ExecResult, files: dict[str, str | None]) -> dict[str, Any]:
    """SandboxFusion's response for one run (`result.compile` is the compiler's run)."""
    compiled = result.compile
    # run_code returns the compiler's result itself when compilation failed.
    run = None if compiled is not None and not compiled.ok else result
    infra = (result.status is ExecStatus.INFRA
             or (compiled is not None and compiled.status is ExecStatus.INFRA))
    if infra:
        status, message = "SandboxError", ("infrastructure failure (not the program's "
                                           f"fault; retry): {result.message}")
    elif run is not None and run.ok:
        status, message = "Success", ""
    else:
        status = "Failed"
        message = (f"compilation failed: {compiled.message or compiled.status.value}"
                   if run is None and compiled is not None
                   else (run.message if run is not None else ""))
    return {"status": status, "message": message,
            "compile_result": command_result(compiled) if compiled is not None else None,
            "run_result": command_result(run) if run is not None else None,
            "executor_pod_name": None,
            "files": {k: v for k, v in files.items() if v is not None}}


@router.post("/run_code")
async def run_code_endpoint(body: RunCodeRequest, request: Request) -> dict[str, Any]:
    """Run `code` once in a fresh sandbox, SandboxFusion style."""
    from trialbox.service.v1 import offer, one_shot
    state: ServiceState = request.app.state.service
    config = state.config
    spec = language(body.language, offer(state))  # unknown → 400 listing those offered
    memory = body.memory_limit_MB if body.memory_limit_MB > 0 else None
    if body.memory_limit_MB == 0 or body.memory_limit_MB < -1:
        raise FieldError("memory_limit_MB", f"must be a positive number of MiB or -1 (the "
                         f"server's default), got {body.memory_limit_MB}")
    if memory is not None and memory > config.max_limits.memory_mb:
        raise FieldError("memory_limit_MB", f"{memory} MiB is above this server's cap of "
                         f"{config.max_limits.memory_mb} MiB (trialbox serve "
                         "--max-memory-mb); ask for less")
    if body.run_timeout > config.max_limits.wall_s:
        raise FieldError("run_timeout", f"{body.run_timeout} s is above this server's "
                         f"maximum {config.max_limits.wall_s} s")
    if body.compile_timeout > config.max_limits.wall_s:
        raise FieldError("compile_timeout", f"{body.compile_timeout} s is above this "
                         f"server's maximum {config.max_limits.wall_s} s")
    files = {name: decode_b64(data, f"files.{name}")
             for name, data in body.files.items() if data is not None}
    shot = OneShotIn(code=body.code, language=body.language, stdin=body.stdin or "",
                     fetch_files=body.fetch_files,
                     limits=LimitsIn(wall_s=body.run_timeout, cpu_s=body.run_timeout,
                                     memory_mb=memory))
    # The compiler gets compile_timeout (and the usual compiler memory), the program
    # run_timeout; SandboxFusion times them apart the same way.
    run_limits = config.default_limits.with_(wall_s=body.run_timeout,
                                             cpu_s=body.run_timeout)
    compile_limits = compile_limits_for(run_limits, spec).with_(
        wall_s=body.compile_timeout, cpu_s=body.compile_timeout)
    result, fetched = await one_shot(state, request, shot, files, compile_limits,
                                     kind="run_code")
    return fusion_response(result, fetched)
