"""A task's reference solution as a program the variant generator edits, and the
completion that renders an edited program back into what a model would write.

    base = Base.of(task)             # prompt + canonical_solution, parsed once
    prog = base.program()            # a fresh, editable copy (ast)
    ...edit prog.own, prog.append(...)...
    completion = base.render(prog)   # appended to task.prompt, like any completion

The *target* is the entry point's `def` that the prompt opens and the canonical
solution completes. Its *own* statements are the canonical solution's (the prompt's
docstring and whatever else the prompt wrote stay). A program renders in the smallest
form that holds it:

    body        the prompt's def is unchanged: the completion is the new body, indented
                as the prompt indents it, then any module-level code appended after it
                (a helper, a class, `signal.signal(...)`) — what most completions are
    expression  a prompt that ends in `return ` (the demo's): the returned expression,
                then any module-level code
    redefinition  anything else (a new signature, a decorator, code before the def):
                the whole edited module after the prompt, redefining the entry point

`ast.unparse` writes the code, so comments of the canonical solution are not kept.
"""

from __future__ import annotations

import ast
import copy
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from trialbox.types import Task

PREFIX = "_fv_"
"""Every name the generator introduces starts with this (none of the tasks use it)."""


@dataclass(frozen=True)
class Base:
    """One task's prompt + canonical solution, parsed, and what rendering compares an
    edited program with."""

    task: Task
    text: str
    """prompt + canonical_solution."""
    index: int
    """The target def's position in the module's body."""
    keep: int
    """Leading statements of the target's body that are the prompt's."""
    expression: bool
    """The prompt ends in `return `: the canonical solution is an expression."""
    indent: str
    """How the prompt indents the target's body."""
    before: tuple[str, ...]
    """ast.dump of each module statement before the target."""
    head: str
    """ast.dump of the target's def without its body (name, arguments, decorators)."""
    kept: tuple[str, ...]
    """ast.dump of the prompt's statements of the target's body."""

    @classmethod
    def of(cls, task: Task) -> Base | None:
        """The task's base, or None when its prompt + canonical solution is not a
        program whose last top-level def is the entry point the prompt opens."""
        text = task.prompt + task.canonical_solution
        try:
            module = ast.parse(text)
            prompt = ast.parse(task.prompt)
        except SyntaxError:
            return None
        index = _target(module, task.entry_point)
        pindex = _target(prompt, task.entry_point)
        if index is None or pindex is None:
            return None
        fn = module.body[index]
        pfn = prompt.body[pindex]
        assert isinstance(fn, ast.FunctionDef) and isinstance(pfn, ast.FunctionDef)
        expression = (task.prompt.rstrip(" ").endswith("return")
                      and isinstance(pfn.body[-1], ast.Return) and pfn.body[-1].value is None)
        keep = len(pfn.body) - (1 if expression else 0)
        kept = tuple(ast.dump(s) for s in fn.body[:keep])
        if kept != tuple(ast.dump(s) for s in pfn.body[:keep]):
            return None
        line = text.splitlines()[fn.body[0].lineno - 1]
        indent = line[:len(line) - len(line.lstrip())]
        return cls(task, text, index, keep, expression, indent,
                   tuple(ast.dump(s) for s in module.body[:index]), _head(fn), kept)

    def program(self) -> Program:
        return Program(self)

    def render(self, prog: Program, redefine: bool = False) -> str | None:
        """The completion for `prog` (appended to the prompt), or None when the result
        does not compile."""
        ast.fix_missing_locations(prog.module)  # unparse reads a def's line number
        text = None if redefine or prog.redefine else self._in_place(prog.module)
        if text is None:
            lead = "" if self.task.prompt.endswith("\n") else "\n"
            text = lead + "\n\n" + ast.unparse(prog.module) + "\n"
        try:
            compile(self.task.prompt + text, "<variant>", "exec")
        except (SyntaxError, ValueError):
            return None
        return text

    def _in_place(self, module: ast.Module) -> str | None:
        """The body or expression form, when the prompt's part is unchanged."""
        body = module.body
        if len(body) <= self.index or tuple(ast.dump(s) for s in body[:self.index]) \
                != self.before:
            return None
        fn = body[self.index]
        if not isinstance(fn, ast.FunctionDef) or _head(fn) != self.head or \
                tuple(ast.dump(s) for s in fn.body[:self.keep]) != self.kept:
            return None
        own, extras = fn.body[self.keep:], body[self.index + 1:]
        if self.expression:
            if len(own) != 1 or not isinstance(own[0], ast.Return) or own[0].value is None:
                return None
            text = ast.unparse(own[0].value) + "\n"
        else:
            text = textwrap.indent(ast.unparse(ast.Module(own, [])), self.indent) + "\n"
        if extras:
            text += "\n\n" + ast.unparse(ast.Module(extras, [])) + "\n"
        return text


