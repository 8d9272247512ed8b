"""Candidate side of a repository judgement on the trusted tier (docs/judge.md,
"Repository tasks"). Runs INSIDE the candidate's sandbox as
`python3 -c 'import _trialbox_repo_stub as m; m.main()'`, cwd the candidate's tree, which
holds no hidden test file.

It imports nothing of the candidate's until asked, then serves requests from the
trusted test process over fd 3: each is a frame (4-byte big-endian length + codec bytes)

    ["import", name]            ["getattr", ref, name]        ["setattr", ref, name, arg]
    ["call", ref, args, kwargs] ["op", ref, op, args]         (op: len, iter, getitem,
                                                               setitem, delitem, bool,
                                                               str, int, float, ...)

    ["levels", {logger name: level}, disable]   the tests' logging levels, mirrored

where an argument is ["v", plain data], ["r", ref] (an object this stub handed out
before), ["b", module, qualified name] (a function of the standard library the test
passed, e.g. `operator.add` or `len`: resolved here, it runs here) or ["t", id] (any
other object of the test's — a lambda, a test's function, a mock, an iterator — which
stays in the tests' process). Using a ["t"] object here (calling it, iterating it, len,
bool, getitem, contains, hash, str) is a *callback*: this stub sends
["cb", id, op, args, kwargs] and waits for ["ret", answer]; meanwhile the tests' process
may send requests of its own (the callback calls the candidate's code again), served
here in turn. A callback's answer is ["v", data], ["r", ref] (this process's own object),
["t", id] (another of the test's objects) or ["x", exception type name, None, message].
Using it also covers setitem, delitem and reading a public attribute (which the tests'
process allows only on objects of its own test classes and mocks).

Each answer is ["v", plain data] (a value of exact builtin types that the codec
takes whole), ["r", ref, kind, name, info] (any other object, kept here under a number:
kind is module / class / exception-class / callable / object; an exception class's info
is its builtin ancestor and its own classes in MRO order), ["l", [answer, ...]] (the
items of an `iter`), or ["x", exception type name, its class's answer or None for a
builtin, message] when the candidate's code raised. A coroutine (or other awaitable) is
a reference of kind `coroutine`; the `await` op runs it to completion here. An iterator
is a reference of kind `iterator`, never read ahead: the tests' process asks `next` for
each item, so an endless or lazy one behaves as it would in one process.

A call that changed an argument it was sent by value in place (a list appended to)
answers ["m", [[position or keyword, value now], ...], answer]: the tests' process
gives the test's own object that state, as one process would have left it.

What the request's code did besides answering — wrote to sys.stdout / sys.stderr,
logged, warned — rides along as ["e", events, answer], the events in the order they
happened: ["out" | "err", text], ["log", logger, levelno, levelname, message, pathname,
lineno, funcName, exc_text], ["warn", category name, its class's answer or None for a
builtin, message, filename, lineno]. The tests' process replays them (its capsys,
caplog, pytest.warns and warning filters see them as in one process). They are data like
any answer: written text, records and warnings, never code.

Nothing here is trusted: the candidate shares this process and may rewrite any of it.
Whatever comes back over fd 3 is decoded as plain data by the trusted side, which never
runs the candidate's code nor lets it near the tests — tampering makes calls fail, never
tests pass. Standalone: imports nothing from trialbox (it is copied into the sandbox).
"""

import asyncio
import builtins
import collections
import importlib
import inspect
import io
import logging
import operator
import os
import struct
import sys
import warnings

import _trialbox_codec as codec

