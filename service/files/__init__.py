"""Job files: the storage path and each job's prefix in it (storage.py), what jobs wrote,
as the API host reads it, and what the server writes beside it: local
files opened by directory fd without following a link a job planted (localfs.py), the
server's own writes and deletes under the storage path done the same way (nofollow.py),
and a checkpoint streamed as a tar.gz (archive.py). Imports nothing else of service."""
