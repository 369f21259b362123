"""How each event type is stored: one writer per type (``job_events.py``: the events
every job sends; ``search_events.py``: a search's), each checking its event before its
first write and raising ``Dropped`` (or a validation error) for one it refuses, and the
``Batch`` the writers of one transaction share (``batch.py``). Ingestion
(``service/events/ingest.py``) holds the table of writers by event type. The writers
never import the reads (``service/events/reads/``)."""
