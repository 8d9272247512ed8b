"""Sessions of the namespace tier: what persists within one, what never crosses two.

A session is a private workspace kept across runs and deleted at close; the file API
(write_file / read_file / list_files) works on the same files the runs see, and never
follows a link the candidate made.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from tests.conftest import load_scaled
from tests.sandbox.conftest import (
    CANDIDATE_STATUSES,
    TIME_SCALE,
    describe,
    limits,
    no_leaks,
)
from trialbox.errors import UsageError
from trialbox.sandbox import NamespaceSandbox, run_code
from trialbox.types import ExecStatus


async def _open(runner, **changes):
    return await NamespaceSandbox.open(runner.pool, limits(**changes))


async def _sh(sb, script: str, **kw):
    return await sb.exec(["/bin/bash", "-c", script], **kw)


# ------------------------------------------------------------------ within a session


def test_files_persist_across_runs(runner):
    async def body():
        async with await _open(runner) as sb:
            r1 = await _sh(sb, "echo one > a.txt && mkdir -p d/e && printf two > d/e/b.bin")
            assert r1.status is ExecStatus.OK, describe(r1)
            r2 = await _sh(sb, "cat a.txt d/e/b.bin")
            assert r2.status is ExecStatus.OK, describe(r2)
            assert r2.stdout == b"one\ntwo"
            assert await sb.read_file("a.txt") == b"one\n"
            assert await sb.read_file("/workspace/d/e/b.bin") == b"two"
            assert await sb.list_files() == ["a.txt", "d/e/b.bin"]
    runner.run(body())
    no_leaks(runner)


def test_park_gives_the_cell_back_and_keeps_the_files(runner):
    """While the model thinks the session holds no cell; the next run gets one and sees
    the same workspace."""
    async def body():
        async with await _open(runner) as sb:
            assert sb.parked  # no cell before the first run
            r = await _sh(sb, "echo kept > a.txt; sleep 30 & echo started")
            assert r.status is ExecStatus.OK, describe(r)
            assert not sb.parked
            before = runner.pool._in_use
            await sb.park()
            assert sb.parked and runner.pool._in_use == before - 1
            await sb.park()  # idempotent
            r = await _sh(sb, "cat a.txt; pgrep -c sleep || true")
            assert r.stdout == b"kept\n0\n", describe(r)
            assert not sb.parked and runner.pool._in_use == before
    runner.run(body())
    no_leaks(runner)


def test_write_file_is_seen_by_runs(runner):
    async def body():
        async with await _open(runner) as sb:
            await sb.write_file("in/data.bin", bytes(range(256)))
            await sb.write_file("/workspace/run.sh", b"#!/bin/sh\necho ran $1\n", mode=0o755)
            r = await sb.exec(["python3", "-c",
                               ("import sys; d = open('in/data.bin', 'rb').read();"
                                " print(d == bytes(range(256)), len(d))")])
            assert r.stdout == b"True 256\n", describe(r)
            r = await sb.exec(["./run.sh", "x"])
            assert (r.status, r.stdout) == (ExecStatus.OK, b"ran x\n"), describe(r)
            r = await _sh(sb, "stat -c '%u %a' in/data.bin run.sh; id -u")
            assert r.stdout == b"1000 644\n1000 755\n1000\n", describe(r)
            await sb.write_file("in/data.bin", b"overwritten")  # replacing is allowed
            r = await _sh(sb, "cat in/data.bin")
            assert r.stdout == b"overwritten"
            assert await sb.list_files() == ["in/data.bin", "run.sh"]
    runner.run(body())


def test_tmp_persists_within_a_session(runner):
    async def body():
        async with await _open(runner) as sb:
            await _sh(sb, "echo kept > /tmp/t && echo shm > /dev/shm/s")
            r = await _sh(sb, "cat /tmp/t /dev/shm/s")
            assert r.stdout == b"kept\nshm\n", describe(r)
    runner.run(body())


def test_run_code_in_a_session_sees_earlier_files(runner):
    async def body():
        async with await _open(runner) as sb:
            await sb.write_file("helper.py", b"def triple(x):\n    return 3 * x\n")
            r = await run_code(sb, "from helper import triple\nprint(triple(14))")
            assert (r.status, r.stdout) == (ExecStatus.OK, b"42\n"), describe(r)
    runner.run(body())


def test_status_and_measures_are_per_run_not_per_session(runner):
    """One session, several runs: an OOM kill, CPU use or memory peak of an earlier run
    must not colour a later run's status or numbers."""
    hog = "b = []\nwhile True:\n    b.append(b'x' * 10**7)"
    # times x TIME_SCALE on a slow kernel (the UML guest, where the hog's page faults
    # alone pass a second of CPU)
    spin = ("import time\nt = time.process_time()\n"
            f"while time.process_time() - t < {0.7 * TIME_SCALE}:\n    pass")

    async def body():
        async with await _open(runner, memory_mb=64, cpu_s=1 * TIME_SCALE,
                               wall_s=10 * TIME_SCALE) as sb:  # wall: not the subject
            r1 = await run_code(sb, hog)
            r2 = await run_code(sb, "import sys; sys.exit(3)")
            r3 = await run_code(sb, "print('small')")
            r4 = await run_code(sb, spin)
            r5 = await run_code(sb, spin)
            r6 = await run_code(sb, "print('idle')")
            return r1, r2, r3, r4, r5, r6
    r1, r2, r3, r4, r5, r6 = runner.run(body())
    assert r1.status is ExecStatus.MEMORY, describe(r1)
    assert (r2.status, r2.exit_code) == (ExecStatus.EXIT, 3), describe(r2)
    assert (r3.status, r3.message) == (ExecStatus.OK, ""), describe(r3)
    assert r3.peak_memory_bytes < 40 << 20, r3.peak_memory_bytes
    # 0.7 s each: two together pass cpu_s=1, neither alone does
    assert r4.status is ExecStatus.OK, describe(r4)
    assert r5.status is ExecStatus.OK, describe(r5)
    assert 600 * TIME_SCALE <= r5.cpu_ms < 1000 * TIME_SCALE, r5.cpu_ms
    assert r6.cpu_ms < 300 * TIME_SCALE, r6.cpu_ms
    no_leaks(runner)


