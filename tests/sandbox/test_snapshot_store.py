"""Snapshots through the artifact store: saved on one pool, restored on another, exactly
(files, modes, links, mtimes, /tmp); a changed or hostile archive is refused. Time
limits are roomy: time is not under test here (a loaded 2-core machine is slow)."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from collections.abc import Iterator

import pytest

from trialbox.errors import UsageError
from trialbox.sandbox import CellPool, PoolConfig
from trialbox.sandbox.snapshot import Snapshot, restored_owner
from trialbox.store.artifacts import ArtifactStore
from trialbox.types import ExecStatus, Limits
from tests.conftest import Runner

LIM = Limits(wall_s=30, cpu_s=30, memory_mb=256, disk_mb=32, output_bytes=1 << 16)

PREPARE = r"""
import os
os.makedirs('pkg/sub', exist_ok=True)
open('pkg/__init__.py', 'w').write('VALUE = 41\n')
open('pkg/sub/data.bin', 'wb').write(bytes(range(256)) * 4000)
open('run.sh', 'w').write('#!/bin/sh\necho ran\n'); os.chmod('run.sh', 0o750)
os.symlink('/usr/bin/python3', 'py')          # a link out of the tree, kept verbatim
os.symlink('pkg/__init__.py', 'init-link')
os.link('pkg/__init__.py', 'hard.py')
os.makedirs('empty')
os.mkfifo('fifo')
os.utime('pkg/__init__.py', (1_000_000_000, 1_000_000_000))
open('/tmp/state', 'w').write('tmp-state')
"""

CHECK = r"""
import os, stat
import pkg
assert pkg.VALUE == 41
assert open('pkg/sub/data.bin', 'rb').read() == bytes(range(256)) * 4000
assert stat.S_IMODE(os.stat('run.sh').st_mode) == 0o750
assert os.readlink('py') == '/usr/bin/python3' and os.readlink('init-link') == 'pkg/__init__.py'
assert os.stat('hard.py').st_ino == os.stat('pkg/__init__.py').st_ino
assert os.listdir('empty') == [] and stat.S_ISFIFO(os.lstat('fifo').st_mode)
assert int(os.stat('pkg/__init__.py').st_mtime) == 1_000_000_000
assert open('/tmp/state').read() == 'tmp-state'
assert os.stat('pkg/__init__.py').st_uid == os.getuid()   # the fork's own
open('pkg/__init__.py', 'a').write('VALUE += 1\n')          # so it may change it
os.remove('hard.py')
print(os.popen('./run.sh').read().strip(), 'ok')
"""


@pytest.fixture(scope="module")
def two_pools() -> Iterator[tuple[Runner, CellPool]]:
    """A pool, and a second one in its loop: 'another machine' as far as a snapshot
    can tell (its own zygote, cells, uids and state directory)."""
    r = Runner(PoolConfig(warm=1))
    other = r.run(CellPool(PoolConfig(warm=1)).start())
    yield r, other
    r.run(other.close())
    r.close()


def out(r) -> str:
    assert r.status is ExecStatus.OK, (r.status, r.message, r.stderr[-800:])
    return r.stdout.decode()


def test_save_then_load_on_another_pool_restores_the_state_exactly(two_pools, tmp_path):
    runner, other = two_pools
    store = ArtifactStore(str(tmp_path / "store"))

    async def body():
        async with await runner.pool.open(LIM) as sb:
            out(await sb.exec(["python3", "-c", PREPARE]))
            [child] = await sb.fork(1)
        async with child:  # save a two-layer snapshot: flattened into one tree
            out(await child.exec(["python3", "-c", "open('from-child', 'w').write('c')"]))
            async with await child.snapshot() as snap:
                assert len(snap.layers) == 2
                meta = await snap.save(store, "runs/r1/prepared")
        assert meta["format"] == "trialbox-snapshot/1" and meta["layers"] == 2
        assert meta["bytes"] >= 256 * 4000 and meta["files"] >= 4
        assert store.exists("runs/r1/prepared.tar.zst")
        snap2 = await Snapshot.load(other, store, "runs/r1/prepared")
        assert snap2.layers[0].owner == restored_owner(other)
        assert snap2.limits == LIM
        async with snap2:
            forks = await snap2.fork(2)
        for f in forks:
            assert out(await f.exec(["python3", "-c", CHECK])) == "ran ok\n"
            assert await f.read_file("from-child") == b"c"
        # each fork changed only its own copy
        async with await Snapshot.load(other, store, "runs/r1/prepared") as snap3:
            async with await other.open(None, from_snapshot=snap3) as again:
                assert b"VALUE += 1" not in await again.read_file("pkg/__init__.py")
        for f in forks:
            await f.close()
    runner.run(body())


def test_a_changed_archive_is_refused_before_anything_is_extracted(two_pools, tmp_path):
    runner, other = two_pools
    store = ArtifactStore(str(tmp_path / "store"))

    async def body():
        async with await runner.pool.open(LIM) as sb:
            await sb.write_file("a", b"a")
            async with await sb.snapshot() as snap:
                await snap.save(store, "s")
        data = bytearray(store.get("s.tar.zst"))
        data[len(data) // 2] ^= 0xFF
        store.put("s.tar.zst", bytes(data))
        with pytest.raises(UsageError, match="does not match its metadata.*save the "
                                             "snapshot again"):
            await Snapshot.load(other, store, "s")
        store.put("t.json", b"{}")
        with pytest.raises(UsageError, match="not a trialbox snapshot"):
            await Snapshot.load(other, store, "t")
        with pytest.raises(UsageError, match="no artifact"):
            await Snapshot.load(other, store, "missing")
    runner.run(body())


@pytest.mark.parametrize("member", ["root/../escape", "/etc/passwd", "elsewhere/x"])
def test_a_hostile_archive_with_a_valid_hash_is_refused(two_pools, tmp_path, member):
    """Metadata and hash can be forged by whoever can write the store: the extractor
    itself refuses members outside the tree (and never follows links)."""
    runner, other = two_pools
    store = ArtifactStore(str(tmp_path / "store"))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(member)
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    archive = subprocess.run(["zstd", "-q", "-c"], input=buf.getvalue(),
                             capture_output=True, check=True).stdout
    store.put("h.tar.zst", archive)
    import hashlib
    store.put("h.json", json.dumps({
        "format": "trialbox-snapshot/1", "archive": "h.tar.zst", "entries": 1,
        "tmpfs_bytes": 1 << 20, "sha256": hashlib.sha256(archive).hexdigest()}).encode())
    with pytest.raises(UsageError, match="outside root/"):
        runner.run(Snapshot.load(other, store, "h"))


def test_links_in_an_archive_are_never_followed_on_restore(two_pools, tmp_path):
    runner, other = two_pools
    store = ArtifactStore(str(tmp_path / "store"))
    buf = io.BytesIO()
    victim = tmp_path / "victim"
    victim.mkdir()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        link = tarfile.TarInfo("root/work/out")
        link.type, link.linkname = tarfile.SYMTYPE, str(victim)
        tar.addfile(link)
        info = tarfile.TarInfo("root/work/out/pwned")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    archive = subprocess.run(["zstd", "-q", "-c"], input=buf.getvalue(),
                             capture_output=True, check=True).stdout
    store.put("l.tar.zst", archive)
    import hashlib
    store.put("l.json", json.dumps({
        "format": "trialbox-snapshot/1", "archive": "l.tar.zst", "entries": 2,
        "tmpfs_bytes": 1 << 20, "sha256": hashlib.sha256(archive).hexdigest()}).encode())
    with pytest.raises(UsageError, match="not a directory"):
        runner.run(Snapshot.load(other, store, "l"))
    assert list(victim.iterdir()) == []
