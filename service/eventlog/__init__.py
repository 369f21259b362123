"""The event log: an append-only record of what happened to each job and to the server,
with the actor (a token's owner, or ``system``), and what reads it (notifications,
audits, metrics)."""
