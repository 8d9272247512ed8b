"""SandboxFusion compatibility of POST /run_code.

`verl_call` and `verl_classify` reproduce, from its documented API, what verl's
`sandbox_fusion` reward client (verl/utils/reward_score/sandbox_fusion/utils.py) does:
it POSTs {"compile_timeout", "run_timeout", "code", "stdin", "memory_limit_MB",
"language", "files": {}, "fetch_files": []} as JSON, retries on HTTP 504, and reads
`status`, `compile_result` and `run_result` (`status`, `return_code`, `stdout`) to put
the case in one of success / wrong_answer / compile_error / timeout / runtime_error /
sandbox_error. Nothing of verl is vendored or imported.
"""

from __future__ import annotations

import base64
import json
import textwrap
import time
from typing import Any

import httpx
import pytest

from tests.conftest import load_scaled
from trialbox.store.tasks import load_humaneval

RESPONSE_KEYS = {"status", "message", "compile_result", "run_result", "executor_pod_name",
                 "files"}
RESULT_KEYS = {"status", "execution_time", "return_code", "stdout", "stderr"}


def verl_call(url: str, code: str, stdin: str | None = None, compile_timeout: float = 10,
              run_timeout: float = 10, memory_limit_mb: int = 1024,
              language: str = "python") -> tuple[dict[str, Any] | None, str | None]:
    payload = json.dumps({"compile_timeout": compile_timeout, "run_timeout": run_timeout,
                          "code": code, "stdin": stdin, "memory_limit_MB": memory_limit_mb,
                          "language": language, "files": {}, "fetch_files": []})
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    error = None
    for attempt in range(3):
        try:
            r = httpx.post(url, headers=headers, content=payload,
                           timeout=compile_timeout + run_timeout + 10)
            if r.status_code == 504:
                error = f"gateway timeout, attempt {attempt + 1}"
                time.sleep(0.2)
                continue
            r.raise_for_status()
            return r.json(), None
        except httpx.HTTPError as e:
            return None, f"API request error: {e}"
    return None, error


def verl_classify(api: dict[str, Any] | None, error: str | None,
                  expected_output: str | None = None) -> str:
    if error or api is None:
        return "api_error"
    compile_result, run_result = api.get("compile_result"), api.get("run_result")
    status = api.get("status")
    if status == "SandboxError":
        return "sandbox_error"
    if status == "Failed":
        if compile_result and (compile_result.get("status") in ("Error", "TimeLimitExceeded")
                               or (compile_result.get("status") == "Finished"
                                   and compile_result.get("return_code") != 0)):
            return "compile_error"
        if run_result:
            rs = run_result.get("status")
            if rs == "TimeLimitExceeded":
                return "timeout"
            if rs == "Error" or (rs == "Finished" and run_result.get("return_code") != 0):
                return "runtime_error"
        return "unknown_failure"
    if status == "Success":
        if run_result and run_result.get("status") == "Finished":
            if expected_output is None:
                return "success"
            got = (run_result.get("stdout") or "").strip()
            return "success" if got == expected_output.strip() else "wrong_answer"
        return "unexpected_success_state"
    return "unknown_api_status"


def _shape(api: dict[str, Any]) -> None:
    assert set(api) >= RESPONSE_KEYS
    assert api["status"] in ("Success", "Failed", "SandboxError")
    for key in ("compile_result", "run_result"):
        if api[key] is not None:
            assert set(api[key]) >= RESULT_KEYS
            assert api[key]["status"] in ("Finished", "TimeLimitExceeded", "Error")


@pytest.fixture(scope="module")
def url(server: Any) -> str:
    return f"{server.url}/run_code"


