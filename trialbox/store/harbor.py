"""Harbor-style task directories as a task source.

A Harbor task is a directory (the format several agent-RL projects share; Terminal-Bench's
successor)::

    my-task/
      task.toml          configuration: [metadata], [verifier], [agent], [solution],
                         [environment] (timeouts, cpus, memory, storage, env)
      instruction.md     what the agent is asked to do
      environment/       the agent's starting state: a Dockerfile (or `docker_image`)
                         and the files it copies in
      tests/test.sh      the verifier: run after the agent, writes its reward to
                         /logs/verifier/reward.txt (a number) or reward.json
      solution/solve.sh  the reference (oracle) solution, optional

`load_harbor(path)` reads one task directory, or a data set directory holding several
(task directories up to three levels down, hidden ones skipped). Every file and field is
checked; a malformed task raises `HarborError` naming the file and the field. A task
whose environment trialbox cannot provide (a Dockerfile that installs or builds
anything: `RUN`, a base image that is not a Debian-family/Python one, a WORKDIR other
than /app) is not an error: it loads with `unsupported` saying why, and the caller
reports it and runs the rest (`trialbox harbor` does).

The environment trialbox provides is the sandbox tier's own runtime (the host's Debian
12 /usr on the namespace tier) with `/app` (the agent's working directory, the
session's workspace), `/tests` and `/logs` in place: see `trialbox.judge.harbor`.
"""

from __future__ import annotations

import os
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from typing import Any

from trialbox.errors import UsageError
from trialbox.types import Limits

MAX_FILE_BYTES = 8 << 20
"""The largest single file a task may carry (environment, tests, solution)."""
MAX_TASK_BYTES = 64 << 20
"""All of a task's files together."""
WORKDIR = "/app"
"""The only working directory the provided environment has (the sandbox's workspace)."""
BASES = ("python", "debian", "ubuntu", "buildpack-deps")
"""Base images whose place the host's Debian runtime can take (FROM <one>[:tag])."""


class HarborError(UsageError):
    """A Harbor task directory is malformed; the message names the file and the field."""


@dataclass(frozen=True)
class HarborTask:
    """One Harbor task, read and checked."""

    task_id: str
    """The directory's name (a data set's tasks: its path under the data set root)."""
    path: str
    instruction: str
    tests: tuple[tuple[str, bytes, int], ...]
    """The verifier's files (path under tests/, content, mode); tests/test.sh among them."""
    environment_files: tuple[tuple[str, bytes, int], ...] = ()
    """Files the Dockerfile copies into /app (path under /app, content, mode)."""
    solution: tuple[tuple[str, bytes, int], ...] = ()
    """solution/'s files; solution/solve.sh is the oracle."""
    agent_limits: Limits = field(default_factory=Limits)
    verifier_limits: Limits = field(default_factory=Limits)
    verifier_env: tuple[tuple[str, str], ...] = ()
    solution_env: tuple[tuple[str, str], ...] = ()
    environment_env: tuple[tuple[str, str], ...] = ()
    """ENV lines of the Dockerfile (and [environment].env): every run sees them."""
    metadata: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    """What differs from the task's own description and why (e.g. network kept off)."""
    unsupported: str = ""
    """Why trialbox cannot provide this task's environment ("" when it can)."""

    @property
    def has_solution(self) -> bool:
        return any(p == "solve.sh" for p, _d, _m in self.solution)

    @property
    def oracle(self) -> str:
        """solve.sh's text (the oracle's answer, a bash script)."""
        for p, data, _m in self.solution:
            if p == "solve.sh":
                return data.decode("utf-8", errors="surrogateescape")
        raise UsageError(f"{self.task_id}: the task has no solution/solve.sh")


