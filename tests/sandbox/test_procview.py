"""procview.py: the /proc files a sandbox reads instead of the host's figures (what a
sandbox sees through them is tests/adversarial/test_l_tier_views.py, on every tier)."""

from __future__ import annotations

import os
from pathlib import Path

from trialbox.sandbox import procview
from trialbox.types import Limits


def _fields(text: str) -> list[str]:
    return [line.split(":")[0] for line in text.splitlines()]


def test_meminfo_keeps_the_kernels_fields_and_says_the_limit() -> None:
    shown = procview.meminfo(Limits(memory_mb=300).memory_bytes).decode()
    with open("/proc/meminfo") as f:
        host = f.read()
    assert _fields(shown) == _fields(host)
    values = {line.split(":")[0]: line.split()[1:] for line in shown.splitlines()}
    for name in ("MemTotal", "MemFree", "MemAvailable", "CommitLimit"):
        assert values[name] == [str(300 * 1024), "kB"], (name, values[name])
    assert values["SwapTotal"] == ["0", "kB"] and values["Cached"] == ["0", "kB"]
    # the kernel's own layout: the name padded to 16 columns, the number to 8
    assert shown.splitlines()[0] == "MemTotal:" + " " * 7 + "  307200 kB"


def test_cpus_shown_is_the_allowance_within_the_host() -> None:
    host = os.cpu_count() or 1
    assert procview.cpus_shown(Limits(cpus=0.25)) == 1
    assert procview.cpus_shown(Limits(cpus=1.0)) == 1
    assert procview.cpus_shown(Limits(cpus=1.5)) == min(2, host)
    assert procview.cpus_shown(Limits(cpus=1000)) == host
    stat = procview.stat(1).decode().splitlines()
    assert [line.split()[0] for line in stat[:2]] == ["cpu", "cpu0"]
    assert not any(line.startswith("cpu1") for line in stat)
    assert procview.cpuinfo(1).decode().count("processor\t:") == 1


def test_a_view_is_rewritten_in_place_only_when_the_limits_change(tmp_path: Path) -> None:
    view = procview.ProcView(str(tmp_path / "v"), Limits(memory_mb=64))
    assert sorted(os.listdir(view.dir)) == sorted(procview.NAMES)
    meminfo = view.path("meminfo")
    inode, mtime = os.stat(meminfo).st_ino, os.stat(meminfo).st_mtime_ns
    view.show(Limits(memory_mb=64, wall_s=1))  # the same figures: nothing written
    assert os.stat(meminfo).st_mtime_ns == mtime
    view.show(Limits(memory_mb=32))
    assert os.stat(meminfo).st_ino == inode  # a bind of it sees the new text
    assert "MemTotal:          32768 kB" in open(meminfo).read()
    assert oct(os.stat(meminfo).st_mode & 0o777) == "0o444"
    only = procview.ProcView(str(tmp_path / "g"), Limits(), ("meminfo",))
    assert os.listdir(only.dir) == ["meminfo"]
