"""F: snapshots and forks (trialbox.sandbox.snapshot, snapshot_archive) under a hostile
program, on the real namespace tier: a fork changes only its own files, whatever call
it changes them with; what a session holds is bounded by disk_mb in the archive too
(holes travel as holes); a hostile archive is refused with a UsageError, nothing else;
a fork's abuse of its own files never makes its parent or siblings fail. Time limits
are roomy: time is not under test (a loaded 2-core machine is slow)."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from collections.abc import Iterator

import pytest

from tests.conftest import Runner
from trialbox.errors import UsageError
from trialbox.sandbox import PoolConfig
from trialbox.sandbox.snapshot import Snapshot
from trialbox.store.artifacts import ArtifactStore
from trialbox.types import ExecStatus, Limits

LIM = Limits(wall_s=60, cpu_s=60, memory_mb=256, disk_mb=32, output_bytes=1 << 16)

PREPARE = r"""
import os
open('shared.txt', 'w').write('orig\n')
os.link('shared.txt', 'hard.txt')
open('/tmp/t.txt', 'w').write('orig\n')
os.makedirs('d'); open('d/f', 'w').write('orig\n')
open('map.bin', 'wb').write(b'o' * 8192)
"""

# Everything a fork can do to what it inherited.
TAMPER = r"""
import fcntl, mmap, os
open('shared.txt', 'a').write('fork\n')
open('hard.txt', 'a').write('via-link\n')
open('/tmp/t.txt', 'w').write('fork\n')
with open('map.bin', 'r+b') as f:
    m = mmap.mmap(f.fileno(), 8192, mmap.MAP_SHARED); m[:4] = b'FORK'; m.flush(); m.close()
    fcntl.flock(f, fcntl.LOCK_EX)
os.setxattr('d/f', 'user.x', b'fork')
os.chmod('d/f', 0o6777)
open('new', 'w').write('fork\n'); os.rename('new', 'd/f')
os.link('shared.txt', 'hard2.txt')
os.mkfifo('fifo')
for bad in (lambda: os.mknod('dev', 0o600 | 0o20000, os.makedev(1, 3)),):
    try:
        bad(); print('MKNOD-OK')
    except OSError:
        pass
print('tampered')
"""

UNCHANGED = r"""
import os, stat
assert open('shared.txt').read() == 'orig\n', open('shared.txt').read()
assert open('hard.txt').read() == 'orig\n'
assert os.stat('hard.txt').st_ino == os.stat('shared.txt').st_ino
assert open('/tmp/t.txt').read() == 'orig\n'
assert open('map.bin', 'rb').read() == b'o' * 8192
assert open('d/f').read() == 'orig\n'
assert not stat.S_IMODE(os.stat('d/f').st_mode) & 0o6000
try:
    assert os.getxattr('d/f', 'user.x') != b'fork'
except OSError:
    pass
assert not os.path.lexists('fifo') and not os.path.lexists('hard2.txt')
print('unchanged')
"""


@pytest.fixture(scope="module")
def runner() -> Iterator[Runner]:
    r = Runner(PoolConfig(warm=1))
    yield r
    r.close()


def out(r) -> str:
    assert r.status is ExecStatus.OK and r.exit_code == 0, (r.status, r.message,
                                                           r.stderr[-800:])
    return r.stdout.decode()


def test_a_fork_changes_only_its_own_files_whatever_call_it_uses(runner):
    async def body():
        async with await runner.pool.open(LIM) as sb:
            out(await sb.exec(["python3", "-c", PREPARE]))
            async with await sb.snapshot() as snap:
                a, b = await snap.fork(2)
                async with a, b:
                    assert "MKNOD-OK" not in out(await a.exec(["python3", "-c", TAMPER]))
                    assert out(await b.exec(["python3", "-c", UNCHANGED])) == "unchanged\n"
                    async with await snap.open() as c:   # a fork made after the tampering
                        assert out(await c.exec(["python3", "-c", UNCHANGED])) == \
                            "unchanged\n"
                    # the setuid bit a fork set never runs as anyone else: nosuid
                    r = await a.exec(["bash", "-c", "cp /usr/bin/id ./id && chmod 4755 ./id "
                                      "&& ./id -u && id -u"])
                    uids = out(r).split()
                    assert uids[0] == uids[1], uids
            # the parent carries on, unchanged
            assert out(await sb.exec(["python3", "-c", UNCHANGED])) == "unchanged\n"
    runner.run(body(), timeout=300)
    runner.assert_no_leaks(timeout=30)


def test_a_fork_that_abuses_its_disk_never_fails_its_parent_or_siblings(runner):
    """Disk filled, inodes exhausted, files of the snapshot removed and its directory
    made unusable: the fork's own doing, and the parent and a sibling run as before."""
    abuse = ("cd /workspace; head -c 64M /dev/zero > fill; seq 100000 | "
             "(mkdir m && cd m && xargs touch) 2>/dev/null; rm -rf d shared.txt; "
             "chmod 000 /workspace /tmp; true")
    async def body():
        async with await runner.pool.open(LIM) as sb:
            out(await sb.exec(["python3", "-c", PREPARE]))
            async with await sb.snapshot() as snap:
                a, b = await snap.fork(2)
                async with a, b:
                    r = await a.exec(["bash", "-c", abuse])
                    assert r.status is not ExecStatus.INFRA, r
                    again = await a.exec(["true"])   # its next run: its own outcome
                    assert again.status is not ExecStatus.INFRA, again
                    assert out(await b.exec(["python3", "-c", UNCHANGED])) == "unchanged\n"
            assert out(await sb.exec(["python3", "-c", UNCHANGED])) == "unchanged\n"
    runner.run(body(), timeout=300)
    runner.assert_no_leaks(timeout=30)