def load_harbor(path: str) -> list[HarborTask]:
    """The Harbor tasks at `path`: one task directory (it holds task.toml), or a data
    set directory whose task directories lie up to three levels down, sorted by id."""
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(path):
        raise HarborError(f"{path}: no such directory (a Harbor task directory holds "
                          "task.toml, instruction.md and tests/test.sh)")
    if os.path.isfile(os.path.join(path, "task.toml")):
        return [load_task(path, os.path.basename(path))]
    found: list[HarborTask] = []
    for root, dirs, files in os.walk(path):
        depth = os.path.relpath(root, path).count(os.sep) + (root != path)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")
                         and not os.path.islink(os.path.join(root, d)))
        if "task.toml" in files and root != path:
            found.append(load_task(root, os.path.relpath(root, path)))
            dirs[:] = []  # a task's own tests/ etc. are no tasks
        elif depth >= 3:
            dirs[:] = []
    if not found:
        raise HarborError(f"{path}: no Harbor task here (no task.toml in it or in its "
                          "subdirectories up to three levels down)")
    return sorted(found, key=lambda t: t.task_id)


def load_task(path: str, task_id: str) -> HarborTask:
    """One task directory, checked (see the module docstring)."""
    toml_path = os.path.join(path, "task.toml")
    try:
        with open(toml_path, "rb") as f:
            conf = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise HarborError(f"{toml_path}: not valid TOML: {e}") from None
    except OSError as e:
        raise HarborError(f"{toml_path}: cannot be read: {e.strerror}") from None
    where = toml_path
    for section in ("metadata", "verifier", "agent", "solution", "environment"):
        if section in conf and not isinstance(conf[section], dict):
            raise HarborError(f"{where}: [{section}] must be a table, got "
                              f"{type(conf[section]).__name__}")
    version = conf.get("version", "1.0")
    if not isinstance(version, str) or not re.fullmatch(r"1(\.\d+)*", version):
        raise HarborError(f"{where}: version: this reader knows task format 1.x, got "
                          f"{version!r}")
    ver, agent, sol, env = (conf.get(k, {}) for k in
                            ("verifier", "agent", "solution", "environment"))
    instruction_path = os.path.join(path, "instruction.md")
    if not os.path.isfile(instruction_path):
        raise HarborError(f"{instruction_path}: missing (the instruction the agent gets)")
    instruction = _read(instruction_path).decode("utf-8", errors="replace")
    if not instruction.strip():
        raise HarborError(f"{instruction_path}: empty (write the instruction the agent gets)")
    tests = _tree(os.path.join(path, "tests"))
    if not any(p == "test.sh" for p, _d, _m in tests):
        raise HarborError(f"{os.path.join(path, 'tests', 'test.sh')}: missing (the verifier "
                          "script that writes /logs/verifier/reward.txt or reward.json)")
    has_solution_dir = os.path.isdir(os.path.join(path, "solution"))
    solution = _tree(os.path.join(path, "solution")) if has_solution_dir else ()
    if has_solution_dir and not any(p == "solve.sh" for p, _d, _m in solution):
        raise HarborError(f"{os.path.join(path, 'solution')}: has no solve.sh (the oracle "
                          "script); remove the directory or add solve.sh")
    cpus = _number(env, "cpus", 1.0, where, "environment")
    memory = _size_mb(env, "memory_mb", "memory", 2048, where)
    storage = _size_mb(env, "storage_mb", "storage", 1024, where)
    base = Limits(cpus=min(cpus, float(os.cpu_count() or 1)), memory_mb=memory,
                  disk_mb=min(storage, 4096), pids=256, open_files=1024, cpu_s=3600)
    agent_timeout = _number(agent, "timeout_sec", 600.0, where, "agent")
    verifier_timeout = _number(ver, "timeout_sec", 600.0, where, "verifier")
    notes: list[str] = []
    if env.get("allow_internet") is True:
        notes.append("[environment] allow_internet = true: network kept off (trialbox "
                     "sandboxes have no network unless an allow-list names it)")
    if storage > 4096:
        notes.append(f"[environment] storage {storage} MB: the workspace is capped at "
                     "4096 MB")
    files, env_vars, unsupported = _environment(path, env, where)
    total = sum(len(d) for _p, d, _m in (*tests, *solution, *files))
    if total > MAX_TASK_BYTES:
        raise HarborError(f"{path}: the task's files hold {total} bytes, more than "
                          f"{MAX_TASK_BYTES}: keep large data out of task directories")
    return HarborTask(
        task_id=task_id, path=path, instruction=instruction, tests=tests,
        environment_files=files, solution=solution,
        agent_limits=Limits(**{**_fields(base), "wall_s": agent_timeout}),
        verifier_limits=Limits(**{**_fields(base), "wall_s": verifier_timeout}),
        verifier_env=_env(ver, where, "verifier"), solution_env=_env(sol, where, "solution"),
        environment_env=(*env_vars, *_env(env, where, "environment")),
        metadata=dict(conf.get("metadata", {})), notes=tuple(notes),
        unsupported=unsupported)


