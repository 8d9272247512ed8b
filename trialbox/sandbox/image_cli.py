"""`trialbox image build|verify|list|show` (registered by cli.py through `add_parser`)."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from trialbox.sandbox import image as img
from trialbox.sandbox import image_manifest as im


def add_parser(sub: Any) -> None:
    p = sub.add_parser("image", help="environment images: build from a spec, verify, list")
    p.add_argument("--store", default=img.DEFAULT_STORE,
                   help=f"where built images live (default {img.DEFAULT_STORE}, or "
                   "$TRIALBOX_IMAGES)")
    isub = p.add_subparsers(dest="image", required=True)
    b = isub.add_parser("build", help="build SPEC (TOML) into a root filesystem, a lock "
                        "and a manifest with one content hash")
    b.add_argument("spec")
    b.add_argument("--lock", default=None, help="a lock.json the build must resolve to "
                   "(a rebuild); differences are an error naming each package")
    b.add_argument("--fresh", action="store_true", help="debootstrap the Debian base again "
                   "even when a cached one exists")
    b.add_argument("--expect", default=None, help="the content hash the build must give; "
                   "otherwise an error naming each file that differs from --against")
    b.add_argument("--against", default=None, help="a built image to compare with "
                   "(its files are named when the hashes differ)")
    b.set_defaults(handler=_build)
    v = isub.add_parser("verify", help="re-hash an image and compare with its manifest")
    v.add_argument("ref", help="image directory, NAME or NAME@HASHPREFIX")
    v.add_argument("--cheap", action="store_true", help="the per-task check only (stat "
                   "against the seal taken at build; reads no file)")
    v.set_defaults(handler=_verify)
    ls = isub.add_parser("list", help="built images in the store")
    ls.set_defaults(handler=_list)
    s = isub.add_parser("show", help="an image's metadata and lock")
    s.add_argument("ref")
    s.add_argument("--diff", default=None, help="another image: the files and versions "
                   "that differ")
    s.set_defaults(handler=_show)


def _build(args: Any) -> int:
    spec = img.load_spec(args.spec)
    lock: dict[str, Any] | None = None
    if args.lock:
        raw = im.load(args.lock)
        if not isinstance(raw, dict):
            raise img.ImageSpecError(f"{args.lock} is not a lock (a JSON object)")
        lock = raw
    rep = img.build(spec, store=args.store, lock=lock, fresh=args.fresh)
    out = {"image": rep.image.id, "dir": rep.image.dir,
           "content_hash": rep.image.content_hash, "seconds": round(rep.seconds, 2),
           "reused_base": rep.reused_base}
    print(json.dumps(out, indent=2))
    if args.against:
        other = img.find_image(args.against, args.store)
        diffs = im.diff(other.manifest(), rep.image.manifest())
        for d in diffs:
            print(f"differs: {d}")
        for line in img.lock_diff(other.lock(), rep.image.lock()):
            print(f"lock: {line}")
    if args.expect and not rep.image.content_hash.startswith(args.expect):
        print(f"trialbox: error: content hash {rep.image.content_hash} is not the expected "
              f"{args.expect}")
        return 1
    return 0


def _verify(args: Any) -> int:
    from trialbox.sandbox.image_verify import ImageGuard, describe
    image = img.find_image(args.ref, args.store)
    t0 = time.monotonic()
    if args.cheap:
        diffs = im.check_seal(image.rootfs, image.seal())
        kind = "cheap"
    else:
        guard = ImageGuard(image)
        try:
            diffs = guard.full()
        except img.ImageMismatch:
            diffs = im.diff(image.manifest(), im.build_manifest(image.rootfs)[0])
        kind = "full"
    dt = time.monotonic() - t0
    if not diffs and not args.cheap:
        img.reseal(image)  # every byte matched: the cheap check's seal is today's
    if diffs:
        print(f"trialbox: error: {describe(image, diffs, kind)}")
        for d in diffs:
            print(f"differs: {d}")
        return 1
    print(json.dumps({"image": image.id, "check": kind, "ok": True,
                      "seconds": round(dt, 3)}))
    return 0


def _list(args: Any) -> int:
    for i in img.list_images(args.store):
        meta = im.load(os.path.join(i.dir, "image.json"))
        assert isinstance(meta, dict)
        print(f"{i.name:20s} {i.content_hash[:16]}  files={meta.get('files', '?'):>6}  "
              f"bytes={meta.get('bytes', '?'):>10}  {i.dir}")
    return 0


def _show(args: Any) -> int:
    i = img.find_image(args.ref, args.store)
    meta = im.load(os.path.join(i.dir, "image.json"))
    assert isinstance(meta, dict)
    if args.diff:
        other = img.find_image(args.diff, args.store)
        for d in im.diff(other.manifest(), i.manifest()):
            print(f"differs: {d}")
        for line in img.lock_diff(other.lock(), i.lock()):
            print(f"lock: {line}")
        return 0
    print(json.dumps({**meta, "id": i.id, "dir": i.dir, "lock": i.lock()}, indent=2))
    return 0
