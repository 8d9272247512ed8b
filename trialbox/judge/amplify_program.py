"""Test amplification, sandbox side: run INSIDE a fresh sandbox by `amplify.py` as
`python3 _trialbox_amplify.py` with one JSON job on stdin per task batch, prints one JSON
line per task. Standard library only (and `_trialbox_codec`, copied beside it).

For each task: load the reference (prompt + canonical solution), run the task's own
tests with `candidate` bound to a recorder around it (the tests' inputs, as the tests
build them), mutate those inputs type-aware with a seeded RNG, run the reference on
each mutant under a per-call time limit, and keep the (input, output) pairs that are
plain data, deterministic (two runs agree), new, and within the per-task cap.
"""

import copy
import json
import math
import random
import signal
import sys
import time

import _trialbox_codec as codec

PLAIN = (type(None), bool, int, float, str, list, tuple, dict)


class _Timeout(BaseException):
    pass


_armed = [False]


def _alarm(signum, frame):
    # Only while a limited call runs: an alarm that lands after the call returned (a
    # loaded machine delays both) must not escape into the loop around it.
    if _armed[0]:
        _armed[0] = False
        raise _Timeout()


def _limited(limit, fn, *args):
    """fn(*args) under a time limit: (True, value) or (False, None) if it raised or
    overran."""
    _armed[0] = True
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        value = fn(*args)
        _armed[0] = False
        return True, value
    except BaseException:
        _armed[0] = False
        return False, None
    finally:
        _armed[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)


def _plain(v, depth=0):
    """Exact plain types a test can spell as a literal: finite floats only."""
    t = type(v)
    if depth > 8 or t not in PLAIN:
        return False
    if t is float:
        return math.isfinite(v)
    if t is int:  # spelt as a literal in the test: no 4,300-digit repr limit near
        return v.bit_length() <= 1024
    if t in (list, tuple):
        return all(_plain(x, depth + 1) for x in v)
    if t is dict:
        return all(_plain(k, depth + 1) and _plain(x, depth + 1) for k, x in v.items())
    return True


def _size(v):
    t = type(v)
    if t in (list, tuple):
        return 1 + sum(_size(x) for x in v)
    if t is dict:
        return 1 + sum(_size(k) + _size(x) for k, x in v.items())
    if t is str:
        return 1 + len(v) // 8
    return 1


# --------------------------------------------------------------------------- mutation

_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ,.!?-_"


