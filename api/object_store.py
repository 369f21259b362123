"""The one place a storage URI becomes a pyarrow filesystem, for the server and the cluster alike.

A local path (or ``file://``) is the local filesystem; anything else (``s3://``, ``gs://``,
``abfs://``) is what ``pyarrow.fs.FileSystem.from_uri`` makes of it, with the endpoint,
region and credentials read as pyarrow and boto read them: ``AWS_ENDPOINT_URL_S3`` /
``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (or
a profile, an instance role). With an endpoint set, an ``s3://`` bucket's region is asked
of that endpoint, never of AWS's public host. No credential is ever passed explicitly, so
a filesystem pickled to another process (Ray Train hands one to every worker) carries
none: each process reads its own.

A path on an object store is a filesystem path without its scheme (``bucket/key``);
``uri_of`` puts the scheme back, so what a job reports names the store it lives in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow.fs as pafs

# The variables the driver of a job gets from the server when storage is an object store:
# where it is and in which region, nothing secret (Ray's job list shows them to every job).
ENDPOINT_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
REGION_ENV = ("AWS_REGION", "AWS_DEFAULT_REGION")
MAX_KEY_BYTES = 1024  # S3's bound on an object key
_SCHEMES = {"s3": "s3://", "gcs": "gs://", "abfs": "abfs://", "hdfs": "hdfs://"}


def is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem ``uri`` lives on and its path there (``bucket/key`` on an object store)."""
    import pyarrow.fs as pafs

    return pafs.FileSystem.from_uri(uri)


def uri_of(fs: pafs.FileSystem | None, path: str) -> str:
    """The URI of ``path`` on ``fs``: the path itself on the local filesystem (or when it
    is a URI already), the store's scheme in front of it otherwise."""
    if fs is None or "://" in path:
        return path
    scheme = _SCHEMES.get(fs.type_name)
    return scheme + path.lstrip("/") if scheme else path


def key_parts(relative: str) -> list[str]:
    """The "/"-separated names of a key below a prefix; none may climb out of it (``..``),
    be empty after a "/" or hold a NUL, and the whole is bounded as S3 bounds a key."""
    parts = [p for p in relative.split("/") if p not in ("", ".")]
    if (
        not parts
        or ".." in parts
        or any("\x00" in p or "\\" in p for p in parts)
        or len(relative.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES
    ):
        raise PermissionError(f"{relative[:200]!r} is not a key below its prefix")
    return parts
