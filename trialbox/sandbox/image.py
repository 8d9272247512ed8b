"""Environment images: a Debian root built from a spec, locked, hashed and verified.

A spec (TOML) declares everything a candidate's environment holds::

    name = "py311"
    suite = "bookworm"             # Debian release, built with debootstrap
    variant = "minbase"            # debootstrap's variant
    # mirror = "http://<a Debian mirror>/debian"   (default: this machine's apt sources)

    [debs]                         # Debian packages, each pinned to one version
    python3 = "3.11.2-1+b1"

    [pip]                          # Python packages, pinned, with their sha256
    tabulate = { version = "0.10.0", sha256 = "f0b0622e..." }

    [files]                        # extra files (path in the image = text or source)
    "/etc/trialbox/motd" = { text = "hello\\n", mode = "0644" }

    [env]                          # the environment programs see
    LANG = "C.UTF-8"

    [runtimes]                     # language runtimes it offers: name = interpreter
    python = "/usr/bin/python3"

`build` makes `<store>/<name>@<hash16>/` with `rootfs/` (the root filesystem), `lock.json`
(every resolved version: the debs as dpkg records them in the root, the Python packages
as installed), `manifest.json` (path, kind, mode, size, sha256 of every entry),
`seal.json` (what the cheap check compares) and `image.json` (name, content hash, spec
hash, env, runtimes). What varies between two builds of the same content — timestamps,
bytecode caches, logs, apt's lists and caches, the loader's aux cache, machine-id,
/etc/shadow's last-change day — is normalised away before the manifest is taken, so a
rebuild from the same spec and lock gives the same content hash, or `ImageMismatch`
naming each file that differs and how.

The Debian base (debootstrap + the pinned debs) is cached under `<store>/.base/<key>`,
keyed by suite, variant, mirror and pins: layering pip packages and files over it is a
copy, not a ~2-minute debootstrap. `build(..., fresh=True)` builds the base again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from typing import Any

from trialbox.errors import SandboxUnavailable, UsageError
from trialbox.sandbox import image_manifest as im

DEFAULT_STORE = os.environ.get("TRIALBOX_IMAGES", "/var/lib/trialbox/images")
"""Where built images live unless told otherwise (`$TRIALBOX_IMAGES` overrides)."""
EPOCH = 946_684_800
"""mtime every entry of a built root gets (2000-01-01T00:00:00Z): builds differ in time,
never in content."""
_NAME = re.compile(r"^[a-z0-9][a-z0-9.+-]*$")
_PIP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SHA = re.compile(r"^[0-9a-f]{64}$")


class ImageSpecError(UsageError):
    """An image spec (or its lock) cannot be built as written; the message names the
    field or package to change."""


class ImageMismatch(SandboxUnavailable):
    """An image's content is not its baseline (a file changed, appeared or vanished): the
    image is not used until it is rebuilt; the message names the files."""


# --------------------------------------------------------------------------- spec

@dataclass(frozen=True)
class PipPin:
    """One Python package: exact version and the sha256 of the file pip may install."""

    name: str
    version: str
    sha256: tuple[str, ...]


@dataclass(frozen=True)
class ExtraFile:
    """A file the spec adds to the root."""

    path: str
    """Absolute path inside the image."""
    data: bytes
    mode: int


@dataclass(frozen=True)
class ImageSpec:
    """A parsed, checked image spec (see the module docstring for the TOML)."""

    name: str
    suite: str = "bookworm"
    variant: str = "minbase"
    mirror: str = ""
    debs: tuple[tuple[str, str], ...] = ()
    """(package, version), sorted."""
    pip: tuple[PipPin, ...] = ()
    files: tuple[ExtraFile, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    runtimes: tuple[tuple[str, str], ...] = ()
    """(name, interpreter path inside the image), e.g. ("python", "/usr/bin/python3")."""

    def base_key(self) -> str:
        """What the cached Debian base depends on."""
        return _sha({"suite": self.suite, "variant": self.variant, "mirror": self.mirror,
                     "debs": self.debs})[:24]

    def digest(self) -> str:
        """sha256 of everything the spec declares (files by content)."""
        return _sha({"name": self.name, "base": self.base_key(),
                     "pip": [[p.name, p.version, list(p.sha256)] for p in self.pip],
                     "files": [[f.path, hashlib.sha256(f.data).hexdigest(), f.mode]
                               for f in self.files],
                     "env": self.env, "runtimes": self.runtimes})


def _sha(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def default_mirror() -> str:
    """The Debian mirror this machine's apt uses (its enabled sources: sources.list and
    the `.list` / `.sources` files beside it); no host is built in."""
    paths = ["/etc/apt/sources.list"]
    d = "/etc/apt/sources.list.d"
    if os.path.isdir(d):
        paths += [os.path.join(d, n) for n in sorted(os.listdir(d))
                  if n.endswith((".list", ".sources"))]  # not *.disabled and the like
    for p in paths:
        try:
            text = open(p).read()
        except OSError:
            continue
        for m in re.finditer(r"(?m)^\s*(?:URIs:|deb)\s+(\S+)", text):
            uri = m.group(1)
            if uri.startswith("[") or "security" in uri:
                continue
            if "debian" in uri and "/debian" in uri:
                return uri.rstrip("/")
    raise ImageSpecError("no Debian mirror in this machine's apt sources (/etc/apt/"
                         "sources.list, sources.list.d/*.list|*.sources): set `mirror` in "
                         "the spec's [image] table to a Debian mirror's URL")


def parse_spec(text: str, where: str = "spec", base_dir: str = ".") -> ImageSpec:
    """Parse and check a spec; every error names the field and what to write instead."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ImageSpecError(f"{where}: not valid TOML: {e}") from e
    known = {"name", "suite", "variant", "mirror", "debs", "pip", "files", "env", "runtimes"}
    extra = set(raw) - known
    if extra:
        raise ImageSpecError(f"{where}: unknown keys {sorted(extra)}; allowed: "
                             f"{sorted(known)}")
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ImageSpecError(f"{where}: name must be lower-case letters, digits, '.', '+' "
                             f"or '-', e.g. name = \"py311\"; got {name!r}")
    suite = raw.get("suite", "bookworm")
    variant = raw.get("variant", "minbase")
    if variant not in ("minbase", "buildd", "-"):
        raise ImageSpecError(f"{where}: variant must be 'minbase', 'buildd' or '-', got "
                             f"{variant!r}")
    debs = []
    for pkg, ver in dict(raw.get("debs", {})).items():
        if not _NAME.match(pkg):
            raise ImageSpecError(f"{where}: [debs] {pkg!r} is not a Debian package name")
        if not isinstance(ver, str) or not ver.strip() or ver.strip() in ("*", "latest"):
            raise ImageSpecError(
                f"{where}: [debs] {pkg} is not pinned ({ver!r}); write its exact version, "
                f"e.g. {pkg} = \"<version>\" (`apt-cache madison {pkg}` lists them)")
        debs.append((pkg, ver.strip()))
    pips = []
    for pkg, pin in dict(raw.get("pip", {})).items():
        hint = (f'write {pkg} = {{ version = "X.Y", sha256 = "<64 hex>" }} (the sha256 '
                f"of the wheel or sdist pip will download)")
        if not _PIP_NAME.match(pkg) or not isinstance(pin, dict):
            raise ImageSpecError(f"{where}: [pip] {pkg!r}: {hint}")
        ver = pin.get("version")
        if not isinstance(ver, str) or not re.match(r"^[0-9][0-9A-Za-z.+!-]*$", ver):
            raise ImageSpecError(f"{where}: [pip] {pkg} is not pinned to one version "
                                 f"({ver!r}); {hint}")
        hashes = pin.get("sha256")
        hashes = [hashes] if isinstance(hashes, str) else hashes
        if not hashes or not all(isinstance(h, str) and _SHA.match(h) for h in hashes):
            raise ImageSpecError(f"{where}: [pip] {pkg} has no valid sha256 "
                                 f"({pin.get('sha256')!r}); {hint}")
        pips.append(PipPin(pkg, ver, tuple(hashes)))
    files = []
    for path, f in dict(raw.get("files", {})).items():
        if not path.startswith("/") or ".." in path.split("/") or path.rstrip("/") == "":
            raise ImageSpecError(f"{where}: [files] {path!r} must be an absolute path "
                                 "inside the image without '..'")
        if not isinstance(f, dict) or ("text" in f) == ("source" in f):
            raise ImageSpecError(f"{where}: [files] {path!r} needs exactly one of "
                                 "text = \"...\" or source = \"file next to the spec\"")
        if "text" in f:
            data = str(f["text"]).encode()
        else:
            src = os.path.join(base_dir, str(f["source"]))
            try:
                data = open(src, "rb").read()
            except OSError as e:
                raise ImageSpecError(f"{where}: [files] {path!r}: cannot read source "
                                     f"{src}: {e.strerror}") from e
        try:
            mode = int(str(f.get("mode", "0644")), 8)
        except ValueError as e:
            raise ImageSpecError(f"{where}: [files] {path!r}: mode must be octal text, "
                                 f"e.g. \"0644\"") from e
        files.append(ExtraFile(path, data, mode))
    env = []
    for k, v in dict(raw.get("env", {})).items():
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k) or not isinstance(v, str):
            raise ImageSpecError(f"{where}: [env] {k!r} must be NAME = \"text\"")
        env.append((k, v))
    runtimes = []
    for k, v in dict(raw.get("runtimes", {})).items():
        if not isinstance(v, str) or not v.startswith("/"):
            raise ImageSpecError(f"{where}: [runtimes] {k} must be an absolute path inside "
                                 f"the image, e.g. {k} = \"/usr/bin/python3\"")
        runtimes.append((k, v))
    return ImageSpec(name=name, suite=str(suite), variant=str(variant),
                     mirror=str(raw.get("mirror") or default_mirror()).rstrip("/"),
                     debs=tuple(sorted(debs)), pip=tuple(sorted(pips, key=lambda p: p.name)),
                     files=tuple(sorted(files, key=lambda f: f.path)),
                     env=tuple(sorted(env)), runtimes=tuple(sorted(runtimes)))


