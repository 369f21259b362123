"""The store: the job tables (models.py) and the tables its events fill
(event_models.py), the engine and migrations (engine.py), SQLite's one-writer
discipline (sqlite_writes.py), job records (job_records.py), listing pages (listing.py) and chunked deletes (purge.py).
Imports nothing else of the service."""
