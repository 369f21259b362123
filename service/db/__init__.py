"""The store: every table (models.py), the engine and migrations (engine.py), SQLite's
one-writer discipline (sqlite_writes.py), reading and writing job records
(job_records.py), listing pages (listing.py) and chunked deletes (purge.py). Imports
nothing else of the service."""
