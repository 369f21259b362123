"""What running jobs send, taken in: the typed events of both channels (ingest.py), their
per-job bounds (limits.py), the push channel's service (pushes.py: a post's check, gate and
batches, over push.py's gate and checks), logs and log tails, metric series and their
rollups, a search's trials, worker groups and replay. Never imports the job core (jobs,
attempts, monitor)."""
