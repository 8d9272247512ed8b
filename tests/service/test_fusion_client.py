"""SandboxFusion parity, checked with SandboxFusion's own client (`sandbox-fusion` 0.3.7
from PyPI, the `dev` extra) against a real `trialbox serve` on a socket — the way a new
user would try it: `set_endpoint(url)`, then `run_code`, `run_concurrent`, `run_jupyter`.

Every language the server offers is run once through the client (a program reading stdin)
and its verdict compared with the native API's (`POST /v1/exec`) on the same program;
each language also gets a memory bomb, which must end as the sandbox's memory limit
(the JVM's own heap limit, sized from the sandbox's, may stop it first: then the run
still fails and stays under the limit). The JVM, tsc and the go tool are slow: each
language's toolchain is exercised once per check.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from sandbox_fusion import (  # the dev extra (pip install -e .[dev]); never skipped
    CommandRunStatus,
    RunCodeRequest,
    RunCodeResponse,
    RunJupyterRequest,
    RunStatus,
    run_code,
    run_concurrent,
    SummaryMapping,
    run_jupyter,
    summary_run_code_result,
)

from tests.conftest import load_scaled
from tests.service.conftest import Server

MiB = 1 << 20


class MemoryRequest(RunCodeRequest):
    """The client's 0.3.7 model has no `memory_limit_MB` (SandboxFusion's server does):
    pydantic drops an unknown field, so a user adds it like this (run_code posts
    `request.dict()`)."""

    memory_limit_MB: int = -1


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    s = Server("--max-running", "4")
    yield s
    s.stop()


def call(server: Server, **kw: Any) -> RunCodeResponse:
    cls = MemoryRequest if "memory_limit_MB" in kw else RunCodeRequest
    return run_code(cls(**kw), endpoint=server.url, max_attempts=1, client_timeout=120)


def native(server: Server, code: str, language: str, stdin: str = "",
           limits: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "language": language, "stdin": stdin}
    if limits:
        body["limits"] = limits
    r = httpx.post(f"{server.url}/v1/exec", json=body, timeout=120)
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()["result"]
    return result


def verdict(resp: RunCodeResponse) -> str:
    """The client's view reduced to the native statuses it must agree with."""
    run = resp.run_result
    if run is None:
        return "compile_failed"
    if resp.status == RunStatus.Success:
        return "ok"
    if run.status == CommandRunStatus.TimeLimitExceeded:
        return "timeout"
    return "failed"


def native_verdict(result: dict[str, Any]) -> str:
    compiled = result.get("compile")
    if compiled is not None and compiled["status"] != "ok":
        return "compile_failed"
    return {"ok": "ok", "timeout": "timeout"}.get(result["status"], "failed")


# --------------------------------------------------------------------- languages

PROGRAMS: dict[str, tuple[str, str]] = {
    # language: (program reading "hello" from stdin, what it prints)
    "python": ("print('py', input())", "py hello"),
    "bash": ("read x; echo \"sh $x\"", "sh hello"),
    "cpp": ("#include <iostream>\n#include <string>\nint main(){std::string s;"
            "std::cin>>s;std::cout<<\"cpp \"<<s<<std::endl;}", "cpp hello"),
    "nodejs": ("const s = require('fs').readFileSync(0, 'utf8').trim();\n"
               "console.log('js', s);", "js hello"),
    "typescript": ("const s: string = require('fs').readFileSync(0, 'utf8').trim();\n"
                   "const n: number = 2;\nconsole.log('ts', s, n);", "ts hello 2"),
    "go": ("package main\nimport (\"bufio\"; \"fmt\"; \"os\")\nfunc main() {\n"
           " r := bufio.NewScanner(os.Stdin); r.Scan(); fmt.Println(\"go\", r.Text())\n}\n",
           "go hello"),
    "java": ("import java.util.Scanner;\npublic class Main {\n public static void main("
             "String[] a) { System.out.println(\"java \" + new Scanner(System.in)"
             ".nextLine()); }\n}\n", "java hello"),
    "rust": ("use std::io::Read;\nfn main() { let mut s = String::new(); std::io::stdin()"
             ".read_to_string(&mut s).unwrap(); println!(\"rust {}\", s.trim()); }\n",
             "rust hello"),
    # test runners: the code is a test file; the verdict is the runner's exit status
    "pytest": ("def test_add():\n    assert 1 + 2 == 3\n", "1 passed"),
    "jest": ("test('adds', () => { expect(1 + 2).toBe(3); });\n", ""),
    "go_test": ("package main\nimport \"testing\"\nfunc add(a, b int) int { return a + b }\n"
                "func TestAdd(t *testing.T) { if add(1, 2) != 3 { t.Fatal(\"1+2\") } }\n",
                "--- PASS: TestAdd"),
    "junit": ("import org.junit.Test;\nimport static org.junit.Assert.*;\n"
              "class Calc { static int add(int a, int b) { return a + b; } }\n"
              "public class CalcTest {\n @Test public void adds() { assertEquals(3, "
              "Calc.add(1, 2)); }\n}\n", "OK (1 test)"),
}

