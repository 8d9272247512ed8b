"""Trusted side of a function-call judgement. Runs in a sandbox of its own (never the
candidate's) as `python3 -c 'import _trialbox_harness as m; m.main()'`, with `job.json`
(the task's setup and tests) beside it and fd 3 connected to the candidate's stub.

`serve()` is the same, for many tasks: a server per harness session that runs job after
job in its own process (see its docstring) — a job then costs neither a sandbox run nor
a fork.

It runs the task's test code with `candidate` bound to a proxy: calling it sends the
arguments, positional and keyword, as plain data to the candidate process, gives the
test's own argument objects the state the call left its copies in (`_apply_changes`:
in-place semantics as in-process) and returns the decoded answer. Each test is one
statement; it passes only if it runs here without raising.
The results are printed as one JSON line carrying the nonce read from stdin, which the
candidate never sees — the judge accepts no other evidence.

Whatever the candidate sends is plain data and is never formatted into a format
string, so no frame, answer or exception text can crash this program; a frame that is
malformed, oversized or garbled fails the call that waited for it (the candidate's
failure). Limits hold before allocation: a frame's JSON values are counted from its
bytes before the parser expands them (`_json_values`: 16 MiB of `[],` would be ~385 MB
of lists), and an answer whose values could flood a trusted test's `set(...)` is
refused (`_flooded`).

Built-in exceptions cross as themselves: the stub sends the nearest built-in class of
what the candidate raised (name and args, as plain data) and `_raised` builds that
class here (never a class of the candidate's), so `except ValueError:` in a test
matches a correct candidate; control flow (StopIteration) arrives as a RuntimeError
instead, so it cannot end the test's own loop. Everything else that goes wrong with a call raises
`CandidateError`, a BaseException a test's `except Exception:` does not swallow.

`random` is seeded before every job from the job's "seed", a per-attempt secret of the
judge recorded in the grade (a re-grade with it sees the same draws).

Standalone: imports nothing from trialbox (it is copied into the sandbox).
"""

import builtins
import collections
import collections.abc
import json
import os
import random
import select
import signal
import socket
import struct
import sys
import time

import _trialbox_codec as codec  # preloaded in a judge pool, else the copy beside us

CHANNEL = 3
MAX_FRAME = codec.MAX_SIZE
KINDS = ("ready", "load_error", "ok", "raised", "bad_return")


MAX_JSON_VALUES = 2 * codec.MAX_ITEMS
"""JSON values the parser may build from one frame: at ~60 bytes a value at worst
(objects, read as tuples of pairs), ~120 MB; a tagged value takes ~5 of them."""
FLOOD_MIN_BYTES = 64
"""Frames up to this size cannot hold MAX_SAME_HASH + 1 distinct numbers: not walked."""
_CHUNK = 1 << 16


def _json_values(data, limit):
    """An upper bound on the JSON values the parser would build from `data`, from the
    bytes alone: every value but the first follows a `[` or a `,`, and an object (read
    as a tuple of two pairs) costs two more, outside strings. Counted over all the bytes
    first (C speed); only if that exceeds `limit` are strings left out and the count
    taken again, a chunk at a time so that no list of pieces grows with the input:
    escaped backslashes and quotes removed, every remaining quote delimits a string."""
    n = 1 + data.count(b"[") + data.count(b",") + 2 * data.count(b"{")
    if n <= limit:
        return n
    bare = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    n, inside = 1, False
    for at in range(0, len(bare), _CHUNK):
        parts = bare[at:at + _CHUNK].split(b'"')
        out = b"".join(parts[1 if inside else 0::2])
        n += out.count(b"[") + out.count(b",") + 2 * out.count(b"{")
        inside ^= len(parts) % 2 == 0  # an odd number of quotes in this chunk
    return n


