"""What running jobs send, taken in and read back: the typed events of both channels
(ingest.py, each stored by its type's writer in writers/), their per-job bounds
(limits.py), the push channel's service (push.py: a post's check, gate and batches), logs
and log tails, metric rollups, and the reads (reads/: a search's trials and replay, metric
series, worker groups). The writers and the reads never import each other. Never imports
the job core (jobs, attempts, monitor)."""
