"""Name and constant-string resolution for the anti-cheat static scan (`anticheat.py`).

`Resolver` answers two questions about an `ast` tree, module-wide and flow-insensitively
(it errs towards resolving, hence towards flagging):

    qual(node)  the qualified name an expression refers to — aliases (`import sys as s`,
                `from sys import _getframe as g`, `g = sys._getframe`), by-name lookups
                (`getattr(sys, '_getframe')`, `__import__('sys')`, `sys.modules['sys']`,
                `vars(builtins)[...]`, `globals()['x']`) and `from m import *`;
    fold(node)  the constant string an expression always evaluates to, and whether it
                took more than a literal to build — concatenation, repetition, joins,
                slices, `chr`, case changes, `replace`, base64/hex/rot13 decoding.

    >>> r = Resolver(ast.parse("import sys as s\\nn = '_get' + 'frame'\\n"))
    >>> r.qual(ast.parse("s._getframe", mode="eval").body)
    'sys._getframe'
    >>> r.fold(ast.parse("n", mode="eval").body)
    ('_getframe', True)

Both memoise by node identity, so chains (`b = a + a; c = b + b; ...`) cost linear time,
and bound their recursion (`MAX_DEPTH`) and their strings (`MAX_FOLD`). The tree is walked
once (`walk`); the resolver's index and the scan built on it read that list of nodes.
"""

from __future__ import annotations

import ast
import base64
import binascii
import builtins
import codecs
from collections import Counter
from collections.abc import Callable
from typing import Any

IMPORTERS = frozenset({"builtins.__import__", "importlib.import_module",
                        "importlib.__import__"})
BUILTIN_NAMES = frozenset(dir(builtins))
MAX_DEPTH = 50
MAX_FOLD = 10_000
STR_METHODS = frozenset({"lower", "upper", "strip", "lstrip", "rstrip", "swapcase",
                          "title", "capitalize", "casefold", "replace"})
BYTES_DECODERS: dict[str, Callable[[Any], bytes]] = {
    "base64.b64decode": base64.b64decode, "base64.b32decode": base64.b32decode,
    "base64.b16decode": base64.b16decode, "base64.b85decode": base64.b85decode,
    "base64.a85decode": base64.a85decode, "base64.urlsafe_b64decode": base64.urlsafe_b64decode,
    "binascii.unhexlify": binascii.unhexlify, "binascii.a2b_hex": binascii.a2b_hex,
    "builtins.bytes.fromhex": bytes.fromhex}


_LEAF_FIELDS = frozenset({"ctx", "op", "ops"})
"""Fields that hold only leaves no check reads (expression contexts, operators)."""
_CHILD_FIELDS: dict[type, tuple[str, ...]] = {
    # the commonest nodes, whose other fields hold plain values
    ast.Name: (), ast.Constant: (), ast.Attribute: ("value",), ast.arg: ("annotation",),
    ast.keyword: ("value",), ast.alias: (),
}


_BINDERS = frozenset({ast.Name, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.arg,
                      ast.ExceptHandler, ast.MatchAs, ast.MatchStar, ast.Import,
                      ast.ImportFrom, ast.Assign, ast.AnnAssign, ast.NamedExpr})
"""The node types the index reads: what binds a name."""


def walk(tree: ast.AST) -> list[ast.AST]:
    """Every node of `tree`, in `ast.walk`'s order (breadth first, `tree` first), less
    expression contexts and operators (`Load`, `Add`, `Eq`: leaves no check reads).
    One pass, about half the time of `list(ast.walk(tree))`.

    >>> [type(n).__name__ for n in walk(ast.parse("x = a + 1"))]
    ['Module', 'Assign', 'Name', 'BinOp', 'Name', 'Constant']
    """
    nodes = [tree]
    append, fields, node_type = nodes.append, _CHILD_FIELDS, ast.AST
    i = 0
    while i < len(nodes):
        node = nodes[i]
        i += 1
        names = fields.get(type(node))
        if names is None:
            names = fields[type(node)] = tuple(
                f for f in type(node)._fields if f not in _LEAF_FIELDS)
        for name in names:
            value = getattr(node, name, None)
            if isinstance(value, node_type):
                append(value)
            elif type(value) is list:
                for item in value:
                    if isinstance(item, node_type):
                        append(item)
    return nodes


