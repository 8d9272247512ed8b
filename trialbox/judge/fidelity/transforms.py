"""Transformations of a reference solution that keep what it computes: the corpus's
*correct* variants (and its *probes*: other return types, which the ordinary harness
accepts or not).

Each transformation edits a `Program` (source.py) in place and returns a short detail
(which form it took), or None when it does not apply to this program. They are what
ordinary programmers write: the work moved into a helper, a closure, a class, a thread,
a coroutine; a cache; output; a signal handler; a scratch file; other names,
annotations, asserts. None attacks a judge. Whether a variant is correct is decided by
the ordinary harness, never assumed from its kind.
"""

from __future__ import annotations

import ast
import builtins
import copy
import random
from collections.abc import Callable

from trialbox.judge.fidelity.returns import RETURN_KINDS
from trialbox.judge.fidelity.source import (
    PREFIX,
    Program,
    expr,
    mangled,
    movable,
    own_walk,
    replace_returns,
    stmts,
    stored,
)

Transform = Callable[[Program, random.Random], "str | None"]


def _impl(p: Program, stem: str = "impl") -> str | None:
    """Move the target's own statements into a module-level function with the same
    parameters (appended after the module); the target's own body is left empty.
    Returns the helper's name, or None when the code cannot move."""
    own = p.own
    if not own or not movable(own):
        return None
    name = p.fresh(stem)
    p.append(ast.FunctionDef(name=name, args=copy.deepcopy(p.fn.args),
                             body=p.prelude() + own,
                             decorator_list=[], returns=None, type_comment=None))
    p.own = []
    return name


def _impl_call(p: Program, rng: random.Random, stem: str = "impl") -> ast.Call | None:
    name = _impl(p, stem)
    return None if name is None else p.call(name, keywords=rng.random() < 0.5)


def _ret(value: ast.expr) -> ast.Return:
    return ast.Return(value)


# ----------------------------------------------------------------- moving the work

def helper(p: Program, rng: random.Random) -> str | None:
    c = _impl_call(p, rng)
    if c is None:
        return None
    p.own = [_ret(c)]
    return "keywords" if c.keywords else "positional"


def closure(p: Program, rng: random.Random) -> str | None:
    own = p.own
    if not own or not movable(own):
        return None
    inner = p.fresh("inner")
    rebound = sorted(stored(own) & set(p.params))
    body = ([ast.Nonlocal(rebound)] if rebound else []) + own
    p.own = [ast.FunctionDef(name=inner, args=ast.arguments([], [], None, [], [], None, []),
                             body=body, decorator_list=[], returns=None, type_comment=None),
             _ret(ast.Call(ast.Name(inner, ast.Load()), [], []))]
    return f"nonlocal {', '.join(rebound)}" if rebound else "no rebinding"


def _class(p: Program, name: str, members: list[ast.stmt]) -> None:
    p.append(ast.ClassDef(name=name, bases=[], keywords=[], body=members,
                          decorator_list=[]))


def class_static(p: Program, rng: random.Random) -> str | None:
    own = p.own
    if not own or not movable(own) or mangled(own):
        return None
    cls = p.fresh("Solver")
    method = ast.FunctionDef(name="solve", args=copy.deepcopy(p.fn.args),
                             body=p.prelude() + own,
                             decorator_list=[ast.Name("staticmethod", ast.Load())],
                             returns=None, type_comment=None)
    _class(p, cls, [method])
    kw = rng.random() < 0.5
    p.own = [_ret(p.call(ast.Attribute(ast.Name(cls, ast.Load()), "solve", ast.Load()), kw))]
    return "staticmethod"


def class_instance(p: Program, rng: random.Random) -> str | None:
    own = p.own
    if not own or not movable(own) or mangled(own):
        return None
    cls, me = p.fresh("Task"), p.fresh("self")
    names = p.params
    init_args = copy.deepcopy(p.fn.args)
    init_args.posonlyargs.insert(0, ast.arg(me))
    init = ast.FunctionDef(
        name="__init__", args=init_args,
        body=[ast.Assign([ast.Attribute(ast.Name(me, ast.Load()), n, ast.Store())],
                         ast.Name(n, ast.Load())) for n in names] or [ast.Pass()],
        decorator_list=[], returns=None, type_comment=None)
    unpack = [ast.Assign([ast.Name(n, ast.Store())],
                         ast.Attribute(ast.Name(me, ast.Load()), n, ast.Load())) for n in names]
    run = ast.FunctionDef(name="run", args=ast.arguments([], [ast.arg(me)], None, [], [],
                                                         None, []),
                          body=unpack + p.prelude() + own, decorator_list=[], returns=None,
                          type_comment=None)
    _class(p, cls, [init, run])
    p.own = [_ret(ast.Call(ast.Attribute(p.call(cls, rng.random() < 0.5), "run",
                                         ast.Load()), [], []))]
    return "instance with a run method"