def _fields(limits: Limits) -> dict[str, Any]:
    return {k: getattr(limits, k) for k in limits.__dataclass_fields__}


def _read(path: str) -> bytes:
    size = os.lstat(path).st_size
    if size > MAX_FILE_BYTES:
        raise HarborError(f"{path}: {size} bytes, more than {MAX_FILE_BYTES} per file")
    with open(path, "rb") as f:
        return f.read()


def _tree(top: str) -> tuple[tuple[str, bytes, int], ...]:
    if not os.path.isdir(top):
        raise HarborError(f"{top}: missing directory")
    out = []
    for root, dirs, files in os.walk(top):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(root, name)
            if os.path.islink(full):
                raise HarborError(f"{full}: a symbolic link; task files must be regular "
                                  "files")
            mode = os.lstat(full).st_mode & 0o777
            out.append((os.path.relpath(full, top), _read(full), mode))
    return tuple(out)


def _number(table: dict[str, Any], key: str, default: float, where: str,
            section: str) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise HarborError(f"{where}: [{section}] {key} must be a positive number, got "
                          f"{value!r}")
    return float(value)


_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?", re.IGNORECASE)


def _size_mb(env: dict[str, Any], key_mb: str, key_text: str, default: int,
             where: str) -> int:
    if key_mb in env:
        return int(_number(env, key_mb, default, where, "environment"))
    text = env.get(key_text)
    if text is None:
        return default
    m = _SIZE.fullmatch(str(text).strip()) if isinstance(text, str) else None
    if m is None:
        raise HarborError(f"{where}: [environment] {key_text} must be a size such as "
                          f"\"4G\" or \"512M\", got {text!r}")
    scale = {"": 1 / (1 << 20), "K": 1 / 1024, "M": 1, "G": 1024, "T": 1 << 20}
    mb = int(float(m.group(1)) * scale[m.group(2).upper()])
    if mb < 1:
        raise HarborError(f"{where}: [environment] {key_text} {text!r} is under 1 MB")
    return mb


def _env(table: dict[str, Any], where: str, section: str) -> tuple[tuple[str, str], ...]:
    env = table.get("env", {})
    if not isinstance(env, dict) or not all(
            isinstance(k, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)
            and isinstance(v, (str, int, float)) and not isinstance(v, bool)
            for k, v in env.items()):
        raise HarborError(f"{where}: [{section}] env must be a table of NAME = \"value\" "
                          f"(names: letters, digits, _), got {env!r}")
    return tuple((k, str(v)) for k, v in env.items())


