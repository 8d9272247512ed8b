"""Builds cell.c — the cell's hot path in C (B's per-run loop and C's set-up; see its
header) — with the system's C compiler, once per source, into a root-only cache under
the pool's state dir. The pool copies the result into its own state dir and the zygote
loads it; without it the zygote runs the same steps in Python (`PoolConfig.native`).

gcc is already one of the sandbox's Debian packages (C/C++ tasks); building takes
~0.2 s, once per boot (the state dir is on /run)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess

from trialbox.errors import SandboxUnavailable

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "cell.c")
CFLAGS = ("-O2", "-shared", "-fPIC", "-Wall", "-Werror")


class NativeUnavailable(SandboxUnavailable):
    """cell.c could not be built here; the message says why."""


def build(state_dir: str, compiler: str = "gcc") -> str:
    """The path of the built shared object (built now unless cached)."""
    cc = shutil.which(compiler, path="/usr/bin:/bin")
    if cc is None:
        raise NativeUnavailable(f"no C compiler ({compiler}) in /usr/bin: install gcc "
                                "(scripts/setup-system.sh does)")
    with open(SOURCE, "rb") as f:
        source = f.read()
    key = hashlib.sha256(source + " ".join((cc,) + CFLAGS).encode()).hexdigest()[:16]
    cache = os.path.join(state_dir, "native")
    os.makedirs(cache, mode=0o700, exist_ok=True)
    st = os.lstat(cache)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        # the zygote (root) loads what is here: nobody else may write to it
        raise NativeUnavailable(f"{cache} is not owned by this user or is writable by "
                                "others; remove it")
    out = os.path.join(cache, f"cell-{key}.so")
    if os.path.exists(out):
        return out
    tmp = f"{out}.{os.getpid()}.tmp"
    try:
        proc = subprocess.run([cc, *CFLAGS, "-o", tmp, SOURCE], capture_output=True,
                              text=True, timeout=120, check=False)
        if proc.returncode != 0:
            raise NativeUnavailable(f"{cc} failed on {SOURCE}: "
                                    f"{proc.stderr.strip()[-800:]}")
        os.replace(tmp, out)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NativeUnavailable(f"building {SOURCE} failed: {e}") from e
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out
