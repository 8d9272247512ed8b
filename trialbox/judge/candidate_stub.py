"""Candidate side of a function-call judgement. Runs INSIDE the candidate's sandbox as
`python3 -c 'import _trialbox_stub as m; m.main()' ENTRY` (preloaded in a judge pool's
interpreter, else imported from the copy in /workspace), next to `solution.py`.

It loads the solution, then serves calls from the trusted harness over fd 3: each
request is a frame (4-byte big-endian length + codec bytes) holding [call id, args];
each answer is [call id, "ok", value] / [call id, "raised", text] /
[call id, "bad_return", text]. Nothing here is trusted: the candidate shares this process
and may rewrite any of it. Whatever comes back over fd 3 is only ever decoded as plain
data by the harness and compared there — so tampering can make tests fail, never pass.

Standalone: imports nothing from trialbox (it is copied into the sandbox).
"""

import os
import struct
import sys
import traceback

import _trialbox_codec as codec  # preloaded in a judge pool, else the copy beside us

CHANNEL = 3
MAX_FRAME = 16 << 20


def _read_exact(n):
    chunks, got = [], 0
    while got < n:
        b = os.read(CHANNEL, n - got)
        if not b:
            return None
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


def recv():
    head = _read_exact(4)
    if head is None:
        return None
    (n,) = struct.unpack(">I", head)
    if n > MAX_FRAME:
        return None
    body = _read_exact(n)
    return None if body is None else codec.decode(body)


def send(obj):
    data = codec.encode(obj)
    view = memoryview(struct.pack(">I", len(data)) + data)
    while view:
        view = view[os.write(CHANNEL, view):]


def _short(exc):
    return ("%s: %s" % (type(exc).__name__, exc))[:2000]


def main():
    entry = sys.argv[1]
    namespace = {"__name__": "solution", "__file__": "/workspace/solution.py"}
    try:
        with open("/workspace/solution.py") as f:
            source = f.read()
        exec(compile(source, "solution.py", "exec"), namespace)
        fn = namespace[entry]
        if not callable(fn):
            raise TypeError("%s is not callable" % entry)
    except BaseException as e:  # the candidate's code failed to load: report it
        detail = traceback.format_exception_only(type(e), e)[-1].strip()
        send([0, "load_error", ("%s" % detail)[:2000]])
        return
    send([0, "ready", None])
    while True:
        msg = recv()
        if msg is None:
            return
        call_id, args = msg[0], msg[1]
        try:
            value = fn(*args)
        except BaseException as e:
            send([call_id, "raised", _short(e)])
            continue
        try:
            send([call_id, "ok", value])
        except codec.CodecError as e:
            send([call_id, "bad_return", str(e)[:2000]])


if __name__ == "__main__":
    main()