BOMBS: dict[str, str] = {
    # each touches 1 GiB (bash: 512 MiB; every page written), under a 256 MiB limit
    "python": "b = b'x' * (1 << 30)\nprint(len(b))",
    "bash": "x=a; for i in $(seq 29); do x=$x$x; done; echo ${#x}",  # 512 MiB string
    "cpp": "#include <vector>\n#include <cstdio>\nint main(){std::vector<char> v(1<<30, 1);"
           "std::printf(\"%d\", (int)v[12345]);}",
    "nodejs": "const b = Buffer.alloc(1 << 30, 1); console.log(b.length);",
    "typescript": "const b: Buffer = Buffer.alloc(1 << 30, 1); console.log(b.length);",
    "go": "package main\nimport \"fmt\"\nfunc main() { b := make([]byte, 1<<30)\n"
          " for i := range b { b[i] = 1 }\n fmt.Println(len(b)) }\n",
    "java": "import java.util.*;\npublic class Main {\n public static void main(String[] a) {"
            " List<byte[]> l = new ArrayList<>(); while (true) { byte[] b = new byte[8 << 20];"
            " Arrays.fill(b, (byte) 1); l.add(b); } }\n}\n",
    "rust": "fn main() { let v = vec![1u8; 1 << 30]; println!(\"{}\", v[12345]); }\n",
    "pytest": "def test_bomb():\n    b = b'x' * (1 << 30)\n    assert len(b)\n",
    "jest": "test('bomb', () => { expect(Buffer.alloc(1 << 30, 1).length).toBe(1 << 30); });\n",
    "go_test": "package main\nimport \"testing\"\nfunc TestBomb(t *testing.T) {\n"
               " b := make([]byte, 1<<30)\n for i := range b { b[i] = 1 }\n"
               " if len(b) == 0 { t.Fatal(\"empty\") } }\n",
    "junit": "import org.junit.Test;\nimport java.util.*;\npublic class BombTest {\n"
             " @Test public void bomb() { List<byte[]> l = new ArrayList<>(); while (true) {"
             " byte[] b = new byte[8 << 20]; Arrays.fill(b, (byte) 1); l.add(b); } }\n}\n",
}
JVM = {"java", "junit"}
RUNNERS = {"pytest", "jest", "go_test", "junit"}
SLOW = pytest.mark.timeout(400)  # every toolchain once; the JVM, tsc and go are slow


@SLOW
def test_every_language_through_the_client_same_verdict_as_native(server: Server) -> None:
    offered = httpx.get(f"{server.url}/v1/languages", timeout=10).json()["languages"]
    assert set(PROGRAMS) <= set(offered), f"not installed here: {set(PROGRAMS) - set(offered)}"
    langs = sorted(PROGRAMS)
    responses = run_concurrent(
        call, kwargs=[{"server": server, "code": PROGRAMS[lang][0], "language": lang,
                       "stdin": "hello\n", "compile_timeout": 60, "run_timeout": 60}
                      for lang in langs], concurrency=4)
    natives = run_concurrent(
        native, kwargs=[{"server": server, "code": PROGRAMS[lang][0], "language": lang,
                         "stdin": "hello\n", "limits": {"wall_s": 60}} for lang in langs],
        concurrency=4)
    for lang, resp, nat in zip(langs, responses, natives, strict=True):
        run = resp.run_result
        assert resp.status == RunStatus.Success, (lang, resp)
        assert run is not None and run.return_code == 0
        out = (run.stdout or "") + (run.stderr or "")  # jest reports on stderr
        assert PROGRAMS[lang][1] in out, (lang, out)
        assert verdict(resp) == native_verdict(nat) == "ok", (lang, nat)


@SLOW
def test_memory_bomb_in_every_language_is_stopped(server: Server) -> None:
    langs = sorted(BOMBS)
    responses = run_concurrent(
        call, kwargs=[{"server": server, "code": BOMBS[lang], "language": lang,
                       "compile_timeout": 60, "run_timeout": 60, "memory_limit_MB": 256}
                      for lang in langs], concurrency=4)
    for lang, resp in zip(langs, responses, strict=True):
        assert resp.status == RunStatus.Failed, (lang, resp)
        got = resp.dict()["run_result"]
        assert got is not None, (lang, resp.compile_result)
        if lang in JVM:  # the JVM's heap (a quarter of the sandbox's memory) fills first
            assert got["status"] == "Finished" and got["return_code"] != 0, (lang, got)
            out = (got["stdout"] or "") + (got["stderr"] or "")
            assert "OutOfMemoryError" in out or "trialbox: memory limit" in out, (lang, got)
        else:  # the sandbox's limit: Finished with a return code, the reason on
            # stderr, as SandboxFusion reports its kills (trialbox_status `memory`:
            # native, below). A test runner whose test process was killed reports its
            # own exit code.
            assert got["status"] == "Finished" and got["return_code"] != 0, (lang, got)
            assert "trialbox: memory limit" in got["stderr"], (lang, got)
            if lang not in RUNNERS:
                assert got["return_code"] == -9, (lang, got)