def test_session_keeps_working_after_every_kind_of_kill(runner):
    """Each limit kill ends one run; the session, its files and its next run are fine."""
    steps = [
        ("import time; time.sleep(60)", ExecStatus.TIMEOUT),
        ("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", ExecStatus.OUTPUT),
        ("b = []\nwhile True:\n    b.append(b'x' * 10**7)", ExecStatus.MEMORY),
        ("import os; os.abort()", ExecStatus.SIGNAL),
        ("while True:\n    pass", ExecStatus.TIMEOUT),
    ]

    async def body():
        # the time limits scale with a slow kernel's speed (the UML guest): four execs of
        # bash, cat, ls and grep take ~0.5 s of CPU there; the wall limit with the load
        # too, so that the memory bomb and the probe after each kill finish under it
        async with await _open(runner, wall_s=load_scaled(1), cpu_s=0.5 * TIME_SCALE,
                               memory_mb=64) as sb:
            await sb.write_file("kept.txt", b"still here")
            out = []
            for code, _ in steps:
                out.append(await run_code(sb, code))
                out.append(await _sh(sb, "cat kept.txt; echo; ls /proc | grep -c '^[0-9]'"))
            return out
    out = runner.run(body())
    for (code, want), killed, after in zip(steps, out[::2], out[1::2], strict=True):
        assert killed.status is want, (code, describe(killed))
        assert after.status is ExecStatus.OK, (code, describe(after))
        # the file survives, and only this run's own processes are there (bash, ls, grep)
        text, count = after.stdout.decode().splitlines()
        assert text == "still here", describe(after)
        assert int(count) <= 4, (code, describe(after))
    no_leaks(runner)


def test_run_limits_apply_to_that_run_only(runner):
    """A run with its own (smaller) limits, then a run with the session's again."""
    alloc = ("b = bytearray(80 << 20)\nfor i in range(0, len(b), 4096):\n    b[i] = 1\n"
             "print('allocated')")

    async def body():
        async with await _open(runner, memory_mb=128) as sb:
            small = await run_code(sb, alloc, limits=limits(memory_mb=48))
            again = await run_code(sb, alloc)
            return small, again
    small, again = runner.run(body())
    assert small.status is ExecStatus.MEMORY and "memory_mb=48" in small.message, \
        describe(small)
    assert (again.status, again.stdout) == (ExecStatus.OK, b"allocated\n"), describe(again)


