"""`/run_jupyter` for ordinary notebooks, on the shared server: the kernel behaves as a
Jupyter kernel does (imports from the workspace, SystemExit is a cell's error, stdin is
empty, a subprocess's output is the driver's), a kernel that ignores its cell timeout
is stopped, and every answer says whose word the cells are. (Forgeries: tests/adversarial
/test_j_service.py.)"""

from __future__ import annotations

import base64
from typing import Any

import httpx


def _nb(client: httpx.Client, cells: list[str], **kw: Any) -> dict[str, Any]:
    r = client.post("/run_jupyter", json={"cells": cells, "total_timeout": 30, **kw})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def test_an_ordinary_notebook(client: httpx.Client) -> None:
    helper = base64.b64encode(b"def double(x):\n    return 2 * x\n").decode()
    nb = _nb(client, ["from helper import double", "double(21)",
                      "raise SystemExit(3)", "input()",
                      "import subprocess; subprocess.run(['echo', 'from a child'])",
                      "print('last')"], files={"helper.py": helper})
    assert nb["status"] == "Success", nb
    cells = nb["cells"]
    assert cells[1]["display"] == [{"text/plain": "42"}]
    assert cells[2]["error"][0]["ename"] == "SystemExit"  # and the next cell ran
    assert cells[3]["error"][0]["ename"] == "EOFError"
    assert nb["driver"]["stdout"] == "from a child\n"
    assert cells[5]["stdout"] == "last\n"
    assert "program's own report" in nb["trust"] and "/v1/submissions" in nb["trust"]
    assert _nb(client, [])["status"] == "Success"


def test_a_kernel_that_ignores_its_cell_timeout_is_stopped(client: httpx.Client) -> None:
    nb = _nb(client, ["import signal; signal.signal(signal.SIGALRM, signal.SIG_IGN)",
                      "while True: pass", "print('never')"], cell_timeout=1)
    assert nb["status"] == "Failed" and "cell_timeout" in nb["message"], nb
    assert len(nb["cells"]) == 2
    assert nb["cells"][1]["error"][0]["ename"] == "TimeoutError"


def test_a_kernel_that_exits_stops_the_notebook(client: httpx.Client) -> None:
    nb = _nb(client, ["x = 1", "import os; os._exit(0)", "x"])
    assert nb["status"] == "Failed" and len(nb["cells"]) == 1, nb
    assert "stopped answering at cell 1" in nb["message"], nb["message"]