class Program:
    """An editable copy of a base: `module`, the target def `fn`, its own statements."""

    def __init__(self, base: Base):
        self.base = base
        self.module = ast.parse(base.text)
        fn = self.module.body[base.index]
        assert isinstance(fn, ast.FunctionDef)
        self.fn = fn
        self.redefine = False
        """Render as a redefinition even if the prompt's part is unchanged."""
        self._taken = {n.id for n in ast.walk(self.module) if isinstance(n, ast.Name)}

    @property
    def own(self) -> list[ast.stmt]:
        return self.fn.body[self.base.keep:]

    @own.setter
    def own(self, stmts: list[ast.stmt]) -> None:
        head = self.fn.body[:self.base.keep]
        self.fn.body = head + (stmts or ([] if head else [ast.Pass()]))

    def prelude(self) -> list[ast.stmt]:
        """Copies of the prompt's statements in the target's body other than its
        docstring (HumanEval/115's prompt imports `math` there): code moved out of the
        target into another function starts with them."""
        return [copy.deepcopy(s) for s in self.fn.body[:self.base.keep]
                if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                        and isinstance(s.value.value, str))]

    def recursive(self) -> bool:
        """Whether the target's own statements call the entry point by name."""
        return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                   and n.func.id == self.fn.name
                   for n in ast.walk(ast.Module(self.own, [])))

    def fresh(self, stem: str) -> str:
        """A module-wide unused name `_fv_<stem>` (numbered when taken)."""
        name, n = PREFIX + stem, 1
        while name in self._taken:
            n += 1
            name = f"{PREFIX}{stem}{n}"
        self._taken.add(name)
        return name

    def append(self, *nodes: ast.stmt) -> None:
        """Module-level statements after everything (run when the module loads)."""
        self.module.body.extend(nodes)

    @property
    def params(self) -> list[str]:
        return params(self.fn.args)

    def call(self, func: ast.expr | str, keywords: bool = False) -> ast.Call:
        """`func(...)` passing every parameter of the target on (by keyword where it
        can be when `keywords`)."""
        return call_through(func, self.fn.args, keywords)

    def is_generator(self) -> bool:
        return any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in own_walk(self.own))


# ----------------------------------------------------------------------- helpers

def _target(module: ast.Module, entry: str) -> int | None:
    defs = [i for i, n in enumerate(module.body) if isinstance(n, ast.FunctionDef)]
    if not defs:
        return None
    fn = module.body[defs[-1]]
    assert isinstance(fn, ast.FunctionDef)
    return defs[-1] if fn.name == entry else None


def _head(fn: ast.FunctionDef) -> str:
    bare = copy.copy(fn)
    bare.body = []
    return ast.dump(bare)


def params(args: ast.arguments) -> list[str]:
    names = [a.arg for a in (*args.posonlyargs, *args.args)]
    if args.vararg:
        names.append(args.vararg.arg)
    names += [a.arg for a in args.kwonlyargs]
    if args.kwarg:
        names.append(args.kwarg.arg)
    return names