def mutate(v, rng, depth=0):
    """A type-aware neighbour of `v` (same type, nested types preserved)."""
    t = type(v)
    if t is bool:
        return not v
    if t is int:
        return rng.choice([
            lambda: v + 1, lambda: v - 1, lambda: v + rng.randint(2, 10),
            lambda: v - rng.randint(2, 10), lambda: -v, lambda: v * 2, lambda: v // 2,
            lambda: 0, lambda: 1, lambda: rng.randint(-100, 100),
            lambda: rng.randint(10**3, 10**6),
            lambda: v + rng.choice([-1, 1]) * 10**rng.randint(2, 6),
        ])()
    if t is float:
        return rng.choice([
            lambda: v + 0.5, lambda: v - 0.5, lambda: -v, lambda: v * 2.0, lambda: v / 2.0,
            lambda: 0.0, lambda: round(rng.uniform(-100, 100), 3), lambda: v + 1e-3,
        ])()
    if t is str:
        alphabet = (v or _LETTERS) if rng.random() < 0.7 else _LETTERS
        i = rng.randint(0, len(v)) if v else 0
        return rng.choice([
            lambda: v[:i] + v[i + 1:], lambda: v[:i] + rng.choice(alphabet) + v[i:],
            lambda: v[:i] + rng.choice(alphabet) + v[i + 1:], lambda: v[::-1],
            lambda: v[: len(v) // 2], lambda: v[len(v) // 2:], lambda: v + v,
            lambda: v.swapcase(), lambda: "", lambda: "".join(rng.sample(v, len(v))),
        ])()
    if t in (list, tuple):
        items = list(v)
        ops = [lambda: [mutate(x, rng, depth + 1) if rng.random() < 0.5 else x
                        for x in items]]
        if t is list:
            ops += [lambda: rng.sample(items, len(items)), lambda: items[: len(items) // 2],
                    lambda: items[1:], lambda: items[:-1], lambda: [],
                    lambda: items + [mutate(rng.choice(items), rng, depth + 1)
                                     for _ in range(rng.randint(1, 3))] if items else [],
                    lambda: items + items, lambda: items[::-1]]
            if items:
                j = rng.randrange(len(items))
                ops += [lambda: items[:j] + [mutate(items[j], rng, depth + 1)] + items[j + 1:],
                        lambda: items[:j] + [items[j]] + items[j:]]
        out = rng.choice(ops)()
        return out if t is list else tuple(out)
    if t is dict:
        d = dict(v)
        if d and rng.random() < 0.5:
            k = rng.choice(list(d))
            d[k] = mutate(d[k], rng, depth + 1)
        elif d:
            k = rng.choice(list(d))
            d[mutate(k, rng, depth + 1)] = d[k]
        return d
    return v


def mutate_args(args, rng):
    """Mutate one or more of the arguments (their count and types kept)."""
    args = list(args)
    if not args:
        return tuple(args)
    for _ in range(rng.choice([1, 1, 1, 2])):
        i = rng.randrange(len(args))
        args[i] = mutate(args[i], rng)
    return tuple(args)


# --------------------------------------------------------------------------- one task

def _call(fn, args, limit):
    """fn(*args) on a deep copy, under a time limit: (True, value) or (False, None)."""
    return _limited(limit, lambda: fn(*copy.deepcopy(args)))


def amplify(task, params):
    rng = random.Random("%s:%s" % (params["seed"], task["task_id"]))
    ns = {"__name__": "reference"}
    exec(compile(task["prompt"] + task["canonical_solution"], "reference", "exec"), ns)
    ref = ns[task["entry_point"]]
    seeds = []

    def recorder(*args):
        seeds.append(copy.deepcopy(args))
        return ref(*args)

    tns = {"__name__": "tests"}
    exec(task["setup"], tns)
    tns["candidate"] = recorder
    tns[task["entry_point"]] = recorder
    for code in task["tests"]:
        # a failing or slow original test: the inputs it built before still count
        _limited(params["call_limit_s"] * 20, exec, code, tns)
    seeds = [a for a in seeds if _plain(a)]
    seen = {repr(a) for a in seeds}
    out = []
    deadline = time.monotonic() + params["task_budget_s"]
    pool = list(seeds)
    tries = 0
    while pool and len(out) < params["per_task"] and tries < params["max_tries"] \
            and time.monotonic() < deadline:
        tries += 1
        base = rng.choice(pool)
        args = mutate_args(base, rng)
        key = repr(args)
        if key in seen or not _plain(args) or _size(args) > params["max_size"]:
            continue
        seen.add(key)
        ok, value = _call(ref, args, params["call_limit_s"])
        if not ok or not _plain(value) or _size(value) > params["max_size"]:
            continue
        ok2, value2 = _call(ref, args, params["call_limit_s"])
        if not ok2 or repr(value2) != repr(value):  # not deterministic: dropped
            continue
        out.append([args, value])
        pool.append(args)  # mutants of mutants, as EvalPlus does
    return {"task_id": task["task_id"], "seeds": len(seeds), "tries": tries,
            "tests": [codec.encode(pair).decode("ascii") for pair in out]}


def main():
    signal.signal(signal.SIGALRM, _alarm)
    sys.setrecursionlimit(10000)
    job = json.loads(sys.stdin.read())
    for task in job["tasks"]:
        try:
            line = amplify(task, job["params"])
        except BaseException as e:  # a reference that does not load: no amplified tests
            line = {"task_id": task["task_id"], "error": "%s: %s" % (type(e).__name__, e),
                    "tests": []}
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
