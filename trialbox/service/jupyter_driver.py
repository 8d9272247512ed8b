# Runs inside the sandbox under the runtime's python3 (not the project's venv): the
# notebook driver of `POST /run_jupyter` (trialbox/service/jupyter.py). Two processes:
#
#   python3 -I -S .jupyter/driver.py driver CHANNEL_FD CELL_TIMEOUT_S < CELLS_JSON
#       the driver: runs no cell. It starts the kernel, hands it one cell at a time with
#       a fresh random token, and writes one JSON record per cell to CHANNEL_FD (the
#       service's end: a socket passed in as fd 3, or its own stdout where no fd can be
#       passed), then {"done": N}. The kernel never holds CHANNEL_FD (not inherited), and
#       the driver makes itself undumpable (prctl), so no cell can open /proc/PID/fd/N,
#       ptrace it or read its memory: what reaches the service in order, with a cell's
#       index, is the driver's word that the kernel answered that cell.
#   python3 .jupyter/driver.py kernel CMD_FD REPLY_FD CELL_TIMEOUT_S
#       the kernel: executes the cells in one namespace, as a Jupyter kernel would — each
#       cell's stdout and stderr captured apart, the value of its last expression
#       displayed as {"text/plain": repr(value)} (None is not), an exception recorded as
#       {"ename", "evalue", "traceback"} and the next cell run anyway. A cell past
#       CELL_TIMEOUT_S (0: none) is interrupted and the notebook stops there.
#
# What a cell reports (output, errors) is the kernel's, i.e. the program's, word: a cell
# can take over the kernel's loop and answer later cells itself. What it cannot do is
# make the driver report a cell the kernel never answered: an answer must carry the token
# the driver sent with that cell (sent only after the answer before it arrived), so
# records written ahead and a kernel that exits (os._exit, a kill) stop the notebook
# there. The driver kills a kernel that overstays CELL_TIMEOUT_S by GRACE_S.
import ast
import contextlib
import io
import json
import os
import select
import signal
import subprocess
import sys
import time
import traceback

GRACE_S = 2.0
MAX_REPLY = 64 << 20


class CellTimeout(BaseException):
    pass


def _alarm(signum, frame):
    raise CellTimeout()


# ----------------------------------------------------------------------- the kernel

def run_cell(namespace, i, source, cell_timeout):
    stdout, stderr = io.StringIO(), io.StringIO()
    display, error = [], []
    timed_out = False
    name = f"<cell {i}>"
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            if cell_timeout > 0:
                signal.setitimer(signal.ITIMER_REAL, cell_timeout)
            try:
                tree = ast.parse(source, name)
                last = None
                if tree.body and isinstance(tree.body[-1], ast.Expr):
                    last = ast.Expression(tree.body.pop().value)
                exec(compile(tree, name, "exec"), namespace)
                if last is not None:
                    value = eval(compile(last, name, "eval"), namespace)
                    if value is not None:
                        display.append({"text/plain": repr(value)})
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
    except CellTimeout:
        timed_out = True
        error.append({"ename": "TimeoutError",
                      "evalue": f"cell {i} ran past cell_timeout={cell_timeout:g} s",
                      "traceback": []})
    except BaseException as e:  # a cell's exception (SystemExit too) is its output
        error.append({"ename": type(e).__name__, "evalue": str(e),
                      "traceback": traceback.format_exception(type(e), e,
                                                              e.__traceback__)[1:]})
    return {"stdout": stdout.getvalue(), "stderr": stderr.getvalue(), "display": display,
            "error": error, "timed_out": timed_out}


def kernel(cmd_fd, reply_fd, cell_timeout):
    for fd in (cmd_fd, reply_fd):  # a cell's subprocesses do not get them
        os.set_inheritable(fd, False)
    commands = os.fdopen(cmd_fd, "rb")
    replies = os.fdopen(reply_fd, "wb")
    signal.signal(signal.SIGALRM, _alarm)
    sys.path[0] = ""  # cells import from the workspace, as in a kernel or `python3 -c`
    sys.argv = [""]
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    for line in commands:
        cmd = json.loads(line)
        record = run_cell(namespace, cmd["i"], cmd["source"], cell_timeout)
        record["token"] = cmd["token"]
        replies.write(json.dumps(record).encode() + b"\n")
        replies.flush()
        if record["timed_out"]:
            break


