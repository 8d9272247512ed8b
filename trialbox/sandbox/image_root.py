"""An image as the namespace tier's root and interpreter (PoolConfig.image).

Without an image a cell binds the host's /usr (and /etc/alternatives) read-only and the
zygote is the host's /usr/bin/python3. With one, both come from the image: the cells
bind the image's /usr and /etc/alternatives, the root template takes the image's loader
cache, and the zygote — whose interpreter every sandboxed Python program runs in — is
started in a private mount namespace where the image's /usr, /etc/alternatives and
/etc/ld.so.cache are bound read-only over the host's, so `/usr/bin/python3` there is the
image's binary, loaded by the image's ld.so against the image's libc. Everything else the
zygote needs from the host (its state dir, cgroups, /proc) stays where it was.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
from collections.abc import Callable

from trialbox.sandbox.image import Image
from trialbox.types import Runtime

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]
CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1, 2, 4, 32, 4096, 16384, 1 << 18)


def image_runtime(image: Image) -> Runtime:
    """What results record for code run on `image`: its name and content hash."""
    lock = image.lock()
    version = ""
    for pkg, ver in sorted(lock.get("debs", {}).items()):
        if re.match(r"^python3\.\d+$", pkg):
            version = ver.split("-")[0].split(":")[-1]
    return Runtime(name=f"image:{image.name}", python=image.python(), version=version,
                   digest=image.content_hash)


EXTRA_TOPS = ("opt", "srv", "var")
"""Top-level directories of an image bound read-only into its cells besides /usr (and
/etc, copied into the root template: the cell's passwd, hosts... are the pool's)."""
_ETC_SKIP = {"alternatives", "shadow", "gshadow"}


def prepare_template(image: Image, root: str) -> None:
    """Put the image's /etc (but alternatives, bound, and the shadow files) in a cell
    root template, and the mount points of `EXTRA_TOPS`; the pool then writes its own
    passwd, group, hosts... over it (zygote_client.build_root_template)."""
    src = os.path.join(image.rootfs, "etc")
    os.makedirs(os.path.join(root, "etc"), exist_ok=True)
    for name in sorted(os.listdir(src)):
        if name in _ETC_SKIP:
            continue
        s, d = os.path.join(src, name), os.path.join(root, "etc", name)
        if os.path.isdir(s) and not os.path.islink(s):
            shutil.copytree(s, d, symlinks=True, dirs_exist_ok=True)
        else:
            shutil.copy2(s, d, follow_symlinks=False)
    for top in EXTRA_TOPS:
        if os.path.isdir(os.path.join(image.rootfs, top)):
            os.makedirs(os.path.join(root, top), mode=0o755, exist_ok=True)


def ro_binds(image: Image) -> list[list[str]]:
    """(source on the host, target in the cell) for the cell's read-only binds."""
    root = image.rootfs
    binds = [[os.path.join(root, "usr"), "/usr"]]
    for top in EXTRA_TOPS:
        if os.path.isdir(os.path.join(root, top)):
            binds.append([os.path.join(root, top), "/" + top])
    if os.path.isdir(os.path.join(root, "etc/alternatives")):
        binds.append([os.path.join(root, "etc/alternatives"), "/etc/alternatives"])
    for top in ("bin", "sbin", "lib", "lib64", "lib32", "libx32"):
        p = os.path.join(root, top)
        if os.path.isdir(p) and not os.path.islink(p):
            binds.append([p, "/" + top])
    return binds


def _mount(src: str | None, dst: str, flags: int) -> None:
    if _libc.mount(src.encode() if src else None, dst.encode(), None, flags, None) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount {src} on {dst}: {os.strerror(e)}")


def zygote_preexec(image: Image) -> Callable[[], None]:
    """For Popen(preexec_fn=...): a private mount namespace with the image's /usr (and
    loader config) bound read-only over the host's, before the zygote is exec'd."""
    root = image.rootfs
    pairs = [(os.path.join(root, "usr"), "/usr")]
    for rel in ("etc/alternatives", "etc/ld.so.cache"):
        if os.path.exists(os.path.join(root, rel)) and os.path.exists("/" + rel):
            pairs.append((os.path.join(root, rel), "/" + rel))

    def enter() -> None:
        if _libc.unshare(CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
        _mount(None, "/", MS_REC | MS_PRIVATE)
        for src, dst in pairs:
            _mount(src, dst, MS_BIND | MS_REC)
            _mount(None, dst, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)

    return enter
