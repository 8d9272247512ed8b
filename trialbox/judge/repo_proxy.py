"""Trusted side of a repository judgement on the trusted tier, run inside the *trusted*
grading sandbox by the judge's pytest runner (`repo_plugin.py`, copied there as
`_trialbox_repo_proxy.py`). The candidate's code never runs in this process.

Every module of the candidate's tree that a trusted test (or the task's conftest)
imports is a `RemoteModule`: reading an attribute asks the candidate's process (its own
sandbox, `repo_stub.py` on the other end of fd 4) for it. Plain data — exact builtin
types the restricted codec takes whole — crosses as itself, so the test's `==`, `<`,
`in`, `bool` on it are the interpreter's own, never the candidate's. Anything else stays
in the candidate's process and is seen here as a `Remote`: calling it, reading or
setting its attributes, `len`, iteration, indexing, `bool`, `str`, unary `-` and `abs`
ask the candidate (the answers are again plain data or references); `==` on it is
identity (the same remote object); ordering, binary operators with another value and
hashing by value are refused, and `in` iterates it (the trusted `==` decides). An
exception the candidate's code raises is raised here as the builtin exception of that
name, or as a local stand-in class for one of its own (same name, same hierarchy down
to the builtin ancestor), so `pytest.raises(ValueError)` and `except errors.Bad:`
match. A candidate that breaks the protocol, exits, or sends more than `MAX_TOTAL`
bytes makes the call raise `_CandidateGone` — a BaseException, so no
`pytest.raises(Exception)` or `except Exception` in a test can take it for an answer.

Standalone: the standard library and the copied codec (`_trialbox_codec`).
"""

import builtins
import importlib
import os
import struct
import sys
import types

try:
    import _trialbox_codec as codec  # the copy beside us in the tests' sandbox
except ImportError:  # imported from the package (tests, tools): the same file
    from trialbox.judge import codec

CANDIDATE_FD = 4
MAX_FRAME = 16 << 20
MAX_TOTAL = 256 << 20
"""Bytes the candidate may send in all: past it every call fails (the trusted process
must not be made to run out of memory on the candidate's behalf)."""


class _CandidateGone(BaseException):
    """The candidate's process broke the protocol, ended, or sent too much: the call
    has no answer, and the test fails."""


class _Channel:
    def __init__(self, fd):
        self.fd = fd
        self.received = 0
        self.answers = 0  # frames the candidate's process answered: proof it ran
        self.gone = None

    def _read_exact(self, n):
        chunks, got = [], 0
        while got < n:
            b = os.read(self.fd, min(n - got, 1 << 20))
            if not b:
                return None
            chunks.append(b)
            got += len(b)
        return b"".join(chunks)

    def ask(self, request):
        if self.gone:
            raise _CandidateGone(self.gone)
        try:
            data = codec.encode(request)
            view = memoryview(struct.pack(">I", len(data)) + data)
            while view:
                view = view[os.write(self.fd, view):]
            head = self._read_exact(4)
            if head is None:
                return self._lose("the candidate's process ended")
            (n,) = struct.unpack(">I", head)
            if n > MAX_FRAME or self.received + n > MAX_TOTAL:
                return self._lose("the candidate's process sent too much (a %d-byte "
                                  "answer, %d bytes before it)" % (n, self.received))
            self.received += 4 + n
            body = self._read_exact(n)
            if body is None:
                return self._lose("the candidate's process ended")
            value = codec.decode(body)
            self.answers += 1
            return value
        except OSError as e:
            return self._lose("the channel to the candidate's process failed: %s"
                              % e.strerror)
        except (codec.CodecError, ValueError, RecursionError, MemoryError) as e:
            return self._lose("the candidate's process sent what is not plain data: %s"
                              % str(e)[:200])

    def _lose(self, why):
        self.gone = why
        raise _CandidateGone(why)


_CHANNEL = None
_remotes = {}  # ref -> Remote (one per remote object: `is` means the same object)
_exc_classes = {}  # ref -> local stand-in exception class
_REPO_TOPS = set()


