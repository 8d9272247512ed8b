"""Candidate side of a function-call judgement. Runs INSIDE the candidate's sandbox as
`python3 -c 'import _trialbox_stub as m; m.main()' ENTRY` (preloaded in a judge pool's
interpreter, else imported from the copy in /workspace), next to `solution.py`.

It loads the solution, then serves calls from the trusted harness over fd 3: each
request is a frame (4-byte big-endian length + codec bytes) holding [call id, args] or
[call id, args, kwargs]; each answer is [call id, "ok", value] / [call id, "raised",
[name, args]] (the nearest built-in class of the exception and its args, as plain data:
the harness raises that built-in class in the test) / [call id, "bad_return", text].
An "ok" or "raised" answer carries a fourth element when the call changed arguments in
place: [[position or keyword, new value], ...] (`_changed`), which the harness applies
to the test's own objects, so in-place semantics are those of an in-process call.
Nothing here is trusted:
the candidate shares this process and may rewrite any of it. Whatever comes back over
fd 3 is only ever decoded as plain data by the harness and compared there — so
tampering can make tests fail, never pass.

Standalone: imports nothing from trialbox (it is copied into the sandbox).
"""

import base64
import io
import json
import math
import os
import struct
import sys
import traceback

import _trialbox_codec as codec  # preloaded in a judge pool, else the copy beside us

CHANNEL = 3
MAX_FRAME = 16 << 20
SHORT_STR = 1 << 16  # answers up to this many characters take the shortcut in `_frame`
_SAFE_INT = 2**53  # codec.encode writes ints beyond +-2**53 in hex, tagged
_dumps = json.encoder.encode_basestring_ascii  # as codec.encode writes a str
_read_json = json.JSONDecoder(object_pairs_hook=tuple).decode  # made once, not per call


def _read_exact(n):
    chunks, got = [], 0
    while got < n:
        b = os.read(CHANNEL, n - got)
        if not b:
            return None
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


def _build(j):
    """The value codec.encode wrote as the JSON `j` (objects read as pairs)."""
    t = type(j)
    if t is list:
        return [_build(x) for x in j]
    if t is not tuple:
        return j  # None, bool, int, float, str stand for themselves
    tag, v = j[0][1], j[1][1]  # {"t": tag, "v": payload}
    if tag == "tuple":
        return tuple([_build(x) for x in v])
    if tag == "int":
        return int(v, 16)
    if tag == "float":
        return float(v)
    if tag == "bytes":
        return base64.b64decode(v)
    if tag == "dict":
        return {_build(k): _build(x) for k, x in v}
    if tag == "set":
        return {_build(x) for x in v}
    if tag == "frozenset":
        return frozenset([_build(x) for x in v])
    return codec._rebuild(tag, _build(v), codec._Made())  # a Counter, a namedtuple...


def load(data):
    """codec.decode for what the trusted harness sent: the same values, built in the same
    order, without decode's checks (canonical form, limits, hash flooding). They guard
    the judge against a hostile sender; here the sender is the judge, and this process
    is the candidate's anyway — it could rewrite any check. A third of the candidate's
    CPU per call went to them."""
    return _load(data)[0]


def _load(data):
    """(value, its JSON tree): the tree is never shared with the value (`_build` makes
    new containers), so it stays what the harness sent — `_changed` compares with it."""
    tree = _read_json(data.decode("utf-8"))
    return _build(tree), tree


def recv():
    head = _read_exact(4)
    if head is None:
        return None
    (n,) = struct.unpack(">I", head)
    if n > MAX_FRAME:
        return None
    body = _read_exact(n)
    return None if body is None else _load(body)


_IMMUTABLE_TAGS = frozenset({"int", "float", "bytes", "frozenset", "range", "Fraction",
                             "Decimal", "iter", "keys", "values", "items"})


def _changed(args, kwargs, tree):
    """[[position or keyword, value], ...] for each argument the call changed in place
    (None if none did): its value now differs from the one the harness sent (`tree`:
    [id, args, kwargs?] as JSON). An argument sent as a JSON array (a list of scalars,
    strs, lists) is compared with its tree as it is — one C-speed `==`, the common
    case —; a tagged container that may hold something mutable (a dict, a set, a tuple
    of lists...) with a copy built afresh; scalars and immutable values not at all."""
    out = None
    for i, sent in enumerate(tree[1]):
        t = type(sent)
        if t is list or t is tuple and sent[0][1] not in _IMMUTABLE_TAGS:
            out = _compare(i, args[i], sent, out)
    if kwargs:
        for k, sent in tree[2][1][1]:  # {"t": "dict", "v": [[key, value], ...]}
            t = type(sent)
            if t is list or t is tuple and sent[0][1] not in _IMMUTABLE_TAGS:
                out = _compare(k, kwargs[k], sent, out)
    return out


def _compare(key, value, sent, out):
    try:
        same = type(sent) is list and value == sent or value == _build(sent)
    except BaseException:  # the candidate's objects compared
        same = False
    if not same:
        out = out or []
        out.append([key, value])
    return out