def load_spec(path: str) -> ImageSpec:
    try:
        text = open(path).read()
    except OSError as e:
        raise ImageSpecError(f"cannot read image spec {path}: {e.strerror}") from e
    return parse_spec(text, where=path, base_dir=os.path.dirname(os.path.abspath(path)))


# --------------------------------------------------------------------------- built

@dataclass(frozen=True)
class Image:
    """A built image on disk (`load_image`)."""

    dir: str
    name: str
    content_hash: str
    spec_sha256: str
    env: tuple[tuple[str, str], ...]
    runtimes: tuple[tuple[str, str], ...]
    build_s: float = 0.0

    @property
    def rootfs(self) -> str:
        return os.path.join(self.dir, "rootfs")

    @property
    def id(self) -> str:
        """What results record: `image:<name>@sha256:<first 16 hex>`."""
        return f"image:{self.name}@sha256:{self.content_hash[:16]}"

    def manifest(self) -> list[im.Entry]:
        rows = im.load(os.path.join(self.dir, "manifest.json"))
        assert isinstance(rows, dict)
        return [im.Entry.from_json(r) for r in rows["entries"]]

    def lock(self) -> dict[str, Any]:
        lock = im.load(os.path.join(self.dir, "lock.json"))
        assert isinstance(lock, dict)
        return lock

    def seal(self) -> im.Seal:
        raw = im.load(os.path.join(self.dir, "seal.json"))
        assert isinstance(raw, dict)
        return {k: (v[0], v[1], v[2], v[3]) for k, v in raw.items()}

    def python(self) -> str:
        """The image's Python interpreter (its `python` runtime, else /usr/bin/python3)."""
        return dict(self.runtimes).get("python", "/usr/bin/python3")