def test_a_runs_environment_is_exactly_its_own(runner):
    """The usual environment is the zygote's already (a run that asks for nothing else
    inherits it); a run with its own variables sees exactly those plus the base ones,
    in os.environ and in the C library's environment, and the next run does not."""
    from trialbox.sandbox.zygote_client import BASE_ENV
    show = ("import json, os, ctypes\n"
            "libc = ctypes.CDLL(None); libc.getenv.restype = ctypes.c_char_p\n"
            "print(json.dumps([dict(os.environ), libc.getenv(b'EXTRA')"
            " and libc.getenv(b'EXTRA').decode()]))")

    async def body():
        async with await _open(runner) as sb:
            await sb.write_file("show.py", show.encode())
            plain = await sb.exec(["python3", "show.py"])
            own = await sb.exec(["python3", "show.py"], env={"EXTRA": "1", "HOME": "/tmp"})
            again = await sb.exec(["python3", "show.py"])
            exe = await sb.exec(["/usr/bin/env"], env={"EXTRA": "2"})
            return plain, own, again, exe
    plain, own, again, exe = runner.run(body())
    import json
    for r in (plain, own, again, exe):
        assert r.status is ExecStatus.OK, describe(r)
    assert json.loads(plain.stdout) == [BASE_ENV, None]
    assert json.loads(own.stdout) == [{**BASE_ENV, "EXTRA": "1", "HOME": "/tmp"}, "1"]
    assert json.loads(again.stdout) == [BASE_ENV, None]
    assert sorted(exe.stdout.decode().splitlines()) == sorted(
        f"{k}={v}" for k, v in {**BASE_ENV, "EXTRA": "2"}.items())


# ------------------------------------------------------------------ between sessions


def test_nothing_persists_between_sessions(runner):
    async def body():
        async with await _open(runner) as a:
            await a.write_file("api.txt", b"from session A")
            r = await _sh(a, "echo A > ws.txt; echo A > /tmp/tmp.txt; echo A > /dev/shm/shm.txt;"
                             " ls -a /workspace /tmp /dev/shm")
            assert r.status is ExecStatus.OK, describe(r)
        async with await _open(runner) as b:
            assert await b.list_files() == []
            r = await _sh(b, "ls -A /workspace /tmp /dev/shm; cat ws.txt api.txt "
                             "/tmp/tmp.txt /dev/shm/shm.txt")
            assert r.status is ExecStatus.EXIT, describe(r)
            assert b"A" not in r.stdout.replace(b"/", b"")
            assert r.stdout == b"/dev/shm:\n\n/tmp:\n\n/workspace:\n", describe(r)
            with pytest.raises(UsageError):
                await b.read_file("api.txt")
    runner.run(body())
    no_leaks(runner)


def test_open_sessions_do_not_see_each_other(runner):
    async def body():
        async with await _open(runner) as a, await _open(runner) as b:
            await _sh(a, "echo secret-a > mine; echo secret-a > /tmp/mine")
            r = await _sh(b, "ls -A /workspace /tmp /dev/shm; cat /tmp/mine mine; "
                             "find / -path /proc -prune -o -path /usr -prune -o -name mine "
                             "-print")
            assert r.status in CANDIDATE_STATUSES, describe(r)
            assert r.stdout == b"/dev/shm:\n\n/tmp:\n\n/workspace:\n", describe(r)
            assert await a.read_file("mine") == b"secret-a\n"
    runner.run(body())


# ------------------------------------------------------------------ close


def test_close_is_idempotent_and_closed_session_refuses(runner):
    async def body():
        sb = await _open(runner)
        await sb.write_file("x", b"1")
        await sb.close()
        await sb.close()
        async with sb:  # __aexit__ closes again: still fine
            pass
        for call in (lambda: sb.exec(["true"]), lambda: sb.write_file("y", b"2"),
                     lambda: sb.read_file("x"), lambda: sb.list_files(),
                     lambda: run_code(sb, "print(1)")):
            with pytest.raises(UsageError, match="closed"):
                await call()
    runner.run(body())
    no_leaks(runner)


