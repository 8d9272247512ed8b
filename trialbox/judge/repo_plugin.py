"""The judge's pytest runner and plugin, run *inside* the grading sandbox by the sandbox's
own interpreter (/usr/bin/python3 with Debian's python3-pytest 7.x), never the venv.

    python3 -c "import _trialbox_pytest as m; m.main()"   (cwd /workspace/_judge, outside
                                                          the tree in /workspace/repo)
      fd 3: a socket to the judge. First the judge's job arrives on it (nonce, repo root,
      the trusted files' sha256, the test files); then this program sends JSON records:
        start  (before any candidate code can run)  pristine check, pytest version
        test   one per test phase as it ends        node id, phase, outcome, duration
        collect                                     a test file that failed to collect
        tamper                                      what changed in the runner, when
        end    (only after pytest.main returned)    exit status, session finished, count
      every record carries the nonce and a sequence number.

What this program does before the candidate's code can run (the candidate's modules are
first imported when a test module imports them, during collection):
* reads every trusted file (test files, the task's conftest.py files) and checks it
  against the judge's hash; a meta-path finder then serves those modules from these
  pristine bytes (pytest's assertion rewriting applied), so rewriting a test file on
  disk at run time changes nothing;
* refuses to import any other `conftest.py` (one written at run time);
* snapshots the pytest internals a forger would patch (report construction, test
  calls, hook callers, our own hooks), re-checked before every record it sends, so a
  tamper is reported as soon as it is seen and cannot be taken back.

On the trusted tier (the job's "proxy", the judge's default) no candidate code runs in
this process at all: every module of the candidate's tree is served by
`_trialbox_repo_proxy` (repo_proxy.py) from the candidate's own sandbox over fd 4, as
plain data or references, and the records here are evidence the candidate cannot reach.
On the in-process tier none of the above makes the process trustworthy once candidate
code runs in it; docs/judge.md says what can still be forged there. Standard library
only, plus pytest.
"""

import hashlib
import importlib.machinery
import json
import os
import sys

CHANNEL_FD = 3
_write = os.write  # captured before any candidate code runs
_dumps = json.dumps
_sha256 = hashlib.sha256
_getattr = getattr
_MAX_MSG = 2000


def _read_job(fd):
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        data += chunk
    return json.loads(data)


JOB = _read_job(CHANNEL_FD)
NONCE = JOB["nonce"]
REPO = JOB["repo"]
_state = {"seq": 0, "finished": False, "tampered": []}


def send(record):
    record["nonce"] = NONCE
    record["seq"] = _state["seq"]
    _state["seq"] += 1
    data = (_dumps(record) + "\n").encode()
    while data:
        n = _write(CHANNEL_FD, data)
        data = data[n:]


def _load_pristine():
    """Trusted files as they are now (no candidate code has run yet), checked against the
    judge's hashes."""
    pristine, bad = {}, []
    for path, digest in sorted(JOB["trusted"].items()):
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            bad.append("%s: %s" % (path, e.strerror))
            continue
        if _sha256(data).hexdigest() != digest:
            bad.append("%s: content differs from the judge's copy" % path)
        pristine[path] = data
    return pristine, bad


PRISTINE, _BAD = _load_pristine()

# The trusted tier (the judge's default): the candidate's code runs in another sandbox,
# and its modules here are remote (repo_proxy.py) — fd 4 leads to its process.
PROXY = None
if JOB.get("proxy"):
    import _trialbox_repo_proxy as PROXY
    PROXY.connect(JOB.get("repo_tops") or [], repo=REPO)

try:
    import _pytest.assertion.rewrite
    import _pytest.main
    import _pytest.outcomes
    import _pytest.python
    import _pytest.reports
    import _pytest.runner
    import _pytest.skipping
    import pluggy._callers
    import pluggy._hooks
    import pytest
except ImportError as e:  # pragma: no cover - the runtime lacks pytest
    send({"t": "start", "error": "pytest is not installed in the sandbox runtime (%s); "
          "install Debian's python3-pytest (scripts/setup-system.sh)" % e})
    raise SystemExit(3) from None

send({"t": "start", "pytest": pytest.__version__,
      "error": "; ".join(_BAD) if _BAD else ""})


# --------------------------------------------------------------------------- integrity

