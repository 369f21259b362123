"""The built-in data sources and named datasets, read through the node's data cache.

``node_cache`` is the node's cache (``trainers.data.cache``) when the server turned it on
(``RAYDOCK_DATA_CACHE_BYTES`` in the job's environment) and the job did not opt out
(``cache: false``); None otherwise, and then every loader here reads the source exactly
as before. ``cached`` reads an entry, or the source once per node (the first reader holds
the key's fill lock; the trials and workers that want it meanwhile wait and then hit),
and counts what it did in the node's counters. An entry that does not decode is
discarded and read again from the source.

What is cached, decoded without pickle:

- digits and synthetic rows: the (x, y) arrays before the job's split (``.npz``);
- the text corpus: its token ids (``.npz``);
- a table (``data.source`` csv/parquet, ``datasets``' tables): the whole table as Arrow
  IPC, keyed by the listing of its files (path, size, modification time). A table whose
  files add up to more than the cap is read by Ray Data as before.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
from collections.abc import Callable
from typing import TypeVar

from api.cluster_contract import DATA_CACHE_BYTES_ENV, DATA_CACHE_DIR_ENV
from trainers.data.cache import DataCache, cache_key

T = TypeVar("T")
log = logging.getLogger(__name__)
FORMAT_VERSION = 1  # bump when what an entry holds changes shape


def default_dir() -> str:
    return os.path.join(tempfile.gettempdir(), f"raydock-data-cache-{os.getuid()}")


def node_cache(enabled: bool = True) -> DataCache | None:
    """This node's cache, or None: off on the server (cap 0) or for this dataset."""
    try:
        cap = int(os.environ.get(DATA_CACHE_BYTES_ENV) or 0)
    except ValueError:
        cap = 0
    if not enabled or cap <= 0:
        return None
    return DataCache(os.environ.get(DATA_CACHE_DIR_ENV) or default_dir(), cap)


def start_keeper() -> None:
    """Start this node's cache keeper (``trainers.data.cache_keeper``) when the cache is on."""
    cache = node_cache()
    if cache is not None:
        from trainers.data.cache_keeper import ensure_keeper

        ensure_keeper(cache)


def cached(
    cache: DataCache | None,
    key: str,
    read: Callable[[], tuple[T, int]],
    encode: Callable[[T], bytes],
    decode: Callable[[bytes], T],
) -> T:
    """``read()``'s value (value, bytes read from the source), through ``cache``."""
    if cache is None:
        return read()[0]
    with contextlib.ExitStack() as stack:
        try:
            from trainers.data.cache_keeper import ensure_keeper

            ensure_keeper(cache)
            value = _hit(cache, key, decode)
            if value is not None:
                return value
            held = stack.enter_context(cache.filling(key))
            value = _hit(cache, key, decode) if held else None  # filled while this reader waited
            if value is not None:
                return value
        except OSError as exc:  # the cache is unusable here (a link in its place): read as before
            log.warning("data cache %s not used: %s", cache.root, exc)
            return read()[0]
        value, source_bytes = read()
        try:
            cache.count(False, source_bytes)
            if held and not cache.put(key, encode(value)):
                log.info("dataset %s is larger than the data cache's cap; not cached", key[:12])
        except OSError as exc:  # a full disk: the value is read, only not kept
            log.warning("data cache %s: could not keep %s: %s", cache.root, key[:12], exc)
        return value


def _hit(cache: DataCache, key: str, decode: Callable[[bytes], T]) -> T | None:
    payload = cache.get(key)
    if payload is None:
        return None
    try:
        value = decode(payload)
    except Exception as exc:  # whole by its digest, yet not what this reader writes: distrust it
        log.warning("data cache entry %s does not decode (%s); reading the source", key[:12], exc)
        cache.discard(key)
        return None
    cache.count(True, 0)
    return value


def arrays_bytes(arrays: dict) -> bytes:
    import numpy as np

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def arrays_of(payload: bytes, names: tuple[str, ...]) -> dict:
    import numpy as np

    with np.load(io.BytesIO(payload), allow_pickle=False) as z:
        return {n: z[n] for n in names}


def arrays_key(kind: str, **parts: object) -> str:
    return cache_key(kind=kind, version=FORMAT_VERSION, **parts)