# ------------------------------------------------------------------ the file API and links


def test_read_file_refuses_candidate_symlinks(runner):
    shadow = b""
    if os.path.exists("/etc/shadow"):
        with open("/etc/shadow", "rb") as f:
            shadow = f.read()

    async def body():
        async with await _open(runner) as sb:
            r = await _sh(sb, "ln -s /etc/shadow x; ln -s /etc d; ln -s / root;"
                              " ln -s /etc/shadow /tmp/x; ln -s ../../../../etc/shadow rel")
            assert r.status is ExecStatus.OK, describe(r)
            for path in ("x", "/workspace/x", "d/shadow", "root/etc/shadow", "rel",
                         "root/etc/passwd"):
                with pytest.raises(UsageError) as info:
                    await sb.read_file(path)
                if shadow:
                    assert shadow[:40] not in str(info.value).encode()
            listed = await sb.list_files()
            assert not any(p.startswith(("d/", "root/")) for p in listed), listed
    runner.run(body())


def test_write_file_never_writes_through_candidate_symlinks(runner, tmp_path):
    """The supervisor is root on the host: a link the candidate made to a host path must
    not turn write_file into a host write."""
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"host data")
    victim_dir = tmp_path / "dir"
    victim_dir.mkdir()

    async def body():
        async with await _open(runner) as sb:
            r = await _sh(sb, f"ln -s {victim} f; ln -s {victim_dir} d")
            assert r.status is ExecStatus.OK, describe(r)
            await sb.write_file("f", b"sandbox data")  # replaces the link itself
            with pytest.raises(UsageError):
                await sb.write_file("d/planted", b"sandbox data")
            r = await _sh(sb, "test -L f && echo link || cat f")
            assert r.stdout == b"sandbox data", describe(r)
    runner.run(body())
    assert victim.read_bytes() == b"host data"
    assert list(victim_dir.iterdir()) == []


def test_read_file_of_fifo_or_directory_refused_without_hanging(runner):
    async def body():
        async with await _open(runner) as sb:
            await _sh(sb, "mkfifo pipe; mkdir adir")
            for path in ("pipe", "adir"):
                with pytest.raises(UsageError):
                    # a FIFO with no writer would block an open forever: fail, not hang
                    await asyncio.wait_for(sb.read_file(path), load_scaled(5))
    runner.run(body())


def test_read_file_size_cap(runner):
    async def body():
        async with await _open(runner) as sb:
            await sb.write_file("big", b"x" * 5000)
            assert await sb.read_file("big", max_bytes=5000) == b"x" * 5000
            with pytest.raises(UsageError, match="max_bytes"):
                await sb.read_file("big", max_bytes=4999)
            with pytest.raises(UsageError, match="no file"):
                await sb.read_file("missing")
    runner.run(body())


@pytest.mark.parametrize("path", [
    "../x", "a/../../x", "..", "/etc/passwd", "/workspace/../etc/passwd", "/tmp/x",
    "/workspacex/y", "", "a\x00b",
])
def test_write_file_outside_workspace_refused(runner, path):
    async def body():
        async with await _open(runner) as sb:
            with pytest.raises(UsageError):
                await sb.write_file(path, b"escape")
            with pytest.raises(UsageError):
                await sb.read_file(path)
            assert await sb.list_files() == []
    runner.run(body())
    assert not os.path.exists("/etc/x") and not os.path.exists("/x")


def test_write_file_over_disk_limit_is_usage_error(runner):
    async def body():
        async with await _open(runner, disk_mb=16) as sb:
            with pytest.raises(UsageError, match="disk_mb"):
                await sb.write_file("huge", b"\0" * (17 << 20))
            assert await sb.list_files() == [], "a failed write must leave no partial file"
            await sb.write_file("small", b"fine")
            assert await sb.read_file("small") == b"fine"
    runner.run(body())


# ------------------------------------------------------------------ concurrency