def _hashable(value):
    """The values in `value` whose hash a sender can choose: ints, floats, tuples and
    frozensets (str and bytes hash with the interpreter's secret SipHash key), and the
    stdlib values the codec rebuilds (`_stdlib_hashable`)."""
    found, todo = [], [value]
    while todo:
        v = todo.pop()
        t = type(v)
        if t is int or t is float:
            found.append(v)
        elif t is list or t is set:
            todo.extend(v)
        elif t is dict:
            todo.extend(v.keys())
            todo.extend(v.values())
        elif t is tuple or t is frozenset:
            found.append(v)
            todo.extend(v)
        elif not (t is str or t is bytes or t is bool or v is None):
            _stdlib_hashable(v, found, todo)
    return found


_LIST_ITERATOR = type(iter([]))


def _stdlib_hashable(v, found, todo):
    """`_hashable` for a value of codec._STDLIB (decoded: trusted types only). Counter,
    OrderedDict, defaultdict, deque, dict views and iterators are walked (an iterator
    through its list, not read); namedtuples, ranges, Fractions and Decimals hash as
    their sender chose."""
    if isinstance(v, dict):
        todo.extend(v.keys())
        todo.extend(v.values())
    elif type(v) is _LIST_ITERATOR:
        todo.extend(v.__reduce__()[1][0])  # (iter, (the list,), position)
    elif isinstance(v, (collections.deque, collections.abc.MappingView)):
        todo.extend(v)
    elif isinstance(v, tuple):
        found.append(v)
        todo.extend(v)
    elif type(v) is not bytearray:  # a range, a Fraction, a Decimal
        found.append(v)


def _flooded(values):
    """Whether more than MAX_SAME_HASH *distinct* values among `values` share a hash.

    Ints equal mod 2**61-1, and tuples or frozensets built from chosen hashes, collide
    at will; a trusted test that puts them in a set or a dict — wherever they sit in
    the answer, not only in one set (the codec checks those) — runs one quadratic C
    call no alarm can interrupt. Equal values (a list of a thousand zeros) share a hash
    harmlessly, so distinct ones are counted, by `==` against at most MAX_SAME_HASH + 1
    representatives per hash: linear. Hashes are sorted, not counted in a dict (a
    million of them would be ~80 MB)."""
    limit = codec.MAX_SAME_HASH
    if len(values) <= limit:
        return False
    hashes = []
    for v in values:
        try:
            hashes.append(hash(v))
        except TypeError:  # a tuple holding a list: no set can hold it
            hashes.append(None)
    ordered = sorted(h for h in hashes if h is not None)
    if not any(map(int.__eq__, ordered, ordered[limit:])):  # no run over the limit
        return False
    heavy = {a for a, b in zip(ordered, ordered[limit:], strict=False) if a == b}
    groups = {}
    for h, v in zip(hashes, values, strict=True):
        if h in heavy:
            reps = groups.setdefault(h, [])
            if not any(v == r for r in reps):
                reps.append(v)
                if len(reps) > limit:
                    return True
    return False


class CandidateError(BaseException):
    """The candidate did not answer a call with a plain value (or raised something that
    is not a built-in exception). A BaseException: a test's `except Exception:` must not
    take a crash, a timeout or a garbled answer for the exception it expects."""


def _text(value, limit=1000):
    """A candidate's plain value as text for a message, whatever it is (never a format
    string's argument tuple; repr of a huge int raises ValueError)."""
    try:
        text = value if type(value) is str else repr(value)
    except Exception:
        text = "<a %s>" % type(value).__name__
    return text[:limit]


def _detail(e, limit=500):
    """str(e), whatever its str() does (an AssertionError holding a 5,000-digit int
    raises ValueError)."""
    try:
        return str(e)[:limit]
    except Exception:
        return "<unprintable>"


def _exc_text(e, limit=500):
    """`Type: message` of an exception, whatever its str() does."""
    detail = _detail(e, limit)
    return type(e).__name__ + (": " + detail if detail else "")