def callable_instance(p: Program, rng: random.Random) -> str | None:
    """The entry point's name rebound, after its def, to another callable."""
    own = p.own
    if not own or not movable(own):
        return None
    impl = p.fresh("impl")
    p.append(ast.FunctionDef(name=impl, args=copy.deepcopy(p.fn.args),
                             body=p.prelude() + copy.deepcopy(own), decorator_list=[],
                             returns=None,
                             type_comment=None))
    entry = p.fn.name
    form = rng.choice(("instance", "lambda", "partial"))
    if form == "instance":
        cls = p.fresh("Callable")
        p.append(*stmts(f"""
            class {cls}:
                def __call__(self, *args, **kwargs):
                    return {impl}(*args, **kwargs)
            {entry} = {cls}()
            """))
    elif form == "lambda":
        p.append(*stmts(f"{entry} = lambda *args, **kwargs: {impl}(*args, **kwargs)"))
    else:
        p.append(*stmts(f"import functools\n{entry} = functools.partial({impl})"))
    return form


def decorator(p: Program, rng: random.Random) -> str | None:
    deco = p.fresh("traced")
    counter = p.fresh("calls")
    p.module.body[p.base.index:p.base.index] = stmts(f"""
        import functools
        {counter} = [0]
        def {deco}(fn):
            @functools.wraps(fn)
            def wrapper(*args, **kwargs):
                {counter}[0] += 1
                return fn(*args, **kwargs)
            return wrapper
        """)
    p.fn.decorator_list.append(ast.Name(deco, ast.Load()))
    return "functools.wraps"


def recursion(p: Program, rng: random.Random) -> str | None:
    if p.is_generator():
        return None
    own = p.own
    if not own or not movable(own):
        return None
    rec, depth = p.fresh("rec"), p.fresh("depth")
    args = copy.deepcopy(p.fn.args)
    args.posonlyargs.insert(0, ast.arg(depth))
    again = p.call(rec)
    again.args.insert(0, expr(f"{depth} - 1"))
    guard = ast.If(expr(f"{depth} > 0"), [_ret(again)], [])
    p.append(ast.FunctionDef(name=rec, args=args, body=[guard, *p.prelude(), *own],
                             decorator_list=[],
                             returns=None, type_comment=None))
    n = rng.randint(1, 3)
    start = p.call(rec)
    start.args.insert(0, ast.Constant(n))
    p.own = [_ret(start)]
    return f"depth {n}"


def generator(p: Program, rng: random.Random) -> str | None:
    own = p.own
    comps = [n for n in ast.walk(ast.Module(own, []))
             if isinstance(n, (ast.ListComp, ast.SetComp, ast.DictComp))]
    if comps:
        if {"list", "set", "dict"} & (stored(own) | _module_names(p)):
            return None  # a shadowed builtin: list(...) would not be the builtin
        for c in comps:
            gen: ast.expr
            if isinstance(c, ast.DictComp):
                gen = ast.GeneratorExp(ast.Tuple([c.key, c.value], ast.Load()), c.generators)
                wrap = "dict"
            else:
                gen = ast.GeneratorExp(c.elt, c.generators)
                wrap = "list" if isinstance(c, ast.ListComp) else "set"
            new = ast.Call(ast.Name(wrap, ast.Load()), [gen], [])
            _swap_node(own, c, new)
        p.own = own
        return f"{len(comps)} comprehension(s) as generator expressions"
    call = _impl_call(p, rng)
    if call is None:
        return None
    gen_name = p.fresh("gen")
    p.append(ast.FunctionDef(name=gen_name, args=copy.deepcopy(p.fn.args),
                             body=[ast.Expr(ast.Yield(call))], decorator_list=[],
                             returns=None, type_comment=None))
    p.own = [_ret(ast.Call(ast.Name("next", ast.Load()), [p.call(gen_name)], []))]
    return "next() of a generator"