def _answer(reply):
    """The value an answer stands for, raising what the candidate's code raised."""
    if type(reply) is not list or not reply:
        raise _CandidateGone("the candidate's process broke the protocol")
    tag = reply[0]
    if tag == "v" and len(reply) == 2:
        return reply[1]
    if tag == "r" and len(reply) == 5 and type(reply[1]) is int and type(reply[2]) is str \
            and type(reply[3]) is str:
        return _reference(reply)
    if tag == "l" and len(reply) == 2 and type(reply[1]) is list:
        return [_answer(r) for r in reply[1]]
    if tag == "x" and len(reply) == 4 and type(reply[1]) is str and type(reply[3]) is str:
        raise _exception(reply[1], reply[2], reply[3])
    raise _CandidateGone("the candidate's process broke the protocol")


def _reference(reply):
    _, ref, kind, name, info = reply
    if kind == "module":
        if name.partition(".")[0] in _REPO_TOPS:
            return importlib.import_module(name)  # the RemoteModule of that name
    elif kind == "exception-class":
        return _exc_class(ref, info)
    if ref not in _remotes:
        _remotes[ref] = Remote(ref, kind, name)
    return _remotes[ref]


def _exc_class(ref, info):
    """The local stand-in for the candidate's exception class `ref`: a subclass of its
    builtin ancestor (Exception if that is no Exception), through stand-ins of its own
    bases, so `except` and `pytest.raises` match as they would in its process."""
    if ref in _exc_classes:
        return _exc_classes[ref]
    try:
        ancestor_name, chain = info
        base = getattr(builtins, str(ancestor_name), Exception)
        if not (isinstance(base, type) and issubclass(base, Exception)):
            base = Exception
        for cref, cname in reversed(chain):
            if cref not in _exc_classes:
                local = type(str(cname).rpartition(".")[2], (base,), {})
                local.__qualname__ = str(cname)
                local.__module__ = "candidate"
                _exc_classes[cref] = local
            base = _exc_classes[cref]
    except (TypeError, ValueError):
        raise _CandidateGone("the candidate's process broke the protocol") from None
    return _exc_classes.get(ref, base)


