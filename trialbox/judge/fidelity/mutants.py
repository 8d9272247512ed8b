"""Mutants of a reference solution: the corpus's *wrong* variants (by intent).

Each operator changes one site of the canonical solution's own statements, drawn from
the generator's random stream; None when the solution has no such site:

    mut_compare       a comparison's operator moved by its boundary (< to <=) or negated
    mut_arith         an arithmetic operator swapped (+ to -, * to //, ...)
    mut_const         an integer constant off by one
    mut_drop          a statement dropped (a block's only one becomes `pass`)
    mut_ifswap        an if's branches swapped (no else: the body moves to an else)
    mut_negate        an if/while/conditional expression/comprehension condition negated
    mut_return_const  the whole solution replaced by `return C`
    mut_boolop        `and` to `or`, or back

A mutant is wrong only if the ordinary harness fails it: an equivalent mutant is
labelled correct, and then trialbox must pass it too.
"""

from __future__ import annotations

import ast
import random

from trialbox.judge.fidelity.source import Program

_BOUNDARY: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In,
    ast.Is: ast.IsNot, ast.IsNot: ast.Is}
_NEGATION: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt,
    ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In,
    ast.Is: ast.IsNot, ast.IsNot: ast.Is}
_ARITH: dict[type[ast.operator], tuple[type[ast.operator], ...]] = {
    ast.Add: (ast.Sub, ast.Mult), ast.Sub: (ast.Add,), ast.Mult: (ast.Add, ast.FloorDiv),
    ast.FloorDiv: (ast.Div, ast.Mult), ast.Div: (ast.FloorDiv, ast.Mult),
    ast.Mod: (ast.FloorDiv,), ast.Pow: (ast.Mult,), ast.LShift: (ast.RShift,),
    ast.RShift: (ast.LShift,), ast.BitAnd: (ast.BitOr,), ast.BitOr: (ast.BitAnd,),
    ast.BitXor: (ast.BitOr,)}
_CONSTANTS = ("None", "0", "1", "''", "[]", "True", "False", "()")


def _nodes(p: Program) -> list[ast.AST]:
    return list(ast.walk(ast.Module(p.own, [])))


def _pick(p: Program, rng: random.Random, types: type | tuple[type, ...]) -> ast.AST | None:
    found = [n for n in _nodes(p) if isinstance(n, types)]
    return rng.choice(found) if found else None


def mut_compare(p: Program, rng: random.Random) -> str | None:
    node = _pick(p, rng, ast.Compare)
    if not isinstance(node, ast.Compare):
        return None
    i = rng.randrange(len(node.ops))
    table = _BOUNDARY if rng.random() < 0.5 else _NEGATION
    old = type(node.ops[i])
    node.ops[i] = table[old]()
    return f"{old.__name__} -> {type(node.ops[i]).__name__}"


def mut_arith(p: Program, rng: random.Random) -> str | None:
    node = _pick(p, rng, (ast.BinOp, ast.AugAssign))
    if not isinstance(node, (ast.BinOp, ast.AugAssign)) or type(node.op) not in _ARITH:
        return None
    old = type(node.op)
    node.op = rng.choice(_ARITH[old])()
    return f"{old.__name__} -> {type(node.op).__name__}"


def mut_const(p: Program, rng: random.Random) -> str | None:
    found = [n for n in _nodes(p) if isinstance(n, ast.Constant) and type(n.value) is int]
    if not found:
        return None
    node = rng.choice(found)
    assert isinstance(node, ast.Constant) and isinstance(node.value, int)
    delta = rng.choice((-1, 1))
    old = node.value
    node.value = old + delta
    return f"{old} -> {node.value}"


def _blocks(p: Program) -> list[list[ast.stmt]]:
    own = p.own
    out = [own]
    for n in ast.walk(ast.Module(own, [])):
        for field in ("body", "orelse", "finalbody"):
            sub = getattr(n, field, None)
            if isinstance(sub, list) and sub and isinstance(sub[0], ast.stmt) and \
                    not isinstance(n, ast.Module):
                out.append(sub)
        if isinstance(n, ast.ExceptHandler):
            out.append(n.body)
    return out


def mut_drop(p: Program, rng: random.Random) -> str | None:
    own = p.own
    blocks = _blocks(p)
    blocks[0] = own
    sites = [(b, i) for b in blocks for i, s in enumerate(b)
             if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
             and not isinstance(s, ast.Pass)]
    if not sites:
        return None
    block, i = rng.choice(sites)
    dropped = type(block[i]).__name__
    if len(block) == 1:
        block[0] = ast.Pass()
    else:
        del block[i]
    p.own = own
    return f"dropped a {dropped}"


def mut_ifswap(p: Program, rng: random.Random) -> str | None:
    node = _pick(p, rng, (ast.If, ast.IfExp))
    if isinstance(node, ast.IfExp):
        node.body, node.orelse = node.orelse, node.body
        return "conditional expression"
    if not isinstance(node, ast.If):
        return None
    if node.orelse:
        node.body, node.orelse = node.orelse, node.body
        return "if/else"
    node.body, node.orelse = [ast.Pass()], node.body
    return "if body moved to an else"


def mut_negate(p: Program, rng: random.Random) -> str | None:
    node = _pick(p, rng, (ast.If, ast.While, ast.IfExp, ast.comprehension))
    if isinstance(node, (ast.If, ast.While, ast.IfExp)):
        node.test = ast.UnaryOp(ast.Not(), node.test)
        return type(node).__name__
    if isinstance(node, ast.comprehension) and node.ifs:
        i = rng.randrange(len(node.ifs))
        node.ifs[i] = ast.UnaryOp(ast.Not(), node.ifs[i])
        return "comprehension condition"
    return None


def mut_return_const(p: Program, rng: random.Random) -> str | None:
    c = rng.choice(_CONSTANTS)
    p.own = [ast.Return(ast.parse(c, mode="eval").body)]
    return f"return {c}"


def mut_boolop(p: Program, rng: random.Random) -> str | None:
    node = _pick(p, rng, ast.BoolOp)
    if not isinstance(node, ast.BoolOp):
        return None
    node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    return type(node.op).__name__.lower()


MUTANTS = {"mut_compare": mut_compare, "mut_arith": mut_arith, "mut_const": mut_const,
           "mut_drop": mut_drop, "mut_ifswap": mut_ifswap, "mut_negate": mut_negate,
           "mut_return_const": mut_return_const, "mut_boolop": mut_boolop}
"""Mutation operators by kind."""
