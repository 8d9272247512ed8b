"""split_check on shapes HumanEval itself does not have but other data sets do."""

from __future__ import annotations

import ast

import pytest

from trialbox.errors import UsageError
from trialbox.store.checks import split_check


def codes(source: str) -> tuple[str, list[str]]:
    setup, tests = split_check(source, where="t")
    return setup, [t.code for t in tests]


def test_setup_keeps_everything_but_check_in_order():
    setup, tests = codes("import math\n\n"
                         "def helper(x):\n    return x * 2\n\n"
                         "def check(candidate):\n    assert candidate(1) == helper(1)\n\n"
                         "# trailing comment\nLIMIT = 3\n"
                         "check(solve)\n")
    assert setup == ("import math\n\ndef helper(x):\n    return x * 2\n\n\n"
                     "# trailing comment\nLIMIT = 3")
    assert tests == ["assert candidate(1) == helper(1)"]


def test_statements_without_asserts_lead_the_next_test_or_trail_the_last():
    _, tests = codes("def check(candidate):\n"
                     "    xs = [1, 2]\n"
                     "    assert candidate(xs) == 3\n"
                     "    if candidate([]) != 0:\n"
                     "        assert False, 'empty'\n"
                     "    print('done')\n")
    assert tests == ["xs = [1, 2]\nassert candidate(xs) == 3",
                     "if candidate([]) != 0:\n    assert False, 'empty'\nprint('done')"]


def test_multiline_strings_are_not_dedented():
    source = ('def check(candidate):\n'
              '    assert candidate("""a\n'
              'b""") == 2\n'
              '    text = """\n'
              '  two spaces\n'
              '"""\n'
              '    assert candidate(text) == 3\n')
    _, tests = codes(source)
    ns: dict[str, object] = {"candidate": lambda s: s.count("\n") + 1}
    for code in tests:
        exec(code, ns)
    assert ns["text"] == "\n  two spaces\n"
    check = ast.parse(source).body[0]
    assert isinstance(check, ast.FunctionDef)
    assert [ast.dump(s) for c in tests for s in ast.parse(c).body] == [
        ast.dump(s) for s in check.body]


def test_decorated_and_nested_definitions_round_trip():
    source = ("import functools\n"
              "def check(candidate):\n"
              "    @functools.lru_cache\n"
              "    def want(n):\n"
              "        return n + 1\n"
              "    assert candidate(1) == want(1); assert candidate(2) == want(2)\n")
    setup, tests = codes(source)
    assert setup == "import functools"
    assert len(tests) == 2  # `;` makes two statements, each its own test
    assert tests[0].startswith("@functools.lru_cache\ndef want(n):")
    assert tests[1] == "assert candidate(2) == want(2)"
    ns: dict[str, object] = {"candidate": lambda n: n + 1}
    exec(setup, ns)
    for code in tests:
        exec(code, ns)


def test_error_names_where():
    with pytest.raises(UsageError) as e:
        split_check("x = 1\n", where="data.jsonl:7: task 'T/1'")
    assert str(e.value).startswith("data.jsonl:7: task 'T/1': field 'test' defines no")


def test_docstring_example():
    import doctest

    import trialbox.store.checks
    assert doctest.testmod(trialbox.store.checks).failed == 0
