"""Artifacts (task sets, trajectory dumps, checkpoints) through fsspec: a local directory
by default, any fsspec URL (`s3://bucket/prefix`, `memory://x`, `gcs://…`) by
configuration, with the same calls.

    store = ArtifactStore("runs/artifacts")            # or "s3://bucket/trialbox"
    store.put("run-1/trajectories.jsonl", data)
    with store.open("run-1/trajectories.parquet", "wb") as f: ...

Writes are atomic on local directories (a temporary name, then a rename), so a reader
never sees half a file and a crash leaves the previous version.
"""

from __future__ import annotations

import os
import posixpath
import uuid
from typing import IO, Any

import fsspec

from trialbox.errors import UsageError


class ArtifactStore:
    def __init__(self, url: str = "artifacts", **storage_options: Any):
        if not isinstance(url, str) or not url:
            raise UsageError("an artifact store needs a directory or an fsspec URL")
        try:
            self.fs, self.root = fsspec.core.url_to_fs(url, **storage_options)
        except (ImportError, ValueError) as e:
            raise UsageError(f"cannot use artifact store {url!r}: {e}; install the fsspec "
                             "backend for that protocol or use a local directory") from e
        self.url = url
        self.local = "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple)
                                else (self.fs.protocol,))
        self.fs.makedirs(self.root, exist_ok=True)

    def path(self, name: str) -> str:
        parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
        if not parts or ".." in parts:
            raise UsageError(f"artifact name {name!r} must be a relative path without '..'")
        return posixpath.join(self.root, *parts)

    def open(self, name: str, mode: str = "rb") -> IO[Any]:
        path = self.path(name)
        if "w" in mode:
            self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        try:
            f: IO[Any] = self.fs.open(path, mode)
        except FileNotFoundError as e:
            raise UsageError(f"no artifact {name!r} in {self.url!r}") from e
        return f

    def put(self, name: str, data: bytes) -> str:
        """Write `data` as `name` (replacing it); returns the full path or URL."""
        path = self.path(name)
        self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        if self.local:
            tmp = f"{path}.tmp-{uuid.uuid4().hex}"
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        else:
            self.fs.pipe_file(path, data)
        return path

    def get(self, name: str) -> bytes:
        try:
            data: bytes = self.fs.cat_file(self.path(name))
        except FileNotFoundError as e:
            raise UsageError(f"no artifact {name!r} in {self.url!r}") from e
        return data

    def exists(self, name: str) -> bool:
        return bool(self.fs.exists(self.path(name)))

    def list(self, prefix: str = "") -> list[str]:
        base = self.path(prefix) if prefix else self.root
        if not self.fs.exists(base):
            return []
        found = self.fs.find(base)
        root = self.root.rstrip("/") + "/"
        return sorted(p[len(root):] if p.startswith(root) else p for p in found)