def _exception(name, cls_reply, message):
    if cls_reply is None:
        cls = getattr(builtins, name, None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            return _make(cls, name, message)
        # KeyboardInterrupt, SystemExit...: must not steer the trusted runner
        return RuntimeError("the candidate's code raised %s: %s" % (name, message))
    cls = _answer(cls_reply)
    if isinstance(cls, type) and issubclass(cls, Exception):
        return _make(cls, name, message)
    raise _CandidateGone("the candidate's process broke the protocol")


def _make(cls, name, message):
    """cls(message), or for a type whose constructor wants more (UnicodeDecodeError) an
    instance with that message as its args."""
    try:
        return cls(message)
    except Exception:
        pass
    try:
        exc = cls.__new__(cls)
        exc.args = (message,)
        return exc
    except Exception:
        return RuntimeError("the candidate's code raised %s: %s" % (name, message))


def _arg(value):
    """A value for the candidate's process: a reference to its own object, or plain
    data. A trusted object (a function, a mock, a fixture's object) cannot cross."""
    if isinstance(value, Remote):
        return ["r", object.__getattribute__(value, "_tb_ref")]
    try:
        codec.encode(value)
    except (codec.CodecError, RecursionError):
        raise TypeError(
            "cannot pass a %s to the candidate's code: only plain data (None, bool, int, "
            "float, str, bytes, and lists, tuples, dicts, sets of those) or the "
            "candidate's own objects cross to its process (docs/judge.md, repository "
            "tasks)" % type(value).__name__) from None
    return ["v", value]


def _ask(*request):
    return _answer(_CHANNEL.ask(list(request)))


def _op(obj, op, *args):
    return _ask("op", object.__getattribute__(obj, "_tb_ref"), op, [_arg(a) for a in args])


class Remote:
    """An object of the candidate's, left in its process."""

    __slots__ = ("_tb_ref", "_tb_kind", "_tb_name")

    def __init__(self, ref, kind, name):
        object.__setattr__(self, "_tb_ref", ref)
        object.__setattr__(self, "_tb_kind", kind)
        object.__setattr__(self, "_tb_name", name)

    def __getattr__(self, name):
        if name.startswith("_tb_"):
            raise AttributeError(name)
        return _ask("getattr", object.__getattribute__(self, "_tb_ref"), name)

    def __setattr__(self, name, value):
        _ask("setattr", object.__getattribute__(self, "_tb_ref"), name, _arg(value))

    def __call__(self, *args, **kwargs):
        return _ask("call", object.__getattribute__(self, "_tb_ref"),
                    [_arg(a) for a in args], {str(k): _arg(v) for k, v in kwargs.items()})

    def __repr__(self):
        return "<the candidate's %s %s>" % (object.__getattribute__(self, "_tb_name"),
                                             object.__getattribute__(self, "_tb_kind"))

    def __eq__(self, other):  # identity: the candidate's __eq__ never decides a test
        return self is other

    def __ne__(self, other):
        return self is not other

    __hash__ = object.__hash__

    def _no_order(self, other):
        raise TypeError("the candidate's objects are not ordered in a trusted test: "
                        "compare plain data (docs/judge.md, repository tasks)")

    __lt__ = __le__ = __gt__ = __ge__ = _no_order

    def __str__(self):
        return _op(self, "str")

    def __bool__(self):
        return _op(self, "bool") is True

    def __len__(self):
        return _op(self, "len")

    def __iter__(self):
        return iter(_op(self, "iter"))

    def __next__(self):
        return _op(self, "next")

    def __getitem__(self, key):
        return _op(self, "getitem", key)

    def __setitem__(self, key, value):
        _op(self, "setitem", key, value)

    def __delitem__(self, key):
        _op(self, "delitem", key)

    # No __contains__: `x in obj` iterates (the items cross as plain data and the
    # trusted == decides), so an object whose __contains__ says yes to anything cannot
    # pass a membership test.

    def __int__(self):
        return _op(self, "int")

    def __float__(self):
        return _op(self, "float")

    def __index__(self):
        return _op(self, "index")

    def __abs__(self):
        return _op(self, "abs")

    def __neg__(self):
        return _op(self, "neg")

    def _no_operator(self, other):
        # `abs(f(x) - 1.5) < 1e-6` must not be decided by an object whose __sub__ answers
        # 0 whatever 1.5 is: an operator with a trusted operand is refused, as == is.
        raise TypeError("an operator between the candidate's object and another value "
                        "is not evaluated in a trusted test (the candidate's method "
                        "would see the expected value): compare plain data "
                        "(docs/judge.md, repository tasks)")

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _no_operator
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = _no_operator
    __mod__ = __rmod__ = __pow__ = __rpow__ = __and__ = __rand__ = _no_operator
    __or__ = __ror__ = __xor__ = __rxor__ = __matmul__ = __rmatmul__ = _no_operator

    def __enter__(self):
        return _op(self, "enter")

    def __exit__(self, *exc):
        _op(self, "exit")
        return False


class RemoteModule(types.ModuleType):
    """A module of the candidate's tree: its attributes live in the candidate's process.
    (What the import system sets — dunders, submodules — is local; anything else a
    test sets, e.g. through `monkeypatch.setattr`, is set in the candidate's module.)"""

    def __getattr__(self, name):
        ref = self.__dict__.get("_tb_ref")
        if ref is None or name.startswith("_tb_"):
            raise AttributeError(name)
        return _ask("getattr", ref, name)

    def __setattr__(self, name, value):
        ref = self.__dict__.get("_tb_ref")
        if ref is None or name.startswith("_") or isinstance(value, types.ModuleType):
            types.ModuleType.__setattr__(self, name, value)
            return
        self.__dict__.pop(name, None)
        _ask("setattr", ref, name, _arg(value))

    def __delattr__(self, name):
        if name in self.__dict__:
            types.ModuleType.__delattr__(self, name)


class RemoteLoader:
    """Makes a RemoteModule for a module of the candidate's tree: the candidate's
    process imports it (raising here what its import raised)."""

    def __init__(self, name):
        self.name = name

    def create_module(self, spec):
        return RemoteModule(spec.name)

    def exec_module(self, module):
        reply = _CHANNEL.ask(["import", self.name])
        if type(reply) is list and len(reply) == 5 and reply[0] == "r" \
                and reply[2] == "module" and type(reply[1]) is int:
            module._tb_ref = reply[1]
            return
        _answer(reply)  # raises what the import raised
        raise ImportError("the candidate's process did not import %s" % self.name)


def answers():
    """How many requests the candidate's process answered (0: it never ran)."""
    return _CHANNEL.answers if _CHANNEL is not None else 0


def connect(repo_tops, fd=CANDIDATE_FD):
    """Open the channel to the candidate's process; `repo_tops` are the top-level names
    of the candidate's tree (modules by those names are remote)."""
    global _CHANNEL
    _CHANNEL = _Channel(fd)
    _REPO_TOPS.update(repo_tops)
    sys.modules.setdefault("_trialbox_repo_proxy", sys.modules[__name__])
