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

What the candidate's code printed, logged and warned during a request comes back with
the answer and is replayed here, in order, before the answer is used: text to
sys.stdout / sys.stderr (capsys, capfd), a log record to the logger of that name
(caplog; the tests' logging levels are mirrored to the candidate's process first, so a
record exists there exactly when it would in one process), a warning through
`warnings.warn_explicit` (pytest.warns, deprecated_call, `-W error`: this process's
filters decide). A coroutine of the candidate's is a real local coroutine here
(`asyncio.run(pkg.fetch())`, `await`, `gather`): awaiting it runs the candidate's
coroutine to completion in its process. A class of the candidate's can be subclassed by
a test (`class Loud(pkg.Counter)`): an instance is the candidate's object plus the
test's methods, which run here; the candidate's own methods never see the test's
overrides (docs/judge.md). `isinstance` / `issubclass` with the candidate's classes ask
its process, as `bool` and `len` do.

Standalone: the standard library and the copied codec (`_trialbox_codec`).
"""

import builtins
import importlib
import logging
import os
import struct
import sys
import types
import warnings

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
        self.levels = ((), logging.NOTSET)  # what the candidate's process was last told

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
        levels = _logging_levels()
        if levels != self.levels:  # caplog.set_level and its undo, mirrored first
            sent = dict(levels[0])
            for name in dict(self.levels[0]):
                sent.setdefault(name, logging.NOTSET)
            answer = self._roundtrip(["levels", sent, levels[1]])
            if answer != ["v", None]:
                _answer(answer)  # raises what the candidate's process made of it
            self.levels = levels
        return self._roundtrip(request)

    def _roundtrip(self, request):
        """Send `request`, then read frames until its answer: a callback the candidate's
        code makes meanwhile (it calls one of the test's functions) is served here and
        answered, and the wait goes on."""
        self._send(request)
        while True:
            frame = self._recv()
            inner = frame
            if type(frame) is list and len(frame) == 3 and frame[0] == "e" \
                    and type(frame[1]) is list and type(frame[2]) is list \
                    and frame[2][:1] == ["cb"]:
                _replay(frame[1])
                inner = frame[2]
            if type(inner) is list and inner[:1] == ["cb"]:
                self._send(["ret", _serve_callback(inner)])
                continue
            return frame

    def _send(self, request):
        try:
            data = codec.encode(request)
            view = memoryview(struct.pack(">I", len(data)) + data)
            while view:
                view = view[os.write(self.fd, view):]
        except OSError as e:
            return self._lose("the channel to the candidate's process failed: %s"
                              % e.strerror)
        except (codec.CodecError, ValueError, RecursionError) as e:
            raise TypeError("cannot send this to the candidate's process: %s"
                            % str(e)[:200]) from None

    def _recv(self):
        try:
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


def _logging_levels():
    """(((logger name, level), ...), logging.disable's level) of this process: the
    root logger (named "") and every logger a level was set on."""
    manager = logging.Logger.manager
    named = [("", logging.getLogger().level)]
    for name, logger in list(manager.loggerDict.items()):
        level = getattr(logger, "level", logging.NOTSET)
        if level != logging.NOTSET and isinstance(name, str):
            named.append((name, level))
    return tuple(sorted(named)), manager.disable


_CHANNEL = None
_trusted = {}  # id -> one of the test's objects handed to the candidate (kept alive)
_trusted_ids = {}  # id(object) -> its id there
_remotes = {}  # ref -> Remote (one per remote object: `is` means the same object)
_exc_classes = {}  # ref -> local stand-in exception class
_REPO_TOPS = set()


def _answer(reply, call=None):
    """The value an answer stands for, raising what the candidate's code raised. `call`
    is the (args, kwargs) of the call answered, whose by-value arguments the answer may
    say it changed in place."""
    if type(reply) is not list or not reply:
        raise _CandidateGone("the candidate's process broke the protocol")
    tag = reply[0]
    if tag == "e" and len(reply) == 3 and type(reply[1]) is list:
        _replay(reply[1])
        return _answer(reply[2], call)
    if tag == "m" and len(reply) == 3 and type(reply[1]) is list and call is not None:
        _put_back(reply[1], *call)
        return _answer(reply[2])
    if tag == "v" and len(reply) == 2:
        return reply[1]
    if tag == "r" and len(reply) == 5 and type(reply[1]) is int and type(reply[2]) is str \
            and type(reply[3]) is str:
        return _reference(reply)
    if tag == "t" and len(reply) == 2 and type(reply[1]) is int and reply[1] in _trusted:
        return _trusted[reply[1]]  # one of the test's own objects, handed back
    if tag == "l" and len(reply) == 2 and type(reply[1]) is list:
        return [_answer(r) for r in reply[1]]
    if tag == "x" and len(reply) == 4 and type(reply[1]) is str and type(reply[3]) is str:
        raise _exception(reply[1], reply[2], reply[3])
    raise _CandidateGone("the candidate's process broke the protocol")


def _put_back(changes, args, kwargs):
    """Give the test's own argument objects the state the candidate's call left its
    copies in, as one process would have (codec.assign keeps the containers inside that
    it can). A change no call could make is a broken protocol."""
    for change in changes:
        if type(change) is list and len(change) == 2:
            key, new = change
            if type(key) is int and 0 <= key < len(args):
                old = args[key]
            elif type(key) is str and key in kwargs:
                old = kwargs[key]
            else:
                old = _NOTHING
            if old is not _NOTHING and not isinstance(old, (Remote, _RemoteInstance)) \
                    and codec.assign(old, new):
                continue
        raise _CandidateGone("the candidate's process broke the protocol")


_NOTHING = object()


def _replay(events):
    """What the candidate's code wrote, logged and warned, done again here in order."""
    for ev in events:
        kind = ev[0] if type(ev) is list and ev else None
        if kind in ("out", "err") and len(ev) == 2 and type(ev[1]) is str:
            stream = sys.stdout if kind == "out" else sys.stderr
            if stream is not None:
                stream.write(ev[1])
        elif kind == "log" and len(ev) == 9 and [type(x) for x in ev[1:]] == [
                str, int, str, str, str, int, str, str]:
            name, levelno, levelname, message, pathname, lineno, func, exc = ev[1:]
            record = logging.makeLogRecord({
                "name": name, "levelno": levelno, "levelname": levelname, "msg": message,
                "args": None, "pathname": pathname,
                "filename": os.path.basename(pathname),
                "module": os.path.splitext(os.path.basename(pathname))[0],
                "lineno": lineno, "funcName": func, "exc_text": exc or None})
            logger = logging.getLogger() if name == "root" else logging.getLogger(name)
            logger.handle(record)
        elif kind == "warn" and len(ev) == 6 and type(ev[1]) is str \
                and type(ev[3]) is str and type(ev[4]) is str and type(ev[5]) is int:
            if ev[2] is None:
                category = getattr(builtins, ev[1], None)
            else:
                category = _answer(ev[2])
            if not (isinstance(category, type) and issubclass(category, Warning)):
                raise _CandidateGone("the candidate's process broke the protocol")
            warnings.warn_explicit(ev[3], category, ev[4], ev[5])
        else:
            raise _CandidateGone("the candidate's process broke the protocol")


async def _awaited(ref):
    """The local coroutine for the candidate's coroutine `ref`: awaiting it runs that one
    to completion in the candidate's process."""
    return _ask("op", ref, "await", [])


def _reference(reply):
    _, ref, kind, name, info = reply
    if kind == "coroutine":
        return _awaited(ref)
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
    """A value for the candidate's process: a reference to its own object, plain data,
    a function of the standard library by name (it runs there), or a handle to any
    other object of the test's (a lambda, a test's function, a mock, an iterator),
    which stays here: using it there is a callback (`_serve_callback`)."""
    if isinstance(value, Remote):
        return ["r", object.__getattribute__(value, "_tb_ref")]
    if isinstance(value, _RemoteInstance):  # a test's subclass: the candidate's object
        return _arg(_remote_of(value))
    if not hasattr(type(value), "__next__"):  # an iterator is never read ahead: a handle
        try:
            # by value only what arrives as itself: a test's subclass of dict (with its
            # own __eq__, say) stays here, where the test compares it
            if type(codec.decode(codec.encode(value))) is type(value):
                return ["v", value]
        except (codec.CodecError, RecursionError):
            pass
    named = _stdlib_name(value)
    if named is not None:
        return ["b", named[0], named[1]]
    tid = _trusted_ids.get(id(value))
    if tid is None or _trusted.get(tid) is not value:
        tid = len(_trusted) + 1
        _trusted[tid] = value
        _trusted_ids[id(value)] = tid
    return ["t", tid]


def _stdlib_name(value):
    """(module, qualified name) of a function or class of the standard library that
    those names find again (`len`, `operator.add`, `str.upper`, `dict`), else None.
    Such a function runs in the candidate's process: the candidate could compute the
    same there anyway, and no object of this process becomes reachable from it."""
    if not callable(value) or isinstance(value, types.MethodType):
        return None
    module = getattr(value, "__module__", None)
    if module is None:
        module = getattr(getattr(value, "__objclass__", None), "__module__", None)
    qualname = getattr(value, "__qualname__", None)
    if type(module) is not str or type(qualname) is not str or "<" in qualname:
        return None
    if module.partition(".")[0] not in _STDLIB or module.startswith("_trialbox"):
        return None
    try:
        found = sys.modules.get(module) or importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except Exception:
        return None
    return (module, qualname) if found is value else None


_STDLIB = getattr(sys, "stdlib_module_names", frozenset()) | {"builtins"}
_REPO = None


def _readable(obj):
    """Whether the candidate may read public attributes of this object of the test's:
    an instance of a class the trusted files define (a test's custom mapping, its
    fixture objects' own classes) or a unittest.mock object — never a module, function,
    frame, generator or anything of pytest's or the runner's, from which the rest of
    this process (the runner, its channel) could be reached."""
    cls = type(obj)
    module = getattr(cls, "__module__", None)
    if module in ("unittest.mock",):
        return True
    mod = sys.modules.get(module) if type(module) is str else None
    path = getattr(mod, "__file__", None) if mod is not None else None
    return (_REPO is not None and type(path) is str and not isinstance(mod, RemoteModule)
            and path.startswith(_REPO + os.sep) and isinstance(obj, object)
            and not isinstance(obj, (type, types.ModuleType, types.FunctionType,
                                     types.MethodType, types.FrameType,
                                     types.GeneratorType, types.CoroutineType)))
_CALLBACK_OPS = {
    "iter": iter, "next": next, "len": len, "bool": bool, "hash": hash, "str": str,
    "repr": repr, "getitem": lambda o, k: o[k], "contains": lambda o, x: x in o,
    "setitem": lambda o, k, v: o.__setitem__(k, v), "delitem": lambda o, k: o.__delitem__(k),
}


def _serve_callback(request):
    """Apply one of the candidate's uses of a test's object: ["cb", id, op, args,
    kwargs]. Only the object's call and its protocols (iteration, len, bool, hash, str,
    indexing, membership) are offered — never its attributes, so nothing else of this
    process is reachable through it. The answer is an argument form, or ["x", name,
    None, message] for what the test's code raised (an Exception; anything else — a
    pytest.fail, a lost candidate — goes on up the tests' process)."""
    if len(request) != 5 or type(request[1]) is not int or request[1] not in _trusted \
            or type(request[2]) is not str or type(request[3]) is not list \
            or type(request[4]) is not dict:
        raise _CandidateGone("the candidate's process broke the protocol")
    obj, op = _trusted[request[1]], request[2]
    args = [_answer(a) for a in request[3]]
    kwargs = {str(k): _answer(v) for k, v in request[4].items()}
    try:
        if op == "call":
            result = obj(*args, **kwargs)
        elif op == "getattr" and len(args) == 1 and type(args[0]) is str and not kwargs:
            if args[0].startswith("_") or not _readable(obj):
                raise AttributeError("the test's %s object: the candidate's code may only "
                                     "call it and use its protocols, not read %r "
                                     "(docs/judge.md, repository tasks)"
                                     % (type(obj).__name__, args[0]))
            result = getattr(obj, args[0])
        elif op in _CALLBACK_OPS and not kwargs:
            result = _CALLBACK_OPS[op](obj, *args)
        else:
            raise _CandidateGone("the candidate's process broke the protocol")
        return _arg(result)
    except Exception as e:
        try:
            text = str(e)[:2000]
        except Exception:
            text = ""
        return ["x", type(e).__name__, None, text]


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

    @property
    def __doc__(self):  # the candidate's object's docstring, not this class's
        return _ask("getattr", object.__getattribute__(self, "_tb_ref"), "__doc__")

    def __setattr__(self, name, value):
        _ask("setattr", object.__getattribute__(self, "_tb_ref"), name, _arg(value))

    def __call__(self, *args, **kwargs):
        reply = _CHANNEL.ask(["call", object.__getattribute__(self, "_tb_ref"),
                              [_arg(a) for a in args],
                              {str(k): _arg(v) for k, v in kwargs.items()}])
        return _answer(reply, (args, kwargs))

    def __repr__(self):
        return "<the candidate's %s %s>" % (object.__getattribute__(self, "_tb_name"),
                                             object.__getattribute__(self, "_tb_kind"))

    # Between two of the candidate's objects its own comparisons and operators decide,
    # as in one process: the test then checks only the candidate's agreement with
    # itself. With any other operand (a test's expected value) `==` is identity and the
    # rest is refused: an always-equal object must not decide against the test's data.
    def __eq__(self, other):
        if isinstance(other, (Remote, _RemoteInstance)) and self is not other:
            return _op(self, "eq", other) is True
        return self is other

    def __ne__(self, other):
        return not self.__eq__(other)

    def __hash__(self):
        got = _op(self, "hash")
        if type(got) is not int:
            raise _CandidateGone("the candidate's process broke the protocol")
        return got

    def _between(op, refusal):
        def method(self, other):
            if isinstance(other, (Remote, _RemoteInstance)):
                return _op(self, op, other)
            raise TypeError(refusal)
        method.__name__ = "__%s__" % op
        return method

    _ORDER = ("the candidate's objects are not ordered against other values in a trusted "
              "test: compare plain data (docs/judge.md, repository tasks)")
    __lt__, __le__ = _between("lt", _ORDER), _between("le", _ORDER)
    __gt__, __ge__ = _between("gt", _ORDER), _between("ge", _ORDER)

    def __str__(self):
        return _op(self, "str")

    def __bool__(self):
        return _op(self, "bool") is True

    def __len__(self):
        return _op(self, "len")

    def __iter__(self):
        if object.__getattribute__(self, "_tb_kind") == "iterator":
            return self  # lazy: `next` asks for one item at a time
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

    # `abs(f(x) - 1.5) < 1e-6` must not be decided by an object whose __sub__ answers
    # 0 whatever 1.5 is: an operator with a trusted operand is refused, as == is.
    _OPERATOR = ("an operator between the candidate's object and another value is not "
                 "evaluated in a trusted test (the candidate's method would see the "
                 "expected value): compare plain data (docs/judge.md, repository tasks)")
    __add__, __sub__ = _between("add", _OPERATOR), _between("sub", _OPERATOR)
    __mul__, __truediv__ = _between("mul", _OPERATOR), _between("truediv", _OPERATOR)
    __floordiv__, __mod__ = _between("floordiv", _OPERATOR), _between("mod", _OPERATOR)
    __pow__, __and__ = _between("pow", _OPERATOR), _between("and", _OPERATOR)
    __or__, __xor__ = _between("or", _OPERATOR), _between("xor", _OPERATOR)
    __matmul__ = _between("matmul", _OPERATOR)

    def _no_reflected(self, other):  # a Remote on the left already had its turn
        raise TypeError(Remote._OPERATOR)

    __radd__ = __rsub__ = __rmul__ = __rtruediv__ = __rfloordiv__ = _no_reflected
    __rmod__ = __rpow__ = __rand__ = __ror__ = __rxor__ = __rmatmul__ = _no_reflected
    del _between

    def __enter__(self):
        return _op(self, "enter")

    def __exit__(self, *exc):
        _op(self, "exit")
        return False

    # A class of the candidate's, as a base class and in isinstance / issubclass.
    def __mro_entries__(self, bases):
        return (_local_base(self),)

    def __instancecheck__(self, obj):
        arg = _crossing(obj)
        return arg is not None and _ask("op", object.__getattribute__(self, "_tb_ref"),
                                        "isinstance", [arg]) is True

    def __subclasscheck__(self, cls):
        if isinstance(cls, type) and issubclass(cls, _RemoteInstance):
            cls = cls._tb_class
        arg = _crossing(cls)
        return arg is not None and _ask("op", object.__getattribute__(self, "_tb_ref"),
                                        "issubclass", [arg]) is True


def _crossing(value):
    """`value` as an argument for the candidate's process, or None if it cannot cross
    (then it is no instance or subclass of the candidate's classes)."""
    try:
        return _arg(value)
    except TypeError:
        return None


def _remote_of(instance):
    try:
        return object.__getattribute__(instance, "_tb_obj")
    except AttributeError:
        raise AttributeError(
            "%s.__init__ did not call the candidate's __init__ (super().__init__(...)): "
            "the object does not exist yet" % type(instance).__name__) from None


class _RemoteInstance:
    """The base of a test's subclass of a candidate's class. An instance is the
    candidate's object (made by the candidate's class, in its process) with the test's
    methods on top: what the test's class defines runs here, anything else is the
    candidate's object's. The candidate's methods run in its process and never call the
    test's overrides."""

    _tb_class = None  # the candidate's class (a Remote), set on the generated base

    def __init__(self, *args, **kwargs):
        object.__setattr__(self, "_tb_obj", type(self)._tb_class(*args, **kwargs))

    def __getattr__(self, name):
        if name.startswith("_tb_"):
            raise AttributeError(name)
        return getattr(_remote_of(self), name)

    def __setattr__(self, name, value):
        # An attribute the candidate's object has is set there (its methods read it);
        # any other — the test's own state — stays here, a live object as in one process.
        try:
            remote = object.__getattribute__(self, "_tb_obj")
        except AttributeError:  # before the candidate's __init__ made the object
            remote = None
        if remote is None or name in self.__dict__ or _crossing(value) is None:
            object.__setattr__(self, name, value)
            return
        try:
            getattr(remote, name)
        except AttributeError:
            object.__setattr__(self, name, value)
            return
        setattr(remote, name, value)

    def __repr__(self):
        return "<a test's %s over %r>" % (type(self).__name__,
                                          self.__dict__.get("_tb_obj"))


_FORWARDED = ("__len__", "__iter__", "__next__", "__getitem__", "__setitem__",
              "__delitem__", "__bool__", "__str__", "__int__", "__float__", "__index__",
              "__abs__", "__neg__", "__enter__", "__exit__", "__call__")
_bases = {}  # ref of the candidate's class -> its local base


def _local_base(remote_class):
    """The local base class a test's `class X(pkg.Cls)` gets: forwarding each method of
    the candidate's class by name (so `super().method()` works), and its operators."""
    if object.__getattribute__(remote_class, "_tb_kind") != "class":
        raise TypeError("the candidate's %r is not a class: it cannot be a base class"
                        % remote_class)
    ref = object.__getattribute__(remote_class, "_tb_ref")
    if ref in _bases:
        return _bases[ref]
    names = _ask("op", ref, "methods", [])
    if type(names) is not list:
        raise _CandidateGone("the candidate's process broke the protocol")
    namespace = {"_tb_class": remote_class}

    def forward(name):
        def method(self, *args, **kwargs):
            return getattr(_remote_of(self), name)(*args, **kwargs)
        method.__name__ = name
        return method

    def forward_op(name):
        def method(self, *args):
            return getattr(type(_remote_of(self)), name)(_remote_of(self), *args)
        method.__name__ = name
        return method

    for name in names:
        if type(name) is not str:
            raise _CandidateGone("the candidate's process broke the protocol")
        if name in _FORWARDED:
            namespace[name] = forward_op(name)
        elif not name.startswith(("__", "_tb_")):  # _tb_*: this wrapper's own
            namespace[name] = forward(name)
    short = object.__getattribute__(remote_class, "_tb_name").rpartition(".")[2]
    base = type(short, (_RemoteInstance,), namespace)
    base.__module__ = "candidate"
    _bases[ref] = base
    return base


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
        if type(reply) is list and len(reply) == 3 and reply[0] == "e" \
                and type(reply[1]) is list:  # what the import printed, logged, warned
            _replay(reply[1])
            reply = reply[2]
        if type(reply) is list and len(reply) == 5 and reply[0] == "r" \
                and reply[2] == "module" and type(reply[1]) is int:
            module._tb_ref = reply[1]
            return
        _answer(reply)  # raises what the import raised
        raise ImportError("the candidate's process did not import %s" % self.name)


def answers():
    """How many requests the candidate's process answered (0: it never ran)."""
    return _CHANNEL.answers if _CHANNEL is not None else 0


def connect(repo_tops, fd=CANDIDATE_FD, repo=None):
    """Open the channel to the candidate's process; `repo_tops` are the top-level names
    of the candidate's tree (modules by those names are remote); `repo` is the tree's
    directory here (classes of the trusted files there may be read by attribute)."""
    global _CHANNEL, _REPO
    _CHANNEL = _Channel(fd)
    _REPO = repo
    _REPO_TOPS.update(repo_tops)
    sys.modules.setdefault("_trialbox_repo_proxy", sys.modules[__name__])