def _raised(value):
    """The exception to raise in the test for a call the candidate answered "raised":
    `value` is [name, args]; a built-in Exception class of that name is built with the
    args (plain data) and marked as the candidate's. Anything else — another name, a
    BaseException-only class (SystemExit, KeyboardInterrupt, GeneratorExit), args the
    class refuses, or the old text form — is a CandidateError: not trusted as a type.

    Control flow is never rebuilt: StopIteration (or StopAsyncIteration) raised here
    would end the test's own loop — `sum(map(candidate, xs))`, `for y in
    map(candidate, xs)` — and a wrong answer would pass, as it does in-process, where
    PEP 479 covers only generators. It arrives as a RuntimeError naming it (what PEP
    479 makes of it inside a generator, and still an Exception, as it was)."""
    if type(value) is list and len(value) == 2 and type(value[0]) is str \
            and type(value[1]) is list:
        cls = getattr(builtins, value[0], None) if value[0].isidentifier() else None
        if isinstance(cls, type) and issubclass(cls, (StopIteration, StopAsyncIteration)):
            exc = RuntimeError("%s (args %s): control flow does not cross the "
                               "boundary" % (value[0], _text(value[1], 200)))
            exc._trialbox_candidate = True
            return exc
        if isinstance(cls, type) and issubclass(cls, Exception) and \
                cls.__module__ == "builtins":
            try:
                exc = cls(*value[1])
                exc._trialbox_candidate = True
                return exc
            except Exception:
                pass
        return CandidateError("the candidate raised %s" % _text(value[0], 100))
    return CandidateError("the candidate raised " + _text(value))


def _raised_text(e):
    """A failed test's message for an exception the candidate raised."""
    return "the candidate raised " + _exc_text(e)