def _swap_node(nodes: list[ast.stmt], old: ast.AST, new: ast.AST) -> None:
    for parent in ast.walk(ast.Module(nodes, [])):
        for field, value in ast.iter_fields(parent):
            if value is old:
                setattr(parent, field, new)
            elif isinstance(value, list):
                for i, v in enumerate(value):
                    if v is old:
                        value[i] = new


def _module_names(p: Program) -> set[str]:
    return stored(p.module.body)


# ------------------------------------------------------------- running the work

def thread(p: Program, rng: random.Random) -> str | None:
    c = _impl_call(p, rng)
    if c is None:
        return None
    call = ast.unparse(c)
    box, run, t = p.fresh("box"), p.fresh("run"), p.fresh("thread")
    if rng.random() < 0.5:
        p.own = stmts(f"""
            import threading
            {box} = {{}}
            def {run}():
                try:
                    {box}['value'] = {call}
                except BaseException as e:
                    {box}['error'] = e
            {t} = threading.Thread(target={run})
            {t}.start()
            {t}.join()
            if 'error' in {box}:
                raise {box}['error']
            return {box}['value']
            """)
        return "threading.Thread"
    p.own = stmts(f"""
        import concurrent.futures
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as ex:
            return ex.submit(lambda: {call}).result()
        """)
    return "ThreadPoolExecutor"


def coroutine(p: Program, rng: random.Random) -> str | None:
    if p.recursive():  # asyncio.run inside asyncio.run raises
        return None
    c = _impl_call(p, rng)
    if c is None:
        return None
    co = p.fresh("co")
    p.own = stmts(f"""
        import asyncio
        async def {co}():
            await asyncio.sleep(0)
            return {ast.unparse(c)}
        return asyncio.run({co}())
        """)
    return "asyncio.run"


def tempfile_(p: Program, rng: random.Random) -> str | None:
    c = _impl_call(p, rng)
    if c is None:
        return None
    r = p.fresh("r")
    text = f"repr({r})[:10000]"
    enc = rng.choice(("", ", encoding='utf-8'"))
    form = rng.choice(("TemporaryDirectory", "NamedTemporaryFile", "mkstemp", "cwd"))
    if form == "cwd":  # a scratch file in the working directory, named like a checkpoint
        io = f"""
            path = 'checkpoint_{{}}.txt'.format(os.getpid())
            with open(path, 'w'{enc}) as f:
                f.write({text})
            with open(path{enc}) as f:
                assert f.read() == {text}
            os.remove(path)
            """
    elif form == "TemporaryDirectory":
        io = f"""
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, 'checkpoint.txt')
                with open(path, 'w'{enc}) as f:
                    f.write({text})
                with open(path{enc}) as f:
                    assert f.read() == {text}
            """
    elif form == "NamedTemporaryFile":
        io = f"""
            with tempfile.NamedTemporaryFile('w+', suffix='.txt'{enc}) as f:
                f.write({text})
                f.flush()
                f.seek(0)
                assert f.read() == {text}
            """
    else:
        io = f"""
            fd, path = tempfile.mkstemp()
            try:
                with os.fdopen(fd, 'w'{enc}) as f:
                    f.write({text})
                with open(path{enc}) as f:
                    assert f.read() == {text}
            finally:
                os.unlink(path)
            """
    p.own = (stmts(f"import os, tempfile\n{r} = {ast.unparse(c)}") + stmts(io)
             + [_ret(ast.Name(r, ast.Load()))])
    return form + (" utf-8" if enc else " default encoding")


def coerce_signal(p: Program, rng: random.Random) -> str | None:
    p.append(*stmts("import signal\nsignal.signal(signal.SIGPIPE, signal.SIG_DFL)"))
    if rng.random() < 0.5:
        return "SIGPIPE at load"
    own = p.own
    if not own:
        return "SIGPIPE at load"
    old = p.fresh("old")
    guard = stmts(f"""
        def _on_alarm(signum, frame):
            raise TimeoutError('too slow')
        {old} = signal.signal(signal.SIGALRM, _on_alarm)
        signal.alarm(60)
        """)
    p.own = guard + [ast.Try(body=own, handlers=[], orelse=[], finalbody=stmts(
        f"signal.alarm(0)\nsignal.signal(signal.SIGALRM, {old})"))]
    return "SIGPIPE at load, SIGALRM guard per call"