def test_verl_cases(url: str) -> None:
    cases = [  # (code, language, stdin, expected stdout, verl's classification)
        ("print(int(input()) * 2)", "python", "21\n", "42", "success"),
        ("print(int(input()) * 3)", "python", "21\n", "42", "wrong_answer"),
        ("raise ValueError('boom')", "python", "", None, "runtime_error"),
        ("while True: pass", "python", "", None, "timeout"),
        ("int main( { return 0; }", "cpp", "", None, "compile_error"),
        ('#include <iostream>\nint main(){int x; std::cin >> x; std::cout << x + 1;}',
         "cpp", "41", "42", "success"),
        ("echo $((6 * 7))", "bash", "", "42", "success"),
    ]
    for code, lang, stdin, expected, want in cases:
        api, err = verl_call(url, code, stdin, run_timeout=1 if "while" in code else 10,
                             language=lang)
        assert api is not None, err
        _shape(api)
        assert verl_classify(api, err, expected) == want, (code, api)


def test_memory_and_output_statuses_it_lacks(url: str) -> None:
    api, _ = verl_call(url, "x = bytearray(512 << 20)\nprint(len(x))", memory_limit_mb=64)
    assert api is not None
    assert api["status"] == "Failed" and api["run_result"]["status"] == "Finished"
    assert api["run_result"]["return_code"] == -9
    assert api["run_result"]["trialbox_status"] == "memory"
    assert "memory" in api["run_result"]["message"].lower()
    assert verl_classify(api, None) == "runtime_error"
    flood, _ = verl_call(url, "import sys\nwhile True: sys.stdout.write('y' * 65536)")
    assert flood is not None and flood["run_result"]["trialbox_status"] == "output"
    assert flood["status"] == "Failed"


def test_files_and_fetch_files(url: str) -> None:
    r = httpx.post(url, json={
        "code": "open('out.bin', 'wb').write(open('in.bin', 'rb').read()[::-1])",
        "language": "python", "files": {"in.bin": base64.b64encode(b"\x00abc").decode()},
        "fetch_files": ["out.bin", "absent"]}, timeout=30)
    api = r.json()
    assert api["status"] == "Success", api
    assert base64.b64decode(api["files"]["out.bin"]) == b"cba\x00"
    assert "absent" not in api["files"]


def test_compile_result_and_execution_time(url: str) -> None:
    api, _ = verl_call(url, '#include <cstdio>\nint main(){puts("hi");return 0;}',
                       language="cpp")
    assert api is not None and api["status"] == "Success"
    assert api["compile_result"]["status"] == "Finished"
    assert api["compile_result"]["return_code"] == 0
    assert api["run_result"]["stdout"] == "hi\n"
    assert 0 < api["run_result"]["execution_time"] < load_scaled(5)  # seconds, not ms
    crash, _ = verl_call(url, "import os\nos.kill(os.getpid(), 11)")
    assert crash is not None and crash["run_result"]["status"] == "Finished"
    assert crash["run_result"]["return_code"] == -11
    assert crash["run_result"]["trialbox_status"] == "signal"


HUMANEVAL = load_humaneval()


def _wrong(task: Any) -> str:
    """A plausible wrong completion: the canonical body returning a different value."""
    return "    return None\n"


def test_humaneval_same_pass_fail_as_native(server: Any, url: str) -> None:
    """Each HumanEval program (prompt + completion + its `check`), sent the way a
    SandboxFusion user sends it, passes on /run_code exactly when the trusted judge
    (/v1/submissions) passes the same completion."""
    native = server.client()
    for task in HUMANEVAL[::14]:  # 12 tasks spread over the set
        test = "\n".join(textwrap.indent(t.code, "    ") for t in task.hidden_tests)
        check = f"{task.test_setup}\n\ndef check(candidate):\n{test}\n"
        for completion in (task.canonical_solution, _wrong(task)):
            program = f"{task.prompt}{completion}\n\n{check}\ncheck({task.entry_point})\n"
            api, err = verl_call(url, program, run_timeout=10)
            fusion_pass = verl_classify(api, err) == "success"
            grade = native.post("/v1/submissions", json={"task_id": task.task_id,
                                                          "completion": completion}).json()
            assert grade["outcome"] in ("passed", "failed"), grade
            assert fusion_pass == grade["passed"], (task.task_id, completion, api, grade)
            assert fusion_pass == (completion is task.canonical_solution)
