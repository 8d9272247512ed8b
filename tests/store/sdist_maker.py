"""Source distributions built in a test's tmp_path: a tarball as `pip download
--no-binary :all:` gives it (one NAME-VERSION/ top directory, PKG-INFO), fixed member
times so the same files give the same bytes."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path


def make_sdist(where: Path, name: str, version: str, files: dict[str, str]) -> Path:
    top = f"{name}-{version}"
    members = {"PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n",
               "setup.py": "from setuptools import setup\nsetup()\n", **files}
    path = where / f"{top}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for rel, text in sorted(members.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{rel}")
            info.size, info.mtime = len(data), 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
    return path