# ----------------------------------------------------------------------- the driver

def _undumpable():
    """PR_SET_DUMPABLE 0: another process of the same uid (the kernel, a cell's child)
    can no longer open /proc/<us>/fd, /proc/<us>/mem or ptrace us."""
    import ctypes
    if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def _read_reply(fd, buf, timeout):
    """One line from the kernel: (line, rest) — line None at EOF, on timeout or past
    MAX_REPLY bytes (with why)."""
    end = None if timeout is None else time.monotonic() + timeout
    while b"\n" not in buf:
        if len(buf) > MAX_REPLY:
            return None, "its answer passed %d bytes" % MAX_REPLY
        left = None if end is None else max(0.0, end - time.monotonic())
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return None, "timeout"
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return None, "the kernel process ended"
        buf += chunk
    line, _, rest = buf.partition(b"\n")
    return line, rest


def driver(channel_fd, cell_timeout):
    os.set_inheritable(channel_fd, False)
    _undumpable()
    channel = os.fdopen(channel_fd, "w", closefd=False)
    with open(".jupyter/cells.json", "rb") as f:
        cells = json.load(f)
    cmd_r, cmd_w = os.pipe()
    reply_r, reply_w = os.pipe()
    # The kernel's stdout and stderr are the run's (a cell's os.write, a subprocess) —
    # unless the channel is our stdout: then both go to stderr.
    out = 2 if channel_fd == 1 else 1
    kernel = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "kernel", str(cmd_r), str(reply_w),
         repr(cell_timeout)], stdin=subprocess.DEVNULL, stdout=out, stderr=2,
        pass_fds=(cmd_r, reply_w), close_fds=True)
    os.close(cmd_r)
    os.close(reply_w)
    commands = os.fdopen(cmd_w, "wb")
    buf = b""
    answered = 0
    for i, source in enumerate(cells):
        token = os.urandom(16).hex()
        try:
            commands.write(json.dumps({"i": i, "token": token, "source": source}).encode()
                           + b"\n")
            commands.flush()
        except BrokenPipeError:
            lost = "the kernel process ended"
        else:
            wait = cell_timeout + GRACE_S if cell_timeout > 0 else None
            line, rest = _read_reply(reply_r, buf, wait)
            lost = ""
            if line is None:
                lost = rest
                if lost == "timeout":
                    kernel.kill()
                    channel.write(json.dumps({
                        "cell": i, "stdout": "", "stderr": "", "display": [],
                        "error": [{"ename": "TimeoutError", "evalue": f"cell {i} ran "
                                   f"past cell_timeout={cell_timeout:g} s (the kernel "
                                   "ignored the interrupt and was killed)",
                                   "traceback": []}], "timed_out": True}) + "\n")
                    channel.flush()
                    break
            else:
                buf = rest
                try:
                    reply = json.loads(line)
                except ValueError:
                    reply = None
                if not isinstance(reply, dict) or reply.get("token") != token:
                    lost = "its answer to this cell was not the one asked for"
        if lost:
            kernel.kill()
            code = kernel.wait()
            channel.write(json.dumps({"cell": i, "lost": f"{lost} (exit status {code})"})
                          + "\n")
            channel.flush()
            break
        answered += 1
        reply.pop("token", None)
        reply["cell"] = i
        channel.write(json.dumps(reply) + "\n")
        channel.flush()
        if reply.get("timed_out"):
            break
    commands.close()
    try:
        kernel.wait(GRACE_S)
    except subprocess.TimeoutExpired:
        kernel.kill()
        kernel.wait()
    channel.write(json.dumps({"done": answered}) + "\n")
    channel.flush()


if __name__ == "__main__":
    if sys.argv[1] == "kernel":
        kernel(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
    else:
        driver(int(sys.argv[2]), float(sys.argv[3]))
