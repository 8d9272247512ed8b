"""Return-type variants (the corpus's *probes*): every value the reference returns is
passed through a converter `_fv_as` that gives it another form, chosen per type.

    ret_container  equal-valued stdlib forms: a list rebuilt by a comprehension or as a
                   UserList, a tuple as a namedtuple, a dict as an OrderedDict,
                   defaultdict, Counter or UserDict, a set as a frozenset, a str as a
                   UserString (optionally applied all the way down: `deep`)
    ret_number     an int as a Fraction, Decimal or float, a float as a Fraction or
                   Decimal, a bool as an int
    ret_iter       a list or tuple as an iterator (iter, a generator, map), a dict as
                   its items view
    ret_swap       list <-> tuple, a set as a sorted tuple, an int or bool as a str
    ret_subclass   the value as an instance of a plain subclass the solution defines
                   (class _fv_List(list): pass — no methods of its own)

Which of them a task's tests accept is for the ordinary harness to say (`x == [1]`
holds for a UserList and not for a tuple); trialbox must say the same.
"""

from __future__ import annotations

import ast
import random
from collections.abc import Callable

from trialbox.judge.fidelity.source import Program, replace_returns, stmts

_CONTAINER = {
    "list": {"comprehension": "[x for x in v]", "UserList": "collections.UserList(v)",
             "list(iter)": "list(iter(v))"},
    "tuple": {"namedtuple": "collections.namedtuple('Result', "
                            "['f%d' % i for i in range(len(v))])(*v)",
              "generator": "tuple(x for x in v)"},
    "dict": {"OrderedDict": "collections.OrderedDict(v)",
             "defaultdict": "collections.defaultdict(int, v)",
             "Counter": "collections.Counter(v)", "UserDict": "collections.UserDict(v)"},
    "set": {"frozenset": "frozenset(v)", "set-comprehension": "{x for x in v}"},
    "str": {"UserString": "collections.UserString(v)", "join": "''.join(list(v))"},
}
_NUMBER = {
    "int": {"Fraction": "fractions.Fraction(v)", "Decimal": "decimal.Decimal(v)",
            "float": "float(v) if abs(v) < 2 ** 53 else v"},
    "float": {"Fraction": "fractions.Fraction(v) if math.isfinite(v) else v",
              "Decimal": "decimal.Decimal(v)"},
    "bool": {"int": "int(v)"},
}
_ITER = {
    "list": {"iter": "iter(v)", "generator": "(x for x in v)",
             "map": "map(lambda x: x, v)"},
    "tuple": {"iter": "iter(v)", "generator": "(x for x in v)"},
    "dict": {"items": "v.items()"},
}
_SWAP = {
    "list": {"tuple": "tuple(v)"}, "tuple": {"list": "list(v)"},
    "set": {"sorted tuple": "tuple(sorted(v, key=repr))"},
    "int": {"str": "str(v)"}, "bool": {"str": "str(v)"},
}
_SUBCLASS = {t: {"subclass": f"_fv_{t.capitalize()}(v)"}
             for t in ("list", "tuple", "dict", "set", "str", "int", "float")}
_SUBCLASS_DEFS = "\n".join(f"class _fv_{t.capitalize()}({t}):\n    pass"
                           for t in _SUBCLASS)

_TABLES = {"ret_container": _CONTAINER, "ret_number": _NUMBER, "ret_iter": _ITER,
           "ret_swap": _SWAP, "ret_subclass": _SUBCLASS}


def _converter(p: Program, kind: str, rng: random.Random) -> str | None:
    """Rewrite the target's returns through a converter; the detail, or None."""
    if p.is_generator():
        return None
    conv = p.fresh("as")
    own = p.own
    if replace_returns(own, lambda v: [ast.Return(ast.Call(ast.Name(conv, ast.Load()),
                                                           [v], []))]) == 0:
        return None
    table = _TABLES[kind]
    chosen = {t: rng.choice(sorted(forms)) for t, forms in table.items()}
    deep = kind == "ret_container" and rng.random() < 0.3
    lines = [f"def {conv}(v):"]
    inner = {"list": f"[{conv}(x) for x in v]", "tuple": f"tuple({conv}(x) for x in v)",
             "dict": f"{{k: {conv}(x) for k, x in v.items()}}"}
    for t, form in chosen.items():
        first = f"        v = {inner[t]}\n" if deep and t in inner else ""
        lines.append(f"    if type(v) is {t}:\n{first}        return {table[t][form]}")
    lines.append("    return v")
    head = "import collections, decimal, fractions, math\n"
    if kind == "ret_subclass":
        head += _SUBCLASS_DEFS + "\n"
    p.append(*stmts(head + "\n".join(lines)))
    p.own = own
    return ", ".join(f"{t}->{f}" for t, f in chosen.items()) + (" (deep)" if deep else "")


def _kind(name: str) -> Callable[[Program, random.Random], str | None]:
    def transform(p: Program, rng: random.Random) -> str | None:
        return _converter(p, name, rng)
    transform.__name__ = name
    return transform


RETURN_KINDS = {name: _kind(name) for name in _TABLES}
