"""The cells' hot path in C (cell.c): built here, used by default, and the spec format
both implementations read. (Every other test of this suite runs on both paths: see the
`runner` fixture in conftest.py.)"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import shutil
import stat
import struct
from typing import Any

import pytest

from tests.conftest import Runner
from trialbox.errors import SandboxUnavailable
from trialbox.sandbox import CellPool, NamespaceSandbox, PoolConfig, native, zygote_client
from trialbox.sandbox.zygote_client import BASE_ENV, encode_spec
from trialbox.types import ExecStatus, Limits

FAST = Limits(wall_s=3, memory_mb=128, disk_mb=16)


def zygote_module() -> Any:
    """zygote.py imported as a plain module (it is standalone: it runs as a script)."""
    spec = importlib.util.spec_from_file_location("_zygote_under_test", zygote_client.ZYGOTE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def a_spec(**changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "mode": "python", "argv": ["python3", "-c", "print('hi')", "x y"],
        "path": "/usr/bin/python3", "env": dict(BASE_ENV), "cwd": "/workspace",
        "uid": 1_000_123, "fds": [5, 9],
        "rlimits": {"RLIMIT_NOFILE": [64, 64], "RLIMIT_CPU": [7, 8],
                    "RLIMIT_CORE": [0, 0], "RLIMIT_FSIZE": [1 << 33, -1]}}
    spec.update(changes)
    return spec


def test_spec_round_trips_through_the_zygotes_decoder() -> None:
    z = zygote_module()
    import resource
    raw = b"G" + encode_spec(a_spec())
    uid, rlimits, targets, cwd, rest = z.decode_spec(raw)
    assert (uid, targets, cwd) == (1_000_123, [5, 9], "/workspace")
    assert rlimits == [(resource.RLIMIT_NOFILE, 64, 64), (resource.RLIMIT_CPU, 7, 8),
                       (resource.RLIMIT_CORE, 0, 0),
                       (resource.RLIMIT_FSIZE, 1 << 33, resource.RLIM_INFINITY)]
    mode, path, argv, env = z.decode_program(rest)
    assert (mode, path, argv) == ("python", "/usr/bin/python3",
                                  ["python3", "-c", "print('hi')", "x y"])
    assert env is None  # the pool's own environment: the candidate inherits it


def test_spec_carries_odd_text_and_other_environments_exactly() -> None:
    z = zygote_module()
    argv = ["prog", "", "é\udcff", "=", "a=b"]  # empty, non-ASCII, a lone surrogate
    env = {"PATH": "/usr/bin", "ODD": "=x=\udcfe", "EMPTY": ""}
    *_, rest = z.decode_spec(b"G" + encode_spec(a_spec(mode="exec", path="", argv=argv,
                                                        env=env, cwd="/tmp/é")))
    assert z.decode_program(rest) == ("exec", "", argv, env)
    *_, rest = z.decode_spec(b"G" + encode_spec(a_spec(env={})))
    assert z.decode_program(rest)[3] == {}
    assert z.decode_spec(b"M" + encode_spec(a_spec(cwd="/tmp/é")))[3] == "/tmp/é"


def test_a_truncated_spec_is_refused() -> None:
    z = zygote_module()
    raw = b"G" + encode_spec(a_spec())
    with pytest.raises((ValueError, IndexError, struct.error)):
        z.decode_spec(raw[:30])


def test_pools_use_the_c_path_where_gcc_is(runner: Runner) -> None:
    assert shutil.which("gcc", path="/usr/bin:/bin"), "gcc is one of setup-system's packages"
    default = PoolConfig()
    assert default.native == "auto"
    if runner.pool.config.native != "off":
        assert runner.pool.native and runner.pool.native_path
        assert runner.pool.native_path.startswith(runner.pool.dir)


def test_build_is_cached_and_root_only(tmp_path: Any) -> None:
    first = native.build(str(tmp_path))
    st = os.stat(first)
    assert st.st_uid == os.geteuid() and not st.st_mode & 0o022
    assert stat.S_IMODE(os.stat(os.path.join(tmp_path, "native")).st_mode) == 0o700
    mtime = st.st_mtime_ns
    assert native.build(str(tmp_path)) == first
    assert os.stat(first).st_mtime_ns == mtime  # not built again


def test_build_refuses_a_cache_others_can_write(tmp_path: Any) -> None:
    cache = tmp_path / "native"
    cache.mkdir()
    os.chmod(cache, 0o777)
    with pytest.raises(native.NativeUnavailable, match="writable by others"):
        native.build(str(tmp_path))


def test_build_says_what_is_missing(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(native.NativeUnavailable, match="install gcc"):
        native.build(str(tmp_path), compiler="no-such-cc")
    broken = tmp_path / "broken.c"
    broken.write_text("int tb_cell( {\n")
    monkeypatch.setattr(native, "SOURCE", str(broken))
    with pytest.raises(native.NativeUnavailable, match="failed on"):
        native.build(str(tmp_path / "other"))


def _pool_runs(config: PoolConfig) -> tuple[bool, Any]:
    async def body() -> tuple[bool, Any]:
        p = await CellPool(config).start()
        try:
            async with await NamespaceSandbox.open(p, FAST) as sb:
                r = await sb.exec(["python3", "-c", "print(6 * 7)"])
            return p.native, r
        finally:
            await p.close()
    return asyncio.run(body())


def test_without_a_compiler_auto_falls_back_and_on_refuses(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def no_gcc(state_dir: str, compiler: str = "gcc") -> str:
        raise native.NativeUnavailable("no C compiler (gcc) in /usr/bin: install gcc")
    monkeypatch.setattr(native, "build", no_gcc)
    with caplog.at_level(logging.WARNING, logger="trialbox.sandbox.pool"):
        used, r = _pool_runs(PoolConfig(warm=1, native="auto"))
    assert not used and r.status is ExecStatus.OK and r.stdout == b"42\n"
    assert "hot path in Python" in caplog.text and "install gcc" in caplog.text
    with pytest.raises(SandboxUnavailable, match="install gcc"):
        _pool_runs(PoolConfig(warm=1, native="on"))


def test_native_setting_is_checked() -> None:
    from trialbox.errors import UsageError
    with pytest.raises(UsageError, match="native must be"):
        PoolConfig(native="yes")


@pytest.mark.parametrize("mode", ["on", "off"])
def test_a_malformed_spec_is_infrastructure_not_the_candidates(
        mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A spec the candidate cannot read is reported by the cell (`E`), the run is INFRA
    with the cause, and the pool goes on working."""
    real = zygote_client.encode_spec
    broken = {"on": True}

    def encode(spec: dict[str, Any], *base: Any) -> bytes:
        return real(spec, *base)[:7] if broken["on"] else real(spec, *base)
    monkeypatch.setattr(zygote_client, "encode_spec", encode)

    async def body() -> tuple[Any, Any]:
        p = await CellPool(PoolConfig(warm=1, native=mode)).start()
        try:
            async with await NamespaceSandbox.open(p, FAST) as sb:
                bad = await sb.exec(["python3", "-c", "print(1)"])
            broken["on"] = False
            async with await NamespaceSandbox.open(p, FAST) as sb:
                good = await sb.exec(["python3", "-c", "print(2)"])
            return bad, good
        finally:
            await p.close()
    bad, good = asyncio.run(body())
    assert bad.status is ExecStatus.INFRA, bad
    assert "cell setup (C)" in bad.message and "spec" in bad.message.lower(), bad.message
    assert good.status is ExecStatus.OK and good.stdout == b"2\n"