def test_concurrent_sessions_keep_results_apart(runner):
    """8 runs over 4 sessions at once: each result belongs to its own session and run;
    runs of one session queue, runs of different sessions overlap. (Overlap is read from
    the runs' own clock readings, not from a wall bound, so it holds on a slow kernel.)"""
    nap = 0.2 * TIME_SCALE

    async def one(sb, i, j):
        return i, j, await _sh(sb, f"cat id; echo run{j}; echo {i}{j} >> log; "
                                   f"date +%s%N; sleep {nap}; date +%s%N")

    async def body():
        sbs = [await _open(runner) for _ in range(4)]
        try:
            for i, sb in enumerate(sbs):
                await sb.write_file("id", f"session{i}\n".encode())
            results = await asyncio.gather(*(one(sb, i, j) for i, sb in enumerate(sbs)
                                             for j in range(2)))
            spans = {}
            for i, j, r in results:
                assert r.status is ExecStatus.OK, describe(r)
                who, run, start, end = r.stdout.decode().split()
                assert (who, run) == (f"session{i}", f"run{j}"), (i, j, r.stdout)
                spans[i, j] = (int(start), int(end))
            for i, sb in enumerate(sbs):
                log = (await sb.read_file("log")).split()
                assert sorted(log) == [f"{i}0".encode(), f"{i}1".encode()]
            # runs of one session queue: its two runs never overlap
            for i in range(4):
                (a0, a1), (b0, b1) = spans[i, 0], spans[i, 1]
                assert a1 <= b0 or b1 <= a0, (i, spans)
            # different sessions run at once: some moment sees two or more runs going
            ticks = sorted([(s, 1) for s, _ in spans.values()] +
                           [(e, -1) for _, e in spans.values()])
            going = most = 0
            for _, step in ticks:
                going += step
                most = max(most, going)
            assert most >= 2, spans
        finally:
            for sb in sbs:
                await sb.close()
    runner.run(body())
    no_leaks(runner)


def test_concurrent_sessions_with_different_outcomes(runner):
    async def body():
        cases = [
            ("import time; time.sleep(60)", ExecStatus.TIMEOUT),
            ("b = []\nwhile True: b.append(b'x' * 10**7)", ExecStatus.MEMORY),
            ("import sys; print('three'); sys.exit(3)", ExecStatus.EXIT),
            ("print('fine')", ExecStatus.OK),
        ]
        # a 64 MiB bomb takes 2-4 s to allocate in the UML guest, longer on a loaded
        # host: the wall limit, which ends only the sleeper, scales with both
        sbs = [await _open(runner, wall_s=load_scaled(1.5), memory_mb=64) for _ in cases]
        try:
            results = await asyncio.gather(*(run_code(sb, code)
                                             for sb, (code, _) in zip(sbs, cases, strict=True)))
        finally:
            for sb in sbs:
                await sb.close()
        for r, (_, want) in zip(results, cases, strict=True):
            assert r.status is want, describe(r)
        assert results[2].stdout == b"three\n" and results[3].stdout == b"fine\n"
    runner.run(body())
    no_leaks(runner)


def test_pass_fds_gives_the_program_a_channel_while_it_runs(runner):
    """A socketpair end passed as fd 3: the program talks over it while it runs (the way
    a judge calls a candidate), and the other end sees EOF once the run is over."""
    import socket

    echo = ("import os\n"
            "while True:\n"
            "    b = os.read(3, 100)\n"
            "    if not b or b == b'bye':\n"
            "        break\n"
            "    os.write(3, b[::-1])\n")

    async def body():
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        loop = asyncio.get_running_loop()
        async with await NamespaceSandbox.open(runner.pool, limits()) as sb:
            task = asyncio.ensure_future(
                sb.exec(["python3", "-c", echo], pass_fds={3: theirs.fileno()}))
            await loop.sock_sendall(ours, b"abc")
            got = await asyncio.wait_for(loop.sock_recv(ours, 100), 5)
            await loop.sock_sendall(ours, b"bye")
            r = await task
            eof = await asyncio.wait_for(loop.sock_recv(ours, 100), 5)
            theirs.detach()  # the sandbox took ownership (the EOF below proves it closed it)
            with pytest.raises(UsageError, match="3 to 63"):
                await sb.exec(["true"], pass_fds={1: ours.fileno()})
            lone = await sb.exec(["/bin/sh", "-c", "ls /proc/self/fd | tr '\\n' ' '"])
        ours.close()
        return got, r, eof, lone
    got, r, eof, lone = runner.run(body())
    assert got == b"cba"
    assert r.status is ExecStatus.OK, describe(r)
    assert eof == b""
    assert lone.stdout.split() == [b"0", b"1", b"2", b"3"], lone  # 3: ls's own dir fd
    runner.assert_no_leaks()


