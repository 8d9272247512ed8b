"""The candidate stub's shortcuts around the codec: `load` builds exactly the values
codec.decode would from what the harness sends, and `_frame` writes exactly the bytes
codec.encode would for an answer — or the harness's strict decode would refuse it and
a correct solution would fail."""

from __future__ import annotations

import importlib
import math
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.judge.test_codec import EDGE_FLOATS, EDGE_INTS, plain_values, same, stdlib_values
from trialbox.judge import codec


@pytest.fixture(scope="module")
def stub():
    sys.modules.setdefault("_trialbox_codec", codec)  # as the sandbox names it
    return importlib.import_module("trialbox.judge.candidate_stub")


@settings(max_examples=400, deadline=None)
@given(plain_values)
def test_load_builds_what_decode_builds(stub, value):
    data = codec.encode([7, [value, value]])
    got, want = stub.load(data), codec.decode(data)
    assert same(got, want) and same(got[1][0], value)
    if "nan" not in repr(want):  # hash(nan) is its address: no order to compare
        assert repr(got) == repr(want)  # built in the same order: same iteration order


@settings(max_examples=200, deadline=None)
@given(stdlib_values)
def test_load_builds_the_stdlib_values_decode_builds(stub, value):
    data = codec.encode([7, [value]])
    assert same(stub.load(data), codec.decode(data))


def test_changed_reports_only_the_arguments_a_call_changed(stub):
    data = codec.encode([1, [[3, 1], 5, {"k": [1]}, (1, [2]), frozenset({1})], {"kw": [0]}])
    (call_id, args, kwargs), tree = stub._load(data)
    assert stub._changed(args, kwargs, tree) is None
    args[0].sort()
    args[2]["k"].append(2)
    args[3][1].clear()
    kwargs["kw"].append(1)
    assert stub._changed(args, kwargs, tree) == [
        [0, [1, 3]], [2, {"k": [1, 2]}], [3, (1, [])], ["kw", [0, 1]]]


SCALARS = [None, True, False, "", "ok", "é ü ∑ 😀", "\ud800", "\x00\"\\/\n", "x" * 70_000,
           *EDGE_INTS, *EDGE_FLOATS, 10**30, -(10**30), 1e16, 1e-7, 0.1]


@pytest.mark.parametrize("value", SCALARS, ids=lambda v: type(v).__name__)
@pytest.mark.parametrize("kind", ["ok", "raised", "bad_return", "é"])
def test_frame_writes_the_codecs_bytes_for_scalar_answers(stub, value, kind):
    for call_id in (0, 1, 12345, 2**53, 2**53 + 1, -3):
        assert stub._frame([call_id, kind, value]) == codec.encode([call_id, kind, value])


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=2**60), plain_values)
def test_frame_writes_the_codecs_bytes_for_any_answer(stub, call_id, value):
    assert stub._frame([call_id, "ok", value]) == codec.encode([call_id, "ok", value])


def test_frame_refuses_what_the_codec_refuses(stub):
    class Sneaky(str):
        def __eq__(self, other):
            return True

        __hash__ = str.__hash__
    for bad in (object(), [1, object()]):
        with pytest.raises(codec.CodecError):
            stub._frame([1, "ok", bad])
    # a str subclass crosses as the str it holds: its always-true __eq__ stays behind
    assert codec.decode(stub._frame([1, "ok", Sneaky("x")])) == [1, "ok", "x"]
    assert math.isnan(stub.load(codec.encode(float("nan"))))