def try_finally(p: Program, rng: random.Random) -> str | None:
    own = p.own
    if not own:
        return None
    form = rng.choice(("finally", "except-reraise", "both"))
    done = p.fresh("done")
    handlers = [ast.ExceptHandler(ast.Name("Exception", ast.Load()), None,
                                  [ast.Raise(None, None)])] if form != "finally" else []
    final = stmts(f"{done} = True") if form != "except-reraise" else []
    p.own = [ast.Try(body=own, handlers=handlers, orelse=[], finalbody=final)]
    return form


# --------------------------------------------------------------- state and output

def cache_global(p: Program, rng: random.Random) -> str | None:
    if p.is_generator():
        return None
    c = _impl_call(p, rng)
    if c is None:
        return None
    calls, memo = p.fresh("calls"), p.fresh("memo")
    p.append(*stmts(f"{calls} = 0\n{memo} = {{}}"))
    key = "repr((" + ", ".join(p.params) + ("," if len(p.params) == 1 else "") + "))"
    p.own = stmts(f"""
        global {calls}
        {calls} += 1
        key = {key}
        if key in {memo}:
            return {memo}[key]
        r = {ast.unparse(c)}
        if type(r) in (int, float, str, bool, type(None)):
            {memo}[key] = r
        return r
        """)
    return "module-level memo of immutable results, call counter"


def lru_cache(p: Program, rng: random.Random) -> str | None:
    if p.is_generator() or p.fn.args.kwarg or p.fn.args.vararg:
        return None
    c = _impl_call(p, rng)
    if c is None:
        return None
    cached = p.fresh("cached")
    assert isinstance(c.func, ast.Name)
    impl = c.func.id
    p.append(*stmts(f"import functools\n{cached} = functools.lru_cache(maxsize=None, "
                    f"typed=True)({impl})"))
    names = p.params
    p.own = stmts(f"""
        try:
            hash(({', '.join(names)}{',' if len(names) == 1 else ''}))
        except TypeError:
            return {ast.unparse(c)}
        return {ast.unparse(ast.Call(ast.Name(cached, ast.Load()), c.args, c.keywords))}
        """)
    return "functools.lru_cache, unhashable arguments uncached"


def output(p: Program, rng: random.Random) -> str | None:
    own = p.own
    if not own:
        return None
    shown = ", ".join(p.params) or "None"
    starts = {
        "print": f"print('called with', repr(({shown},))[:200])",
        "stderr": f"print('debug:', repr(({shown},))[:200], file=sys.stderr)",
        "write": "sys.stdout.write('working...\\n')\nsys.stdout.flush()",
        "warning": "warnings.warn('this is a test warning', RuntimeWarning)",
        "logging": "logging.getLogger('solution').warning('computing %s', "
                   f"repr(({shown},))[:100])",
        "unicode": "print('✓ démarrage — 计算 🚀')",
    }
    picked = rng.sample(sorted(starts), rng.randint(1, 3))
    head = stmts("import sys, warnings, logging\n" + "\n".join(starts[k] for k in picked))
    r = p.fresh("r")
    end = rng.random() < 0.6
    if end and not p.is_generator():
        replace_returns(own, lambda v: [ast.Assign([ast.Name(r, ast.Store())], v),
                                        *stmts(f"print('result:', repr({r})[:200])"),
                                        _ret(ast.Name(r, ast.Load()))])
        picked.append("result")
    if rng.random() < 0.3:
        loops = [n for n in own_walk(own) if isinstance(n, (ast.For, ast.While))]
        for loop in loops:  # debug output on every iteration
            what = ast.unparse(loop.target) if isinstance(loop, ast.For) else "'again'"
            loop.body.insert(0, stmts(f"print('step', repr({what})[:50])")[0])
        if loops:
            picked.append("in loops")
    p.own = head + own
    if rng.random() < 0.5:
        p.append(*stmts("print('module loaded')"))
        picked.append("at load")
    return "+".join(picked)