def load_image(path: str) -> Image:
    """A built image from its directory (the one holding image.json and rootfs/)."""
    meta_path = os.path.join(path, "image.json")
    try:
        meta = im.load(meta_path)
    except (OSError, ValueError) as e:
        raise ImageSpecError(f"{path} is not a built image (no readable image.json: {e}); "
                             "build one with `trialbox image build SPEC`") from e
    assert isinstance(meta, dict)
    return Image(dir=os.path.abspath(path), name=meta["name"],
                 content_hash=meta["content_hash"], spec_sha256=meta["spec_sha256"],
                 env=tuple((k, v) for k, v in meta["env"]),
                 runtimes=tuple((k, v) for k, v in meta["runtimes"]),
                 build_s=float(meta.get("build_s", 0.0)))


def list_images(store: str = DEFAULT_STORE) -> list[Image]:
    out = []
    if os.path.isdir(store):
        for n in sorted(os.listdir(store)):
            p = os.path.join(store, n)
            if "@" in n and os.path.isfile(os.path.join(p, "image.json")):
                out.append(load_image(p))
    return out


def find_image(ref: str, store: str = DEFAULT_STORE) -> Image:
    """An image by directory, `name@hash-prefix` or name (the newest build of it)."""
    if os.path.isdir(ref):
        return load_image(ref)
    name, _, prefix = ref.partition("@")
    prefix = prefix.removeprefix("sha256:")
    found = [i for i in list_images(store) if i.name == name and
             i.content_hash.startswith(prefix)]
    if not found:
        have = ", ".join(sorted({i.name for i in list_images(store)})) or "none"
        raise ImageSpecError(f"no built image {ref!r} in {store} (have: {have}); build it "
                             "with `trialbox image build SPEC`")
    return max(found, key=lambda i: os.stat(i.dir).st_mtime)