_WATCHED = [
    (_pytest.runner, ["runtestprotocol", "call_and_report", "call_runtest_hook",
                      "pytest_runtest_makereport", "pytest_runtest_setup",
                      "pytest_runtest_call", "pytest_runtest_teardown",
                      "check_interactive_exception"]),
    (_pytest.runner.CallInfo, ["from_call"]),
    (_pytest.reports.TestReport, ["from_item_and_call", "__init__"]),
    (_pytest.reports.BaseReport, ["passed", "failed", "skipped"]),
    (_pytest.python.Function, ["runtest", "setup"]),
    (_pytest.python, ["pytest_pyfunc_call"]),
    (_pytest.main, ["pytest_runtestloop", "wrap_session"]),
    (_pytest.main.Session, ["perform_collect", "genitems"]),
    (_pytest.skipping, ["pytest_runtest_makereport", "pytest_runtest_setup",
                        "pytest_runtest_call", "evaluate_skip_marks",
                        "evaluate_xfail_marks"]),
    (_pytest.assertion.rewrite, ["rewrite_asserts"]),
    (_pytest.outcomes, ["fail", "skip", "xfail", "exit"]),
    (pluggy._callers, ["_multicall"]),
    (pluggy._hooks._HookCaller, ["__call__", "_hookexec"]),
    (json, ["dumps"]),
]
_WATCHED_HOOKS = ["pytest_runtest_protocol", "pytest_runtest_makereport",
                  "pytest_runtest_logreport", "pytest_runtest_setup", "pytest_runtest_call",
                  "pytest_runtest_teardown", "pytest_pyfunc_call",
                  "pytest_collection_modifyitems", "pytest_report_teststatus",
                  "pytest_collectreport", "pytest_sessionfinish", "pytest_collect_file",
                  "pytest_pycollect_makemodule", "pytest_pycollect_makeitem"]


def _code_of(obj):
    if isinstance(obj, property):
        obj = obj.fget
    return _getattr(obj, "__code__", None)


def _snapshot():
    snap = {}
    for owner, names in _WATCHED:
        for name in names:
            obj = owner.__dict__.get(name) if isinstance(owner, type) else \
                _getattr(owner, name, None)
            snap["%s.%s" % (_getattr(owner, "__name__", "?"), name)] = (obj, _code_of(obj))
    return snap


_SNAP = _snapshot()
_MODULES = {name: sys.modules[name] for name in (
    "pytest", "_pytest.runner", "_pytest.reports", "_pytest.python", "_pytest.main",
    "_pytest.skipping", "pluggy", "json")}


class _Plugin:
    """The hooks. Registered before pytest parses its arguments (pytest.main plugins=)."""

    def __init__(self):
        self.config = None
        self.hooks = None
        self.plugins = None

    # -- setup, before any candidate code ---------------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_load_initial_conftests(self, early_config):
        self.config = early_config
        _install_finder(early_config)

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection(self, session):
        _install_finder(session.config)  # first again, whatever registered since
        pm = session.config.pluginmanager
        self.plugins = {id(p) for p in pm.get_plugins()}
        self.hooks = {name: _impls(pm, name) for name in _WATCHED_HOOKS}

    # -- checks -----------------------------------------------------------------------
    def check(self):
        """What changed since the snapshots, as new findings (each reported once)."""
        found = []
        for key, (obj, code) in _snapshot().items():
            if obj is not _SNAP[key][0] or code is not _SNAP[key][1]:  # never ==: an
                # always-equal object must not pass for the original
                found.append("%s was replaced" % key)
        for name, mod in _MODULES.items():
            if sys.modules.get(name) is not mod:
                found.append("sys.modules[%r] was replaced" % name)
        if not sys.meta_path or sys.meta_path[0] is not _FINDER:
            found.append("the trusted import finder was moved")
        for meth in ("check", "pytest_runtest_logreport", "pytest_collectreport",
                     "pytest_sessionfinish"):
            if _getattr(_Plugin, meth).__code__ is not _OWN[meth]:
                found.append("the judge's plugin was patched (%s)" % meth)
        if self.config is not None and self.hooks is not None:
            pm = self.config.pluginmanager
            for p in pm.get_plugins():
                if id(p) not in self.plugins and _getattr(p, "__file__", None) not in PRISTINE:
                    found.append("a plugin was registered at run time: %r"
                                 % (pm.get_name(p),))
            for name, impls in self.hooks.items():
                now = _impls(pm, name)
                if len(now) != len(impls) or any(
                        a is not b for a, b in zip(now, impls, strict=True)):
                    found.append("the %s hook implementations changed" % name)
        new = [f for f in found if f not in _state["tampered"]]
        _state["tampered"] += new
        return new

    def _send_checked(self, record):
        new = self.check()
        if new:
            send({"t": "tamper", "what": new})
        send(record)

    # -- evidence ---------------------------------------------------------------------
    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report):
        self._send_checked({
            "t": "test", "id": _rel(report.nodeid), "when": report.when,
            "outcome": report.outcome, "xfail": hasattr(report, "wasxfail"),
            "ms": round(float(report.duration) * 1000, 3),
            "msg": _msg(report) if report.outcome != "passed" else ""})

    @pytest.hookimpl(tryfirst=True)
    def pytest_collectreport(self, report):
        if report.outcome != "passed":
            self._send_checked({"t": "collect", "id": _rel(report.nodeid),
                                "outcome": report.outcome, "msg": _msg(report)})

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        _state["finished"] = True


