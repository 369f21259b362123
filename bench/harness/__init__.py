"""What the tests and the benchmarks both drive: a real server process (``servers``), real
databases, clusters and webhook receivers, a job store without a server (``jobstore``),
the specs they submit, and the attacks each abuse test shares with its ``bench/abuse_*``
script. It imports nothing from ``tests/`` nor from ``bench/`` outside it (tests/test_architecture.py
holds this), so a benchmark runs without the test suite and a test without the benchmarks."""
