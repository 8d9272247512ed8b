"""Languages: how source code becomes a run. Python is first-class (it starts warm in
the zygote); everything else is a command in the same isolation.

    result = await run_code(sb, "print(6 * 7)")                 # python
    result = await run_code(sb, "int main(){return 3;}", "c")  # compiled, then run
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trialbox.errors import UnknownLanguage, UsageError
from trialbox.sandbox.base import Sandbox
from trialbox.sandbox.mounts import PathObstructed, WorkspaceFull
from trialbox.types import ExecResult, ExecStatus, Limits


@dataclass(frozen=True)
class Language:
    """How to write, (maybe) compile and run one language's source in a workspace."""

    name: str
    filename: str
    run: tuple[str, ...]
    compile: tuple[str, ...] = ()


LANGUAGES: dict[str, Language] = {
    "python": Language("python", "main.py", ("python3", "main.py")),
    "bash": Language("bash", "main.sh", ("/bin/bash", "main.sh")),
    "sh": Language("sh", "main.sh", ("/bin/sh", "main.sh")),
    "c": Language("c", "main.c", ("./main",),
                  ("/usr/bin/gcc", "-O2", "-std=c17", "-o", "main", "main.c", "-lm")),
    "cpp": Language("cpp", "main.cpp", ("./main",),
                    ("/usr/bin/g++", "-O2", "-std=c++17", "-o", "main", "main.cpp")),
}
ALIASES = {"python3": "python", "py": "python", "c++": "cpp", "shell": "bash"}

COMPILE_PIDS = 16
"""Processes a compile may always have: gcc's driver runs cc1, as, collect2 and ld."""


def compile_limits_for(limits: Limits) -> Limits:
    """A compile runs as a run of its own under the caller's limits — the same wall
    time, CPU time and memory the program then gets, each phase its own budget — with
    at least COMPILE_PIDS processes. Never more than asked: a source can make its
    compiler work for minutes (a file that includes itself) or take gigabytes, and that
    is the candidate's `timeout` or `memory`, reported as the compile's status."""
    return limits.with_(pids=max(limits.pids, COMPILE_PIDS))


def language(name: str) -> Language:
    key = ALIASES.get(name, name) if isinstance(name, str) else name
    if key not in LANGUAGES:
        raise UnknownLanguage(f"unknown language {name!r}; use one of "
                              f"{', '.join(sorted(LANGUAGES))}")
    return LANGUAGES[key]


def _source_bytes(code: str | bytes) -> bytes:
    if isinstance(code, bytes):
        try:
            code.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UsageError(f"source code must be UTF-8; byte {e.start} is not "
                             "(decode it yourself or fix the encoding)") from e
        return code
    if isinstance(code, str):
        return code.encode("utf-8", errors="strict")
    raise UsageError(f"source code must be str or UTF-8 bytes, got {type(code).__name__}")


async def run_code(sb: Sandbox, code: str | bytes, lang: str = "python", *,
                   stdin: bytes = b"", args: Sequence[str] = (),
                   limits: Limits | None = None,
                   compile_limits: Limits | None = None) -> ExecResult:
    """Write `code` into the session, compile it if the language needs it, run it.

    For compiled languages a failed compilation is returned as the result (its status
    and the compiler's stderr), with the same object also in `.compile`.
    """
    spec = language(lang)
    source = _source_bytes(code)
    try:
        await sb.write_file(spec.filename, source)
    except (PathObstructed, WorkspaceFull) as e:
        # The session's workspace is the candidate's: an earlier run made main.py a
        # directory, or filled it. Its outcome, never an error of the caller's.
        status = ExecStatus.DISK if isinstance(e, WorkspaceFull) else ExecStatus.EXIT
        return ExecResult(status=status, message=f"cannot write {spec.filename}: {e}",
                          tier=getattr(sb, "tier", ""))
    compiled = None
    if spec.compile:
        compiled = await sb.exec(list(spec.compile), limits=compile_limits
                                 or compile_limits_for(limits or sb.limits))
        if not compiled.ok:
            return _with_compile(compiled, compiled)
    result = await sb.exec([*spec.run, *args], stdin=stdin, limits=limits)
    return _with_compile(result, compiled) if compiled else result


def _with_compile(result: ExecResult, compiled: ExecResult) -> ExecResult:
    from dataclasses import replace
    return replace(result, compile=replace(compiled, compile=None))
