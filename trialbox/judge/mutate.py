"""Bugs injected by AST mutation, in the spirit of SWE-smith (issue 29): every place in a
module where one small, plausible mistake can be made, as an edit of its source bytes.

    sites = mutation_sites("pkg/ops.py", b"def add(a, b):\\n    return a + b\\n")
    [(s.operator, s.line, s.before, s.after) for s in sites]
    # [('binop', 2, b'+', b'-'), ('return-none', 2, b'return a + b', b'return None'),
    #  ('drop', 2, b'    return a + b\\n', b'    pass\\n')]
    apply_mutation(source, sites[0])  # b"def add(a, b):\\n    return a - b\\n"

Operators (`OPERATORS`), each a pure function of the module's AST and bytes:

    compare      <  <=  >  >=  ==  !=  is  is not  in  not in  swapped with its partner
    binop        + -, * //, / *, << >>, & |  (also in `x += 1`)
    boolop       and <-> or
    int          an integer constant n -> n + 1 (off by one)
    drop         a statement (<= 3 lines) in a function body removed (`pass` if it
                 was the only one)
    swap-args    the first two positional arguments of a call swapped
    return-none  `return EXPR` -> `return None`

Only the operator's own bytes change (the token, the constant, the statement's lines):
the rest of the file — comments, formatting — is the original's, so the reference
answer is a one-hunk diff. A site whose edit would not parse is not offered (or, with
`checked=False`, is left to the caller's `still_parses`). The order
is the file's (line, column, operator): `factory.py` shuffles it with the seed.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

MAX_DROP_LINES = 3
"""A dropped statement spans at most this many lines: a bug, not a missing feature."""
OPERATORS = ("compare", "binop", "boolop", "int", "drop", "swap-args", "return-none")

_COMPARE: dict[type[ast.cmpop], tuple[str, str]] = {
    ast.Lt: (r"<(?!=)", "<="), ast.LtE: (r"<=", "<"), ast.Gt: (r">(?!=)", ">="),
    ast.GtE: (r">=", ">"), ast.Eq: (r"==", "!="), ast.NotEq: (r"!=", "=="),
    ast.Is: (r"\bis\b(?!\s+not\b)", "is not"), ast.IsNot: (r"\bis\s+not\b", "is"),
    ast.In: (r"(?<!not )\bin\b", "not in"), ast.NotIn: (r"\bnot\s+in\b", "in")}
_BINOP: dict[type[ast.operator], tuple[str, str]] = {
    ast.Add: (r"\+", "-"), ast.Sub: (r"-", "+"), ast.Mult: (r"(?<!\*)\*(?!\*)", "//"),
    ast.FloorDiv: (r"//", "*"), ast.Div: (r"(?<!/)/(?!/)", "*"), ast.LShift: (r"<<", ">>"),
    ast.RShift: (r">>", "<<"), ast.BitAnd: (r"&", "|"), ast.BitOr: (r"\|", "&")}
_BOOLOP: dict[type[ast.boolop], tuple[str, str]] = {
    ast.And: (r"\band\b", "or"), ast.Or: (r"\bor\b", "and")}


@dataclass(frozen=True)
class Mutation:
    """One edit of one module: bytes `start:end` (`before`) become `after`."""

    path: str
    operator: str
    line: int
    start: int
    end: int
    before: bytes
    after: bytes

    def describe(self) -> str:
        return (f"{self.operator} at {self.path}:{self.line}: "
                f"{self.before.decode('utf-8', 'replace').strip()!r} -> "
                f"{self.after.decode('utf-8', 'replace').strip()!r}")


def apply_mutation(source: bytes, m: Mutation) -> bytes:
    """`source` with `m` made."""
    if source[m.start:m.end] != m.before:
        raise ValueError(f"{m.describe()} does not fit this source")
    return source[:m.start] + m.after + source[m.end:]


def mutation_sites(path: str, source: bytes, *, checked: bool = True) -> list[Mutation]:
    """Every mutation `OPERATORS` offer in one module, in source order; [] for a module
    that does not parse. `checked`: only edits whose module still parses (a parse of the
    whole module per site — seconds for a large module; the factory checks the sites it
    tries instead, `still_parses`)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    s = _Source(path, source)
    found: list[Mutation] = []
    functions = [n for n in ast.walk(tree)
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    in_function = {id(n) for f in functions for n in ast.walk(f) if n is not f}
    for node in ast.walk(tree):
        found += _node_sites(s, node, id(node) in in_function)
    for f in functions:
        found += _drops(s, f)
    good = [m for m in found if not checked or still_parses(source, m)]
    unique = {(m.start, m.end, m.after): m for m in good}
    return sorted(unique.values(), key=lambda m: (m.start, m.end, m.operator, m.after))


def _node_sites(s: _Source, node: ast.AST, in_function: bool) -> list[Mutation]:
    out: list[Mutation] = []
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        pat, new = _COMPARE[type(node.ops[0])]
        out += s.token(node.left, node.comparators[0], pat, new, "compare")
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINOP:
        pat, new = _BINOP[type(node.op)]
        out += s.token(node.left, node.right, pat, new, "binop")
    elif isinstance(node, ast.AugAssign) and type(node.op) in (ast.Add, ast.Sub):
        pat, new = _BINOP[type(node.op)]
        out += s.token(node.target, node.value, pat + "=", new + "=", "binop")
    elif isinstance(node, ast.BoolOp) and len(node.values) == 2:
        pat, new = _BOOLOP[type(node.op)]
        out += s.token(node.values[0], node.values[1], pat, new, "boolop")
    elif isinstance(node, ast.Constant) and type(node.value) is int and in_function:
        before = s.segment(node)
        if before is not None and before.isdigit():  # decimal literals only
            out.append(s.edit(node, "int", str(node.value + 1).encode()))
    elif isinstance(node, ast.Call) and len(node.args) >= 2 and not any(
            isinstance(a, ast.Starred) for a in node.args[:2]):
        a, b = s.segment(node.args[0]), s.segment(node.args[1])
        if a is not None and b is not None and a != b:
            start, end = s.offset(node.args[0], False), s.offset(node.args[1], True)
            gap = s.data[start + len(a):end - len(b)]
            out.append(Mutation(s.path, "swap-args", node.lineno, start, end,
                                s.data[start:end], b + gap + a))
    elif isinstance(node, ast.Return) and node.value is not None and not (
            isinstance(node.value, ast.Constant) and node.value.value is None):
        out.append(s.edit(node, "return-none", b"return None"))
    return [m for m in out if m is not None]


def _drops(s: _Source, f: ast.FunctionDef | ast.AsyncFunctionDef) -> list[Mutation]:
    """Each statement of a block inside `f` (not nested definitions, nor docstrings)
    removed, whole lines; `pass` instead when it is the block's only statement."""
    out: list[Mutation] = []
    for node in ast.walk(f):
        if isinstance(node, (ast.ClassDef, ast.Lambda)) or (
                node is not f and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))):
            continue
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if not isinstance(block, list) or not block or not isinstance(block[0], ast.stmt):
                continue
            for i, stmt in enumerate(block):
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                                     ast.Pass, ast.Global, ast.Nonlocal)) or (
                        i == 0 and node is f and isinstance(stmt, ast.Expr)
                        and isinstance(stmt.value, ast.Constant)
                        and isinstance(stmt.value.value, str)):
                    continue
                m = s.lines_of(stmt, alone=len(block) == 1)
                if m is not None and m.before.count(b"\n") <= MAX_DROP_LINES:
                    out.append(m)
    return out


