"""Split a HumanEval-style `check(candidate)` test program into separate test cases.

HumanEval's `test` field is a Python module that defines `check(candidate)`, whose body
is a run of asserts. Graded as one unit it gives one bit per task; split, each assert is
its own piece of evidence. `split_check` does the split without changing what runs:

    >>> setup, tests = split_check('''
    ... METADATA = {}
    ... def check(candidate):
    ...     import math
    ...     assert candidate(4) == 2
    ...     for x in (1, 9):
    ...         assert candidate(x) == math.sqrt(x)
    ... ''', where="demo")
    >>> setup
    'METADATA = {}'
    >>> for t in tests: print(f"# {t.name}", t.code, sep="\\n")
    # test_0
    import math
    assert candidate(4) == 2
    # test_1
    for x in (1, 9):
        assert candidate(x) == math.sqrt(x)

The rule: the module minus `check` is the setup. In `check`'s body, each top-level
statement that contains an assert (anywhere inside it: a loop of asserts is one test) is
one test case; statements without one (imports, helper variables, `print`, and vacuous
`assert True`) lead the next test's code, or trail the last test when none follows. Run
in order in one namespace, the tests therefore execute exactly the statements `check`
would, in the same order, with `candidate` a global instead of a parameter. (A top-level
`check(f)` call, which some data sets append, is left out of the setup: the judge runs the
tests itself.)
"""

from __future__ import annotations

import ast
import re
import textwrap

from trialbox.errors import UsageError
from trialbox.types import TestCase


def split_check(source: str, where: str) -> tuple[str, tuple[TestCase, ...]]:
    """Return `(test_setup, tests)` for a module defining `check(candidate)`.

    `where` prefixes error messages (e.g. `tasks.jsonl:12: task 'HumanEval/3'`).
    Raises `UsageError` when the source does not parse, has no (or more than one)
    top-level `check`, `check` does not take one parameter named `candidate`, or its
    body asserts nothing.
    """
    try:
        module = ast.parse(source)
    except SyntaxError as e:
        raise UsageError(f"{where}: field 'test' is not valid Python: {e.msg} (line "
                         f"{e.lineno} of the test source); fix the test source") from None
    check = _find_check(module, where)

    # ---- setup: every line of the module outside `def check`, in order. A top-level
    # `check(some_function)` call is dropped too: the judge runs the tests itself.
    assert check.end_lineno is not None  # ast.parse sets it
    first = min([check.lineno] + [d.lineno for d in check.decorator_list])
    drop = set(range(first, check.end_lineno + 1))
    for node in module.body:
        if _is_check_call(node):
            drop |= set(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    # Split on what the tokenizer calls a line end (str.splitlines also splits on \f,
    # \u2028 and others, which would shift the line numbers ast reports).
    lines = re.split(r"\r\n|\r|\n", source)
    setup = _trim("\n".join(line for i, line in enumerate(lines, start=1) if i not in drop))

    # ---- tests: one per asserting statement, with pending non-test lines in front
    tests: list[str] = []
    pending: list[str] = []
    for stmt in check.body:
        code = _statement_source(source, stmt)
        if _asserts(stmt):
            tests.append("\n".join([*pending, code]))
            pending = []
        else:
            pending.append(code)
    if not tests:
        raise UsageError(f"{where}: field 'test': check(candidate) asserts nothing, so no "
                         "test case can be made; add assert statements")
    if pending:
        tests[-1] = "\n".join([tests[-1], *pending])
    return setup, tuple(TestCase(name=f"test_{i}", code=c) for i, c in enumerate(tests))


def _find_check(module: ast.Module, where: str) -> ast.FunctionDef:
    found = [n for n in module.body
             if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "check"]
    if not found:
        raise UsageError(f"{where}: field 'test' defines no top-level `def check(candidate):`;"
                         " put the asserts in such a function")
    if len(found) > 1:
        lines = ", ".join(str(n.lineno) for n in found)
        raise UsageError(f"{where}: field 'test' defines `check` {len(found)} times (lines "
                         f"{lines} of the test source); keep one")
    check = found[0]
    if isinstance(check, ast.AsyncFunctionDef):
        raise UsageError(f"{where}: field 'test': `check` is `async def`; make it a plain "
                         "`def check(candidate):`")
    a = check.args
    params = [*a.posonlyargs, *a.args]
    if (len(params) != 1 or params[0].arg != "candidate" or a.vararg or a.kwarg
            or a.kwonlyargs):
        raise UsageError(f"{where}: field 'test': `check` must take exactly one parameter "
                         f"named `candidate` (the tests refer to it by that name), got "
                         f"`def check({ast.unparse(a)})`")
    return check


def _asserts(stmt: ast.stmt) -> bool:
    """True if running `stmt` can fail an assert: it holds an assert that is not vacuous
    (`assert True, "..."` appears in HumanEval as a placeholder and tests nothing)."""
    return any(isinstance(n, ast.Assert)
               and not (isinstance(n.test, ast.Constant) and bool(n.test.value))
               for n in ast.walk(stmt))


def _statement_source(source: str, stmt: ast.stmt) -> str:
    """The statement's own source text, dedented to run at module level.

    Falls back to `ast.unparse` when the text cannot be lifted faithfully (a decorator,
    or a multi-line string whose lines dedenting would change)."""
    segment = ast.get_source_segment(source, stmt, padded=True)
    if segment is not None:
        code = textwrap.dedent(segment).strip("\n")
        try:
            lifted = ast.parse(code).body
        except SyntaxError:
            lifted = []
        if [ast.dump(s) for s in lifted] == [ast.dump(stmt)]:
            return code
    return ast.unparse(stmt)


def _is_check_call(node: ast.stmt) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name) and node.value.func.id == "check")


def _trim(text: str) -> str:
    """Drop blank lines at both ends (inner ones stay: they may be inside a string)."""
    lines = text.split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join(lines)