CHANNEL = 3
MAX_FRAME = 16 << 20
_OPS = {
    "len": len, "iter": lambda o: [x for x in o], "getitem": operator.getitem,
    "setitem": operator.setitem, "delitem": operator.delitem,
    "bool": bool, "str": str, "repr": repr,
    "int": int, "float": float, "index": operator.index, "abs": abs, "neg": operator.neg,
    "enter": lambda o: o.__enter__(), "exit": lambda o: o.__exit__(None, None, None),
    "next": next,
    "await": lambda o: _loop().run_until_complete(o),
    "isinstance": lambda c, o: isinstance(o, c), "issubclass": lambda c, o: issubclass(o, c),
    "methods": lambda c: [n for n in dir(c) if callable(getattr(c, n, None))],
    "hash": hash, "eq": operator.eq, "ne": operator.ne, "lt": operator.lt,
    "le": operator.le, "gt": operator.gt, "ge": operator.ge, "add": operator.add,
    "sub": operator.sub, "mul": operator.mul, "truediv": operator.truediv,
    "floordiv": operator.floordiv, "mod": operator.mod, "pow": operator.pow,
    "and": operator.and_, "or": operator.or_, "xor": operator.xor,
    "matmul": operator.matmul,
}
_CHANGEABLE = (list, dict, set, bytearray, tuple, collections.deque)
_changes = []  # what the last call changed in the arguments it was sent by value


def _changed(sent):
    """[[position or keyword, value now], ...] for each argument the call changed in
    place. One that now holds what cannot cross as plain data (an object of the
    candidate's) is left out: the test's copy keeps its old state."""
    out = []
    for key, value, before in sent:
        try:
            if codec.encode(value) != before:
                out.append([key, value])
        except (codec.CodecError, RecursionError):
            pass
    return out


MAX_TEXT = 4 << 20  # characters of stdout + stderr one request may send back
_events = None  # what the running request wrote, logged and warned (None: no request)
_text = [0]
_event_loop = []


def _loop():
    """The event loop the candidate's coroutines run on (one, kept across requests)."""
    if not _event_loop:
        _event_loop.append(asyncio.new_event_loop())
        asyncio.set_event_loop(_event_loop[0])
    return _event_loop[0]


class _Stream(io.TextIOBase):
    """sys.stdout / sys.stderr while the candidate's code runs: what it writes goes
    back with the answer."""

    def __init__(self, tag):
        self.tag = tag

    def writable(self):
        return True

    @property
    def encoding(self):
        return "utf-8"

    def write(self, text):
        if not isinstance(text, str):
            raise TypeError("write() argument must be str, not %s" % type(text).__name__)
        if _events is None or not text:
            return len(text)
        room = MAX_TEXT - _text[0]
        if room <= 0:
            return len(text)
        kept = text[:room]
        if len(kept) < len(text):
            kept += "\n[trialbox: output past %d characters dropped]\n" % MAX_TEXT
        _text[0] += len(kept)
        if _events and _events[-1][0] == self.tag:
            _events[-1][1] += kept
        else:
            _events.append([self.tag, kept])
        return len(text)


class _Relay(logging.Handler):
    """On the root logger: every record the candidate's loggers let through goes back
    with the answer (formatted here: only text crosses)."""

    def emit(self, record):
        if _events is None or len(_events) > 100000:
            return
        try:
            exc = record.exc_text or ""
            if not exc and record.exc_info:
                exc = logging.Formatter().formatException(record.exc_info)
            _events.append(["log", str(record.name), int(record.levelno),
                            str(record.levelname), record.getMessage()[:100000],
                            str(record.pathname), int(record.lineno), str(record.funcName),
                            str(exc)[:100000]])
        except Exception:
            self.handleError(record)


def _relay_warning(message, category, filename, lineno, file=None, line=None):
    if _events is None or len(_events) > 100000:
        return
    own = getattr(builtins, category.__name__, None) is not category
    _events.append(["warn", category.__name__, _describe(category) if own else None,
                    str(message)[:100000], str(filename), int(lineno)])


def _levels(mapping, disable):
    """Mirror the tests' logging levels, so a record is emitted here exactly when it
    would be in one process (`caplog.set_level`, `caplog.at_level`)."""
    for name, level in mapping.items():
        (logging.getLogger() if name == "" else logging.getLogger(name)).setLevel(level)
    logging.disable(disable)
