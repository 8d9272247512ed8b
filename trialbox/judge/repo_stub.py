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

where an argument is ["v", plain data] or ["r", ref] (an object this stub handed out
before). Each answer is ["v", plain data] (a value of exact builtin types that the codec
takes whole), ["r", ref, kind, name, info] (any other object, kept here under a number:
kind is module / class / exception-class / callable / object; an exception class's info
is its builtin ancestor and its own classes in MRO order), ["l", [answer, ...]] (the
items of an `iter`), or ["x", exception type name, its class's answer or None for a
builtin, message] when the candidate's code raised.

Nothing here is trusted: the candidate shares this process and may rewrite any of it.
Whatever comes back over fd 3 is decoded as plain data by the trusted side, which never
runs the candidate's code nor lets it near the tests — tampering makes calls fail, never
tests pass. Standalone: imports nothing from trialbox (it is copied into the sandbox).
"""

import builtins
import importlib
import operator
import os
import struct
import sys

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
}
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
    try:
        codec.encode(obj)  # exact builtin types only, within the limits
        return ["v", obj]
    except (codec.CodecError, RecursionError):
        pass
    ref = _refs.get(id(obj))
    if ref is None:
        ref = len(_objects) + 1
        _objects[ref] = obj
        _refs[id(obj)] = ref
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
    return ["r", ref, "callable" if callable(obj) else "object", _name(type(obj)), []]


def _name(cls):
    return "%s.%s" % (cls.__module__, cls.__qualname__)


def _arg(a):
    if a[0] == "r":
        return _objects[a[1]]
    return a[1]


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
    if what == "import":
        return importlib.import_module(msg[1])
    target = _objects[msg[1]]
    if what == "getattr":
        return getattr(target, msg[2])
    if what == "setattr":
        setattr(target, msg[2], _arg(msg[3]))
        return None
    if what == "call":
        return target(*[_arg(a) for a in msg[2]], **{k: _arg(a) for k, a in msg[3].items()})
    if what == "op":
        return _OPS[msg[2]](target, *[_arg(a) for a in msg[3]])
    raise ValueError("unknown request %r" % (what,))


def main():
    sys.dont_write_bytecode = True
    sys.path.insert(0, os.getcwd())
    while True:
        msg = recv()
        if msg is None:
            return
        try:
            if msg[0] == "op" and msg[2] == "iter":  # the items, each described
                answer = ["l", [_describe(x) for x in handle(msg)]]
            else:
                answer = _describe(handle(msg))
        except BaseException as e:  # the candidate's code raised: its answer
            answer = _raised(e)
        try:
            send(answer)
        except BaseException as e:
            send(["x", "RuntimeError", None, "the answer could not be sent: %s" % e])


if __name__ == "__main__":
    main()