def module_setup(p: Program, rng: random.Random) -> str | None:
    setups = {
        "recursionlimit": "import sys\nsys.setrecursionlimit(max(sys.getrecursionlimit(), "
                          "5000))",
        "environ": f"import os\n{PREFIX}HOME = os.environ.get('HOME', '')",
        "atexit": "import atexit\natexit.register(print, 'bye')",
        "gc": "import gc\ngc.collect()",
        "random-seed": "import random\nrandom.seed(12345)",
        "main-guard": f"if __name__ == '__main__':\n    print({p.fn.name!r})",
    }
    picked = rng.sample(sorted(setups), rng.randint(1, 3))
    p.append(*stmts("\n".join(setups[k] for k in picked)))
    return "+".join(picked)


# -------------------------------------------------------------------- the surface

def rename(p: Program, rng: random.Random) -> str | None:
    own = p.own
    nodes = ast.Module(own, [])
    bound_otherwise = {a.arg for a in ast.walk(nodes) if isinstance(a, ast.arg)} | {
        n.name for n in ast.walk(nodes) if isinstance(n, ast.ExceptHandler) and n.name} | {
        (a.asname or a.name).split(".")[0] for a in ast.walk(nodes)
        if isinstance(a, ast.alias)} | {
        x for n in ast.walk(nodes) if isinstance(n, (ast.Global, ast.Nonlocal))
        for x in n.names} | {
        n.name for n in ast.walk(nodes) if isinstance(n, (ast.MatchAs, ast.MatchStar))
        and n.name} | {
        n.name for n in ast.walk(nodes)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    keep = set(p.params) | bound_otherwise | _module_names(p) | set(dir(builtins))
    locals_ = sorted({n.id for n in ast.walk(nodes) if isinstance(n, ast.Name)
                      and isinstance(n.ctx, ast.Store)} - keep)
    if not locals_:
        return None
    stems = ("tmp", "val", "acc", "item", "x", "données", "ñ", "αβ", "结果")
    new = {old: p.fresh(rng.choice(stems)) for old in locals_}
    for n in ast.walk(nodes):
        if isinstance(n, ast.Name) and n.id in new:
            n.id = new[n.id]
    p.own = own
    return f"{len(new)} local(s)"


def annotate(p: Program, rng: random.Random) -> str | None:
    """Annotations removed where the prompt has them, `object` added where it has none,
    and every plain local assignment annotated."""
    args = [*p.fn.args.posonlyargs, *p.fn.args.args, *p.fn.args.kwonlyargs]
    if any(a.annotation is not None for a in args) or p.fn.returns is not None:
        for a in args:
            a.annotation = None
        p.fn.returns = None
        detail = "annotations removed"
    else:
        for a in args:
            a.annotation = ast.Name("object", ast.Load())
        p.fn.returns = ast.Name("object", ast.Load())
        detail = "annotations added"
    own = p.own
    declared = {x for s in own_walk(own) if isinstance(s, (ast.Global, ast.Nonlocal))
                for x in s.names}
    changed = 0
    for block in _blocks(own):
        for i, s in enumerate(block):
            if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(
                    s.targets[0], ast.Name) and s.targets[0].id not in declared:
                block[i] = ast.AnnAssign(s.targets[0], ast.Name("object", ast.Load()),
                                         s.value, simple=1)
                changed += 1
    p.own = own
    return detail + (f", {changed} local annotation(s)" if changed else "")


def _blocks(own: list[ast.stmt]) -> list[list[ast.stmt]]:
    """The statement lists of `own` in its own scope (not in nested defs)."""
    out = [own]
    for n in own_walk(own):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for field in ("body", "orelse", "finalbody"):
            sub = getattr(n, field, None)
            if isinstance(sub, list) and sub and isinstance(sub[0], ast.stmt):
                out.append(sub)
        if isinstance(n, ast.ExceptHandler):
            out.append(n.body)
    return out


def asserts(p: Program, rng: random.Random) -> str | None:
    own = p.own
    if not own:
        return None
    checks: list[ast.stmt] = [ast.Expr(ast.Constant("Checks that always hold, then the "
                                                    "work."))]
    checks += stmts("\n".join(f"assert isinstance({n}, object), {n!r}" for n in p.params))
    r = p.fresh("r")
    if not p.is_generator():
        replace_returns(own, lambda v: [ast.Assign([ast.Name(r, ast.Store())], v),
                                        *stmts(f"assert {r} is {r}"),
                                        _ret(ast.Name(r, ast.Load()))])
    p.own = checks + own
    return "isinstance and identity asserts"


def defensive_copy(p: Program, rng: random.Random) -> str | None:
    names = [a.arg for a in (*p.fn.args.posonlyargs, *p.fn.args.args)]
    if not names or not p.own:
        return None
    p.own = stmts("import copy\n" + "\n".join(f"{n} = copy.deepcopy({n})" for n in names)) \
        + p.own
    return "deepcopy of the arguments"


def kwcall(p: Program, rng: random.Random) -> str | None:
    """Internal calls by keyword: the module's own functions (the prompt's helpers, the
    entry point's recursion) and a few builtins with keyword parameters."""
    own = p.own
    sigs = {n.name: n.args for n in p.module.body if isinstance(n, ast.FunctionDef)}
    builtin_kw = {"enumerate": ("iterable", "start"), "round": ("number", "ndigits"),
                  "int": ("x", "base"), "sum": ("iterable", "start")}
    shadowed = stored(own) | _module_names(p)
    changed = 0
    for n in ast.walk(ast.Module(own, [])):
        if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Name)) or any(
                isinstance(a, ast.Starred) for a in n.args):
            continue
        name = n.func.id
        if name in sigs and name not in stored(own):
            a = sigs[name]
            if a.posonlyargs or len(n.args) > len(a.args) or not n.args:
                continue
            n.keywords = [ast.keyword(x.arg, v) for x, v in zip(a.args, n.args,
                                                                strict=False)] + n.keywords
            n.args = []
            changed += 1
        elif name in builtin_kw and name not in shadowed and len(n.args) == 2:
            n.keywords = [ast.keyword(builtin_kw[name][1], n.args[1]), *n.keywords]
            n.args = n.args[:1]
            changed += 1
    if changed:
        p.own = own
        return f"{changed} call(s) by keyword"
    c = _impl_call(p, rng)
    if c is None:
        return None
    p.own = [_ret(p.call(c.func, keywords=True))]
    return "helper called by keyword"