class _Channel:
    def __init__(self, fd, call_timeout):
        self.fd, self.call_timeout = fd, call_timeout
        self.buf = bytearray()  # appended to in place: no copy of 16 MiB per read
        self.gone = ""
        self.next_id = 1
        self.answers = []  # containers the candidate returned (see `call`)

    def _fill(self, deadline):
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            if select.select([self.fd], [], [], left)[0]:
                b = os.read(self.fd, 1 << 16)
                if not b:
                    self.gone = "the candidate process ended"
                    raise CandidateError(self.gone)
                self.buf += b
                return

    def recv(self, deadline):
        """The next frame from the candidate as [id, kind, value]. A frame over
        MAX_FRAME ends the channel (what follows cannot be framed); one that does not
        decode, or is not [int, one of KINDS, value], fails the call that waits."""
        while True:
            if len(self.buf) >= 4:
                (n,) = struct.unpack(">I", self.buf[:4])
                if n > MAX_FRAME:
                    self.gone = "the candidate sent an oversized frame (%d bytes)" % n
                    raise CandidateError(self.gone)
                if len(self.buf) >= 4 + n:
                    body = bytes(self.buf[4:4 + n])
                    del self.buf[:4 + n]
                    if _json_values(body, MAX_JSON_VALUES) > MAX_JSON_VALUES:
                        raise CandidateError(
                            "unreadable answer: more than %d JSON values (at most %d "
                            "values), refused before parsing" % (MAX_JSON_VALUES,
                                                                 codec.MAX_ITEMS))
                    try:
                        msg = codec.decode(body)
                    except (codec.CodecError, MemoryError, RecursionError) as e:
                        raise CandidateError("unreadable answer: " + _exc_text(e)) from None
                    if n > FLOOD_MIN_BYTES and _flooded(_hashable(msg)):
                        raise CandidateError(
                            "unreadable answer: hash flooding: more than %d distinct values "
                            "share one hash (a set of them is quadratic to build)"
                            % codec.MAX_SAME_HASH)
                    if type(msg) is not list or not 3 <= len(msg) <= 4 \
                            or type(msg[0]) is not int or type(msg[1]) is not str \
                            or msg[1] not in KINDS or len(msg) == 4 and (
                                msg[1] not in ("ok", "raised") or type(msg[3]) is not list):
                        raise CandidateError("malformed answer")
                    return msg
            self._fill(deadline)

    def send(self, obj):
        data = codec.encode(obj)
        view = memoryview(struct.pack(">I", len(data)) + data)
        while view:
            view = view[os.write(self.fd, view):]

    def call(self, args, kwargs):
        if self.gone:
            raise CandidateError(self.gone)
        call_id = self.next_id
        self.next_id += 1
        try:
            self.send([call_id, list(args), kwargs] if kwargs else [call_id, list(args)])
        except codec.CodecError as e:
            if self._carries_answer([args, kwargs]):  # e.g. an answer fed back too deep
                raise CandidateError("the candidate's own answer, passed back to it by the "
                                     "test, is not plain data within the codec's limits: "
                                     + _exc_text(e)) from None
            raise TestDataError("the test's arguments are not plain data: %s" % (e,)) \
                from None
        except OSError:
            self.gone = "the candidate process ended"
            raise CandidateError(self.gone) from None
        deadline = time.monotonic() + self.call_timeout
        while True:
            try:
                msg = self.recv(deadline)
            except TimeoutError:
                raise CandidateError("no answer within %.1f s" % self.call_timeout) from None
            got_id, kind, value = msg[0], msg[1], msg[2]
            if got_id != call_id:
                continue  # the late answer to a call that already timed out
            if len(msg) == 4:  # the arguments it changed in place
                _apply_changes(args, kwargs, msg[3])
            if kind == "ok":
                if type(value) not in _SCALARS:
                    self.answers.append(value)
                return value
            if kind == "raised":
                raise _raised(value)
            if kind == "bad_return":
                raise CandidateError("the candidate returned " + _text(value))
            raise CandidateError("malformed answer: a %s frame during a call"
                                 % _text(kind, 40))

    def _carries_answer(self, args, budget=1 << 20):
        """Whether `args` holds (by identity) a container the candidate returned: then
        its not being plain data within the codec's limits is the candidate's doing.
        Walks at most `budget` values."""
        mine = {id(a) for a in self.answers}
        todo = [args]
        while todo and budget > 0:
            v = todo.pop()
            budget -= 1
            if id(v) in mine:
                return True
            if isinstance(v, dict):
                todo.extend(v.keys())
                todo.extend(v.values())
            elif isinstance(v, (list, tuple, set, frozenset, collections.deque)):
                todo.extend(v)
        return False


_SCALARS = frozenset({int, float, str, bytes, bool, type(None)})


def _apply_changes(args, kwargs, changes):
    """Give the test's own argument objects the state the candidate left its copies in
    ([[position or keyword, value], ...]), as an in-process call would have left them.
    A change no call could make (an argument that is not there, another type, an
    immutable value) is a malformed answer: the call fails."""
    for change in changes:
        if type(change) is list and len(change) == 2:
            key, new = change
            if type(key) is int and 0 <= key < len(args):
                old = args[key]
            elif type(key) is str and kwargs and key in kwargs:
                old = kwargs[key]
            else:
                old = _MISSING
            if old is not _MISSING and codec.assign(old, new):
                continue
        raise CandidateError("malformed answer: a change to an argument no call could make")


class TestDataError(Exception):
    """The task's own test code is broken (not the candidate's fault)."""


PAST_DEADLINE = "the test ran past the job's deadline"
NOT_RUN = "not run: the job's deadline had passed"


class JobDeadline(BaseException):
    """Raised by the server's alarm when a job runs past its deadline. A BaseException,
    and re-raised wherever run_job catches everything, so no test can swallow it."""


_CODE_CACHE = {}
_CODE_CACHE_MAX = 4096


def _compiled(source, name):
    """The code object of a trusted test statement, compiled once per server: a task is
    judged again and again (several samples, repeats), and compiling its tests cost
    more than running them. Code objects are immutable, so sharing one is safe."""
    key = (source, name)
    code = _CODE_CACHE.get(key)
    if code is None:
        if len(_CODE_CACHE) >= _CODE_CACHE_MAX:
            _CODE_CACHE.clear()
        code = _CODE_CACHE[key] = compile(source, name, "exec")
    return code