def call_through(func: ast.expr | str, args: ast.arguments, keywords: bool) -> ast.Call:
    f = ast.Name(func, ast.Load()) if isinstance(func, str) else func
    pos: list[ast.expr] = [ast.Name(a.arg, ast.Load()) for a in args.posonlyargs]
    kws: list[ast.keyword] = []
    by_kw = keywords and args.vararg is None
    for a in args.args:
        if by_kw:
            kws.append(ast.keyword(a.arg, ast.Name(a.arg, ast.Load())))
        else:
            pos.append(ast.Name(a.arg, ast.Load()))
    if args.vararg:
        pos.append(ast.Starred(ast.Name(args.vararg.arg, ast.Load()), ast.Load()))
    kws += [ast.keyword(a.arg, ast.Name(a.arg, ast.Load())) for a in args.kwonlyargs]
    if args.kwarg:
        kws.append(ast.keyword(None, ast.Name(args.kwarg.arg, ast.Load())))
    return ast.Call(f, pos, kws)


def stmts(src: str) -> list[ast.stmt]:
    return ast.parse(textwrap.dedent(src)).body


def expr(src: str) -> ast.expr:
    node = ast.parse(src, mode="eval").body
    return node


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def own_walk(nodes: list[ast.stmt]) -> Iterator[ast.AST]:
    """Every node of `nodes` in their own scope: nested defs, lambdas and classes are
    not entered (their decorators and defaults are, being evaluated here)."""
    todo: list[ast.AST] = list(reversed(nodes))
    while todo:
        n = todo.pop()
        yield n
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            todo.extend(n.decorator_list + n.args.defaults
                        + [d for d in n.args.kw_defaults if d is not None])
        elif isinstance(n, ast.Lambda):
            todo.extend(n.args.defaults)
        elif isinstance(n, ast.ClassDef):
            todo.extend(n.decorator_list + n.bases)
        else:
            todo.extend(reversed(list(ast.iter_child_nodes(n))))


MOVE_UNSAFE = frozenset({"locals", "vars", "eval", "exec", "super", "__class__",
                         "_getframe", "currentframe", "globals"})
"""Names whose meaning changes when code moves to another function or scope."""


def movable(nodes: list[ast.stmt]) -> bool:
    """Whether `nodes` may move into another function unchanged."""
    for n in ast.walk(ast.Module(nodes, [])):
        if isinstance(n, ast.Name) and n.id in MOVE_UNSAFE:
            return False
        if isinstance(n, ast.Attribute) and n.attr in MOVE_UNSAFE:
            return False
    return True


def mangled(nodes: list[ast.stmt]) -> bool:
    """Whether a class body would mangle a name in `nodes` (`__x`, not `__x__`)."""
    def private(s: str) -> bool:
        return s.startswith("__") and not s.endswith("__")
    for n in ast.walk(ast.Module(nodes, [])):
        names = [n.id] if isinstance(n, ast.Name) else [n.attr] if isinstance(
            n, ast.Attribute) else [n.arg] if isinstance(n, ast.arg) else [n.name] if \
            isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) else []
        if any(private(s) for s in names):
            return True
    return False


def stored(nodes: list[ast.stmt]) -> set[str]:
    """Names bound in the scope of `nodes` (assigned, deleted, loop targets, imports,
    nested def names)."""
    out: set[str] = set()
    for n in own_walk(nodes):
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            out.add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.alias):
            out.add((n.asname or n.name).split(".")[0])
        elif isinstance(n, ast.ExceptHandler) and n.name:
            out.add(n.name)
    return out


def replace_returns(nodes: list[ast.stmt],
                    make: Callable[[ast.expr], list[ast.stmt]]) -> int:
    """Replace every `return` in the scope of `nodes` (not in nested defs) by the
    statements `make(value)` gives; how many were replaced."""
    count = 0

    def edit(block: list[ast.stmt]) -> list[ast.stmt]:
        nonlocal count
        out: list[ast.stmt] = []
        for s in block:
            if isinstance(s, ast.Return):
                count += 1
                out.extend(make(s.value if s.value is not None else ast.Constant(None)))
                continue
            if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                for field in ("body", "orelse", "finalbody"):
                    sub = getattr(s, field, None)
                    if isinstance(sub, list) and sub and isinstance(sub[0], ast.stmt):
                        setattr(s, field, edit(sub))
                if isinstance(s, ast.Try):
                    for h in s.handlers:
                        h.body = edit(h.body)
                if isinstance(s, ast.Match):
                    for c in s.cases:
                        c.body = edit(c.body)
            out.append(s)
        return out

    nodes[:] = edit(nodes)
    return count
