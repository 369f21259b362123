"""What the server tells Prometheus: counters and histograms kept in this process
(``instruments``), the lifecycle's moves observed once they commit (``transitions``),
gauges read from the store at scrape time (``collector``), and the API's latency by
route template (``latency``). ``GET /metrics`` (``service/http/routes/prometheus.py``)
serves them in the text format."""
