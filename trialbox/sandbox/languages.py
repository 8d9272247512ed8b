"""Languages: how source code becomes a run. Python is first-class (it starts warm in
the zygote); everything else is a command in the same isolation.

    result = await run_code(sb, "print(6 * 7)")                 # python
    result = await run_code(sb, "int main(){return 3;}", "c")  # compiled, then run
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from trialbox.errors import UnknownLanguage, UsageError
from trialbox.sandbox.base import Sandbox
from trialbox.sandbox.mounts import PathObstructed, WorkspaceFull
from trialbox.types import ExecResult, ExecStatus, Limits


@dataclass(frozen=True)
class Language:
    """How to write, (maybe) compile and run one language's source in a workspace, and
    what its toolchain needs from the machine and the sandbox.

    The toolchain runs inside the sandbox against the read-only /usr of the host
    (scripts/setup-system.sh installs each `package` when missing). What a compiler,
    a JVM or the go tool needs beyond a C program — writable caches, more processes
    and threads, memory for the compiler — is declared here per language, never made
    global: `env` is added to the run's environment, `run_pids` / `compile_pids` are
    floors on the process limit, `compile_memory_mb` a floor on the compile's memory.
    The *program's* memory limit is never raised: what the caller asked for is what the
    program gets (a JVM sizes its heap from it)."""

    name: str
    filename: str
    run: tuple[str, ...]
    compile: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()
    """Files the toolchain needs on the host (under /usr, which the sandbox mounts)."""
    package: str = ""
    """Where `needs` come from (a Debian package, or scripts/setup-system.sh's npm)."""
    env: tuple[tuple[str, str], ...] = ()
    """Added to the environment of the compile and the run."""
    run_pids: int = 0
    """At least this many processes + threads for the run (runtimes with thread pools)."""
    compile_pids: int = 0
    """At least this many for the compile (COMPILE_PIDS when 0)."""
    compile_memory_mb: int = 0
    """At least this much memory for the compile (a compiler's own need, not the
    program's); 0: the caller's limit."""
    public_class: bool = False
    """Java: the file is named after the source's public class. `filename` and the
    argument equal to its stem in `run` (`Main`) are the defaults, replaced by the
    source's own class name, so `run` and `compile` stay plain argv."""

    def available(self) -> bool:
        return all(os.path.exists(p) for p in self.needs)

    def file_for(self, source: bytes) -> tuple[str, str]:
        """The file name the source is written to, and its class (Java; else "")."""
        if not self.public_class:
            return self.filename, ""
        m = _PUBLIC_CLASS.search(source.decode("utf-8", errors="replace"))
        cls = m.group(1) if m else self.filename.rsplit(".", 1)[0]
        return f"{cls}.java", cls

    def commands(self, source: bytes) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
        """Where `source` is written, and the argv that compile it (() when the language
        has no compile step) and run it — the source's own file and class name filled
        in (Java). Every caller that runs a source (run_code, the stdio judge) builds
        its commands here, so none of them can write `Main.java` for `class Sum`."""
        filename, cls = self.file_for(source)
        return (filename, tuple(_fill(a, self, filename, cls) for a in self.compile),
                tuple(_fill(a, self, filename, cls) for a in self.run))


_PUBLIC_CLASS = re.compile(r"^\s*public\s+(?:final\s+|abstract\s+)*class\s+([A-Za-z_$][\w$]*)",
                           re.MULTILINE)
JUNIT_CP = "/usr/share/java/junit4.jar:/usr/share/java/hamcrest-core.jar"
JS_ROOT = "/usr/local/lib/trialbox-js"
"""Where scripts/setup-system.sh installs jest (and @types/node with it) from
scripts/js/package-lock.json."""
_JVM = ("-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xss8m")
"""One GC thread and the quick JIT: a JVM in a sandbox of a few cores' worth starts in
a fraction of a second and keeps its thread count (pids) small."""
_GO_ENV = (("GOCACHE", "/tmp/go-cache"), ("GOPATH", "/tmp/go"), ("GO111MODULE", "off"),
           ("CGO_ENABLED", "0"), ("GOFLAGS", "-p=2"), ("GOTOOLCHAIN", "local"))
"""The build cache in the session's /tmp (the only writable place besides /workspace),
GOPATH mode (no module download: there is no network), no cgo (no gcc per build),
two compile jobs at once (pids)."""

LANGUAGES: dict[str, Language] = {
    "python": Language("python", "main.py", ("python3", "main.py")),
    "bash": Language("bash", "main.sh", ("/bin/bash", "main.sh")),
    "sh": Language("sh", "main.sh", ("/bin/sh", "main.sh")),
    "c": Language("c", "main.c", ("./main",),
                  ("/usr/bin/gcc", "-O2", "-std=c17", "-o", "main", "main.c", "-lm"),
                  needs=("/usr/bin/gcc",), package="gcc"),
    "cpp": Language("cpp", "main.cpp", ("./main",),
                    ("/usr/bin/g++", "-O2", "-std=c++17", "-o", "main", "main.cpp"),
                    needs=("/usr/bin/g++",), package="g++"),
    "pytest": Language("pytest", "test_main.py",
                       ("python3", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "test_main.py"),
                       needs=("/usr/lib/python3/dist-packages/pytest/__init__.py",),
                       package="python3-pytest"),
    "nodejs": Language("nodejs", "main.js", ("/usr/bin/node", "main.js"),
                       needs=("/usr/bin/node",), package="nodejs", run_pids=32),
    "typescript": Language(
        "typescript", "main.ts", ("/usr/bin/node", "main.js"),
        ("/usr/bin/tsc", "--target", "es2020", "--module", "commonjs", "--lib", "es2020",
         "--typeRoots", f"{JS_ROOT}/node_modules/@types", "--types", "node",
         "--skipLibCheck", "--outDir", ".", "main.ts"),
        needs=("/usr/bin/node", "/usr/bin/tsc", f"{JS_ROOT}/node_modules/@types/node"),
        package="node-typescript (+ @types/node via scripts/setup-system.sh)",
        run_pids=32, compile_pids=32, compile_memory_mb=512),
    "jest": Language(
        "jest", "main.test.js",
        ("/usr/bin/node", f"{JS_ROOT}/node_modules/jest/bin/jest.js", "--ci",
         "--runInBand", "--watchman=false", "--cache=false",
         "--config", '{"rootDir": "/workspace"}', "main.test.js"),
        needs=("/usr/bin/node", f"{JS_ROOT}/node_modules/jest/bin/jest.js"),
        package="jest (npm, scripts/setup-system.sh)", run_pids=64),
    "go": Language("go", "main.go", ("./main",),
                   ("/usr/bin/go", "build", "-o", "main", "main.go"),
                   needs=("/usr/bin/go",), package="golang-go", env=_GO_ENV,
                   run_pids=32, compile_pids=128, compile_memory_mb=512),
    "go_test": Language("go_test", "main_test.go", ("/usr/bin/go", "test", "-v", "-vet=off", "."),
                        needs=("/usr/bin/go",), package="golang-go", env=_GO_ENV,
                        run_pids=128),
    "java": Language("java", "Main.java", ("/usr/bin/java", *_JVM, "-cp", ".", "Main"),
                     ("/usr/bin/javac", *(f"-J{o}" for o in _JVM[:2]), "-encoding",
                      "UTF-8", "-d", ".", "Main.java"),
                     needs=("/usr/bin/java", "/usr/bin/javac"),
                     package="default-jdk-headless", run_pids=64, compile_pids=64,
                     compile_memory_mb=512, public_class=True),
    "junit": Language("junit", "MainTest.java",
                      ("/usr/bin/java", *_JVM, "-cp", f".:{JUNIT_CP}",
                       "org.junit.runner.JUnitCore", "MainTest"),
                      ("/usr/bin/javac", *(f"-J{o}" for o in _JVM[:2]), "-encoding",
                       "UTF-8", "-cp", f".:{JUNIT_CP}", "-d", ".", "MainTest.java"),
                      needs=("/usr/bin/java", "/usr/bin/javac", "/usr/share/java/junit4.jar",
                             "/usr/share/java/hamcrest-core.jar"),
                      package="default-jdk-headless junit4", run_pids=64, compile_pids=64,
                      compile_memory_mb=512, public_class=True),
    "rust": Language("rust", "main.rs", ("./main",),
                     ("/usr/bin/rustc", "--edition", "2021", "-O", "-o", "main", "main.rs"),
                     needs=("/usr/bin/rustc",), package="rustc", compile_pids=64,
                     compile_memory_mb=512),
}
ALIASES = {"python3": "python", "py": "python", "c++": "cpp", "shell": "bash",
           "javascript": "nodejs", "js": "nodejs", "node": "nodejs", "ts": "typescript",
           "golang": "go", "rs": "rust"}

COMPILE_PIDS = 16
"""Processes a compile may always have: gcc's driver runs cc1, as, collect2 and ld."""


def compile_limits_for(limits: Limits, spec: Language | None = None) -> Limits:
    """A compile runs as a run of its own under the caller's limits — the same wall
    time, CPU time and memory the program then gets, each phase its own budget — with
    at least COMPILE_PIDS processes. Never more than asked, except the floors a
    language declares for its compiler's own needs (a JVM-hosted javac, rustc, the go
    tool: `compile_memory_mb`, `compile_pids`): a source can make its compiler work for
    minutes (a file that includes itself) or take gigabytes, and that is the
    candidate's `timeout` or `memory`, reported as the compile's status."""
    pids = max(limits.pids, COMPILE_PIDS, spec.compile_pids if spec else 0)
    memory = max(limits.memory_mb, spec.compile_memory_mb if spec else 0)
    return limits.with_(pids=pids, memory_mb=memory)


def run_limits_for(limits: Limits, spec: Language) -> Limits:
    """The program's limits: the caller's, with the language's floor on processes +
    threads (a runtime's own thread pool). Memory and time are never raised."""
    return limits.with_(pids=max(limits.pids, spec.run_pids)) if spec.run_pids else limits


def offered() -> list[str]:
    """The languages this machine can run (their toolchains are installed)."""
    return sorted(n for n, spec in LANGUAGES.items() if spec.available())


def language(name: str, offer: Sequence[str] | None = None) -> Language:
    """The spec of `name` (or an alias), refused (`UnknownLanguage`, a UsageError) when
    unknown or not runnable where it will run: this machine, or — `offer` given — the
    machines that will run it (a cluster's nodes: `trialbox serve --backend ray`)."""
    key = ALIASES.get(name, name) if isinstance(name, str) else name
    if offer is not None:
        if key not in offer:
            known = "unknown language" if key not in LANGUAGES else "language"
            raise UnknownLanguage(
                f"{known} {name!r} is not offered by the cluster's nodes (their installed "
                f"toolchains; a run may be placed on any of them): use one of "
                f"{', '.join(offer) or 'none'}"
                + (f", or install {LANGUAGES[key].package} on every node"
                   if key in LANGUAGES else ""))
        return LANGUAGES[key]
    if key not in LANGUAGES:
        raise UnknownLanguage(f"unknown language {name!r}; use one of those installed here: "
                              f"{', '.join(offered())}")
    spec = LANGUAGES[key]
    if not spec.available():
        missing = [p for p in spec.needs if not os.path.exists(p)]
        raise UnknownLanguage(f"language {name!r} is not installed on this machine "
                              f"(missing {', '.join(missing)}: install {spec.package}, "
                              f"e.g. run scripts/setup-system.sh); offered here: "
                              f"{', '.join(offered())}")
    return spec


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
    # a session on another machine (a cluster node's) says what that machine runs
    spec = language(lang, getattr(sb, "languages", None))
    source = _source_bytes(code)
    filename, build, run = spec.commands(source)
    try:
        await sb.write_file(filename, source)
    except (PathObstructed, WorkspaceFull) as e:
        # The session's workspace is the candidate's: an earlier run made main.py a
        # directory, or filled it. Its outcome, never an error of the caller's.
        status = ExecStatus.DISK if isinstance(e, WorkspaceFull) else ExecStatus.EXIT
        return ExecResult(status=status, message=f"cannot write {filename}: {e}",
                          tier=getattr(sb, "tier", ""))
    env = dict(spec.env) or None
    compiled = None
    if build:
        compiled = await sb.exec(list(build), env=env, limits=compile_limits
                                 or compile_limits_for(limits or sb.limits, spec))
        if not compiled.ok:
            return _with_compile(compiled, compiled)
    run_limits = run_limits_for(limits or sb.limits, spec) if spec.run_pids else limits
    result = await sb.exec([*run, *args], stdin=stdin, env=env, limits=run_limits)
    return _with_compile(result, compiled) if compiled else result


def _fill(arg: str, spec: Language, filename: str, cls: str) -> str:
    """`spec`'s default file name and class replaced by the source's (exact arguments
    only)."""
    if not spec.public_class:
        return arg
    if arg == spec.filename:
        return filename
    return cls if arg == spec.filename.rsplit(".", 1)[0] else arg


def _with_compile(result: ExecResult, compiled: ExecResult) -> ExecResult:
    from dataclasses import replace
    return replace(result, compile=replace(compiled, compile=None))
