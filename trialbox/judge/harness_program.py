"""Trusted side of a function-call judgement. Runs in a sandbox of its own (never the
candidate's) as `python3 -c 'import _trialbox_harness as m; m.main()'`, with `job.json`
(the task's setup and tests) beside it and fd 3 connected to the candidate's stub.

`serve()` is the same, for many tasks: a server per harness session that forks a
child per job (see its docstring) — a job then costs a fork instead of a sandbox run.

It runs the task's test code with `candidate` bound to a proxy: calling it sends the
arguments as plain data to the candidate process and returns the decoded plain-data
answer. Each test is one statement; it passes only if it runs here without raising.
The results are printed as one JSON line carrying the nonce read from stdin, which the
candidate never sees — the judge accepts no other evidence.

Standalone: imports nothing from trialbox (it is copied into the sandbox).
"""

import json
import os
import select
import signal
import socket
import struct
import sys
import time

import _trialbox_codec as codec  # preloaded in a judge pool, else the copy beside us

CHANNEL = 3
MAX_FRAME = 16 << 20


class CandidateError(Exception):
    """The candidate did not answer a call with a plain value."""


class _Channel:
    def __init__(self, fd, call_timeout):
        self.fd, self.call_timeout = fd, call_timeout
        self.buf = b""
        self.gone = ""
        self.next_id = 1

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
        while True:
            if len(self.buf) >= 4:
                (n,) = struct.unpack(">I", self.buf[:4])
                if n > MAX_FRAME:
                    self.gone = "the candidate sent an oversized frame"
                    raise CandidateError(self.gone)
                if len(self.buf) >= 4 + n:
                    body, self.buf = self.buf[4:4 + n], self.buf[4 + n:]
                    try:
                        msg = codec.decode(body)
                    except codec.CodecError as e:
                        raise CandidateError("unreadable answer: %s" % e) from None
                    if type(msg) is not list or len(msg) != 3 or type(msg[0]) is not int:
                        raise CandidateError("malformed answer")
                    return msg
            self._fill(deadline)

    def send(self, obj):
        data = codec.encode(obj)
        view = memoryview(struct.pack(">I", len(data)) + data)
        while view:
            view = view[os.write(self.fd, view):]

    def call(self, args):
        if self.gone:
            raise CandidateError(self.gone)
        call_id = self.next_id
        self.next_id += 1
        try:
            self.send([call_id, list(args)])
        except codec.CodecError as e:
            raise TestDataError("the test's arguments are not plain data: %s" % e) from None
        except OSError:
            self.gone = "the candidate process ended"
            raise CandidateError(self.gone) from None
        deadline = time.monotonic() + self.call_timeout
        while True:
            try:
                got_id, kind, value = self.recv(deadline)
            except TimeoutError:
                raise CandidateError("no answer within %.1f s" % self.call_timeout) from None
            if got_id != call_id:
                continue  # the late answer to a call that already timed out
            if kind == "ok":
                return value
            if kind == "raised":
                raise CandidateError("the candidate raised %s" % value)
            raise CandidateError("the candidate returned %s" % value)


class TestDataError(Exception):
    """The task's own test code is broken (not the candidate's fault)."""


def run_job(job, nonce, channel_fd):
    """Run one task's tests against the candidate on `channel_fd`; the report dict."""
    chan = _Channel(channel_fd, job["call_timeout"])
    out = {"nonce": nonce, "load": "", "setup_error": "", "results": []}
    try:
        _, kind, value = chan.recv(time.monotonic() + job["load_timeout"])
        if kind != "ready":
            out["load"] = "the solution failed to load: %s" % value
    except TimeoutError:
        out["load"] = "the solution did not load within %.1f s" % job["load_timeout"]
    except CandidateError as e:
        out["load"] = "the solution failed to load: %s" % e
    namespace = {"__name__": "__trialbox_test__"}
    try:
        exec(compile(job["setup"], "test_setup", "exec"), namespace)
    except BaseException as e:
        out["setup_error"] = "%s: %s" % (type(e).__name__, e)
    proxy = lambda *args: chan.call(args)  # noqa: E731
    namespace["candidate"] = proxy
    namespace[job["entry_point"]] = proxy  # tests may call the function by its own name
    for test in job["tests"]:
        # a per-test limit (scaled from the reference solution's time) when the judge
        # sent one, else the task-wide one
        chan.call_timeout = test.get("timeout") or job["call_timeout"]
        t0 = time.monotonic()
        if out["load"] or out["setup_error"]:
            passed, message = False, out["load"] or "test setup failed"
        else:
            try:
                exec(compile(test["code"], test["name"], "exec"), namespace)
                passed, message = True, ""
            except AssertionError as e:
                passed, message = False, "assertion failed" + (": %s" % e if str(e) else "")
            except CandidateError as e:
                passed, message = False, str(e)
            except TestDataError as e:
                passed, message = False, "test error: %s" % e
                out["setup_error"] = out["setup_error"] or str(e)
            except BaseException as e:  # e.g. a wrong type the test cannot compare
                passed, message = False, "%s: %s" % (type(e).__name__, str(e)[:500])
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


def serve():
    """Many jobs, one after another, each in a child forked for it (so nothing one
    task's test code does reaches the next, and a hung job is killed on its deadline).

    Control socket (SOCK_SEQPACKET) on fd 3. Request: {"seq", "job" (a file in the
    workspace), "nonce", "deadline" (s)} with the candidate's channel passed as an fd.
    The child writes its report to out-SEQ.json (atomically) and exits; then the reply
    {"seq", "ok": bool, "why": str}. EOF on the control socket ends the server."""
    ctl = socket.socket(fileno=CHANNEL)
    devnull = os.open("/dev/null", os.O_RDWR)
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(ctl, 1 << 16, 4)
        except OSError:
            return
        if not data:
            return
        req = json.loads(data)
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            ctl.send(json.dumps({"seq": req.get("seq"), "ok": False,
                                 "why": "no candidate channel with the request"}).encode())
            continue
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                ctl.close()
                os.dup2(devnull, 1)  # test code's prints must not fill the server's pipe
                os.dup2(devnull, 2)
                with open(req["job"]) as f:
                    job = json.load(f)
                out = run_job(job, req["nonce"], fds[0])
                tmp = "out-%d.tmp" % req["seq"]
                with open(tmp, "w") as f:
                    f.write(json.dumps(out))
                os.rename(tmp, "out-%d.json" % req["seq"])
            except BaseException:
                code = 1
            os._exit(code)
        os.close(fds[0])  # the child has it: EOF for the candidate when the child ends
        why = ""
        pidfd = os.pidfd_open(pid)
        try:
            if not select.select([pidfd], [], [], req["deadline"])[0]:
                os.kill(pid, signal.SIGKILL)
                why = "the test job ran past its %.1f s deadline" % req["deadline"]
            _, status = os.waitpid(pid, 0)
        finally:
            os.close(pidfd)
        if not why and status != 0:
            why = "the test job crashed (wait status %d)" % status
        ctl.send(json.dumps({"seq": req["seq"], "ok": not why, "why": why}).encode())


if __name__ == "__main__":
    main()