def test_memory_kill_reads_as_the_clients_read_it(server: Server) -> None:
    """The reason where the typed client keeps it (stderr; it drops `message` and
    `trialbox_status`), and a return code its `summary_run_code_result` can classify —
    it raises on a null one."""
    resp = call(server, code=BOMBS["python"], language="python", memory_limit_MB=128)
    run = resp.run_result
    assert resp.status == RunStatus.Failed and run is not None
    assert run.status == CommandRunStatus.Finished and run.return_code == -9
    assert "trialbox: memory limit" in (run.stderr or ""), run
    assert summary_run_code_result(resp, SummaryMapping(RunFailed="oom")) == "oom"


def test_memory_bomb_native_verdicts_match(server: Server) -> None:
    for lang in ("python", "cpp", "nodejs"):
        resp = call(server, code=BOMBS[lang], language=lang, memory_limit_MB=256)
        nat = native(server, BOMBS[lang], lang, limits={"memory_mb": 256})
        assert nat["status"] == "memory", (lang, nat)
        assert verdict(resp) == native_verdict(nat) == "failed"


# --------------------------------------------------------------------- memory_limit_MB

ALLOC = "b = b'x' * ({mb} << 20)\nprint(len(b) >> 20)"


def test_memory_limit_mb_is_honoured(server: Server) -> None:
    # the client's own model silently drops the field: say so, and send it as users must
    assert "memory_limit_MB" not in RunCodeRequest(code="1", language="python",
                                                   memory_limit_MB=128).dict()
    small = call(server, code=ALLOC.format(mb=300), language="python", memory_limit_MB=128)
    assert small.status == RunStatus.Failed
    assert small.run_result is not None and small.run_result.return_code == -9
    big = call(server, code=ALLOC.format(mb=600), language="python", memory_limit_MB=1024)
    assert big.status == RunStatus.Success, big
    assert big.run_result is not None and big.run_result.stdout == "600\n"
    # above the server's cap: a clear refusal naming the field and the cap, nothing run
    with pytest.raises(Exception, match=r"memory_limit_MB.*cap of 4096 MiB"):
        call(server, code="print(1)", language="python", memory_limit_MB=8192)
    # without the field: the server's default (512 MiB) — 600 MB does not fit
    default = call(server, code=ALLOC.format(mb=600), language="python")
    assert default.status == RunStatus.Failed


# --------------------------------------------------------------------- run_code features

def test_stdin_files_and_fetch_files(server: Server) -> None:
    code = ("import sys\ndata = open('in/data.txt').read()\n"
            "open('out.txt', 'w').write(data.upper() + sys.stdin.read())\nprint('done')")
    resp = call(server, code=code, language="python", stdin="!",
                files={"in/data.txt": base64.b64encode(b"abc").decode()},
                fetch_files=["out.txt", "missing.txt"])
    assert resp.status == RunStatus.Success
    assert resp.run_result is not None and resp.run_result.stdout == "done\n"
    assert base64.b64decode(resp.files["out.txt"]) == b"ABC!"
    assert "missing.txt" not in resp.files


