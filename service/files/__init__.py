"""Reading what jobs wrote, as the API host: local files opened by directory fd without
following a link a job planted (localfs.py), and a checkpoint streamed as a tar.gz
(archive.py). Imports nothing of service but storage."""