SPARSE = r"""
import os
for i in range(400):                       # 400 x 31 MiB of holes, 0 bytes used
    with open(f'h{i}', 'wb') as f:
        f.truncate(31 << 20)
with open('h0', 'r+b') as f:
    f.seek(20 << 20); f.write(b'data in the middle')
print(os.statvfs('.').f_bfree)
"""


def test_holes_travel_as_holes_a_session_cannot_archive_more_than_it_holds(runner, tmp_path):
    """Before: 13 GB of zeros archived (48 s at load ~20) for a session using no disk,
    unpacked on load into 13 GB of memory (when max_mb let it)."""
    store = ArtifactStore(str(tmp_path / "store"))

    async def body():
        async with await runner.pool.open(LIM) as sb:
            out(await sb.exec(["python3", "-c", SPARSE]))
            async with await sb.snapshot() as snap:
                meta = await snap.save(store, "sparse")
        assert meta["bytes"] < 1 << 20 and meta["tmpfs_bytes"] < 8 << 20, meta
        async with await Snapshot.load(runner.pool, store, "sparse", max_mb=64) as snap2:
            async with await snap2.open() as f:
                check = ("import os; s = os.stat('h0'); "
                         "assert s.st_size == 31 << 20 and s.st_blocks < 64, s; "
                         "f = open('h0', 'rb'); f.seek(20 << 20); "
                         "assert f.read(18) == b'data in the middle'; "
                         "assert open('h7', 'rb').read(4096) == bytes(4096); print('ok')")
                assert out(await f.exec(["python3", "-c", check])) == "ok\n"
    runner.run(body(), timeout=300)


def _put(store: ArtifactStore, name: str, tar_bytes: bytes, **meta) -> None:
    archive = subprocess.run(["zstd", "-q", "-c"], input=tar_bytes, capture_output=True,
                             check=True).stdout
    store.put(f"{name}.tar.zst", archive)
    store.put(f"{name}.json", json.dumps({
        "format": "trialbox-snapshot/1", "archive": f"{name}.tar.zst", "entries": 8,
        "tmpfs_bytes": 1 << 20, "sha256": hashlib.sha256(archive).hexdigest(),
        **meta}).encode())