_objects = {}  # ref -> object handed out
_refs = {}  # id(object) -> ref (the same object always gets the same ref)


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


def _builtin_ancestor(cls):
    for c in cls.__mro__:
        if getattr(builtins, c.__name__, None) is c:
            return c.__name__
    return "Exception"


def _describe(obj):
    """The answer for `obj`: itself if it is plain data, else a reference."""
    if type(obj) is _Trusted:  # one of the test's objects: named by its id
        return ["t", object.__getattribute__(obj, "_tid")]
    if hasattr(type(obj), "__next__"):  # an iterator stays here, read one item a time
        return _reference(obj, "iterator")
    try:
        codec.encode(obj)  # exact builtin types only, within the limits
        return ["v", obj]
    except (codec.CodecError, RecursionError):
        pass
    ref = _ref(obj)
    if isinstance(obj, type(sys)):
        return ["r", ref, "module", str(obj.__name__), []]
    if isinstance(obj, type) and issubclass(obj, BaseException):
        # its own classes in method resolution order, down to the first builtin one, so
        # the trusted side can rebuild the hierarchy `pytest.raises` / `except` match on
        mro = [c for c in obj.__mro__ if getattr(builtins, c.__name__, None) is not c]
        chain = [[ref if c is obj else _describe(c)[1], _name(c)] for c in mro]
        return ["r", ref, "exception-class", _name(obj), [_builtin_ancestor(obj), chain]]
    if isinstance(obj, type):
        return ["r", ref, "class", _name(obj), []]
    if inspect.isawaitable(obj):
        return ["r", ref, "coroutine", _name(type(obj)), []]
    return ["r", ref, "callable" if callable(obj) else "object", _name(type(obj)), []]


def _ref(obj):
    ref = _refs.get(id(obj))
    if ref is None:
        ref = len(_objects) + 1
        _objects[ref] = obj
        _refs[id(obj)] = ref
    return ref


def _reference(obj, kind):
    return ["r", _ref(obj), kind, _name(type(obj)), []]


def _name(cls):
    return "%s.%s" % (cls.__module__, cls.__qualname__)


def _arg(a):
    if a[0] == "r":
        return _objects[a[1]]
    if a[0] == "t":
        return _trusted(a[1])
    if a[0] == "b":
        obj = importlib.import_module(a[1])
        for part in a[2].split("."):
            obj = getattr(obj, part)
        return obj
    return a[1]


_trusted_objects = {}


def _trusted(tid):
    if tid not in _trusted_objects:
        _trusted_objects[tid] = _Trusted(tid)
    return _trusted_objects[tid]


def _callback(tid, op, args, kwargs=None):
    """Ask the tests' process to apply `op` to its object `tid`; serve what it asks of
    us meanwhile; return its answer or raise what it raised."""
    global _events
    request = ["cb", tid, op, [_describe(a) for a in args],
               {str(k): _describe(v) for k, v in (kwargs or {}).items()}]
    if _events:  # what was printed, logged, warned before the call comes first
        request = ["e", _events, request]
    if _events is not None:
        _events = []
    send(request)
    while True:
        msg = recv()
        if msg is None:
            os._exit(0)  # the tests' process is gone: nothing left to answer
        if msg[0] == "ret":
            reply = msg[1]
            if reply[0] == "x":
                cls = getattr(builtins, reply[1], None)
                if not (isinstance(cls, type) and issubclass(cls, Exception)):
                    cls = RuntimeError
                try:
                    exc = cls(reply[3])
                except Exception:
                    exc = RuntimeError(reply[3])
                raise exc
            return _arg(reply)
        serve(msg)


