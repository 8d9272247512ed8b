r"""How workspace file names cross JSON, which carries text, not bytes.

A candidate may name its files with any bytes; those that are not UTF-8 reach us from
the kernel as Python does (`surrogateescape`: byte 0xff is the code point U+DCFF),
which no JSON encoder can send. Such a name is *shown* with those bytes as backslash
escapes, and said to be so:

    shown("bad-\udcff.txt")    ->  'bad-\\xff.txt'   (10 characters, one backslash)
    escaped("bad-\udcff.txt")  ->  {"name": 'bad-\\xff.txt', "name_b64": "YmFkLf8udHh0"}

and the file endpoints take the shown form back (`workspace_names`): the name as given
first, then — when it holds such escapes — the bytes they stand for.
"""

from __future__ import annotations

import base64
import re

from trialbox.errors import UsageError
from trialbox.sandbox.base import Sandbox

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
