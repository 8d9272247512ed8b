"""Request bodies of the native `/v1` API (pydantic; a bad field is a 422 naming it)."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from trialbox.service.config import ServiceConfig
from trialbox.service.errors import FieldError
from trialbox.types import Limits

LIMIT_FIELDS = ("wall_s", "cpu_s", "memory_mb", "disk_mb", "pids", "output_bytes")


class LimitsIn(BaseModel):
    """Any subset of `trialbox.types.Limits` (no `network`: the service never gives a
    sandbox the host's network). Missing fields come from the server's defaults."""

    model_config = ConfigDict(extra="forbid")
    wall_s: float | None = Field(default=None, gt=0, description="wall-clock seconds")
    cpu_s: float | None = Field(default=None, gt=0, description="CPU seconds (all processes)")
    memory_mb: int | None = Field(default=None, gt=0, description="memory, MiB")
    disk_mb: int | None = Field(default=None, gt=0, description="workspace tmpfs size, MiB")
    pids: int | None = Field(default=None, gt=0, description="processes + threads")
    output_bytes: int | None = Field(default=None, gt=0, description="bytes kept per stream")


def resolve_limits(given: LimitsIn | None, config: ServiceConfig,
                   prefix: str = "limits") -> Limits:
    """The server's default limits with the request's changes, each checked against
    `config.max_limits`; too much or out of range → FieldError naming the field."""
    base = config.default_limits
    if given is None:
        return base
    changes: dict[str, Any] = {k: v for k, v in given.model_dump().items() if v is not None}
    for name, value in changes.items():
        cap = getattr(config.max_limits, name)
        if value > cap:
            raise FieldError(f"{prefix}.{name}", f"{value} is above this server's maximum "
                             f"{cap}; ask for less")
    if "wall_s" in changes and "cpu_s" not in changes:
        changes["cpu_s"] = min(changes["wall_s"], config.max_limits.cpu_s)
    try:
        return base.with_(**changes)
    except ValueError as e:  # LimitsError: too small to start an interpreter, …
        raise FieldError(prefix, str(e)) from None


def decode_b64(value: str, field: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise FieldError(field, "is not valid base64 (standard alphabet, padded); encode "
                         "the bytes with base64") from None


def decode_files(files: dict[str, str] | None, field: str = "files") -> dict[str, bytes]:
    return {name: decode_b64(data, f"{field}.{name}") for name, data in (files or {}).items()}


def encode_b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class SessionIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    limits: LimitsIn | None = None


class RunIn(BaseModel):
    """Run source code in a session (or one-shot): written to the language's file,
    compiled if needed, then run."""

    model_config = ConfigDict(extra="forbid")
    code: str = Field(description="the program's source")
    language: str = Field(default="python", description="python, bash, sh, c, cpp")
    stdin: str = Field(default="", description="text fed to stdin")
    stdin_b64: str | None = Field(default=None,
                                    description="bytes fed to stdin (wins over stdin)")
    args: list[str] = Field(default_factory=list, description="program arguments")
    limits: LimitsIn | None = None


class ExecIn(BaseModel):
    """Run a command (argv) in a session's workspace."""

    model_config = ConfigDict(extra="forbid")
    argv: list[str] = Field(min_length=1, description="command and arguments")
    stdin: str = ""
    stdin_b64: str | None = None
    limits: LimitsIn | None = None


class OneShotIn(RunIn):
    """A fresh sandbox for one run: files written first, files fetched after."""

    files: dict[str, str] = Field(default_factory=dict, description="path → base64")
    fetch_files: list[str] = Field(default_factory=list,
                                   description="workspace paths returned after the run")


class FilesIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    files: dict[str, str] = Field(description="path → base64 content")


class SubmissionIn(BaseModel):
    """A completion to grade: against a bundled task (`task_id`, e.g. "HumanEval/0") or
    an inline `task` (a row in the JSONL task format of trialbox/store/tasks.py)."""

    model_config = ConfigDict(extra="forbid")
    task_id: str | None = None
    task: dict[str, Any] | None = None
    completion: str = Field(description="function tasks: appended to the prompt; stdio "
                            "tasks: the whole program")
    language: str = Field(default="python", description="stdio tasks: the program's language")


class BatchIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    submissions: list[SubmissionIn] = Field(min_length=1, max_length=1024)
