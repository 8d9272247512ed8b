"""Object stores (S3 and S3-compatible servers: MinIO, Ceph, SeaweedFS) behind fsspec.

`s3://bucket/prefix` goes through s3fs (`pip install 'trialbox[s3]'`). Where the store is
and who we are come from, in order: the `storage_options` given to `ArtifactStore`
(`endpoint_url=`, `key=`, `secret=`), fsspec's environment configuration
(`FSSPEC_S3_ENDPOINT_URL`, `FSSPEC_S3_KEY`, `FSSPEC_S3_SECRET`), then botocore's usual
chain (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`, a profile).

A store that cannot be used is the caller's configuration to fix, so every failure is a
`UsageError` naming what to set (`explain`), raised before anything is written: an
artifact store checks its bucket when it is created (`check`), and nothing creates a
bucket implicitly (a mistyped name must not become a new bucket).
"""

from __future__ import annotations

from typing import Any

from trialbox.errors import UsageError

OBJECT_PROTOCOLS = ("s3", "s3a")
ENDPOINT_HINT = ("set the endpoint: ArtifactStore(url, endpoint_url='http://host:port'), "
                 "or FSSPEC_S3_ENDPOINT_URL / AWS_ENDPOINT_URL in the environment")
CREDENTIALS_HINT = ("set credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or "
                    "FSSPEC_S3_KEY / FSSPEC_S3_SECRET, or ArtifactStore(url, key=..., "
                    "secret=...), or anon=True for a public bucket)")
TIMEOUTS = {"connect_timeout": 5, "read_timeout": 60,
            "retries": {"max_attempts": 2, "mode": "standard"}}
"""botocore's defaults retry an unreachable endpoint for ~30 s before saying so."""


def is_object_url(url: str) -> bool:
    return url.split("://", 1)[0].lower() in OBJECT_PROTOCOLS if "://" in url else False


def options(url: str, storage_options: dict[str, Any]) -> dict[str, Any]:
    """`storage_options` for an object-store URL, with bounded timeouts; ImportError
    becomes a UsageError naming the extra to install."""
    if not is_object_url(url):
        return storage_options
    try:
        import s3fs  # noqa: F401
    except ImportError:
        raise UsageError(f"{url!r} needs s3fs, the S3 driver of fsspec: "
                         "pip install 'trialbox[s3]'") from None
    opts = dict(storage_options)
    config = dict(TIMEOUTS)
    config.update(opts.get("config_kwargs", {}))
    opts["config_kwargs"] = config
    return opts


def explain(e: BaseException, url: str) -> UsageError | None:
    """A UsageError naming what to set for an object-store failure, or None when `e`
    is not one (the caller re-raises it)."""
    name = type(e).__name__
    text = str(e)
    if name in ("NoCredentialsError", "PartialCredentialsError",
                "NoAuthTokenError") or "Unable to locate credentials" in text:
        return UsageError(f"object store {url!r}: no credentials ({text}); "
                          f"{CREDENTIALS_HINT}")
    if name in ("EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError",
                "ClientConnectorError", "InvalidEndpointError") or \
            "Could not connect to the endpoint" in text:
        return UsageError(f"object store {url!r}: cannot reach the endpoint ({text}); "
                          f"{ENDPOINT_HINT}")
    if isinstance(e, PermissionError) or any(
            s in text for s in ("InvalidAccessKeyId", "SignatureDoesNotMatch",
                                "AccessDenied", "Forbidden")):
        return UsageError(f"object store {url!r}: access refused ({text}); check the "
                          f"credentials and the bucket's policy; {CREDENTIALS_HINT}")
    if "bucket does not exist" in text or "NoSuchBucket" in text:
        return UsageError(f"object store {url!r}: no such bucket ({text}); create it "
                          "first (trialbox never creates buckets) or fix the URL")
    return None


def check(fs: Any, root: str, url: str) -> None:
    """Fail now, with what to set, if the bucket of `root` cannot be listed (no
    credentials, wrong endpoint, no such bucket, access refused)."""
    bucket = root.split("/", 1)[0]
    try:
        fs.ls(bucket, detail=False, refresh=True)
    except Exception as e:
        why = explain(e, url)
        if why is None:
            if isinstance(e, FileNotFoundError):
                why = UsageError(f"object store {url!r}: no bucket {bucket!r}; create it "
                                 "first (trialbox never creates buckets) or fix the URL")
            else:
                why = UsageError(f"object store {url!r} cannot be used: "
                                 f"{type(e).__name__}: {e}; {ENDPOINT_HINT}; "
                                 f"{CREDENTIALS_HINT}")
        raise why from None
