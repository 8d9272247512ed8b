"""Artifacts (task sets, trajectory dumps, checkpoints) through fsspec: a local directory
by default, any fsspec URL (`s3://bucket/prefix`, `memory://x`, `gcs://…`) by
configuration, with the same calls.

    store = ArtifactStore("runs/artifacts")            # or "s3://bucket/trialbox"
    store.put("run-1/trajectories.jsonl", data)
    with store.open("run-1/trajectories.parquet", "wb") as f: ...

Writes are atomic on local directories (a temporary name, then a rename) and on object
stores (one PUT per object), so a reader never sees half a file and a crash leaves the
previous version. A directory (a checkpoint) goes up file by file with a manifest
written last (`put_tree`): it exists for readers (`get_tree`) only once complete, and
the manifest is what a journal or run config points at (its key, its files' keys,
sizes and sha256). Object stores: objects.py (s3fs; errors name what to set).
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import uuid
from typing import IO, Any

import fsspec

from trialbox.errors import UsageError
from trialbox.store import objects

MANIFEST = "MANIFEST.json"


class ArtifactStore:
    def __init__(self, url: str = "artifacts", **storage_options: Any):
        if not isinstance(url, str) or not url:
            raise UsageError("an artifact store needs a directory or an fsspec URL")
        storage_options = objects.options(url, storage_options)
        try:
            self.fs, self.root = fsspec.core.url_to_fs(url, **storage_options)
        except (ImportError, ValueError) as e:
            raise UsageError(f"cannot use artifact store {url!r}: {e}; install the fsspec "
                             "backend for that protocol or use a local directory") from e
        self.url = url
        self.local = "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple)
                                else (self.fs.protocol,))
        self.object_store = objects.is_object_url(url)
        if self.object_store:
            objects.check(self.fs, self.root, url)  # before anything is written
        else:
            self.fs.makedirs(self.root, exist_ok=True)

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """`fn(*args)` with object-store failures turned into UsageErrors naming the fix."""
        try:
            return fn(*args, **kwargs)
        except FileNotFoundError:
            raise
        except Exception as e:
            why = objects.explain(e, self.url) if self.object_store else None
            if why is None:
                raise
            raise why from None

    def key(self, name: str) -> str:
        """The full URL of artifact `name` (what a journal or manifest records)."""
        path = self.path(name)
        if self.local:
            return path
        proto = self.url.split("://", 1)[0]
        return f"{proto}://{path}"

    def path(self, name: str) -> str:
        parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
        if not parts or ".." in parts:
            raise UsageError(f"artifact name {name!r} must be a relative path without '..'")
        return posixpath.join(self.root, *parts)

    def open(self, name: str, mode: str = "rb") -> IO[Any]:
        path = self.path(name)
        if "w" in mode and not self.object_store:
            self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        try:
            f: IO[Any] = self._call(self.fs.open, path, mode)
        except FileNotFoundError as e:
            raise UsageError(f"no artifact {name!r} in {self.url!r}") from e
        return f

    def put(self, name: str, data: bytes) -> str:
        """Write `data` as `name` (replacing it); returns the full path or URL."""
        path = self.path(name)
        if not self.object_store:
            self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        if self.local:
            tmp = f"{path}.tmp-{uuid.uuid4().hex}"
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        else:
            self._call(self.fs.pipe_file, path, data)
        return path

    def get(self, name: str) -> bytes:
        try:
            data: bytes = self._call(self.fs.cat_file, self.path(name))
        except FileNotFoundError as e:
            raise UsageError(f"no artifact {name!r} in {self.url!r}") from e
        return data

    def exists(self, name: str) -> bool:
        return bool(self._call(self.fs.exists, self.path(name)))

    def delete(self, name: str) -> None:
        """Remove artifact `name`; one that is not there is no error."""
        try:
            self._call(self.fs.rm_file, self.path(name))
        except FileNotFoundError:
            pass

    def list(self, prefix: str = "") -> list[str]:
        base = self.path(prefix) if prefix else self.root
        if not self._call(self.fs.exists, base):
            return []
        found = self._call(self.fs.find, base)
        root = self.root.rstrip("/") + "/"
        return sorted(p[len(root):] if p.startswith(root) else p for p in found)

    # ------------------------------------------------------------ directories
    def put_tree(self, local_dir: str, name: str) -> dict[str, Any]:
        """Upload every file under `local_dir` as `name/...`, then `name/MANIFEST.json`
        (each file's key, size and sha256): until the manifest is there, `get_tree`
        sees no tree, so an upload cut short is never read as a checkpoint. Returns the
        manifest; its `key` is what a journal or run config records."""
        if not os.path.isdir(local_dir):
            raise UsageError(f"put_tree: {local_dir!r} is not a directory")
        files = []
        for dirpath, _dirs, names in sorted(os.walk(local_dir)):
            for fname in sorted(names):
                full = os.path.join(dirpath, fname)
                rel = os.path.relpath(full, local_dir).replace(os.sep, "/")
                if rel == MANIFEST:
                    raise UsageError(f"put_tree: {local_dir!r} holds a {MANIFEST} of its "
                                     "own; the store writes that name")
                with open(full, "rb") as f:
                    data = f.read()
                self.put(f"{name}/{rel}", data)
                files.append({"path": rel, "key": self.key(f"{name}/{rel}"),
                              "bytes": len(data),
                              "sha256": hashlib.sha256(data).hexdigest()})
        manifest = {"key": self.key(f"{name}/{MANIFEST}"), "tree": self.key(name),
                    "files": files}
        self.put(f"{name}/{MANIFEST}", json.dumps(manifest, indent=1).encode())
        return manifest

    def get_tree(self, name: str, local_dir: str) -> dict[str, Any]:
        """Download the tree `put_tree` wrote as `name` into `local_dir` (created; it
        must be empty or absent), checking every file against the manifest."""
        try:
            manifest: dict[str, Any] = json.loads(self.get(f"{name}/{MANIFEST}"))
        except UsageError as e:
            raise UsageError(f"no complete tree {name!r} in {self.url!r} (its {MANIFEST} "
                             "is missing: never written, or its upload was cut short)") \
                from e
        if os.path.isdir(local_dir) and os.listdir(local_dir):
            raise UsageError(f"get_tree: {local_dir!r} is not empty")
        for entry in manifest["files"]:
            data = self.get(f"{name}/{entry['path']}")
            if (len(data) != entry["bytes"]
                    or hashlib.sha256(data).hexdigest() != entry["sha256"]):
                raise UsageError(f"tree {name!r}: {entry['path']} does not match its "
                                 "manifest (changed after it was written)")
            dest = os.path.join(local_dir, *entry["path"].split("/"))
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with open(dest, "wb") as f:
                f.write(data)
        return manifest
