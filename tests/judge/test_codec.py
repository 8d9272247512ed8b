"""The plain-data codec: exact round trips, refusal of anything but plain data, and a
decoder that accepts nothing `encode` could not have made (DESIGN.md, decision 2)."""

from __future__ import annotations

import ast
import collections
import enum
import math
import re
import shutil
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trialbox.judge import codec
from trialbox.judge.codec import MAX_DEPTH, MAX_ITEMS, MAX_SIZE, CodecError, decode, encode

CODEC_FILE = Path(codec.__file__)
NAN = float("nan")


def same(a: Any, b: Any) -> bool:
    """Equal with identical types all the way down; nan is the same as nan, 0.0 is not
    the same as -0.0, and dict order counts."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(map(same, a, b))
    if type(a) is dict:
        pairs = zip(a.items(), b.items(), strict=False)
        return len(a) == len(b) and all(same(ka, kb) and same(va, vb)
                                        for (ka, va), (kb, vb) in pairs)
    if type(a) in (set, frozenset):
        left = list(b)
        for x in a:
            match = next((i for i, y in enumerate(left) if same(x, y)), None)
            if match is None:
                return False
            left.pop(match)
        return not left
    return bool(a == b)


def round_trip(value: Any) -> Any:
    data = encode(value)
    assert type(data) is bytes
    back = decode(data)
    assert same(back, value), (value, back)
    assert encode(back) == data  # one encoding per value
    return back


def test_same_is_strict_about_types_nan_zero_sign_and_order():
    assert same([1, (NAN, {b"x"})], [1, (NAN, {b"x"})])
    assert not same(1, True) and not same(1, 1.0) and not same([1], (1,))
    assert not same(0.0, -0.0) and not same({0.0}, {-0.0})
    assert not same({1: 2, 3: 4}, {3: 4, 1: 2})
    assert not same(set(), frozenset())


# -- round trips ----------------------------------------------------------------------

EDGE_FLOATS = [0.0, -0.0, NAN, math.inf, -math.inf, 5e-324, -5e-324, 2.2250738585072014e-308,
               1.7976931348623157e308, -1.7976931348623157e308, 0.1, 1e16, 1e-7, 2.0**53,
               2.0**53 + 2, 123456789.123456789, math.pi]
EDGE_INTS = [0, 1, -1, 2**53 - 1, 2**53, -(2**53), 2**53 + 1, -(2**53) - 1, 2**63, -(2**63),
             2**64 + 1, 10**4300, 10**5000 + 7, -(2**100_000) + 3]


def number_id(x: float) -> str:
    if type(x) is float or abs(x) < 10**30:
        return repr(x)
    return f"{'-' if x < 0 else ''}{x.bit_length()}-bit int"


@pytest.mark.parametrize("x", EDGE_FLOATS + EDGE_INTS, ids=number_id)
def test_edge_numbers_round_trip_exactly(x):
    back = round_trip(x)
    assert type(back) is type(x)
    if type(x) is float and not math.isnan(x):
        assert back.hex() == x.hex()


@pytest.mark.parametrize("value", [
    None, True, False, "", b"", [], (), {}, set(), frozenset(),
    "ascii", "é ü ∑ 😀 中文", "\ud800 lone surrogate \udfff", "\x00\n\t\"\\/", bytes(range(256)),
    [[], [[]], ((),), [(), {}]],
    (1,), ((1, 2), [3, (4,)]),
    {"b": 1, "a": 2, "c": 3},  # order kept
    {1: "int", 2.5: "float", None: "none", False: "bool", b"k": "bytes", (1, (2, b"x")): "tuple",
     frozenset({1, "a"}): "frozenset", "": "str", -0.5: "minus"},
    {1: "one"}, {True: "true"}, {1.0: "float one"},  # equal keys, types kept
    {NAN: 1}, {float("nan"): 1, float("nan"): 2},  # two distinct nan keys
    {1, "1", b"1", (1,), frozenset({1}), None, 2.5, NAN},
    frozenset({frozenset({frozenset()}), (frozenset({(1, 2)}),)}),
    {-1, -2},  # hash(-1) == hash(-2)
    [2**200, -(2**200), {2**70: (2**80, {2**90})}],
    {"nested": [{"deep": ({1, 2}, frozenset({"x"}), {b"y": [None, NAN, -0.0]})}]},
], ids=lambda v: repr(v)[:40])
def test_values_round_trip_with_exact_types(value):
    round_trip(value)


def test_encoding_is_compact_ascii_json_with_tags():
    # the example in the module docstring
    assert encode([(1, b"hi"), {"k": {-0.0}}, 2**64]) == (
        b'[{"t":"tuple","v":[1,{"t":"bytes","v":"aGk="}]},{"t":"dict","v":[["k",'
        b'{"t":"set","v":[-0.0]}]]},{"t":"int","v":"10000000000000000"}]')
    assert encode([None, True, 2**53, -1.5, "\u00e9"]) == (
        b'[null,true,9007199254740992,-1.5,"\\u00e9"]')
    assert encode([NAN, -math.inf]) == b'[{"t":"float","v":"nan"},{"t":"float","v":"-inf"}]'
    assert encode({1, 2, 10}) == b'{"t":"set","v":[1,10,2]}'  # sorted by encoding


def test_set_encoding_does_not_depend_on_iteration_order():
    items = [f"s{i}" for i in range(50)] + list(range(50)) + [(i, b"b") for i in range(50)]
    a, b = set(items), set(reversed(items))
    b.update(range(1000, 2000))
    b.difference_update(range(1000, 2000))  # same content, a different table history
    assert encode(a) == encode(b)
    assert encode(frozenset(b)) == encode(a).replace(b'"set"', b'"frozenset"', 1)


def test_shared_references_are_not_cycles():
    leaf = [1, {2}]
    back = round_trip([leaf, leaf, (leaf,), {"x": leaf}])
    assert back[0] is not back[1]  # plain data: sharing is not kept, and need not be


plain_scalars = (st.none() | st.booleans() | st.integers() | st.sampled_from(EDGE_INTS[:-3])
                 | st.integers(min_value=-(2**300), max_value=2**300) | st.floats()
                 | st.sampled_from(EDGE_FLOATS) | st.text() | st.binary())
plain_hashables = st.recursive(
    plain_scalars,
    lambda inner: st.lists(inner, max_size=3).map(tuple) | st.frozensets(inner, max_size=3),
    max_leaves=8)
plain_values = st.recursive(
    plain_hashables,
    lambda inner: (st.lists(inner, max_size=4) | st.lists(inner, max_size=4).map(tuple)
                   | st.dictionaries(plain_hashables, inner, max_size=4)
                   | st.sets(plain_hashables, max_size=4)
                   | st.frozensets(plain_hashables, max_size=4)),
    max_leaves=25)


@settings(max_examples=400, deadline=None)
@given(plain_values)
def test_any_plain_value_round_trips_exactly(value):
    round_trip(value)


# -- refusing what is not plain data --------------------------------------------------

class Foo:
    pass


class AlwaysEqual:
    def __eq__(self, other):
        return True

    def __hash__(self):
        return 0


class SneakyStr(str):
    def __eq__(self, other):
        return True

    __hash__ = str.__hash__


class SneakyInt(int):
    pass


class Color(enum.IntEnum):
    RED = 1


class Point(NamedTuple):
    x: int
    y: int


class LooksLikeInt(type):
    """A metaclass whose classes claim to be int under == and hash()."""

    def __eq__(cls, other):
        return True

    def __hash__(cls):
        return hash(int)


class FakeInt(metaclass=LooksLikeInt):
    pass


NOT_PLAIN = [
    (Foo(), "Foo"), (AlwaysEqual(), "AlwaysEqual"), (SneakyStr("x"), "SneakyStr"),
    (SneakyInt(3), "SneakyInt"), (Color.RED, "Color"), (Point(1, 2), "Point"),
    (FakeInt(), "FakeInt"), (FakeInt, "LooksLikeInt"),
    (collections.OrderedDict(a=1), "OrderedDict"),
    (collections.defaultdict(list), "defaultdict"), (collections.Counter("ab"), "Counter"),
    (type("MyList", (list,), {})([1]), "MyList"), (type("MyFloat", (float,), {})(1.0), "MyFloat"),
    (type("MyBytes", (bytes,), {})(b"x"), "MyBytes"), (type("MySet", (set,), {})(), "MySet"),
    (bytearray(b"x"), "bytearray"), (memoryview(b"x"), "memoryview"), (1j, "complex"),
    (Fraction(1, 3), "Fraction"), (range(3), "range"), (iter([]), "list_iterator"),
    (lambda: 0, "function"), (print, "builtin_function_or_method"), (int, "type"),
    (Foo, "type"), (Ellipsis, "ellipsis"), (NotImplemented, "NotImplementedType"),
    ((x for x in []), "generator"), (object(), "object"), (sys, "module"),
]


@pytest.mark.parametrize(("value", "name"), NOT_PLAIN, ids=[n for _, n in NOT_PLAIN])
def test_anything_but_exact_builtin_types_is_refused(value, name):
    with pytest.raises(CodecError, match=rf"^at top level: type {name} is not plain data$"):
        encode(value)
    with pytest.raises(CodecError, match=rf"^at \[1\]\[0\]: type {name} is not plain data$"):
        encode([0, (value,)])


def test_the_error_names_the_path_to_the_offending_value():
    with pytest.raises(CodecError, match=r"^at \[2\]\['k'\]: type Foo is not plain data$"):
        encode([0, 1, {"k": Foo()}])
    with pytest.raises(CodecError, match=r"^at \[0\]\[5\]\[1\]: type AlwaysEqual is not"):
        encode([{5: (1, AlwaysEqual())}])
    with pytest.raises(CodecError, match=r"^at <key 1>: type Foo is not plain data$"):
        encode({"a": 1, Foo(): 2})
    with pytest.raises(CodecError, match=r"^at <key 0>\[1\]: type SneakyStr"):
        encode({(1, SneakyStr("x")): 2})
    with pytest.raises(CodecError, match=r"^at \[<key 0>\]: type Foo"):  # long key: no repr
        encode({"k" * 100: Foo()})
    with pytest.raises(CodecError, match=r"^at \[0\]<item \d>: type AlwaysEqual"):
        encode([{1, 2, AlwaysEqual()}])


def test_cycles_are_refused_not_a_recursion_error():
    loop: list[Any] = [1]
    loop.append(loop)
    with pytest.raises(CodecError, match=r"^at \[1\]: cycle: this list contains itself$"):
        encode(loop)
    d: dict[str, Any] = {}
    d["me"] = [d]
    with pytest.raises(CodecError, match=r"^at \['me'\]\[0\]: cycle: this dict contains"):
        encode(d)
    t = ([],)
    t[0].append(t)
    with pytest.raises(CodecError, match="cycle"):
        encode(t)


# -- limits ---------------------------------------------------------------------------

def nested(depth: int, leaf: Any = 0, wrap: Any = list) -> Any:
    value = leaf
    for _ in range(depth):
        value = wrap([value])
    return value


@pytest.mark.parametrize("wrap", [list, tuple, lambda x: {"k": x[0]}, lambda x: frozenset(x)])
def test_depth_limit(wrap):
    round_trip(nested(MAX_DEPTH, wrap=wrap))
    too_deep = nested(MAX_DEPTH + 1, wrap=wrap)
    with pytest.raises(CodecError, match=f"nested more than {MAX_DEPTH} deep"):
        encode(too_deep)
    with pytest.raises(CodecError, match=f"nested more than {MAX_DEPTH} deep"):
        decode(encode(too_deep, max_depth=MAX_DEPTH + 1))
    with pytest.raises(CodecError, match="nested more than 3 deep"):
        encode(nested(4, wrap=wrap), max_depth=3)


def test_item_limit_counts_every_value():
    assert decode(encode([0] * (MAX_ITEMS - 1))) == [0] * (MAX_ITEMS - 1)  # + the list
    with pytest.raises(CodecError, match=f"more than {MAX_ITEMS} values"):
        encode([0] * MAX_ITEMS)
    with pytest.raises(CodecError, match=f"more than {MAX_ITEMS} values"):
        decode(encode([0] * MAX_ITEMS, max_items=MAX_ITEMS + 1))
    # a dict counts itself, each key and each value
    assert decode(encode({1: 2, 3: 4}, max_items=5), max_items=5) == {1: 2, 3: 4}
    with pytest.raises(CodecError, match="more than 4 values"):
        encode({1: 2, 3: 4}, max_items=4)
    with pytest.raises(CodecError, match="more than 4 values"):
        decode(encode({1: 2, 3: 4}), max_items=4)


def test_shared_reference_bomb_stops_at_the_item_limit():
    bomb: Any = []
    for _ in range(50):
        bomb = [bomb, bomb]  # 2**51 values once unfolded, from 51 lists
    start = time.monotonic()
    with pytest.raises(CodecError, match="more than 1000 values"):
        encode(bomb, max_items=1000)
    with pytest.raises(CodecError, match=f"more than {MAX_ITEMS} values"):
        encode(bomb)
    assert time.monotonic() - start < 20


def test_size_limit():
    value = ["x" * 100, b"y" * 100]
    data = encode(value)
    assert encode(value, max_size=len(data)) == data
    assert decode(data, max_size=len(data)) == value
    with pytest.raises(CodecError, match=f"more than max_size={len(data) - 1}"):
        encode(value, max_size=len(data) - 1)
    with pytest.raises(CodecError, match=f"input is {len(data)} bytes, more than max_size"):
        decode(data, max_size=len(data) - 1)
    start = time.monotonic()  # a huge value is refused before it is encoded
    with pytest.raises(CodecError, match=f"exceeds max_size={MAX_SIZE}"):
        encode([b"z" * (1 << 20)] * 20_000)
    with pytest.raises(CodecError, match=f"more than max_size={MAX_SIZE}"):
        decode(b'"' + b"a" * MAX_SIZE + b'"')
    assert time.monotonic() - start < 5


# -- decoding only what encode makes --------------------------------------------------

MALICIOUS = [
    # unknown or malformed tags
    (b'{"t":"pickle","v":"gASVAAAAAAAAAAAu"}', "unknown tag"),
    (b'{"t":"list","v":[]}', "unknown tag"),
    (b'{"t":"object","v":["os.system","true"]}', "unknown tag"),
    (b'{"t":"tuple","v":[],"x":1}', "not {"),
    (b'{"v":[],"t":"tuple"}', "not {"),
    (b'{"t":"tuple"}', "not {"),
    (b'{"t":"tuple","t":"set","v":[]}', "not {"),
    (b'{"t":1,"v":[]}', "not {"),
    (b'{"t":null,"v":[]}', "not {"),
    (b"{}", "not {"),
    (b'{"a":1}', "not {"),
    # wrong payloads
    (b'{"t":"tuple","v":"ab"}', "malformed payload"),
    (b'{"t":"set","v":{"t":"tuple","v":[]}}', "malformed payload"),
    (b'{"t":"dict","v":[[1]]}', "must be [key, value] pairs"),
    (b'{"t":"dict","v":[[1,2,3]]}', "must be [key, value] pairs"),
    (b'{"t":"dict","v":[{"t":"tuple","v":[1,2]}]}', "must be [key, value] pairs"),
    (b'{"t":"bytes","v":5}', "malformed payload"),
    (b'{"t":"bytes","v":"!!!!"}', "malformed base64"),
    (b'{"t":"bytes","v":"aGk"}', "malformed base64"),
    (b'{"t":"bytes","v":"aGl="}', "canonical"),  # padding bits set
    (b'{"t":"bytes","v":"\\u00e9AAA"}', "malformed base64"),
    (b'{"t":"int","v":5}', "malformed payload"),
    (b'{"t":"int","v":"5"}', "canonical"),  # small ints are never tagged
    (b'{"t":"int","v":"0x20000000000001"}', "malformed payload"),
    (b'{"t":"int","v":"20_000_000_000_001"}', "malformed payload"),
    (b'{"t":"int","v":" 20000000000001"}', "malformed payload"),
    (b'{"t":"int","v":"020000000000001"}', "malformed payload"),
    (b'{"t":"int","v":"20000000000001F"}', "malformed payload"),
    (b'{"t":"float","v":"1.5"}', "malformed payload"),
    (b'{"t":"float","v":"NaN"}', "malformed payload"),
    (b'{"t":"float","v":null}', "malformed payload"),
    # duplicates and unhashables
    (b'{"t":"dict","v":[[1,"a"],[1,"b"]]}', "duplicate key in dict"),
    (b'{"t":"dict","v":[[1,"a"],[true,"b"]]}', "duplicate key in dict"),
    (b'{"t":"dict","v":[[0.0,"a"],[-0.0,"b"]]}', "duplicate key in dict"),
    (b'{"t":"set","v":[1,1]}', "duplicate key in set"),
    (b'{"t":"frozenset","v":["a","a"]}', "duplicate key in frozenset"),
    (b'{"t":"set","v":[[1]]}', "unhashable key in set"),
    (b'{"t":"dict","v":[[[1],2]]}', "unhashable key in dict"),
    (b'{"t":"dict","v":[[{"t":"tuple","v":[[]]},2]]}', "unhashable key in dict"),
    # numbers JSON or encode would not write
    (b"NaN", "out of range"), (b"Infinity", "out of range"), (b"-Infinity", "out of range"),
    (b"[1e400]", "out of range"), (b"-1e99999999999", "out of range"),
    (b"9007199254740993", "out of range"),  # 2**53 + 1 must be tagged
    (b"1" * 5000, "integer literal of 5000 characters"),
    (b"[" + b"9" * 1_000_000 + b"]", "integer literal of 1000000 characters"),
    # not the canonical spelling of a value
    (b"[1, 2]", "canonical"), (b" 1", "canonical"), (b"1\n", "canonical"),
    (b"1.50", "canonical"), (b"1E5", "canonical"), (b"1e5", "canonical"), (b"-0", "canonical"),
    (b'"\\u00E9"', "canonical"), (b'"\\/"', "canonical"), (b'"\xc3\xa9"', "canonical"),
    (b'{"t":"set","v":[2,1]}', "canonical"),
    (b'{"t":"dict","v":[["a",1],["b",2]]} ', "canonical"),
    # not JSON, not UTF-8
    (b"", "not UTF-8 JSON"), (b"[1,2", "not UTF-8 JSON"), (b"[1,]", "not UTF-8 JSON"),
    (b"\xff\xfe[]", "not UTF-8 JSON"), (b'"\xed\xa0\x80"', "not UTF-8 JSON"),
    (b"\xef\xbb\xbf[]", "not UTF-8 JSON"), (b"[1] [2]", "not UTF-8 JSON"),
    (b"pickle", "not UTF-8 JSON"), (b"\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00]\x94.",
                                     "not UTF-8 JSON"),
    # nesting bombs
    (b"[" * 10_000 + b"]" * 10_000, "not UTF-8 JSON"),
    (b'{"t":"tuple","v":[' * 10_000 + b"]}" * 10_000, "not UTF-8 JSON"),
    (b"[" * 100 + b"]" * 100, f"nested more than {MAX_DEPTH} deep"),
    (b'{"t":"tuple","v":[' * 65 + b"]}" * 65, f"nested more than {MAX_DEPTH} deep"),
]


@pytest.mark.parametrize(("data", "why"), MALICIOUS, ids=[repr(d)[:50] for d, _ in MALICIOUS])
def test_decode_refuses_what_encode_would_not_make(data, why):
    with pytest.raises(CodecError, match=re.escape(why)):
        decode(data)


def test_decode_errors_name_the_path():
    with pytest.raises(CodecError, match=r"^at \[1\]\['k'\]: unknown tag or malformed"):
        decode(b'[0,{"t":"dict","v":[["k",{"t":"zip","v":[]}]]}]')
    with pytest.raises(CodecError, match=r"^at \[0\]<key 1>: number inf out of range$"):
        decode(b'[{"t":"dict","v":[[1,2],[1e999,3]]}]')


def test_hash_flooding_is_refused_quickly():
    m = 2**61 - 1  # ints equal mod 2**61-1 share a hash, making a set quadratic to build
    bad = b'{"t":"set","v":[%s]}' % b",".join(
        sorted(encode(i * m) for i in range(1, 100_001)))
    start = time.monotonic()
    with pytest.raises(CodecError, match="keys of this set share a hash"):
        decode(bad)
    with pytest.raises(CodecError, match="keys of this dict share a hash"):
        decode(encode({i * m: 0 for i in range(1, 30)}))
    assert time.monotonic() - start < 10
    round_trip({i * m for i in range(1, codec.MAX_SAME_HASH + 1)})


def test_decode_takes_bytes_only():
    for wrong in ("[]", bytearray(b"[]"), memoryview(b"[]"), None):
        with pytest.raises(TypeError, match="decode\\(\\) takes bytes"):
            decode(wrong)


# -- one standalone file --------------------------------------------------------------

def test_codec_is_one_standard_library_file_without_dangerous_names():
    tree = ast.parse(CODEC_FILE.read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= {"__future__", "base64", "collections", "functools", "json", "math",
                        "re", "typing"}, imported
    called = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    assert not called & {"eval", "exec", "compile", "__import__", "getattr", "setattr",
                         "globals", "vars", "open"}
    words = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    words |= {node.arg for node in ast.walk(tree) if isinstance(node, ast.keyword)}
    assert not (called | words) & {"pickle", "marshal", "object_hook", "cls"}
    assert len(CODEC_FILE.read_text().splitlines()) < 200


SYSTEM_PYTHON = "/usr/bin/python3"


def test_same_bytes_from_the_sandbox_python_under_other_hash_seeds(tmp_path):
    """The stub imports a copy of the file under the system python, isolated from
    trialbox and site-packages; both sides must make and accept the same bytes."""
    shutil.copy(CODEC_FILE, tmp_path / "_trialbox_codec.py")
    value = [{f"s{i}" for i in range(40)}, frozenset({(i, b"x") for i in range(20)}),
             {"k": (1.5, -0.0, NAN, 2**100)}, {None, True, 3, "3", b"3"}]
    program = ("import sys; sys.path.insert(0, '')\n"
               "import _trialbox_codec as c\n"
               "v = c.decode(sys.stdin.buffer.read())\n"
               "sys.stdout.buffer.write(c.encode(v))\n")
    for seed in ("1", "2", "12345"):
        out = subprocess.run(
            [SYSTEM_PYTHON, "-I", "-S", "-c", program], input=encode(value),
            capture_output=True, cwd=tmp_path, env={"PYTHONHASHSEED": seed}, timeout=60)
        assert out.returncode == 0, out.stderr.decode()
        assert out.stdout == encode(value)
        assert same(decode(out.stdout), value)
