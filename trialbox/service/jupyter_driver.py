# Runs inside the sandbox under the runtime's python3 (not the project's venv): the
# notebook driver of `POST /run_jupyter` (trialbox/service/jupyter.py).
#
#   python3 .jupyter/driver.py CELLS_JSON CELL_TIMEOUT_S
#
# Executes the cells in order in one namespace, as a Jupyter kernel would: each cell's
# stdout and stderr captured apart, the value of a cell's last expression displayed as
# {"text/plain": repr(value)} (None is not displayed), an exception recorded as
# {"ename", "evalue", "traceback"} and the next cell run anyway. A cell past CELL_TIMEOUT_S
# (0: none) is interrupted and the notebook stops there. One JSON line per finished cell
# goes to .jupyter/cells.jsonl, flushed as it is written, so the cells done before the
# whole run is stopped (total_timeout, memory) are still reported.
import ast
import contextlib
import io
import json
import signal
import sys
import traceback


class CellTimeout(BaseException):
    pass


def _alarm(signum, frame):
    raise CellTimeout()


def main():
    with open(sys.argv[1]) as f:
        cells = json.load(f)
    cell_timeout = float(sys.argv[2])
    signal.signal(signal.SIGALRM, _alarm)
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    out = open(".jupyter/cells.jsonl", "w")
    for i, source in enumerate(cells):
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
        out.write(json.dumps({"stdout": stdout.getvalue(), "stderr": stderr.getvalue(),
                              "display": display, "error": error,
                              "timed_out": timed_out}) + "\n")
        out.flush()
        if timed_out:
            break
    out.close()


if __name__ == "__main__":
    main()