def still_parses(source: bytes, m: Mutation) -> bool:
    """Whether `source` with `m` made is still valid Python."""
    try:
        ast.parse(apply_mutation(source, m))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


class _Source:
    """A module's bytes and the AST's (line, UTF-8 column) positions as offsets."""

    def __init__(self, path: str, data: bytes) -> None:
        self.path, self.data = path, data
        self.starts = [0]
        for i, c in enumerate(data):
            if c == 0x0A:  # "\n"; ast counts "\r\n" as one line end too
                self.starts.append(i + 1)

    def offset(self, node: ast.AST, end: bool) -> int:
        line = node.end_lineno if end else node.lineno  # type: ignore[attr-defined]
        col = node.end_col_offset if end else node.col_offset  # type: ignore[attr-defined]
        return int(self.starts[line - 1] + col)

    def segment(self, node: ast.AST) -> bytes | None:
        if getattr(node, "end_lineno", None) is None:
            return None
        return self.data[self.offset(node, False):self.offset(node, True)]

    def edit(self, node: ast.AST, operator: str, after: bytes) -> Mutation:
        start, end = self.offset(node, False), self.offset(node, True)
        return Mutation(self.path, operator, node.lineno,  # type: ignore[attr-defined]
                        start, end, self.data[start:end], after)

    def token(self, left: ast.AST, right: ast.AST, pattern: str, new: str,
              operator: str) -> list[Mutation]:
        """The operator between `left` and `right`, when the gap holds it once."""
        lo, hi = self.offset(left, True), self.offset(right, False)
        gap = self.data[lo:hi].decode("utf-8", "replace")
        if "#" in gap:
            return []
        hits = list(re.finditer(pattern, gap))
        if len(hits) != 1:
            return []
        h = hits[0]
        start = lo + len(gap[:h.start()].encode())
        end = lo + len(gap[:h.end()].encode())
        line = left.end_lineno or 0  # type: ignore[attr-defined]
        return [Mutation(self.path, operator, line, start, end, self.data[start:end],
                         new.encode())]

    def lines_of(self, stmt: ast.stmt, alone: bool) -> Mutation | None:
        """`stmt`'s whole lines removed, when nothing else shares them."""
        first = self.starts[stmt.lineno - 1]
        start, end = self.offset(stmt, False), self.offset(stmt, True)
        last = stmt.end_lineno or stmt.lineno
        stop = self.starts[last] if last < len(self.starts) else len(self.data)
        head, tail = self.data[first:start], self.data[end:stop]
        if head.strip() or (tail.strip() and not tail.strip().startswith(b"#")):
            return None  # another statement on its lines (`a; b`)
        after = head + b"pass\n" if alone else b""
        return Mutation(self.path, "drop", stmt.lineno, first, stop,
                        self.data[first:stop], after)
