"""Environment images (docs/images.md), for real: a Debian minbase + python3 image built
with debootstrap from this machine's mirror, one pinned pip package, one extra file.

The image is built once and cached between test modules and test runs under
`.cache/images` in the checkout (`$TRIALBOX_TEST_IMAGES` overrides), found again by its
spec's hash and fully re-verified before use; a cache that fails the check is rebuilt.
A fresh clone pays the build once (~2-3 min here, ~160 MB). Tests that tamper with the
cached image put every byte back (and the fixture's full check would catch it if not).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import shutil
import subprocess
import sys

import pytest

from trialbox.sandbox import CellPool, PoolConfig
from trialbox.sandbox import image as img
from trialbox.sandbox import image_manifest as im
from trialbox.sandbox.image_verify import ImageGuard, environment_mismatch
from trialbox.sandbox.namespace import NamespaceSandbox
from trialbox.types import Limits

HERE = os.path.dirname(__file__)
SPEC = os.path.join(HERE, "images", "min.toml")
REPO = os.path.dirname(os.path.dirname(HERE))
STORE = os.environ.get("TRIALBOX_TEST_IMAGES", os.path.join(REPO, ".cache", "images"))
LIMITS = Limits(wall_s=20, cpu_s=10, memory_mb=256, disk_mb=16)
JSON_INIT = "usr/lib/python3.11/json/__init__.py"

# A fresh checkout builds the image in the first test that asks for it (~2-4 min here).
pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="building images needs root"),
              pytest.mark.timeout(1800)]


def served(text: str) -> str:
    """min.toml with each pinned deb moved to the version the mirror serves now, when the
    pin is no longer offered: bookworm's archive keeps only its latest point release, so
    a pin such as python3.11 = "3.11.2-6+deb12u8" stops being buildable at the next
    security update. (The spec format still demands pins; what the tests check —
    reproducible hashes, lock diffs, tamper detection — does not depend on which.)"""
    if not shutil.which("apt-cache"):
        return text
    for m in re.finditer(r'(?m)^"?([a-z0-9.+-]+)"? = "([^"]+)"$', text.split("[debs]")[1]
                         .split("[")[0]):
        pkg, ver = m.groups()
        out = subprocess.run(["apt-cache", "madison", pkg], capture_output=True, text=True)
        # debootstrap installs from the suite itself, not bookworm-security/-updates
        offered = [ln.split("|")[1].strip() for ln in out.stdout.splitlines()
                   if ln.count("|") >= 2 and " bookworm/main " in ln.split("|")[2] + " "]
        if offered and ver not in offered:
            text = text.replace(f'= "{ver}"', f'= "{offered[0]}"')
    return text


SPEC_TEXT = served(open(SPEC).read())


def spec_of(text: str = "") -> img.ImageSpec:
    return img.parse_spec(text or SPEC_TEXT, SPEC, base_dir=os.path.dirname(SPEC))


def cached_image(spec: img.ImageSpec) -> img.Image:
    """The built image of `spec` from the store, verified in full, or a new build."""
    for i in img.list_images(STORE):
        if i.spec_sha256 == spec.digest():
            try:
                ImageGuard(i).full()
            except img.ImageMismatch:
                shutil.rmtree(i.dir)  # a broken cache: build it again
                continue
            img.reseal(i)
            return i
    return img.build(spec, store=STORE).image


@pytest.fixture(scope="session")
def image() -> img.Image:
    if not shutil.which("debootstrap"):
        pytest.fail("debootstrap is missing: run scripts/setup-system.sh as root")
    return cached_image(spec_of())


class Tamper:
    """Append to one file of the image; put it back on exit (bytes, mode, mtime)."""

    def __init__(self, image: img.Image, rel: str, via: str = ""):
        self.path = os.path.join(via or image.rootfs, rel)

    def __enter__(self) -> Tamper:
        self.saved = open(self.path, "rb").read()
        self.st = os.stat(self.path)
        with open(self.path, "ab") as f:
            f.write(b"\n# changed\n")
        return self

    def __exit__(self, *exc: object) -> None:
        with open(self.path, "wb") as f:
            f.write(self.saved)
        os.utime(self.path, ns=(self.st.st_atime_ns, self.st.st_mtime_ns))


def run(coro):  # a fresh loop per test: the pools here are the tests' own
    return asyncio.run(asyncio.wait_for(coro, 300))


# ------------------------------------------------------------------ build and lock

def test_build_gives_a_root_a_lock_and_a_manifest_with_one_hash(image, capsys):
    entries = image.manifest()
    assert im.content_hash(entries) == image.content_hash
    paths = {e.path: e for e in entries}
    py = paths["usr/bin/python3.11"]
    assert py.kind == "f" and len(py.digest) == 64 and py.mode == 0o755
    assert paths["etc/trialbox-image"].digest == hashlib.sha256(b"tb-test-min\n").hexdigest()
    lock = image.lock()
    assert lock["debs"]["python3"] == "3.11.2-1+b1" and "libc6" in lock["debs"]
    assert lock["pip"] == {"tabulate": "0.8.10"}
    # normalised: no bytecode, logs, apt lists; every mtime the same
    assert not [p for p in paths if p.endswith(".pyc") or "/__pycache__" in p]
    assert not [p for p in paths if p.startswith(("var/log/", "var/lib/apt/lists/"))]
    assert paths.get("etc/machine-id", im.Entry("", "f", 0, 0, "")).size == 0
    shadow = open(os.path.join(image.rootfs, "etc/shadow")).read().splitlines()
    assert shadow and {row.split(":")[2] for row in shadow} == {"0"}  # no build day
    assert {os.lstat(os.path.join(image.rootfs, p)).st_mtime for p in
            ("usr/bin/python3.11", "etc/trialbox-image", "var/lib/dpkg/status")} == {img.EPOCH}
    # trialbox image list / show
    from trialbox.cli import main
    assert main(["image", "--store", STORE, "list"]) == 0
    assert image.content_hash[:16] in capsys.readouterr().out
    assert main(["image", "--store", STORE, "show", f"{image.name}@{image.content_hash[:12]}"]) == 0
    shown = capsys.readouterr().out
    assert image.id in shown and '"tabulate": "0.8.10"' in shown


def test_rebuild_from_spec_and_lock_gives_the_same_hash(image):
    spec = spec_of()
    again = img.build(spec, store=STORE, lock=image.lock())
    assert again.reused_base  # the Debian layer comes from the cache; the rest is redone
    assert again.image.content_hash == image.content_hash
    assert again.image.dir == image.dir


def test_a_version_bump_gives_another_hash_and_a_lock_diff(image, tmp_path):
    old = "0ba055423dbaa164b9e456abe7920c5e8ed33fcc16f6d1b2f2d152c8e1e8b4fc"
    new = "f0b0622e567335c8fabaaa659f1b33bcb6ddfe2e496071b743aa113f8774f2d3"
    text = SPEC_TEXT.replace(f'version = "0.8.10", sha256 = "{old}"',
                                     f'version = "0.10.0", sha256 = "{new}"')
    assert "0.10.0" in text
    bumped = img.build(spec_of(text), store=STORE)
    try:
        assert bumped.image.content_hash != image.content_hash
        assert img.lock_diff(image.lock(), bumped.image.lock()) == \
            ["pip tabulate 0.8.10 -> 0.10.0"]
        changed = {d.path for d in im.diff(image.manifest(), bumped.image.manifest())}
        assert any("tabulate-0.10.0.dist-info" in p for p in changed), sorted(changed)[:20]
        assert any("tabulate-0.8.10.dist-info" in p for p in changed)
        # ... and a rebuild that must resolve to the old lock says which package moved
        with pytest.raises(img.ImageSpecError, match=r"\[pip\] tabulate = 0\.10\.0 but the "
                                                     r"lock has 0\.8\.10"):
            img.build(img.parse_spec(text, "bumped"), store=STORE, lock=image.lock())
    finally:
        shutil.rmtree(bumped.image.dir)


# ------------------------------------------------------------------ verification

def test_tampering_with_one_file_fails_verification_naming_it(image):
    assert ImageGuard(image).full() == []
    with Tamper(image, JSON_INIT):
        guard = ImageGuard(image)
        with pytest.raises(img.ImageMismatch, match=JSON_INIT) as e:
            guard.full()
        assert "size" in str(e.value) and guard.counts == {"full/on-demand": 1}
        # the CLI says the same, exit 1
        out = subprocess.run([sys.executable, "-c", "import sys; from trialbox.cli import main; "
                              "sys.exit(main(sys.argv[1:]))", "image", "--store", STORE,
                              "verify", image.dir], capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": REPO}, cwd=REPO)
        assert out.returncode == 1 and f"differs: {JSON_INIT}" in out.stdout, out
        # without reading a byte, the build's lstat seal sees it too
        assert JSON_INIT in {d.path for d in im.check_seal(image.rootfs, image.seal())}
    assert ImageGuard(image).full() == []  # every byte back


def test_the_watch_sees_a_change_made_through_another_path(image, tmp_path):
    """The cheap check is inotify on every directory: a write through a bind mount of
    the image (another path to the same files) is seen; nothing else reads a file."""
    guard = ImageGuard(image)
    guard.start()
    try:
        assert guard.cheap() == []
        other = tmp_path / "other"
        other.mkdir()
        subprocess.run(["mount", "--bind", image.rootfs, str(other)], check=True)
        try:
            with Tamper(image, "etc/trialbox-image", via=str(other)):
                with pytest.raises(img.ImageMismatch, match="etc/trialbox-image"):
                    guard.cheap()
        finally:
            subprocess.run(["umount", str(other)], check=True)
        with pytest.raises(img.ImageMismatch, match="etc/trialbox-image"):
            guard.cheap()  # stopped for good, even once put back: refused, not checked
        assert guard.counts == {"full/pool-start": 1, "cheap/before-task": 2}
    finally:
        guard.close()


# ------------------------------------------------------------------ running on it

# The image's [env] and its /var (beside /usr) in a run, with a caller's own env on top:
# every tier must give both (docs/images.md "Running on an image").
ENV_PROBE = ["python3", "-c", "import hashlib, os; print(os.environ.get('TB_IMAGE'), "
             "os.environ.get('CALLER'), hashlib.sha256(open('/var/lib/dpkg/status', "
             "'rb').read()).hexdigest())"]


async def check_env_and_var(sb, image) -> None:
    dpkg = im.file_sha256(os.path.join(image.rootfs, "var/lib/dpkg/status"))
    for env, caller in ((None, "None"), ({"CALLER": "x"}, "x")):
        r = await sb.exec(ENV_PROBE, env=env)
        assert r.ok and r.stdout_text.split() == ["tb-test-min", caller, dpkg], (env, r)


def test_the_namespace_tier_runs_the_image_and_refuses_it_once_tampered(image):
    python_sha = im.file_sha256(os.path.join(image.rootfs, "usr/bin/python3.11"))

    async def body() -> None:
        pool = await CellPool(PoolConfig(warm=1, image=image.dir)).start()
        try:
            assert pool.runtime.id == image.id
            assert pool.image_guard is not None
            async with await NamespaceSandbox.open(pool, LIMITS) as sb:
                r = await sb.exec(["python3", "-c",
                                   "import hashlib, tabulate; print(hashlib.sha256(open("
                                   "'/proc/self/exe','rb').read()).hexdigest()); print("
                                   "tabulate.__version__); print(open('/etc/trialbox-"
                                   "image').read().strip())"])
                assert r.ok, r
                assert r.stdout_text.split() == [python_sha, "0.8.10", "tb-test-min"]
                assert r.runtime == image.id
                await check_env_and_var(sb, image)
            with Tamper(image, JSON_INIT):
                with pytest.raises(img.ImageMismatch, match=JSON_INIT):
                    await NamespaceSandbox.open(pool, LIMITS)
            # refused from then on, never run: no session was opened
            with pytest.raises(img.ImageMismatch, match=JSON_INIT):
                await NamespaceSandbox.open(pool, LIMITS)
            assert pool.image_guard.counts["full/pool-start"] == 1
        finally:
            await pool.close()
        # and a pool will not start on a tampered image
        with Tamper(image, JSON_INIT):
            with pytest.raises(img.ImageMismatch, match=JSON_INIT):
                await CellPool(PoolConfig(warm=0, image=image.dir)).start()

    run(body())


def test_humaneval_canonical_solutions_pass_on_the_image_and_cheats_fail(image):
    from tests.judge.test_function import CHEATS, DETECTOR, FAST
    from trialbox.judge.evaluate import evaluate
    from trialbox.judge.function import judge_pool_config
    from trialbox.store.tasks import load_humaneval
    tasks = {t.task_id: t for t in load_humaneval()}
    ids = ["HumanEval/0", "HumanEval/13", "HumanEval/38", "HumanEval/53", "HumanEval/101"]
    cheats = ["always-equal object", "patches builtins", "writes to the judge channel"]
    samples = [{"task_id": i, "completion": tasks[i].canonical_solution} for i in ids]
    samples += [{"task_id": "HumanEval/0", "completion": CHEATS[c]} for c in cheats]

    async def body():
        pool = await CellPool(judge_pool_config(warm=2, image=image.dir)).start()
        try:
            return await evaluate(tasks, samples, pool, workers=2, config=FAST)
        finally:
            await pool.close()

    rows, summary = run(body())
    rows = [r.to_dict() for r in rows]
    assert [r["outcome"] for r in rows[:len(ids)]] == ["passed"] * len(ids), rows
    for r, c in zip(rows[len(ids):], cheats, strict=True):
        assert r["outcome"] == "failed" and r["reward"] == 0.0, (c, r)
        assert DETECTOR[c] in r["flags"], (c, r)  # notable: the tests decided
    assert {r["environment"] for r in rows} == {image.id}
    assert summary["outcomes_by_environment"] == {
        image.id: {"passed": len(ids), "failed": len(cheats)}}


def test_a_task_declaring_another_environment_is_not_run(image):
    from trialbox.sandbox.image_root import image_runtime
    rt = image_runtime(image)
    assert environment_mismatch("", rt) == ""
    assert environment_mismatch(f"{image.name}@sha256:{image.content_hash[:16]}", rt) == ""
    why = environment_mismatch(f"{image.name}@sha256:{'0' * 16}", rt)
    assert image.id in why and "PoolConfig(image=" in why


# ------------------------------------------------------------------ bad input

@pytest.mark.parametrize("body, needle", [
    ('[debs]\npython3 = ""\n', r"\[debs\] python3 is not pinned"),
    ('[debs]\npython3 = "*"\n', r"\[debs\] python3 is not pinned"),
    ('[pip]\ntabulate = { version = ">=0.8", sha256 = "' + "0" * 64 + '" }\n',
     r"\[pip\] tabulate is not pinned"),
    ('[pip]\ntabulate = { version = "0.8.10" }\n', r"\[pip\] tabulate has no valid sha256"),
    ('[runtimes]\npython = "python3"\n', r"\[runtimes\] python must be an absolute path"),
    ('colour = "blue"\n', r"unknown keys \['colour'\]"),
])
def test_a_spec_that_cannot_be_built_as_written_is_named(body, needle):
    with pytest.raises(img.ImageSpecError, match=needle):
        img.parse_spec('name = "x"\n' + body)


def test_a_package_that_does_not_exist_or_a_version_not_offered_is_named_before_building(
        tmp_path):
    spec = img.parse_spec('name = "x"\n[debs]\npython3-no-such-package = "1.0"\n')
    with pytest.raises(img.ImageSpecError, match="python3-no-such-package: no such Debian "
                                                 "package"):
        img.build(spec, store=str(tmp_path))
    spec = img.parse_spec('name = "x"\n[debs]\npython3 = "0.0.1-1"\n')
    with pytest.raises(img.ImageSpecError, match=r"python3 = \"0\.0\.1-1\" is not offered.*"
                                                 r"3\.11\.2-1\+b1"):
        img.build(spec, store=str(tmp_path))
    assert not os.listdir(tmp_path) or os.listdir(tmp_path) == [".base"]


def test_a_pip_hash_that_does_not_match_is_named(image):
    text = SPEC_TEXT.replace("0ba055423dbaa164", "1ba055423dbaa164")
    with pytest.raises(img.ImageSpecError, match="sha256 does not match.*0ba055423dbaa164"):
        img.build(img.parse_spec(text, "bad-hash"), store=STORE)


def test_an_image_that_is_not_built_is_named():
    with pytest.raises(img.ImageSpecError, match="not a built image"):
        img.load_image("/nonexistent")
    with pytest.raises(img.ImageSpecError, match="trialbox image build"):
        run(CellPool(PoolConfig(warm=0, image="/nonexistent")).start())


def test_a_task_names_its_environment_in_its_row(tmp_path):
    import json

    from trialbox.errors import UsageError
    from trialbox.store.tasks import load_tasks
    row = {"task_id": "t1", "kind": "stdio", "prompt": "echo", "tests": [
        {"stdin": "a", "expected": "a"}], "image": "tb-test-min@sha256:" + "ab" * 8}
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps(row) + "\n")
    assert load_tasks(str(f))[0].image == "tb-test-min@sha256:" + "ab" * 8
    f.write_text(json.dumps({**row, "image": "tb-test-min"}) + "\n")
    with pytest.raises(UsageError, match="field 'image' must be 'name@sha256:"):
        load_tasks(str(f))


@pytest.mark.parametrize("tier", ["container", "gvisor"])
def test_the_oci_tiers_run_the_same_image(image, tier):
    """The same image definition as the container's rootfs: its python binary, its pip
    package, its /etc; a tampered image refused there too."""
    from trialbox.sandbox.container import ContainerProvider
    from trialbox.sandbox.gvisor import GVisorProvider
    from trialbox.sandbox.oci import OciConfig
    python_sha = im.file_sha256(os.path.join(image.rootfs, "usr/bin/python3.11"))

    async def body() -> None:
        config = OciConfig(warm=0, image=image.dir)
        p = ContainerProvider(config, runtime="crun") if tier == "container" \
            else GVisorProvider(config)
        await p.start()
        try:
            sb = await p.open(LIMITS)
            try:
                r = await sb.exec(["python3", "-c",
                                   "import hashlib, tabulate; print(hashlib.sha256(open("
                                   "'/proc/self/exe','rb').read()).hexdigest(), tabulate."
                                   "__version__, open('/etc/trialbox-image').read())"])
                await check_env_and_var(sb, image)
            finally:
                await sb.close()
            assert r.ok and r.stdout_text.split() == [python_sha, "0.8.10", "tb-test-min"], r
            assert r.runtime == image.id
            with Tamper(image, JSON_INIT):
                with pytest.raises(img.ImageMismatch, match=JSON_INIT):
                    await p.open(LIMITS)
        finally:
            await p.close()

    run(body())
