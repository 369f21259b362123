"""What only the tests use: the session cluster's facts, the user-code spec, the cluster
teardown checks, the architecture checks and a few probes. What the benchmarks drive too
lives in ``bench/harness/``; conftest.py keeps only fixtures and hooks."""