def test_absolute_file_paths_are_placed_as_sandboxfusion_places_them(
        server: Server) -> None:
    """SandboxFusion writes an absolute `files` name at that path (its docs' example is
    /tmp/flag.txt) and fetches an absolute `fetch_files` name from there; a relative
    name is in the directory the code runs in. One attempt: a 400 here would be retried
    by the client for ~50 s."""
    code = "\n".join([
        "import os",
        "got = [open(p).read() for p in ('/tmp/flag.txt', '/tmp/a/b/deep.txt',",
        "                                '/workspace/in/ws.txt', 'rel.txt')]",
        "os.makedirs('/tmp/out', exist_ok=True)",
        "open('/tmp/out/result.txt', 'w').write(''.join(got))",
        "print(sorted(os.listdir('.')))"])
    b64 = {name: base64.b64encode(data).decode() for name, data in (
        ("/tmp/flag.txt", b"F"), ("/tmp/a/b/deep.txt", b"D"),
        ("/workspace/in/ws.txt", b"W"), ("rel.txt", b"R"))}
    resp = call(server, code=code, language="python", files=b64,
                fetch_files=["/tmp/out/result.txt", "/tmp/flag.txt", "/tmp/none.txt",
                             "/workspace/rel.txt"])
    assert resp.status == RunStatus.Success, resp
    assert resp.run_result is not None
    assert ".trialbox-files" not in (resp.run_result.stdout or ""), resp.run_result.stdout
    got = {name: base64.b64decode(data) for name, data in resp.files.items()}
    assert got == {"/tmp/out/result.txt": b"FDWR", "/tmp/flag.txt": b"F",
                   "/workspace/rel.txt": b"R"}
    # run_jupyter takes the same files
    nb = run_jupyter(RunJupyterRequest(cells=["print(open('/tmp/flag.txt').read())"],
                                       files={"/tmp/flag.txt": b64["/tmp/flag.txt"]}),
                     endpoint=server.url, max_attempts=1, client_timeout=60)
    assert nb.status == RunStatus.Success and nb.cells[0].stdout == "F\n", nb
    # where no file can go (the read-only rest of the file system): refused at once,
    # naming the places that take one
    with pytest.raises(Exception, match=r"400.*/etc/x.*/workspace/, /tmp/, /dev/shm/"):
        call(server, code="print(1)", language="python",
             files={"/etc/x": b64["rel.txt"]})


def test_timeout_and_compile_error(server: Server) -> None:
    slow = call(server, code="while True: pass", language="python", run_timeout=1)
    assert slow.status == RunStatus.Failed
    assert slow.run_result is not None
    assert slow.run_result.status == CommandRunStatus.TimeLimitExceeded
    assert slow.run_result.execution_time is not None
    assert slow.run_result.execution_time < load_scaled(5)  # seconds, about its limit
    broken = call(server, code="int main() { return x; }", language="cpp")
    assert broken.status == RunStatus.Failed and broken.run_result is None
    assert broken.compile_result is not None and broken.compile_result.return_code != 0
    assert "x" in (broken.compile_result.stderr or "")
    assert verdict(broken) == native_verdict(
        native(server, "int main() { return x; }", "cpp")) == "compile_failed"
    failing = call(server, code="def test_no():\n    assert 1 == 2\n", language="pytest")
    assert failing.status == RunStatus.Failed and failing.run_result is not None
    assert failing.run_result.return_code == 1 and "1 failed" in (failing.run_result.stdout or "")


def test_run_concurrent(server: Server) -> None:
    n = 12
    responses = run_concurrent(call, kwargs=[{"server": server, "language": "python",
                                              "code": f"print({i} * {i})"} for i in range(n)],
                               concurrency=n)
    assert [r.run_result.stdout for r in responses if r.run_result] == \
        [f"{i * i}\n" for i in range(n)]


def test_unknown_language_lists_what_is_offered(server: Server) -> None:
    # 'php' is in the client's Literal of languages; this server does not offer it
    with pytest.raises(Exception, match=r"400.*language .php.*installed here: .*go.*python"):
        call(server, code="<?php echo 1;", language="php")


# --------------------------------------------------------------------- /run_jupyter

def test_run_jupyter_through_the_client(server: Server) -> None:
    cells = ["a = 123", "a", "print(a)", "import sys; sys.stderr.write('stderr message')",
             "raise RuntimeError('error message')", "open('nb.txt', 'w').write(str(a + 1))"]
    resp = run_jupyter(RunJupyterRequest(cells=cells, fetch_files=["nb.txt"]),
                       endpoint=server.url, max_attempts=1, client_timeout=60)
    assert resp.status == RunStatus.Success, resp
    assert len(resp.cells) == len(cells)
    assert resp.cells[1].display == [{"text/plain": "123"}]
    assert resp.cells[2].stdout == "123\n" and resp.cells[2].display == []
    assert resp.cells[3].stderr == "stderr message"
    assert resp.cells[4].error[0]["ename"] == "RuntimeError"
    assert resp.cells[4].error[0]["evalue"] == "error message"
    assert base64.b64decode(resp.files["nb.txt"]) == b"124"  # the cell after the error ran
    assert resp.driver is not None and resp.driver.status == CommandRunStatus.Finished


def test_run_jupyter_cell_timeout_and_files(server: Server) -> None:
    resp = run_jupyter(RunJupyterRequest(
        cells=["x = open('in.txt').read()", "x", "while True: pass", "print('never')"],
        cell_timeout=1, total_timeout=20,
        files={"in.txt": base64.b64encode(b"given").decode()}),
        endpoint=server.url, max_attempts=1, client_timeout=60)
    assert resp.status == RunStatus.Failed and "cell_timeout" in resp.message
    assert resp.cells[1].display == [{"text/plain": "'given'"}]
    assert len(resp.cells) == 3 and resp.cells[2].error[0]["ename"] == "TimeoutError"