def _tar(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _m(name: str, **kw) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    for k, v in kw.items():
        setattr(info, k, v)
    return info


def _pax_bomb() -> bytes:
    """A 64 MiB PAX record (a few KB of zstd) that tarfile would read into memory."""
    body = b" comment=" + b"x" * (64 << 20) + b"\n"
    n = len(body) + 8
    rec = str(n + len(str(n)) - 8).encode() + body   # a valid record: its own length
    assert int(rec.split(b" ")[0]) == len(rec)
    info = tarfile.TarInfo("././@PaxHeader")
    info.type, info.size = tarfile.XHDTYPE, len(rec)
    hdr = info.tobuf(tarfile.USTAR_FORMAT)
    pad = b"\0" * (-len(rec) % 512)
    return hdr + rec + pad + _tar((_m("root/a"), b"a"))


HOSTILE = {
    "zstd-bomb": lambda: _tar((_m("root/big"), bytes(64 << 20))),
    "twice": lambda: _tar((_m("root/a"), b"a"), (_m("root/a"), b"b")),
    "hardlink-to-dir": lambda: _tar((_m("root/d", type=tarfile.DIRTYPE), None),
                                    (_m("root/l", type=tarfile.LNKTYPE, linkname="root/d"),
                                     None)),
    "hardlink-outside": lambda: _tar((_m("root/l", type=tarfile.LNKTYPE,
                                         linkname="/etc/passwd"), None)),
    "device": lambda: _tar((_m("root/null", type=tarfile.CHRTYPE, devmajor=1, devminor=3),
                            None)),
    "sparse-forged": lambda: _tar((_m("root/s", pax_headers={
        "TRIALBOX.sparse": "10;8:4,0:4"}), b"abcdefgh")),
    "pax-bomb": _pax_bomb,
    "not-a-tar": lambda: b"\x01" * 4096,
}


@pytest.mark.parametrize("how", sorted(HOSTILE))
def test_a_hostile_archive_is_refused_with_a_usage_error(runner, tmp_path, how):
    store = ArtifactStore(str(tmp_path / "store"))
    _put(store, "h", HOSTILE[how]())
    with pytest.raises(UsageError, match="snapshot archive h"):
        runner.run(Snapshot.load(runner.pool, store, "h"), timeout=120)
    runner.assert_no_leaks(timeout=30)


def test_a_snapshot_of_a_session_that_locked_itself_out_forks_into_working_sessions(runner):
    """The parent made its workspace, /tmp and /dev/shm unusable before the snapshot:
    its forks (and its own next run) still start; what they run is theirs."""
    async def body():
        async with await runner.pool.open(LIM) as sb:
            out(await sb.exec(["bash", "-c", "mkdir -p /workspace/x && chmod 000 "
                               "/workspace/x /workspace /tmp /dev/shm"]))
            async with await sb.snapshot() as snap:
                [f] = await snap.fork(1)
                async with f:
                    out(await f.exec(["bash", "-c", "echo hi > /workspace/y && "
                                      "echo hi > /tmp/y"]))
            out(await sb.exec(["bash", "-c", "echo hi > /workspace/z"]))
    runner.run(body(), timeout=300)


ODD_NAMES = r"""
import os
for n in [b'\xff\xfe', b'a\nb', b'\x1b[31m', b'x' * 255, b'-rf', b'.\xc3']:
    open(n, 'wb').write(n)
os.makedirs(b'd/' * 100 + b'e', exist_ok=True)
os.symlink(b'\xff' * 100, b'lnk')
os.utime(b'a\nb', (2**40, 2**40))
os.utime(b'-rf', (-5, -5))
os.chmod(b'.\xc3', 0)
print('made')
"""

ODD_NAMES_BACK = r"""
import os
for n in [b'\xff\xfe', b'a\nb', b'\x1b[31m', b'x' * 255, b'-rf']:
    assert open(n, 'rb').read() == n, n
assert os.path.isdir(b'd/' * 100 + b'e') and os.readlink(b'lnk') == b'\xff' * 100
print(os.stat(b'a\nb').st_mtime, os.stat(b'-rf').st_mtime, 'ok')
"""


def test_odd_names_modes_and_times_survive_save_and_load(runner, tmp_path):
    """Undecodable and control-character names, a 255-byte name, a 100-deep tree, an
    unreadable file, mtimes of 2**40 and before 1970: saved and restored exactly, never
    an error of the machinery."""
    store = ArtifactStore(str(tmp_path / "store"))

    async def body():
        async with await runner.pool.open(LIM) as sb:
            assert out(await sb.exec(["python3", "-c", ODD_NAMES])) == "made\n"
            async with await sb.snapshot() as snap:
                await snap.save(store, "odd")
        async with await Snapshot.load(runner.pool, store, "odd") as snap2:
            async with await snap2.open() as f:
                back = out(await f.exec(["python3", "-c", ODD_NAMES_BACK]))
        assert back == "1099511627776.0 -5.0 ok\n", back
    runner.run(body(), timeout=300)


def _many_empty_files() -> bytes:
    return _tar(*[(_m(f"root/f{i}"), b"") for i in range(2000)])


def _noise() -> bytes:
    import random
    return _tar((_m("root/noise"), random.Random(0).randbytes(3 << 20)))


ABSURD = {
    "size-not-a-number": ({"tmpfs_bytes": "1"}, lambda: _tar((_m("root/a"), b"a"))),
    "entries-missing": ({"entries": None}, lambda: _tar((_m("root/a"), b"a"))),
    "size-negative": ({"tmpfs_bytes": -1}, lambda: _tar((_m("root/a"), b"a"))),
    # 2,000 empty files claimed to need 1 MiB: inodes are kernel memory the tmpfs's
    # size does not bound (before: loaded, with nr_inodes = entries = 10**9)
    "inodes": ({"entries": 10 ** 9}, _many_empty_files),
    # 3 MiB of noise claimed to unpack to 8 KiB: refused before it is copied to disk
    "larger-than-claimed": ({"tmpfs_bytes": 8192}, _noise),
}


@pytest.mark.parametrize("how", sorted(ABSURD))
def test_absurd_metadata_is_refused_with_a_usage_error(runner, tmp_path, how):
    meta, make = ABSURD[how]
    store = ArtifactStore(str(tmp_path / "store"))
    _put(store, "h", make(), **meta)
    match = "is larger than" if how == "larger-than-claimed" else "snapshot archive h|h.json"
    with pytest.raises(UsageError, match=match):
        runner.run(Snapshot.load(runner.pool, store, "h"), timeout=120)
    runner.assert_no_leaks(timeout=30)
