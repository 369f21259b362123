"""Jobs that run after others, and pipelines of them: the dependencies a job waits for
(``dependencies``), a pipeline's graph checked at submit (``graph``), its commands
(``commands``), the monitor's step that queues or stops waiting jobs (``release``) and the
checkpoint a job starts from (``outputs``)."""