class Resolver:
    """Resolves names and folds constant strings over one module (see the module
    docstring). `known`: qualified names a `from m import *` is checked for (a star
    import binds a name only when `m.name` is in it). A child resolver (code that `exec`
    runs from a constant string) starts from its parent's bindings."""

    def __init__(self, tree: ast.Module, parent: Resolver | None = None,
                 known: frozenset[str] = frozenset()) -> None:
        self.tree = tree
        self.nodes = walk(tree)
        """every node of `tree` but contexts and operators, in `ast.walk`'s order"""
        self.known = known
        self.aliases: dict[str, str] = dict(parent.aliases) if parent else {}
        """local name -> qualified name (`s` -> `sys`, `g` -> `sys._getframe`)"""
        self.modules: set[str] = set(parent.modules) if parent else {"builtins"}
        """qualified names known to be modules"""
        self.consts: dict[str, ast.expr] = dict(parent.consts) if parent else {}
        """names bound exactly once, by `name = expr`"""
        self.bound: set[str] = set(parent.bound) if parent else set()
        self.star: list[str] = list(parent.star) if parent else []
        """modules imported with `from m import *`"""
        # Memos keyed by node identity (the tree outlives the resolver): every node is
        # resolved once, so chains like `b = a + a; c = b + b; ...` cost linear time.
        self._quals: dict[int, str | None] = {}
        self._folds: dict[int, tuple[str, bool] | None] = {}
        self._index()
        self._quals.clear()  # resolved while aliases were still being found

    # -- names -------------------------------------------------------------------------
    def _index(self) -> None:
        counts: Counter[str] = Counter()
        assigned: dict[str, ast.expr] = {}
        for node in self.nodes:
            if type(node) not in _BINDERS:
                continue
            if isinstance(node, ast.Name):
                if not isinstance(node.ctx, ast.Load):
                    counts[node.id] += 1
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                counts[node.name] += 1
            elif isinstance(node, ast.arg):
                counts[node.arg] += 1
            elif isinstance(node, ast.ExceptHandler):
                if node.name:
                    counts[node.name] += 1
            elif isinstance(node, (ast.MatchAs, ast.MatchStar)):
                if node.name:
                    counts[node.name] += 1
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for a in node.names:
                    if a.name == "*":
                        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                            self.star.append(node.module)
                        continue
                    local = a.asname or a.name.split(".")[0]
                    counts[local] += 1
                    if isinstance(node, ast.Import):
                        parts = a.name.split(".")
                        self.modules.update(".".join(parts[:i + 1]) for i in range(len(parts)))
                        self.aliases.setdefault(local, a.name if a.asname else parts[0])
                    elif node.level == 0 and node.module:
                        self.aliases.setdefault(local, f"{node.module}.{a.name}")
            elif isinstance(node, ast.Assign):
                if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    assigned[node.targets[0].id] = node.value
            elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)):
                if isinstance(node.target, ast.Name) and node.value is not None:
                    assigned[node.target.id] = node.value
        self.bound |= set(counts)
        self.consts.update((n, v) for n, v in assigned.items() if counts[n] == 1)
        for _ in range(4):  # alias chains: s = sys; t = s
            self._quals.clear()
            new = {n: q for n, v in self.consts.items() if n not in self.aliases
                   for q in [self.qual(v)] if q}
            if not new:
                break
            self.aliases.update(new)

    def _module(self, name: str) -> str:
        self.modules.add(name)
        return name

    def _name(self, name: str) -> str | None:
        if name in self.aliases:
            return self.aliases[name]
        if name == "__builtins__":
            return "builtins"
        if name in self.bound:
            return None
        for module in self.star:  # `from os import *` ... `_exit(0)`
            if f"{module}.{name}" in self.known:
                return f"{module}.{name}"
        return f"builtins.{name}" if name in BUILTIN_NAMES else None

    def qual(self, node: ast.AST | None, depth: int = 0) -> str | None:
        """The qualified name `node` refers to (`sys._getframe`, `builtins.exit`), if
        it can be told statically."""
        if node is None or depth > MAX_DEPTH:
            return None
        key = id(node)
        if key not in self._quals:
            self._quals[key] = None  # a cycle resolves to None
            self._quals[key] = self._qual(node, depth + 1)
        return self._quals[key]

    def _qual(self, node: ast.AST, d: int) -> str | None:
        if isinstance(node, ast.Name):
            return self._name(node.id)
        if isinstance(node, ast.Attribute):
            base = self.qual(node.value, d)
            return f"{base}.{node.attr}" if base else None
        if isinstance(node, ast.Subscript):
            key = self.fold(node.slice, d)
            if key is None:
                return None
            if isinstance(node.value, ast.Call) and self.qual(node.value.func, d) in (
                    "builtins.globals", "builtins.locals"):
                return self._name(key[0])
            base = self.qual(node.value, d)
            if base == "sys.modules":
                return self._module(key[0])
            if base == "builtins":  # __builtins__ as a dict
                return f"builtins.{key[0]}"
            if base and base.endswith(".__dict__"):
                return f"{base[:-len('.__dict__')]}.{key[0]}"
            return None
        if isinstance(node, ast.Call):
            obj, name = self._attr_lookup(node, d)
            if obj is not None and name is not None:
                base = self.qual(obj, d)
                key = self.fold(name, d)
                return f"{base}.{key[0]}" if base and key else None
            fn = self.qual(node.func, d)
            if fn in IMPORTERS and node.args:
                key = self.fold(node.args[0], d)
                if key is None:
                    return None
                whole = fn == "importlib.import_module" or len(node.args) >= 4 or any(
                    k.arg == "fromlist" for k in node.keywords)
                return self._module(key[0] if whole else key[0].split(".")[0])
            if fn == "sys.modules.get" and node.args:
                key = self.fold(node.args[0], d)
                return self._module(key[0]) if key else None
            if fn == "builtins.vars" and len(node.args) == 1:
                base = self.qual(node.args[0], d)
                return f"{base}.__dict__" if base else None
        return None

    def _attr_lookup(self, call: ast.Call, depth: int = 0) -> tuple[ast.expr | None,
                                                                    ast.expr | None]:
        """(object, name) of a by-name attribute lookup: `getattr(obj, name)`,
        `obj.__getattribute__(name)`, `object.__getattribute__(obj, name)`."""
        f, args = call.func, call.args
        if isinstance(f, ast.Attribute) and f.attr == "__getattribute__":
            if len(args) == 1:
                return f.value, args[0]
            if len(args) == 2:
                return args[0], args[1]
        fn = self.qual(f, depth)
        if fn in ("builtins.getattr", "inspect.getattr_static") and len(args) >= 2:
            return args[0], args[1]
        return None, None

    # -- constant strings --------------------------------------------------------------
    def fold(self, node: ast.AST | None, depth: int = 0) -> tuple[str, bool] | None:
        """The constant string `node` always evaluates to, and whether it took more than
        a literal to build it (`'_get' + 'frame'` -> ('_getframe', True))."""
        if node is None or depth > MAX_DEPTH:
            return None
        key = id(node)
        if key not in self._folds:
            self._folds[key] = None  # a cycle (`x = x + 'a'`) folds to None
            out = self._fold(node, depth + 1)
            self._folds[key] = out if out is None or len(out[0]) <= MAX_FOLD else None
        return self._folds[key]

    def _fold(self, node: ast.AST, d: int) -> tuple[str, bool] | None:
        out: tuple[str, bool] | None = None
        if isinstance(node, ast.Constant):
            out = (node.value, False) if isinstance(node.value, str) else None
        elif isinstance(node, ast.Name):
            value = self.consts.get(node.id)
            out = self.fold(value, d) if value is not None else None
        elif isinstance(node, ast.JoinedStr):
            parts = []
            for v in node.values:
                if isinstance(v, ast.FormattedValue):
                    if v.conversion != -1 or v.format_spec is not None:
                        return None
                    p = self.fold(v.value, d)
                else:
                    p = self.fold(v, d)
                if p is None:
                    return None
                parts.append(p[0])
            out = ("".join(parts), len(node.values) > 1)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            a, b = self.fold(node.left, d), self.fold(node.right, d)
            out = (a[0] + b[0], True) if a and b else None
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            s, n = (node.left, node.right) if isinstance(node.right, ast.Constant) \
                else (node.right, node.left)
            a = self.fold(s, d)
            if a and isinstance(n, ast.Constant) and type(n.value) is int \
                    and 0 <= n.value * len(a[0]) <= MAX_FOLD:
                out = (a[0] * n.value, True)
        elif isinstance(node, ast.Subscript):
            out = self._fold_subscript(node, d)
        elif isinstance(node, ast.Call):
            out = self._fold_call(node, d)
        return out

    def _fold_subscript(self, node: ast.Subscript, d: int) -> tuple[str, bool] | None:
        s = self.fold(node.value, d)
        if s is None:
            return None
        sl = node.slice
        if isinstance(sl, ast.Slice):
            bounds = [None if b is None else const_int(b) for b in (sl.lower, sl.upper, sl.step)]
            given = [b for b in (sl.lower, sl.upper, sl.step) if b is not None]
            if any(const_int(b) is None for b in given) or bounds[2] == 0:
                return None
            return (s[0][slice(*bounds)], True)
        i = const_int(sl)
        if i is None or not -len(s[0]) <= i < len(s[0]):
            return None
        return (s[0][i], True)

    def _fold_call(self, node: ast.Call, d: int) -> tuple[str, bool] | None:
        f, args = node.func, node.args
        if isinstance(f, ast.Attribute):
            if f.attr == "join" and len(args) == 1:
                sep, items = self.fold(f.value, d), self._fold_items(args[0], d)
                return (sep[0].join(items), True) if sep is not None and items is not None \
                    else None
            if f.attr in STR_METHODS:
                s = self.fold(f.value, d)
                rest = [self.fold(a, d) for a in args]
                if s is None or any(r is None for r in rest) or len(rest) > 2:
                    return None
                strs = [r[0] for r in rest if r is not None]
                if f.attr == "replace" and (len(strs) != 2 or len(strs[1]) > 100):
                    return None
                try:
                    return (str(getattr(str, f.attr)(s[0], *strs)), True)
                except (TypeError, ValueError):
                    return None
            if f.attr == "decode" and len(args) <= 1:
                raw = self._fold_bytes(f.value, d)
                enc = self.fold(args[0], d) if args else ("utf-8", False)
                try:
                    return (raw.decode(enc[0]), True) if raw is not None and enc else None
                except (ValueError, LookupError):
                    return None
        fn = self.qual(f, d)
        if fn == "builtins.chr" and len(args) == 1:
            i = const_int(args[0])
            return (chr(i), True) if i is not None and 0 <= i < 0x110000 else None
        if fn == "builtins.str" and len(args) == 1:
            return self.fold(args[0], d)
        if fn == "codecs.decode" and len(args) == 2:
            s, enc = self.fold(args[0], d), self.fold(args[1], d)
            if s and enc and enc[0].replace("_", "").lower() == "rot13":
                return (codecs.decode(s[0], "rot13"), True)
        return None

    def _fold_items(self, node: ast.expr, d: int) -> list[str] | None:
        """The strings a `"".join(...)` argument yields."""
        if isinstance(node, (ast.List, ast.Tuple)):
            items = [self.fold(e, d) for e in node.elts]
            return None if any(i is None for i in items) else [i[0] for i in items if i]
        if isinstance(node, ast.Call) and len(node.args) == 1 \
                and self.qual(node.func, d) == "builtins.reversed":
            inner = self._fold_items(node.args[0], d)
            return None if inner is None else inner[::-1]
        s = self.fold(node, d)
        return None if s is None else list(s[0])

    def _fold_bytes(self, node: ast.expr, d: int) -> bytes | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, bytes):
            return node.value
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "encode" and not node.args:
            s = self.fold(node.func.value, d)
            return s[0].encode("utf-8", "surrogateescape") if s else None
        if isinstance(node, ast.Call) and len(node.args) == 1:
            decoder = BYTES_DECODERS.get(self.qual(node.func, d) or "")
            arg: str | bytes | None = self._fold_bytes(node.args[0], d)
            if arg is None:
                s = self.fold(node.args[0], d)
                arg = s[0] if s else None
            if decoder is None or arg is None or len(arg) > MAX_FOLD:
                return None
            try:
                return decoder(arg)
            except (ValueError, TypeError):
                return None
        return None


def const_int(node: ast.AST) -> int | None:
    """The int literal `node` is (`3`, `-1`), or None."""
    sign = 1
    while isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        sign, node = -sign, node.operand
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return sign * node.value
    return None
