"""What running jobs send, taken in: the typed events of both channels (ingest.py), their
per-job bounds (limits.py) and the push channel's gate (push.py), logs and log tails,
metric series and their rollups, a search's trials, worker groups and replay. Never
imports the job core (jobs, attempts, monitor)."""
