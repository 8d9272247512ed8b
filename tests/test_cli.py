"""`trialbox exec` end to end: a real process, a real sandbox, JSON out, exit codes."""

import json
import os
import subprocess
import sys

TRIALBOX = [sys.executable, "-m", "trialbox.cli"]


def _run(args, stdin=b""):
    return subprocess.run(TRIALBOX + args, input=stdin, capture_output=True, timeout=120)


def test_exec_file_json_passes_stdin(tmp_path):
    prog = tmp_path / "rev.py"
    prog.write_text("import sys\nprint(sys.stdin.read()[::-1])")
    p = _run(["exec", "--json", "--timeout", "5", "--file", str(prog)], stdin=b"abc")
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout)
    assert result["status"] == "ok" and result["stdout"] == "cba\n"
    assert result["tier"] == "namespace" and result["runtime"].startswith("python3")


def test_exec_command_and_candidate_failure_exit_code():
    p = _run(["exec", "--json", "--memory-mb", "64", "--", "/bin/sh", "-c", "exit 3"])
    assert p.returncode == 1
    assert json.loads(p.stdout)["exit_code"] == 3


def test_exec_usage_errors_exit_2_with_a_clear_message(tmp_path):
    p = _run(["exec", "--json", "--", "no-such-command-xyz"])
    assert p.returncode == 2 and b"not found on the sandbox PATH" in p.stderr
    p = _run(["exec", "--json", "--memory-mb", "-5", "--", "true"])
    assert p.returncode == 2 and b"Limits.memory_mb" in p.stderr
    weird = tmp_path / "prog.xyz"
    weird.write_text("x")
    p = _run(["exec", "--file", str(weird)])
    assert p.returncode == 2 and b"--language" in p.stderr
    p = _run(["exec", "--file", str(tmp_path / "missing.py")])
    assert p.returncode == 2 and b"cannot read" in p.stderr


def test_help_lists_the_commands():
    p = _run(["--help"])
    assert p.returncode == 0
    for word in (b"exec", b"bench", b"demo"):
        assert word in p.stdout
    assert os.path.basename(TRIALBOX[-1]) == "trialbox.cli"


def test_exec_writes_the_audit_log_that_audit_log_query_reads(tmp_path):
    """Issue 30: the README's `audit-log query` needs a log some command writes."""
    log = str(tmp_path / "audit.jsonl")
    p = _run(["exec", "--json", "--audit-log", log, "--timeout", "1", "--",
              "python3", "-c", "while True: pass"])
    assert p.returncode == 1 and json.loads(p.stdout)["status"] == "timeout", p.stderr
    p = _run(["exec", "--json", "--audit-log", log, "--", "/bin/sh", "-c", "exit 3"])
    assert p.returncode == 1, p.stderr
    q = _run(["audit-log", "query", "--file", log, "--status", "timeout"])
    assert q.returncode == 0, q.stderr
    (record,) = [json.loads(line) for line in q.stdout.splitlines()]
    assert record["closed"] and record["tier"] == "namespace"
    assert [c["argv"] for c in record["commands"]] == [["python3", "-c", "while True: pass"]]
    q = _run(["audit-log", "query", "--file", log, "--count"])
    assert q.returncode == 0 and q.stdout.strip() == b"2", q.stderr
