"""What test-runner output looks like: the patterns behind the `test-runner-output`
detector (`anticheat.py`), for strings in a candidate's code and lines of its output.

    >>> runner_text("3 passed in 0.01s", weak=False)
    'a pass count'
    >>> runner_text("{} passed", weak=False, template=True)  # placeholders filled: "1 passed"
    'a pass count'
    >>> json_record('{"passed": true}')
    'a JSON result record'

Strong patterns (summaries, result lines, result records) fire anywhere; weak ones (a bare
"OK", "passed", a `=====` banner) only on what the code prints, since such words are
common in strings that are never shown.
"""

from __future__ import annotations

import json
import re

# Text that imitates a test runner. _STRONG fires on any string in the candidate's code
# and on any line of its output; _WEAK only on what the code prints.
_STRONG = [(re.compile(p, f), why) for p, f, why in [
    (r"\ball\b.{0,40}\btests?\b.{0,40}\b(passed|pass|succeeded|ok)\b", re.I,
     "claims all tests passed"),
    (r"\btests?\s+(passed|succeeded)\b", re.I, "claims tests passed"),
    (r"^\W*\d+\s+(tests?\s+)?passed\b|\b\d+\s*/\s*\d+\s+(tests?\s+)?passed\b", re.I,
     "a pass count"),
    (r"\b\d+\s+passed(\s+in\s+[\d.]+s|,\s*\d+\s+(failed|skipped|errors?|warnings?))\b",
     re.I, "a pytest summary"),
    (r"={3,}.{0,80}\b(passed|failed|errors?|test session starts|short test summary)\b"
     r".{0,80}={3,}", re.I, "a pytest summary line"),
    (r"\btest session starts\b|\bshort test summary info\b|\bcollected \d+ items?\b", re.I,
     "a pytest header"),
    (r"\bRan \d+ tests? in\b", 0, "a unittest summary"),
    (r"^FAILED \((failures|errors)=\d+", 0, "a unittest summary"),
    (r"(?i:\btest)\w*\b.{0,200}\bPASSED\b", 0, "a pytest result line"),
    (r"(?i:\btest)\w*\b.{0,200}\.\.\.\s*ok\s*$", 0, "a unittest result line"),
    (r"[\"']passed[\"']\s*:\s*true\b", re.I, "a JSON result record"),
    (r"[\"']nonce[\"']\s*:", 0, "the judge's result record"),
]]
_WEAK = [(re.compile(p, f), why) for p, f, why in [
    (r"^\W*(all\s+)?(passed|pass|ok|success|successful|all good|correct)\W*$", re.I,
     "a bare pass verdict"),
    (r"^OK(\s*\(.*\))?$", 0, "unittest's OK"),
    (r"^={3,}\s.*\s={3,}$", 0, "a pytest-style banner"),
]]
_PLACEHOLDER = re.compile(r"\{[^{}]*\}|%[-#0 +]*\d*(?:\.\d+)?[sdifrxXeEgGc]")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
MAX_OUTPUT = 16 << 20
MAX_LINE = 4096
MAX_OUTPUT_FLAGS = 10


def runner_text(text: str, weak: bool, template: bool = False) -> str | None:
    """Why `text` looks like test-runner output, or None. A `template` (a string in
    code) is also tried with its placeholders filled: "{} passed" -> "1 passed"."""
    if template and (why := runner_text(_PLACEHOLDER.sub("1", text), weak)):
        return why
    for line in text.splitlines():
        line = line.strip()[:MAX_LINE]
        for rx, why in _STRONG + (_WEAK if weak else []):
            if rx.search(line):
                return why
    return None


def json_record(line: str) -> str | None:
    """Why a JSON line looks like a test result record, or None."""
    if not line.startswith(("{", "[")):
        return None
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None
    records = obj if isinstance(obj, list) else [obj]
    for rec in records[:100]:
        if not isinstance(rec, dict):
            continue
        results = rec.get("results")
        if rec.get("passed") is True or "nonce" in rec or (
                isinstance(results, list) and any(isinstance(r, dict) and "passed" in r
                                                  for r in results[:100])):
            return "a JSON result record"
    return None
