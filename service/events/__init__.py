"""What running jobs send, taken in: the typed events of both channels (ingest.py), their
per-job bounds (limits.py), the push channel's service (push.py: a post's check, gate and
batches), logs and log tails, metric series and their rollups, a search's trials, worker
groups and replay. Never imports the job core (jobs, attempts, monitor)."""