def run_job(job, nonce, channel_fd):
    """Run one task's tests against the candidate on `channel_fd`; the report dict."""
    random.seed(job.get("seed"))  # the judge's per-attempt secret (None: from urandom)
    chan = _Channel(channel_fd, job["call_timeout"])
    out = {"nonce": nonce, "load": "", "setup_error": "", "results": []}
    try:
        _, kind, value = chan.recv(time.monotonic() + job["load_timeout"])
        if kind != "ready":
            out["load"] = "the solution failed to load: " + _text(value, 2000)
    except TimeoutError:
        out["load"] = "the solution did not load within %.1f s" % job["load_timeout"]
    except CandidateError as e:
        out["load"] = "the solution failed to load: " + _detail(e, 2000)
    namespace = {"__name__": "__trialbox_test__"}
    try:
        exec(_compiled(job["setup"], "test_setup"), namespace)
    except JobDeadline:
        raise
    except BaseException as e:
        out["setup_error"] = _exc_text(e, 2000)
    proxy = lambda *args, **kwargs: chan.call(args, kwargs)  # noqa: E731
    namespace["candidate"] = proxy
    namespace[job["entry_point"]] = proxy  # tests may call the function by its own name
    for test in job["tests"]:
        if out.get("deadline"):  # the job's time is up: the rest is not run
            out["results"].append({"name": test["name"], "passed": False,
                                   "message": NOT_RUN, "ms": 0.0})
            continue
        # a per-test limit (scaled from the reference solution's time) when the judge
        # sent one, else the task-wide one
        chan.call_timeout = test.get("timeout") or job["call_timeout"]
        try:  # compiled before the clock starts: a test's time is its run, not whether
            code = _compiled(test["code"], test["name"])  # this server compiled it yet
        except BaseException as e:  # raised again below, as a failure of this test
            code = e
        t0 = time.monotonic()
        if out["load"] or out["setup_error"]:
            passed, message = False, out["load"] or "test setup failed"
        else:
            try:
                if isinstance(code, BaseException):
                    raise code
                exec(code, namespace)
                passed, message = True, ""
            except AssertionError as e:
                if getattr(e, "_trialbox_candidate", False):
                    passed, message = False, _raised_text(e)
                else:
                    text = _detail(e)
                    passed, message = False, "assertion failed" + (": " + text if text else "")
            except CandidateError as e:
                passed, message = False, _detail(e, 1000)
            except TestDataError as e:
                passed, message = False, "test error: " + _exc_text(e)
                out["setup_error"] = out["setup_error"] or _exc_text(e)
            except JobDeadline:
                # The job's deadline passed inside this test: the test fails and the
                # report names it. Whose fault that is — the candidate's answers made
                # trusted code slow, or the task's test is broken — the judge decides
                # by the reference solution (function.py, judge_function).
                out["deadline"] = test["name"]
                passed, message = False, PAST_DEADLINE
            except BaseException as e:  # e.g. a wrong type the test cannot compare
                passed, message = False, (_raised_text(e) if getattr(
                    e, "_trialbox_candidate", False) else _exc_text(e))
        out["results"].append({"name": test["name"], "passed": passed,
                               "message": message[:1000],
                               "ms": round((time.monotonic() - t0) * 1000, 3)})
    return out


def main():
    """One job: the nonce on stdin, the job in job.json, the candidate on fd 3; the
    report printed as one JSON line."""
    nonce = sys.stdin.read().strip()
    with open("/workspace/job.json") as f:
        job = json.load(f)
    sys.stdout.write(json.dumps(run_job(job, nonce, CHANNEL)) + "\n")
    sys.stdout.flush()