# --------------------------------------------------------------------------- build

def _run(argv: list[str], what: str, timeout: float = 1800, **kw: Any) -> str:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    except FileNotFoundError as e:
        raise SandboxUnavailable(f"{what}: {argv[0]} is not installed (run "
                                 "scripts/setup-system.sh as root)") from e
    if p.returncode != 0:
        tail = (p.stderr.strip() or p.stdout.strip())[-1500:]
        raise _BuildFailed(what, tail)
    return str(p.stdout)


class _BuildFailed(Exception):
    def __init__(self, what: str, tail: str):
        super().__init__(f"{what} failed: {tail}")
        self.what, self.tail = what, tail


def check_debs_offered(spec: ImageSpec) -> None:
    """Fail fast, before any download, on a pinned deb the mirror's index (this machine's
    apt lists) does not know, or a version it does not offer."""
    lists = "/var/lib/apt/lists"
    if not shutil.which("apt-cache") or not os.path.isdir(lists) or not any(
            "_Packages" in n for n in os.listdir(lists)):
        return  # no index here (apt-get update never ran): debootstrap's check decides
    for pkg, ver in spec.debs:
        p = subprocess.run(["apt-cache", "madison", pkg], capture_output=True, text=True)
        offered = [line.split("|")[1].strip() for line in p.stdout.splitlines()
                   if line.count("|") >= 2]
        if not offered:
            raise ImageSpecError(
                f"[debs] {pkg}: no such Debian package in the mirror's index "
                f"(`apt-cache madison {pkg}` finds nothing); check the name "
                f"(`apt-cache search {pkg}`), or run `apt-get update` if it is new")
        if ver not in offered:
            raise ImageSpecError(f"[debs] {pkg} = \"{ver}\" is not offered by the mirror; "
                                 f"it has {', '.join(offered)}: pin one of those")


def _build_base(spec: ImageSpec, dest: str) -> None:
    """debootstrap into `dest` (in a private mount namespace: debootstrap mounts /proc
    and /sys inside the target, and a failed run must not leave them on the host)."""
    if os.geteuid() != 0:
        raise SandboxUnavailable("building an image needs root (debootstrap)")
    if not shutil.which("debootstrap"):
        raise SandboxUnavailable("debootstrap is not installed: run scripts/setup-system.sh "
                                 "as root (apt-get install debootstrap)")
    include = ",".join(p for p, _ in spec.debs)
    argv = ["unshare", "--mount", "--propagation", "private", "debootstrap",
            f"--variant={spec.variant}"]
    if include:
        argv.append(f"--include={include}")
    argv += [spec.suite, dest, spec.mirror]
    try:
        _run(argv, "debootstrap")
    except _BuildFailed as e:
        missing = re.search(r"Couldn't find these debs: (.*)", e.tail)
        if missing:
            raise ImageSpecError(f"[debs] {missing.group(1).strip()}: no such Debian "
                                 f"package in {spec.mirror} {spec.suite}; fix the name or "
                                 "remove it") from e
        raise SandboxUnavailable(f"debootstrap of {spec.suite} from {spec.mirror} failed: "
                                 f"{e.tail}") from e
    installed = dpkg_versions(dest)
    wrong = [f"{p} = \"{v}\" is not offered (the mirror installed "
             f"{installed.get(p, 'nothing')})" for p, v in spec.debs if installed.get(p) != v]
    if wrong:
        raise ImageSpecError(f"[debs] {'; '.join(wrong)} for {spec.suite}: pin what it "
                             "serves, or use a snapshot mirror (mirror = the URL of a "
                             "dated Debian snapshot archive)")
    _normalise(dest)


