"""Experiment-tracking export: a job whose spec asks for ``tracking`` has its stored
reports written to TensorBoard event files in its storage prefix and/or to an MLflow run,
by a background exporter (``exporter``) that reads them by cursor, off the ingest path."""