# Modules the tests of HumanEval-style tasks import: loaded before the server's first
# job, so they are part of the state every job starts from (not imported by one job and
# forgotten after it).
SERVER_IMPORTS = ("copy", "math", "random", "string")
INLINE_MAX = 60000  # larger jobs and reports go through a workspace file
_MISSING = object()


def _on_alarm(_signum, _frame):
    raise JobDeadline


def _dict_versions():
    """A reader of a dict's version tag, or None where this interpreter has none.

    CPython (3.6-3.13) gives every dict a 64-bit version (PEP 509, `ma_version_tag`,
    right after `ma_used`) that changes whenever the dict changes — an item added,
    removed or rebound to another object. Reading it tells `_Baseline.restore` which
    module dicts a job touched, so it compares only those instead of every global of
    every loaded module (~5,400 entries here: ~0.1 ms warm, ~0.5 ms between jobs, with
    the caches cold). The layout is checked here on a dict of our own; anything
    unexpected and the restore compares everything, as before."""
    if sys.implementation.name != "cpython" or not (3, 6) <= sys.version_info[:2] <= (3, 13):
        return None
    try:
        import ctypes
        offset = 2 * ctypes.sizeof(ctypes.c_void_p) + ctypes.sizeof(ctypes.c_ssize_t)

        def reader(d):
            return ctypes.c_uint64.from_address(id(d) + offset)

        probe = {}
        seen = [reader(probe).value]
        for change in (lambda: probe.__setitem__("k", 1), lambda: probe.__setitem__("k", 2),
                       lambda: probe.__delitem__("k"), lambda: probe.update(k=3),
                       lambda: probe.clear()):
            change()
            seen.append(reader(probe).value)
        if len(set(seen)) != len(seen):
            return None
        return reader
    except Exception:
        return None


class _Baseline:
    """What a job may change in this process and must not leave to the next one: the
    globals of every loaded module (restored shallowly: rebinding `json.x` is undone,
    mutating an object json.x refers to is not), modules a job imported (forgotten, so
    the next job imports them afresh), sys.path, the recursion limit and warning filters
    (`random` is seeded by run_job from the job's own seed). Dicts whose version tag
    (`_dict_versions`) has not moved since the last restore are unchanged and skipped."""

    def __init__(self):
        self.modules = dict(sys.modules)
        self.globals = {name: dict(m.__dict__) for name, m in self.modules.items()
                        if getattr(m, "__dict__", None) is not None}
        self.path = list(sys.path)
        self.recursion = sys.getrecursionlimit()
        import warnings
        self.warnings = warnings
        self.filters = list(warnings.filters)
        reader = _dict_versions()
        # (name, view of its dict's version) per module; the version when last known
        # equal to the baseline in `seen`; sys.modules itself under None
        self.views = []
        if reader is not None:
            self.views = [(name, reader(self.modules[name].__dict__))
                          for name in self.globals]
            self.views.append((None, reader(sys.modules)))
        self.seen = {name: view.value for name, view in self.views}

    def restore(self):
        changed = [name for name, view in self.views if view.value != self.seen[name]]
        if not self.views:  # no version tags: compare everything
            changed = [None, *self.globals]
        for name in changed:
            if name is None:
                for extra in [n for n in sys.modules if n not in self.modules]:
                    del sys.modules[extra]
                for mod_name, module in self.modules.items():
                    if sys.modules.get(mod_name, _MISSING) is not module:
                        sys.modules[mod_name] = module
                continue
            saved = self.globals[name]
            now = self.modules[name].__dict__
            try:
                same = now == saved  # identical values compare equal without __eq__
            except Exception:
                same = False
            if not same:
                for key in [k for k in now if k not in saved]:
                    del now[key]
                for key, value in saved.items():
                    if now.get(key, _MISSING) is not value:
                        now[key] = value
        if changed and self.views:  # put back: equal to the baseline at these versions
            self.seen = {name: view.value for name, view in self.views}
        sys.path[:] = self.path
        sys.setrecursionlimit(self.recursion)
        self.warnings.filters[:] = self.filters
        self.warnings._filters_mutated()