def dpkg_versions(root: str) -> dict[str, str]:
    """Every installed deb of the root as dpkg records it (read with the host's
    dpkg-query from the root's own database)."""
    out = _run(["dpkg-query", f"--admindir={root}/var/lib/dpkg", "-W",
                "-f", "${Package}:${Architecture}\t${Version}\t${db:Status-Abbrev}\n"],
               "dpkg-query")
    vers = {}
    for line in out.splitlines():
        pkg, ver, status = line.split("\t")
        if status.strip() == "ii":
            vers[pkg.split(":")[0]] = ver
    return vers


def _pyver(root: str) -> str:
    libs = sorted(n for n in os.listdir(os.path.join(root, "usr/lib"))
                  if re.match(r"^python3\.\d+$", n))
    if not libs:
        raise ImageSpecError("[pip] needs a Python in the image: add python3 to [debs]")
    return libs[-1]


def _pip_install(spec: ImageSpec, target: str) -> None:
    """pip's hash-checked install into `target` (a staging directory: a bad pin fails
    here, in seconds, before the base is copied)."""
    if not spec.pip:
        return
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as req:
        for p in spec.pip:
            req.write(f"{p.name}=={p.version} " +
                      " ".join(f"--hash=sha256:{h}" for h in p.sha256) + "\n")
    try:
        _run([sys.executable, "-m", "pip", "install", "--quiet", "--no-compile",
              "--no-warn-script-location", "--disable-pip-version-check",
              "--require-hashes", "--only-binary=:all:", "--target", target,
              "-r", req.name], "pip install", env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    except _BuildFailed as e:
        if "DO NOT MATCH THE HASHES" in e.tail:
            got = re.findall(r"Got\s+([0-9a-f]{64})", e.tail)
            raise ImageSpecError(f"[pip] a sha256 does not match what the registry serves "
                                 f"(got {', '.join(got) or '?'}); pip says: {e.tail[-600:]}"
                                 "; fix the sha256 of that package") from e
        if "No matching distribution" in e.tail or "Could not find a version" in e.tail:
            raise ImageSpecError(f"[pip] a package or version the registry does not have: "
                                 f"{e.tail[-600:]}; fix its name or version") from e
        if "hashes are required" in e.tail.lower() or "--hash" in e.tail:
            raise ImageSpecError(f"[pip] every dependency must be pinned with its sha256 "
                                 f"too: {e.tail[-600:]}; add it to [pip]") from e
        raise ImageSpecError(f"[pip] install failed: {e.tail[-800:]}") from e
    finally:
        os.unlink(req.name)


def pip_versions(root: str) -> dict[str, str]:
    """Python packages installed in the root (dist-info directories), name -> version."""
    out = {}
    for d in ("usr/local/lib", "usr/lib"):
        base = os.path.join(root, d)
        if not os.path.isdir(base):
            continue
        for py in os.listdir(base):
            for sub in ("dist-packages", "site-packages"):
                sp = os.path.join(base, py, sub)
                if not os.path.isdir(sp):
                    continue
                for n in os.listdir(sp):
                    m = re.match(r"^(.+?)-([^-]+)\.dist-info$", n)
                    if m:
                        out[m.group(1).lower().replace("_", "-")] = m.group(2)
    return dict(sorted(out.items()))


_DROP_DIRS = ("var/cache/apt", "var/lib/apt/lists", "var/log", "var/cache/debconf",
              "var/cache/ldconfig", "tmp", "var/tmp", "run")
_DROP_FILES = ("var/lib/dpkg/status-old", "var/lib/dpkg/diversions-old",
               "var/lib/dpkg/statoverride-old", "var/cache/debconf/config.dat-old",
               "var/cache/debconf/templates.dat-old", "etc/shadow-", "etc/gshadow-",
               "etc/passwd-", "etc/group-", "etc/subuid-", "etc/subgid-",
               "var/lib/dbus/machine-id", "etc/hostname", "etc/resolv.conf")


def _normalise(root: str) -> None:
    """Remove or fix what differs between builds of the same content (docstring)."""
    for d in _DROP_DIRS:
        p = os.path.join(root, d)
        if os.path.isdir(p) and not os.path.islink(p):
            for n in os.listdir(p):
                q = os.path.join(p, n)
                if os.path.isdir(q) and not os.path.islink(q):
                    shutil.rmtree(q)
                else:
                    os.unlink(q)
    for f in _DROP_FILES:
        p = os.path.join(root, f)
        if os.path.lexists(p):
            os.unlink(p)
    mid = os.path.join(root, "etc/machine-id")
    if os.path.exists(mid):
        open(mid, "w").close()
    for f in ("etc/shadow", "etc/gshadow"):
        p = os.path.join(root, f)
        if f == "etc/shadow" and os.path.isfile(p):
            rows = [r.split(":") for r in open(p).read().splitlines()]
            with open(p, "w") as fh:
                for r in rows:
                    if len(r) > 2:
                        r[2] = "0"  # the day it was built
                    fh.write(":".join(r) + "\n")
    for dirpath, dirnames, filenames in os.walk(root):
        if "__pycache__" in dirnames:
            shutil.rmtree(os.path.join(dirpath, "__pycache__"))
            dirnames.remove("__pycache__")
        for n in filenames:
            if n.endswith((".pyc", ".pyo")):
                os.unlink(os.path.join(dirpath, n))
    _stamp(root)


def _stamp(root: str) -> None:
    for rel, _st in im.walk(root):
        os.utime(os.path.join(root, rel), (EPOCH, EPOCH), follow_symlinks=False)
    os.utime(root, (EPOCH, EPOCH))


def _add_files(spec: ImageSpec, root: str) -> None:
    for f in spec.files:
        dest = os.path.join(root, f.path.lstrip("/"))
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        if os.path.lexists(dest):
            os.unlink(dest)
        with open(dest, "wb") as fh:
            fh.write(f.data)
        os.chmod(dest, f.mode)


def _check_runtimes(spec: ImageSpec, root: str) -> None:
    for name, path in spec.runtimes:
        p = os.path.join(root, path.lstrip("/"))
        # a link inside the image resolves against the image, not the host
        seen = 0
        while os.path.islink(p) and seen < 16:
            t = os.readlink(p)
            p = os.path.join(root, t.lstrip("/")) if t.startswith("/") else \
                os.path.join(os.path.dirname(p), t)
            seen += 1
        if not os.path.isfile(p) or not os.access(p, os.X_OK):
            raise ImageSpecError(f"[runtimes] {name} = \"{path}\" is not an executable in "
                                 "the built image; add the deb that provides it to [debs]")


@dataclass
class BuildReport:
    """What `build` did."""

    image: Image
    reused_base: bool
    seconds: float
    lock_diff: list[str] = field(default_factory=list)


def build(spec: ImageSpec, store: str = DEFAULT_STORE, lock: dict[str, Any] | None = None,
          fresh: bool = False) -> BuildReport:
    """Build `spec` into `store`; with `lock`, the result must resolve to exactly the
    lock's versions (else ImageSpecError naming each package that moved)."""
    t0 = time.monotonic()
    if lock is not None:
        spec_against_lock(spec, lock)
    check_debs_offered(spec)
    os.makedirs(store, exist_ok=True)
    base = os.path.join(store, ".base", spec.base_key())
    reused = os.path.isdir(base) and not fresh
    if not reused:
        os.makedirs(os.path.dirname(base), exist_ok=True)
        tmp_base = tempfile.mkdtemp(prefix=".tmp-", dir=os.path.dirname(base))
        try:
            _build_base(spec, os.path.join(tmp_base, "root"))
            if os.path.isdir(base):
                shutil.rmtree(base)
            os.rename(os.path.join(tmp_base, "root"), base)
        finally:
            shutil.rmtree(tmp_base, ignore_errors=True)
    work = tempfile.mkdtemp(prefix=".build-", dir=store)
    try:
        root = os.path.join(work, "rootfs")
        site = os.path.join("usr/local/lib", _pyver(base) if spec.pip else "", "dist-packages")
        staged = os.path.join(work, "pip")
        _pip_install(spec, staged)
        _run(["cp", "-a", "--reflink=auto", base, root], "copying the base")
        if spec.pip:
            os.makedirs(os.path.join(root, site), exist_ok=True)
            _run(["cp", "-a", staged + "/.", os.path.join(root, site)], "adding pip's files")
            shutil.rmtree(staged)
        _add_files(spec, root)
        _check_runtimes(spec, root)
        _normalise(root)
        new_lock = {"suite": spec.suite, "variant": spec.variant, "mirror": spec.mirror,
                    "debs": dpkg_versions(root), "pip": pip_versions(root)}
        moved = lock_diff(lock, new_lock) if lock is not None else []
        if moved:
            raise ImageSpecError("the build does not resolve to the lock: " +
                                 "; ".join(moved) + " (the mirror or registry moved: "
                                 "rebuild without the lock to take the new versions, or "
                                 "pin the old ones)")
        entries, seal = im.build_manifest(root)
        chash = im.content_hash(entries)
        im.save(os.path.join(work, "manifest.json"),
                {"content_hash": chash, "entries": [e.to_json() for e in entries]})
        im.save(os.path.join(work, "lock.json"), new_lock)
        seconds = time.monotonic() - t0
        meta = {"name": spec.name, "content_hash": chash, "spec_sha256": spec.digest(),
                "env": [list(x) for x in spec.env],
                "runtimes": [list(x) for x in spec.runtimes], "build_s": round(seconds, 2),
                "files": len(entries), "bytes": sum(e.size for e in entries if e.kind == "f")}
        im.save(os.path.join(work, "image.json"), meta)
        final = os.path.join(store, f"{spec.name}@{chash[:16]}")
        if os.path.isdir(final):
            # the same content already built: keep the existing one (its seal is what
            # pools compare with), drop this copy
            shutil.rmtree(work)
        else:
            im.save(os.path.join(work, "seal.json"), {k: list(v) for k, v in seal.items()})
            os.rename(work, final)
            _seal_again(final)
        img = load_image(final)
        return BuildReport(img, reused, seconds,
                           lock_diff(lock, new_lock) if lock is not None else [])
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def reseal(image: Image) -> None:
    """Take the lstat seal again (after a full check passed: a file changed and changed
    back has the same bytes but a new ctime)."""
    _seal_again(image.dir)


def _seal_again(final: str) -> None:
    """Renaming the build directory moves no entry's ctime, but take the seal after the
    rename anyway: it is what the cheap check compares."""
    root = os.path.join(final, "rootfs")
    seal = {rel: [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
            for rel, st in im.walk(root)}
    im.save(os.path.join(final, "seal.json"), seal)


def spec_against_lock(spec: ImageSpec, lock: dict[str, Any]) -> None:
    """Before building: a pin of the spec that its lock contradicts (the spec was
    edited since the lock was taken)."""
    bad = [f"[debs] {p} = {v} but the lock has {lock.get('debs', {}).get(p, 'none')}"
           for p, v in spec.debs if lock.get("debs", {}).get(p) != v]
    bad += [f"[pip] {p.name} = {p.version} but the lock has "
            f"{lock.get('pip', {}).get(p.name.lower(), 'none')}"
            for p in spec.pip if lock.get("pip", {}).get(p.name.lower()) != p.version]
    if bad:
        raise ImageSpecError("the spec and the lock disagree: " + "; ".join(bad) +
                             " (build without the lock to take the spec's versions)")


def lock_diff(old: dict[str, Any] | None, new: dict[str, Any]) -> list[str]:
    """Each resolved version that differs, e.g. `pip tabulate 0.8.10 -> 0.10.0`."""
    if old is None:
        return []
    out = []
    for kind in ("debs", "pip"):
        a, b = old.get(kind, {}), new.get(kind, {})
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                out.append(f"{kind} {k} {a.get(k, '(none)')} -> {b.get(k, '(none)')}")
    return out