def _impls(pm, name):
    """A hook's implementations, except those of the task's own conftest files (a trusted
    conftest in a deeper directory registers while collection runs)."""
    return [i.function for i in _getattr(pm.hook, name).get_hookimpls()
            if _getattr(i.plugin, "__file__", None) not in PRISTINE]


_OWN = {m: getattr(_Plugin, m).__code__ for m in (
    "check", "pytest_runtest_logreport", "pytest_collectreport", "pytest_sessionfinish")}


def _rel(nodeid):
    """A node id relative to the repository root (`tests/test_x.py::test_y`)."""
    path, sep, rest = nodeid.partition("::")
    root = str(_PLUGIN.config.rootpath) if _PLUGIN.config is not None else REPO
    full = os.path.normpath(os.path.join(root, path))
    return os.path.relpath(full, REPO) + sep + rest


def _msg(report):
    try:
        text = str(report.longreprtext)
    except Exception:  # a report we cannot render is still a failure
        text = "(no details)"
    return text[-_MAX_MSG:]


# --------------------------------------------------------------------------- imports

class _TrustedLoader:
    """Executes a trusted module from the bytes read before any candidate code ran, with
    pytest's assertion rewriting, whatever the file on disk says now."""

    def __init__(self, origin):
        self.origin = origin

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        import ast
        source = PRISTINE[self.origin]
        tree = ast.parse(source, filename=self.origin)
        _pytest.assertion.rewrite.rewrite_asserts(tree, source, self.origin, _PLUGIN.config)
        code = compile(tree, self.origin, "exec", dont_inherit=True)
        exec(code, module.__dict__)


class _TrustedFinder:
    """First on sys.meta_path: trusted files come from memory; any other conftest.py is
    refused (an import error fails its directory's tests)."""

    def find_spec(self, name, path=None, target=None):
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or not spec.origin:
            return None
        origin = os.path.normpath(spec.origin)
        if origin in PRISTINE:
            spec.loader = _TrustedLoader(origin)
            spec.cached = None
            return spec
        if os.path.basename(origin) == "conftest.py":
            msg = "an untrusted conftest.py was imported at run time: %s" % origin
            if msg not in _state["tampered"]:
                _state["tampered"].append(msg)
                send({"t": "tamper", "what": [msg]})
            raise ImportError(msg)
        if PROXY is not None and origin.startswith(REPO + os.sep):
            # the candidate's module: imported in its own process, remote here
            spec.loader = PROXY.RemoteLoader(name)
            spec.cached = None
            return spec
        return None

    def invalidate_caches(self):
        pass


_FINDER = _TrustedFinder()


def _install_finder(config):
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    sys.meta_path.insert(0, _FINDER)


_PLUGIN = _Plugin()


def main():
    sys.dont_write_bytecode = True
    ini = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pytest.ini")
    args = ["-c", ini, "--rootdir", REPO, "--confcutdir", REPO, "-p", "no:cacheprovider",
            "-p", "no:pastebin", "-o", "addopts=", "--import-mode=prepend", "-q",
            "--tb=short", "-p", "no:stepwise"]
    if not any(os.path.basename(p) == "conftest.py" for p in PRISTINE):
        args.append("--noconftest")
    code = pytest.main(args + ["--"] + JOB["tests"], plugins=[_PLUGIN])
    _PLUGIN.check_final = _PLUGIN.check()
    if _PLUGIN.check_final:
        send({"t": "tamper", "what": _PLUGIN.check_final})
    send({"t": "end", "exit": int(code), "finished": _state["finished"],
          "answers": PROXY.answers() if PROXY is not None else None,
          "count": _state["seq"] + 1})
    sys.stdout.flush()
    os._exit(0)  # no atexit handler of the candidate's runs after the verdict

