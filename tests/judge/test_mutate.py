"""AST mutation sites (judge/mutate.py): each operator's edit, only its own bytes
changed, in source order, and nothing offered that would not parse."""

from __future__ import annotations

import pytest

from trialbox.judge.mutate import OPERATORS, apply_mutation, mutation_sites, still_parses


def edits(source: str, operator: str) -> list[str]:
    src = source.encode()
    return [apply_mutation(src, m).decode() for m in mutation_sites("m.py", src)
            if m.operator == operator]


@pytest.mark.parametrize("operator, source, expected", [
    ("compare", "def f(a, b):\n    return a < b\n", ["def f(a, b):\n    return a <= b\n"]),
    ("compare", "def f(a):\n    return a is not None\n",
     ["def f(a):\n    return a is None\n"]),
    ("compare", "def f(a, b):\n    return a not in b\n",
     ["def f(a, b):\n    return a in b\n"]),
    ("binop", "def f(a, b):\n    return a + b  # sum\n",
     ["def f(a, b):\n    return a - b  # sum\n"]),
    ("binop", "def f(n):\n    n += 2\n    return n\n", ["def f(n):\n    n -= 2\n    return n\n"]),
    ("boolop", "def f(a, b):\n    return a or b\n", ["def f(a, b):\n    return a and b\n"]),
    ("int", "LIMIT = 3\n\n\ndef f(xs):\n    return xs[0]\n",
     ["LIMIT = 3\n\n\ndef f(xs):\n    return xs[1]\n"]),  # module constants: left alone
    ("swap-args", "def f(a, b):\n    return pow(a,  b)\n",
     ["def f(a, b):\n    return pow(b,  a)\n"]),
    ("return-none", "def f(a):\n    return a * 2\n", ["def f(a):\n    return None\n"]),
    ("drop", 'def f(a):\n    """Doc."""\n    a.sort()\n    return a\n',
     ['def f(a):\n    """Doc."""\n    return a\n', 'def f(a):\n    """Doc."""\n    a.sort()\n']),
    ("drop", "def f(a):\n    if a:\n        a.pop()\n    return a\n",
     ["def f(a):\n    return a\n", "def f(a):\n    if a:\n        pass\n    return a\n",
      "def f(a):\n    if a:\n        a.pop()\n"]),
], ids=lambda v: v if isinstance(v, str) and v in OPERATORS else "")
def test_each_operator_changes_only_its_own_bytes(operator, source, expected):
    assert edits(source, operator) == expected


def test_no_site_in_a_module_that_does_not_parse_nor_an_edit_that_would_not():
    assert mutation_sites("m.py", b"def f(:\n") == []
    # `a; b` on one line: dropping a whole line would take both, so it is not offered
    assert edits("def f(a):\n    a.sort(); a.pop()\n    return a\n", "drop") == [
        "def f(a):\n    a.sort(); a.pop()\n"]


def test_sites_are_in_source_order_and_describe_themselves():
    src = b"def f(a, b):\n    x = a + 1\n    return x < b\n"
    sites = mutation_sites("pkg/m.py", src)
    assert [s.start for s in sites] == sorted(s.start for s in sites)
    assert sites == mutation_sites("pkg/m.py", src)
    # unchecked (the factory's way: each site checked when tried) offers the same here
    assert mutation_sites("pkg/m.py", src, checked=False) == sites
    assert all(still_parses(src, s) for s in sites)
    assert {s.operator for s in sites} == {"binop", "int", "drop", "compare", "return-none"}
    assert sites[0].describe().startswith("drop at pkg/m.py:2")
    with pytest.raises(ValueError, match="does not fit"):
        apply_mutation(b"", sites[-1])
