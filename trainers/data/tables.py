"""User tables (``data.source`` csv/parquet, ``datasets``' tables) through the node's data cache.

With the cache on, a table is read once per node: its files are listed (path, size,
modification time: the key, with the format), read whole by the process that builds the
job's trainer (the driver, or a search trial) and kept as Arrow IPC; the job gets it as
a Ray Dataset already in the object store (``ray.data.from_arrow``), so its epochs read
memory, not the source. A table the cache cannot hold (its files add up to more than the
cap, or more than ``MAX_FILES`` of them) returns None: Ray Data reads it as before.
"""

from __future__ import annotations

import io
import os

from api import object_store
from trainers.data.cache import DataCache, cache_key
from trainers.data.sources import FORMAT_VERSION, cached

MAX_FILES = 10_000
EXTENSIONS = {"csv": (".csv", ".csv.gz"), "parquet": (".parquet",), "json": (".json", ".jsonl", ".json.gz")}


def listing(fmt: str, path: str) -> tuple[object, list[tuple[str, int, int]]] | None:
    """The table's filesystem and its files (path, size, mtime in ns), sorted; None when
    there are more than MAX_FILES or none."""
    import pyarrow.fs as pafs

    fs, root = object_store.filesystem(os.path.abspath(path) if "://" not in path else path)
    info = fs.get_file_info(root)
    if info.type == pafs.FileType.File:
        infos = [info]
    elif info.type == pafs.FileType.Directory:
        infos = [
            i
            for i in fs.get_file_info(pafs.FileSelector(root, recursive=True))
            if i.type == pafs.FileType.File
            and i.base_name.endswith(EXTENSIONS[fmt])
            and not i.base_name.startswith((".", "_"))
        ]
    else:
        return None
    if not infos or len(infos) > MAX_FILES:
        return None
    return fs, sorted((i.path, int(i.size or 0), int(i.mtime_ns or 0)) for i in infos)


def read_files(fs, files: list[tuple[str, int, int]], fmt: str):
    """The files' rows as one Arrow table."""
    import pyarrow as pa

    tables = []
    for path, _, _ in files:
        with fs.open_input_file(path) as f:
            data = io.BytesIO(f.read())
        if fmt == "csv":
            import pyarrow.csv as pcsv

            tables.append(pcsv.read_csv(data))
        elif fmt == "parquet":
            import pyarrow.parquet as pq

            tables.append(pq.read_table(data))
        else:
            import pyarrow.json as pjson

            tables.append(pjson.read_json(data))
    return pa.concat_tables(tables, promote_options="default")


def ipc_bytes(table) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def table_of(payload: bytes):
    import pyarrow as pa

    return pa.ipc.open_stream(payload).read_all()


def cached_arrow(fmt: str, path: str, cache: DataCache | None):
    """The table as Arrow through ``cache``; None: not cacheable, read it with Ray Data."""
    if cache is None:
        return None
    listed = listing(fmt, path)
    if listed is None:
        return None
    fs, files = listed
    total = sum(size for _, size, _ in files)
    if total > cache.max_bytes:
        return None
    key = cache_key(kind="table", version=FORMAT_VERSION, format=fmt, store=fs.type_name, files=files)
    return cached(cache, key, lambda: (read_files(fs, files, fmt), total), ipc_bytes, table_of)


def cached_table(fmt: str, path: str, cache: DataCache | None):
    """The table as a Ray Dataset through ``cache``; None: read it with Ray Data as before."""
    table = cached_arrow(fmt, path, cache)
    if table is None:
        return None
    import ray.data

    return ray.data.from_arrow(table)
