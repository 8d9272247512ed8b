"""The vocabulary: validation errors name the field and say what to change."""

import math

import pytest

from trialbox.errors import InfraError, LimitsError, TrialboxError, UsageError
from trialbox.types import ExecResult, ExecStatus, Limits


def test_defaults_and_reference_quota():
    lim = Limits()
    assert lim.network is False, "network is off unless a task asks for it"
    ref = Limits.reference()
    assert (ref.cpus, ref.memory_mb, ref.disk_mb) == (2.0, 4096, 50 * 1024)
    assert ref.memory_bytes == 4096 * 2**20


@pytest.mark.parametrize("field,value", [
    ("wall_s", -1), ("wall_s", 0), ("cpu_s", math.nan), ("memory_mb", math.inf),
    ("pids", -5), ("disk_mb", 0), ("output_bytes", -1), ("open_files", 0), ("cpus", 0),
    ("wall_s", "10"), ("memory_mb", True), ("network", 1),
])
def test_bad_limits_name_the_field(field, value):
    with pytest.raises(LimitsError) as e:
        Limits(**{field: value})
    assert f"Limits.{field}" in str(e.value)


def test_too_small_and_too_large_limits_say_what_to_use():
    with pytest.raises(LimitsError, match="at least 16"):
        Limits(memory_mb=8)
    with pytest.raises(LimitsError, match="above the maximum"):
        Limits(wall_s=10**9)
    with pytest.raises(LimitsError):
        Limits().with_(pids=1)


def test_error_tree_keeps_the_three_kinds_apart():
    assert issubclass(LimitsError, UsageError) and issubclass(UsageError, TrialboxError)
    assert issubclass(InfraError, TrialboxError)
    assert not issubclass(InfraError, UsageError) and not issubclass(UsageError, InfraError)
    assert "ok" not in {s.value for s in ExecStatus} - {"ok"}
    assert {s.value for s in ExecStatus} == {"ok", "exit", "signal", "timeout", "memory",
                                             "output", "disk", "infra"}


def test_exec_result_json_keeps_bytes_and_decodes_leniently():
    r = ExecResult(ExecStatus.OK, exit_code=0, stdout=b"caf\xc3\xa9 \xff\xfe", stderr=b"")
    j = r.to_json()
    assert j["status"] == "ok"
    assert j["stdout"] == "café \ufffd\ufffd"
    import base64
    assert base64.b64decode(j["stdout_b64"]) == r.stdout
    nested = ExecResult(ExecStatus.EXIT, exit_code=1, compile=r).to_json()
    assert nested["compile"]["status"] == "ok"
