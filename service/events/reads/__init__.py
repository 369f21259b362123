"""What the events of jobs stored, read back: a search's trials, lineage and best trial
(``trials.py``), its best trial replayed as a training job (``replay.py``), metric series
(``series.py``) and worker groups (``worker_groups.py``). The reads change nothing and
never import the writers (``service/events/writers/``) nor ingestion."""