def test_a_first_run_gets_every_passed_fd_and_its_workspace(runner):
    """The session's first run carries its workspace trees in the same message as its
    fds: with the most fds a run may pass (targets 3..63), every one arrives where it
    was asked for, and the workspace is attached."""
    targets = list(range(3, 64))

    async def body():
        pipes = {t: os.pipe() for t in targets}
        async with await NamespaceSandbox.open(runner.pool, limits(open_files=128)) as sb:
            await sb.write_file("mark", b"here")
            r = await sb.exec(
                ["python3", "-c", "import os, sys\n"
                 "for t in range(3, 64): os.write(t, b'%d' % t)\n"
                 "print(open('/workspace/mark').read())"],
                pass_fds={t: w for t, (_r, w) in pipes.items()})
        got = {t: os.read(rd, 10) for t, (rd, _w) in pipes.items()}
        for rd, _w in pipes.values():
            os.close(rd)
        return r, got
    r, got = runner.run(body())
    assert r.status is ExecStatus.OK and r.stdout == b"here\n", describe(r)
    assert got == {t: b"%d" % t for t in targets}
    runner.assert_no_leaks()


@pytest.mark.parametrize("cell_start_s", [0.0, 1.0], ids=["running", "waiting-for-its-cell"])
def test_close_stops_a_run_in_flight(runner, cell_start_s):
    """Closing a session (from another task) stops its run, whether the program runs or
    the run is still being set up (its cell starting: seconds on a slow kernel or a
    loaded host — then it is not started at all): close never waits for the whole run,
    nothing leaks, and the session stays closed. (The second case was found in the UML
    guest: close waited out a 30 s `sleep`.)"""
    async def body():
        sb = await NamespaceSandbox.open(runner.pool, limits(wall_s=30))
        if cell_start_s:
            real = sb._cell

            async def slow_cell():
                await asyncio.sleep(cell_start_s)
                return await real()
            sb._cell = slow_cell
        task = asyncio.ensure_future(sb.exec(["sleep", "30"]))
        await asyncio.sleep(0.3)
        t0 = time.monotonic()
        await sb.close()
        r = await task
        took = time.monotonic() - t0
        with pytest.raises(UsageError):
            await sb.exec(["true"])
        return r, took
    r, took = runner.run(body())
    # the caller's close ended it, not its 30 s wall limit
    assert r.status is ExecStatus.SIGNAL and "stopped by the caller" in r.message, describe(r)
    # …at once, not by waiting out the 30 s run: a wall bound, scaled by the load
    assert took < load_scaled(5), took
    no_leaks(runner)


def test_a_last_run_leaves_no_candidate_forked_ahead(runner):
    """After a run the cell forks the next candidate ahead (it waits in the cell's
    cgroup); after a run marked `last` it does not — and a further run in the session
    still works, forked on demand."""
    from tests.sandbox.conftest import processes_in_cgroup

    async def body():
        async with await NamespaceSandbox.open(runner.pool, limits()) as sb:
            first = await sb.exec(["python3", "-c", "print(1)"])
            await asyncio.sleep(0.2)  # past the cell's grace period
            cell = sb.cell.rel + "\n"  # the end of a /proc/PID/cgroup line: exactly it
            ahead = processes_in_cgroup(cell)
            last = await sb.exec(["python3", "-c", "print(2)"], last=True)
            await asyncio.sleep(0.2)
            after_last = processes_in_cgroup(cell)
            again = await sb.exec(["python3", "-c", "print(3)"])
            return first, ahead, last, after_last, again
    first, ahead, last, after_last, again = runner.run(body())
    assert [r.stdout for r in (first, last, again)] == [b"1\n", b"2\n", b"3\n"]
    assert len(ahead) == 1, ahead          # the next candidate, waiting for its go
    assert after_last == [], after_last    # none after the last run
    no_leaks(runner)