def _warm_up():
    """Run the job's code paths once before the first job (codec both ways, compiling
    and running a statement, JSON), so the first job's per-test times — often a task's
    reference times — are not inflated by a cold process."""
    value = [1, -2.5, "s", b"b", None, True, (1, 2), {"k": [1]}, {3}]
    codec.decode(codec.encode([1, "ok", value]))
    exec(compile("assert sorted([3, 1, 2]) == [1, 2, 3]", "warm_up", "exec"), {})
    json.loads(json.dumps({"results": [{"name": "t", "passed": True, "ms": 0.1}]}))


def _serve_one(req, chan_fd):
    """One job in this process, under an alarm at its deadline. Returns (report, why)."""
    if "job" in req:
        job = req["job"]
    else:
        with open(req["job_file"]) as f:
            job = json.load(f)
    signal.signal(signal.SIGALRM, _on_alarm)  # ours again, whatever the last job did
    signal.setitimer(signal.ITIMER_REAL, max(0.001, float(req["deadline"])))
    try:
        return run_job(job, req["nonce"], chan_fd), ""
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def serve():
    """Many jobs, one after another, in this process: the task's test code is trusted
    and only plain data comes from the candidate, so no job needs a process of its own.
    What a job changes in the interpreter is put back before the next (`_Baseline`),
    and a job past its deadline is interrupted by an alarm (test code stuck inside one
    C call cannot be: the judge then stops this server and the attempt is retried as
    an infrastructure failure).

    Control socket (SOCK_SEQPACKET) on fd 3. Request: {"seq", "nonce", "deadline" (s),
    and "job" (the job itself) or "job_file" (a file in the workspace, for big jobs)}
    with the candidate's channel passed as an fd, closed when the job ends (the
    candidate sees EOF). Reply: {"seq", "ok": bool, "why": str, and "report" or
    "report_file" (out-SEQ.json, for big reports)}. EOF on the control socket ends the
    server."""
    ctl = socket.socket(fileno=CHANNEL)
    devnull = os.open("/dev/null", os.O_RDWR)
    os.dup2(devnull, 1)  # test code's prints must not fill the sandbox's pipes
    os.dup2(devnull, 2)
    for name in SERVER_IMPORTS:
        __import__(name)
    _warm_up()
    signal.signal(signal.SIGALRM, _on_alarm)
    baseline = _Baseline()
    while True:
        try:
            # requests are at most the judge's _INLINE_MAX (60,000) bytes; a buffer
            # under glibc's mmap threshold is not a fresh mapping per job (~20 us)
            data, fds, _flags, _addr = socket.recv_fds(ctl, 1 << 16, 4)
        except OSError:
            return
        if not data:
            return
        reply = {"seq": None, "ok": False, "why": ""}
        try:
            req = json.loads(data)
            reply["seq"] = req.get("seq")
            if len(fds) != 1:
                reply["why"] = "no candidate channel with the request"
            else:
                baseline.restore()
                out, reply["why"] = _serve_one(req, fds[0])
                text = json.dumps(out)
                if len(text) <= INLINE_MAX:
                    reply["report"] = out
                else:
                    name = "out-%d.json" % req["seq"]
                    with open(name + ".tmp", "w") as f:
                        f.write(text)
                    os.rename(name + ".tmp", name)
                    reply["report_file"] = name
                reply["ok"] = True
        except JobDeadline:
            reply["ok"], reply["why"] = False, (
                "the test job ran past its %.1f s deadline" % req["deadline"])
        except BaseException as e:  # the job's machinery, not a test, failed
            reply["ok"], reply["why"] = False, "the test job crashed: " + _exc_text(e, 300)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            for fd in fds:  # the candidate sees EOF once the job is over
                os.close(fd)
        ctl.send(json.dumps(reply).encode())


if __name__ == "__main__":
    main()
