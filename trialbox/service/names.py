r"""How workspace file names cross JSON, which carries text, not bytes.

A candidate may name its files with any bytes; those that are not UTF-8 reach us from
the kernel as Python does (`surrogateescape`: byte 0xff is the code point U+DCFF),
which no JSON encoder can send. Such a name is *shown* with those bytes as backslash
escapes, and said to be so:

    shown("bad-\udcff.txt")    ->  'bad-\\xff.txt'   (10 characters, one backslash)
    escaped("bad-\udcff.txt")  ->  {"name": 'bad-\\xff.txt', "name_b64": "YmFkLf8udHh0"}

and the file endpoints take the shown form back (`workspace_names`): the name as given
first, then — when it holds such escapes — the bytes they stand for.

A one-shot run's `files` and `fetch_files` (`/run_code`, `/run_jupyter`, `/v1/exec`) may
also name a file by an absolute path, as SandboxFusion's do (its server joins the name
to the run's directory, so `/tmp/flag.txt` lands at `/tmp/flag.txt`): `write_all` and
`read_all` place and fetch those under the session's own writable trees (`/workspace/`,
`/tmp/`, `/dev/shm/`) with one helper command in the session, as its own user; an
absolute path anywhere else is refused, naming those trees.
"""

from __future__ import annotations

import base64
import posixpath
import re
from collections.abc import Mapping, Sequence

from trialbox.errors import UsageError
from trialbox.sandbox.base import Sandbox
from trialbox.types import Limits

_ESCAPE = re.compile(r"\\x([89a-fA-F][0-9a-fA-F])")


def shown(name: str) -> str:
    """`name` as JSON can carry it: non-UTF-8 bytes as `\\xNN` escapes."""
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def escaped(name: str) -> dict[str, str] | None:
    """For a name `shown` had to escape: {"name": the shown form, "name_b64": its bytes
    in base64}; None for a name JSON carries as it is."""
    text = shown(name)
    if text == name:
        return None
    raw = name.encode("utf-8", "surrogateescape")
    return {"name": text, "name_b64": base64.b64encode(raw).decode()}


def workspace_names(given: str) -> list[str]:
    """The names a client's `given` path may mean, in the order to try: itself, then,
    when it holds `\\xNN` escapes of bytes 0x80-0xff (what `shown` writes), the name
    with those bytes."""
    if not _ESCAPE.search(given):
        return [given]
    raw = _ESCAPE.sub(lambda m: chr(0xDC00 + int(m.group(1), 16)), given)
    return [given, raw]


async def read_named(sb: Sandbox, given: str) -> bytes:
    """The workspace file a client named `given` (in the shown form or not); the
    sandbox's `UsageError` when none of its `workspace_names` is a readable file."""
    names = workspace_names(given)
    for name in names[:-1]:
        try:
            return await sb.read_file(name)
        except UsageError:
            pass
    return await sb.read_file(names[-1])


OUTSIDE_ROOTS = ("/tmp/", "/dev/shm/")
"""Absolute places outside the workspace that a session writes: its own tmpfs."""
_STAGE = ".trialbox-files"
"""Workspace directory a file outside the workspace passes through (removed after)."""
_HELPER_LIMITS = Limits(wall_s=10.0, cpu_s=5.0)
"""The helper command's: a copy of files the request carried or a run left behind."""
_PLACE = ('set -e; while [ "$#" -gt 0 ]; do mkdir -p -- "$(dirname -- "$2")"; '
          'mv -f -- "$1" "$2"; shift 2; done; rmdir -- ' + _STAGE)
_COPY = ('mkdir -p -- ' + _STAGE + '; i=0; for f in "$@"; do '
         '[ -f "$f" ] && cp -- "$f" ' + _STAGE + '/$i; i=$((i+1)); done; true')


def outside(given: str) -> str | None:
    """`given` normalised when it is an absolute path outside the workspace (one of
    `OUTSIDE_ROOTS`); None for a workspace path (relative or under /workspace/).
    Another absolute path, or one climbing out with `..`, is a `UsageError`."""
    if not given.startswith("/") or given.startswith("/workspace/"):
        return None
    path = posixpath.normpath(given)
    if (not any(path.startswith(root) for root in OUTSIDE_ROOTS)
            or ".." in given.split("/") or "\x00" in given):
        raise UsageError(f"file {given!r}: an absolute path must be in the sandbox's "
                         f"writable trees, /workspace/, {', '.join(OUTSIDE_ROOTS)} "
                         "(the rest of its file system is read-only); a relative path "
                         "is in /workspace, where the code runs")
    return path


async def write_all(sb: Sandbox, files: Mapping[str, bytes]) -> None:
    """Write `files` into a fresh session: workspace paths directly, absolute paths
    under `OUTSIDE_ROOTS` through the workspace and one `mv` in the session."""
    moves: list[str] = []
    for given, data in files.items():
        path = outside(given)
        if path is None:
            await sb.write_file(given, data)
            continue
        staged = f"{_STAGE}/{len(moves) // 2}"
        await sb.write_file(staged, data)
        moves += [staged, path]
    if moves:
        r = await sb.exec(["/bin/sh", "-c", _PLACE, "place", *moves],
                          limits=_HELPER_LIMITS)
        if not r.ok:
            raise UsageError(f"could not place the files outside the workspace "
                             f"({', '.join(moves[1::2])}): {r.stderr_text.strip() or r.message}")


async def read_all(sb: Sandbox, paths: Sequence[str]) -> dict[str, bytes | None]:
    """The files `paths` name after a run (None for one that is not a readable regular
    file): workspace paths as `read_named`, absolute paths under `OUTSIDE_ROOTS` copied
    into the workspace by one `cp` in the session first (it reads only what the
    session's user can; the copy is read with links never followed)."""
    out: dict[str, bytes | None] = {}
    away: dict[str, str] = {}  # given -> its absolute path outside the workspace
    for given in paths:
        try:
            if (path := outside(given)) is not None:
                away[given] = path
        except UsageError:  # elsewhere: the run cannot have left it
            out[given] = None
    copied = bool(away) and (await sb.exec(
        ["/bin/sh", "-c", _COPY, "copy", *away.values()], limits=_HELPER_LIMITS)).ok
    for given in paths:
        if given in out:
            continue
        try:
            if given in away:
                index = list(away).index(given)
                out[given] = (await sb.read_file(f"{_STAGE}/{index}")) if copied else None
            else:
                out[given] = await read_named(sb, given)
        except UsageError:
            out[given] = None
    return {given: out[given] for given in paths}