def expr_wrap(p: Program, rng: random.Random) -> str | None:
    own = p.own
    form = rng.choice(("(lambda v: v)({})", "[{}][0]", "{} if True else None",
                       "({},)[-1]"))
    if p.is_generator() or replace_returns(
            own, lambda v: [_ret(expr(form.format(ast.unparse(v))))]) == 0:
        return None
    p.own = own
    return form.format("e")


def redefine(p: Program, rng: random.Random) -> str | None:
    p.redefine = True
    return "whole module after the prompt"


CORRECT: dict[str, Transform] = {
    "redefine": redefine, "helper": helper, "closure": closure,
    "class_static": class_static, "class_instance": class_instance,
    "callable_instance": callable_instance, "decorator": decorator,
    "recursion": recursion, "generator": generator, "kwcall": kwcall,
    "thread": thread, "coroutine": coroutine, "tempfile": tempfile_,
    "signal": coerce_signal, "try_finally": try_finally, "cache_global": cache_global,
    "lru_cache": lru_cache, "output": output, "module_setup": module_setup,
    "rename": rename, "annotate": annotate, "asserts": asserts,
    "defensive_copy": defensive_copy, "expr_wrap": expr_wrap,
}
"""Semantics-preserving transformations by kind."""

COMBINABLE = ("helper", "closure", "class_static", "class_instance", "recursion",
              "generator", "kwcall", "thread", "coroutine", "tempfile", "try_finally",
              "cache_global", "output", "module_setup", "rename", "asserts", "expr_wrap")
"""Kinds `combo` draws two or three from (in a random order)."""


def combo(p: Program, rng: random.Random) -> str | None:
    picked = rng.sample(COMBINABLE, rng.randint(2, 3))
    done = []
    for kind in picked:
        detail = CORRECT[kind](p, rng)
        if detail is not None:
            done.append(kind)
    return "+".join(done) if len(done) >= 2 else None


PROBES = RETURN_KINDS
"""Return-type variants: equal-valued or other forms of the answer (returns.py)."""