def _environment(path: str, env: dict[str, Any], where: str
                 ) -> tuple[tuple[tuple[str, bytes, int], ...], list[tuple[str, str]], str]:
    """The files the environment copies into /app, its ENV lines, and why it cannot be
    provided ("" when it can)."""
    env_dir = os.path.join(path, "environment")
    dockerfile = os.path.join(env_dir, "Dockerfile")
    image = env.get("docker_image")
    if image is not None and not isinstance(image, str):
        raise HarborError(f"{where}: [environment] docker_image must be a string")
    if not os.path.isfile(dockerfile):
        if os.path.isfile(os.path.join(env_dir, "docker-compose.yaml")):
            return (), [], ("environment/docker-compose.yaml: several containers are not "
                            "provided by trialbox")
        if image and not _debian_like(image):
            return (), [], (f"[environment] docker_image {image!r}: trialbox cannot pull "
                             "images; only a Debian-family or Python base is stood in for by "
                             "the sandbox's own Debian runtime")
        return (_tree(env_dir) if os.path.isdir(env_dir) else ()), [], ""
    text = _read(dockerfile).decode("utf-8", errors="replace")
    files: list[tuple[str, bytes, int]] = []
    env_vars: list[tuple[str, str]] = []
    workdir = "/"
    # Continuation lines joined; comments and blank lines dropped.
    lines = re.sub(r"\\\n", " ", text).splitlines()
    for n, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        op, rest = word.upper(), rest.strip()
        why = f"environment/Dockerfile line {n}: {line[:80]!r}"
        if op == "FROM":
            if not _debian_like(rest.split()[0] if rest else ""):
                return (), [], (f"{why}: trialbox does not pull images; a Debian-family or "
                                "Python base is stood in for by the sandbox's Debian runtime")
        elif op == "WORKDIR":
            workdir = rest
            if workdir.rstrip("/") != WORKDIR:
                return (), [], f"{why}: the provided environment's working directory is /app"
        elif op == "ENV":
            parsed = _env_line(rest)
            if parsed is None:
                raise HarborError(f"{dockerfile}: line {n}: ENV must be NAME=value or "
                                  f"NAME value, got {rest!r}")
            env_vars += parsed
        elif op in ("COPY", "ADD"):
            try:
                args = [a for a in shlex.split(rest) if not a.startswith("--")]
            except ValueError as e:
                raise HarborError(f"{dockerfile}: line {n}: {e}") from None
            if len(args) < 2:
                raise HarborError(f"{dockerfile}: line {n}: {op} needs a source and a "
                                  "destination")
            copied = _copy(env_dir, args[:-1], args[-1], workdir, why)
            if isinstance(copied, str):
                return (), [], copied
            files.extend(copied)
        elif op in ("LABEL", "MAINTAINER", "CMD", "ENTRYPOINT", "EXPOSE", "SHELL", "USER",
                    "ARG"):
            continue  # nothing to provide: the sandbox runs the agent's commands itself
        else:
            return (), [], (f"{why}: {op} needs an image build, which trialbox does not do "
                            "for Dockerfiles (declare the environment as an image spec: "
                            "docs/images.md)")
    if workdir.rstrip("/") != WORKDIR:
        return (), [], ("environment/Dockerfile: no WORKDIR /app (the provided environment's "
                        "working directory is /app)")
    return tuple(files), env_vars, ""


def _debian_like(image: str) -> bool:
    name = image.split("@")[0].split(":")[0].rsplit("/", 1)[-1].lower()
    return name in BASES


def _env_line(rest: str) -> list[tuple[str, str]] | None:
    try:
        parts = shlex.split(rest)
    except ValueError:
        return None
    if parts and all("=" in p for p in parts):
        out = [tuple(p.split("=", 1)) for p in parts]
    elif len(parts) >= 2 and "=" not in parts[0]:
        out = [(parts[0], " ".join(parts[1:]))]
    else:
        return None
    if not all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) for k, _v in out):
        return None
    return [(k, v) for k, v in out]


def _copy(env_dir: str, sources: list[str], dest: str, workdir: str, why: str
          ) -> list[tuple[str, bytes, int]] | str:
    # Docker's rule: a destination ending in "/" (or ".", or several sources) is a
    # directory the sources go into; else a single file source is renamed to it.
    into = dest.endswith(("/", "/.")) or dest == "." or len(sources) > 1
    dest = os.path.normpath(dest if dest.startswith("/") else os.path.join(workdir, dest))
    if dest != WORKDIR and not dest.startswith(WORKDIR + "/"):
        return f"{why}: copies outside /app, which the provided environment cannot hold"
    into = into or dest == WORKDIR
    rel_dest = os.path.relpath(dest, WORKDIR)
    out: list[tuple[str, bytes, int]] = []
    base = os.path.realpath(env_dir)
    for src in sources:
        full = os.path.realpath(os.path.join(env_dir, src))
        if full != base and not full.startswith(base + os.sep):
            return f"{why}: {src!r} lies outside environment/"
        if os.path.isdir(full):
            for p, data, mode in _tree(full):
                out.append((os.path.normpath(os.path.join(rel_dest, p)), data, mode))
        elif os.path.isfile(full):
            target = os.path.join(rel_dest, os.path.basename(full)) if into else rel_dest
            out.append((os.path.normpath(target), _read(full),
                        os.lstat(full).st_mode & 0o777))
        else:
            return f"{why}: {src!r} is not in environment/"
    return out