class _Trusted:
    """One of the test's objects, left in the tests' process: using it asks there."""

    __slots__ = ("_tid",)

    def __init__(self, tid):
        object.__setattr__(self, "_tid", tid)

    def __call__(self, *args, **kwargs):
        return _callback(self._tid, "call", args, kwargs)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _callback(object.__getattribute__(self, "_tid"), "getattr", (name,))

    def __iter__(self):
        return _callback(self._tid, "iter", ())

    def __next__(self):
        return _callback(self._tid, "next", ())

    def __len__(self):
        return _callback(self._tid, "len", ())

    def __bool__(self):
        return _callback(self._tid, "bool", ())

    def __getitem__(self, key):
        return _callback(self._tid, "getitem", (key,))

    def __contains__(self, item):
        return _callback(self._tid, "contains", (item,))

    def __setitem__(self, key, value):
        _callback(self._tid, "setitem", (key, value))

    def __delitem__(self, key):
        _callback(self._tid, "delitem", (key,))

    def __hash__(self):
        return _callback(self._tid, "hash", ())

    def __eq__(self, other):
        return self is other

    def __str__(self):
        return _callback(self._tid, "str", ())

    def __repr__(self):
        return _callback(self._tid, "repr", ())


def _raised(e):
    cls = type(e)
    own = getattr(builtins, cls.__name__, None) is not cls
    try:
        text = str(str(e)[:2000])
    except BaseException:  # a message we cannot render is still an exception
        text = ""
    return ["x", cls.__name__, _describe(cls) if own else None, text]


def handle(msg):
    what = msg[0]
    if what == "levels":
        return _levels(msg[1], msg[2])
    if what == "import":
        return importlib.import_module(msg[1])
    target = _objects[msg[1]]
    if what == "getattr":
        return getattr(target, msg[2])
    if what == "setattr":
        setattr(target, msg[2], _arg(msg[3]))
        return None
    if what == "call":
        args = [_arg(a) for a in msg[2]]
        kwargs = {k: _arg(a) for k, a in msg[3].items()}
        sent = [(i, args[i], codec.encode(args[i])) for i, a in enumerate(msg[2])
                if a[0] == "v" and type(a[1]) in _CHANGEABLE]
        sent += [(k, kwargs[k], codec.encode(kwargs[k])) for k, a in msg[3].items()
                 if a[0] == "v" and type(a[1]) in _CHANGEABLE]
        try:
            return target(*args, **kwargs)
        finally:
            _changes[:] = _changed(sent)
    if what == "op":
        return _OPS[msg[2]](target, *[_arg(a) for a in msg[3]])
    raise ValueError("unknown request %r" % (what,))


def main():
    global _events
    sys.dont_write_bytecode = True
    sys.path.insert(0, os.getcwd())
    sys.stdout, sys.stderr = _Stream("out"), _Stream("err")
    logging.getLogger().addHandler(_Relay())
    # Every warning reaches the tests' process, whose filters decide (as pytest's do
    # in one process): filters the candidate's code adds still come first.
    warnings.resetwarnings()
    warnings.simplefilter("always")
    warnings.showwarning = _relay_warning
    while True:
        msg = recv()
        if msg is None:
            return
        serve(msg)


def serve(msg):
    """Answer one request (at the top, or inside a callback: what was being recorded for
    the request outside it is kept aside meanwhile)."""
    global _events
    outer, outer_text = _events, _text[0]
    _events, _text[0] = [], 0
    try:
        del _changes[:]
        try:
            if msg[0] == "op" and msg[2] == "iter":  # the items, each described
                answer = ["l", [_describe(x) for x in handle(msg)]]
            else:
                answer = _describe(handle(msg))
        except BaseException as e:  # the candidate's code raised: its answer
            answer = _raised(e)
        if _changes:  # the call changed arguments in place: their new state
            answer = ["m", list(_changes), answer]
            del _changes[:]
        if _events:
            answer = ["e", _events, answer]
    finally:
        _events, _text[0] = outer, outer_text
    try:
        send(answer)
    except BaseException as e:
        send(["x", "RuntimeError", None, "the answer could not be sent: %s" % e])


if __name__ == "__main__":
    main()