def _frame(obj):
    """codec.encode(obj) — byte for byte — for an answer [id, kind, value] whose value is
    None, a bool, a short str, an int within +-2**53 or a finite float, without the
    encoder's general walk; anything else goes through codec.encode."""
    if type(obj) is list and len(obj) == 3 and type(obj[0]) is int \
            and -_SAFE_INT <= obj[0] <= _SAFE_INT and type(obj[1]) is str:
        v, t = obj[2], type(obj[2])
        if v is None or t is bool or t is str and len(v) <= SHORT_STR:
            text = _dumps(v) if t is str else "null" if v is None else str(v).lower()
        elif t is int and -_SAFE_INT <= v <= _SAFE_INT or t is float and math.isfinite(v):
            text = repr(v)
        else:
            text = None
        if text is not None:
            return ("[%d,%s,%s]" % (obj[0], _dumps(obj[1]), text)).encode("ascii")
    return codec.encode(obj)


def send(obj):
    _write(_frame(obj))


def _write(data):
    view = memoryview(struct.pack(">I", len(data)) + data)
    while view:
        view = view[os.write(CHANNEL, view):]


def _raised(call_id, exc, changes=None):
    """The "raised" answer for `exc`: [name, args] of its nearest built-in class (a
    class of the solution's own crosses as the built-in it derives from), args as plain
    data or, failing that, its text; with the arguments it changed, if any."""
    try:
        cls = next(c for c in type(exc).__mro__ if c.__module__ == "builtins")
        name = cls.__name__
    except Exception:
        name = "Exception"
    tail = [changes] if changes else []
    try:
        return _frame([call_id, "raised", [name, list(exc.args)], *tail])
    except Exception:
        pass
    try:
        text = str(exc)[:2000]
    except Exception:
        text = ""
    try:
        return _frame([call_id, "raised", [name, [text]], *tail])
    except Exception as e:  # the changed arguments are not plain data
        return _frame([call_id, "bad_return", _changes_text(e)])


def _changes_text(e):
    return ("an argument changed in place that is no longer plain data: %s"
            % (e,))[:2000]


def _read_source():
    """solution.py as text: what open() in text mode gives (UTF-8, strict; compile()
    of a str turns \r\n and \r into \n as its newline translation would, and ignores a
    coding cookie, as reading it as UTF-8 did) with plain syscalls — in a freshly forked
    process each heap page Python writes is a copy-on-write fault, and a text file
    object touches many (~110 us and ~22 faults of the candidate's CPU a judgement)."""
    fd = os.open("/workspace/solution.py", os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while True:
            b = os.read(fd, 1 << 16)
            if not b:
                return b"".join(chunks).decode("utf-8")
            chunks.append(b)
    finally:
        os.close(fd)


OUTPUT_KEPT = 256 << 10
"""Characters of each of stdout and stderr the candidate's prints reach the sandbox's
output with; past it they are dropped. A function's printing is not its answer (nor
evidence: only the detectors read it), so correct code that prints a lot must not end
at the sandbox's output limit (Limits.output_bytes) — in the ordinary harness it
prints without one."""


class _Bounded(io.TextIOBase):
    """sys.stdout / sys.stderr for the candidate's code: the first OUTPUT_KEPT
    characters pass to the real stream, the rest is counted and dropped."""

    def __init__(self, stream):
        self._stream = stream
        self._left = OUTPUT_KEPT
        self.buffer = _BoundedBytes(self)

    def writable(self):
        return True

    @property
    def encoding(self):
        return getattr(self._stream, "encoding", "utf-8")

    def write(self, text):
        if not isinstance(text, str):
            raise TypeError("write() argument must be str, not %s" % type(text).__name__)
        if self._left > 0:
            kept = text[:self._left]
            self._left -= len(kept)
            self._stream.write(kept)
            if self._left <= 0:
                self._stream.write("\n[trialbox: output past %d characters dropped]\n"
                                   % OUTPUT_KEPT)
        return len(text)

    def flush(self):
        self._stream.flush()


class _BoundedBytes:
    """`sys.stdout.buffer`: bytes written count against the same budget."""

    def __init__(self, owner):
        self._owner = owner

    def write(self, data):
        self._owner.write(bytes(data).decode("utf-8", "replace"))
        return len(data)

    def flush(self):
        self._owner.flush()


def main():
    sys.stdout, sys.stderr = _Bounded(sys.stdout), _Bounded(sys.stderr)
    entry = sys.argv[1]
    namespace = {"__name__": "solution", "__file__": "/workspace/solution.py"}
    try:
        exec(compile(_read_source(), "solution.py", "exec"), namespace)
        fn = namespace[entry]
        if not callable(fn):
            raise TypeError("%s is not callable" % entry)
    except BaseException as e:  # the candidate's code failed to load: report it
        detail = traceback.format_exception_only(type(e), e)[-1].strip()
        send([0, "load_error", ("%s" % detail)[:2000]])
        return
    send([0, "ready", None])
    while True:
        got = recv()
        if got is None:
            return
        msg, tree = got
        call_id, args = msg[0], msg[1]
        kwargs = msg[2] if len(msg) > 2 else None
        try:
            value = fn(*args, **kwargs) if kwargs else fn(*args)
        except BaseException as e:
            _write(_raised(call_id, e, _changed(args, kwargs, tree)))
            continue
        changes = _changed(args, kwargs, tree)
        try:  # encode reads a returned iterator (a generator...) to its end: it may raise
            send([call_id, "ok", value, changes] if changes else [call_id, "ok", value])
        except codec.CodecError as e:  # "at [2]...": the value; "at [3]...": an argument
            text = _changes_text(e) if str(e).startswith("at [3]") else str(e)[:2000]
            send([call_id, "bad_return", text])
        except BaseException as e:  # raised by the candidate's code
            _write(_raised(call_id, e, changes))


if __name__ == "__main__":
    main()
