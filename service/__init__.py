"""The raydock server. The job core sits here, where a newcomer looks first: the composition
root that builds every part and wires them (runtime.py), the job commands (jobs.py) and
reads (job_reads.py), attempts, the monitor, the lifecycle, retention and settings.
Everything else has a room of its own:

- ``cluster/``: the Ray cluster (the only part of the server that imports ``ray``);
- ``db/``: the tables and how they are written and read (imports nothing else of service);
- ``events/``: what running jobs send (metrics, logs, trials, checkpoints), taken in, and
  the pushes service that checks and admits a post of them;
- ``code/``: what a job runs (uploaded packages, the server-path and runtime_env policy);
- ``files/``: what jobs wrote, read by the API host without following a planted link;
- ``http/``: the REST API; ``cli/``: the ``raydock`` command;
- ``dashboard/``, ``eventlog/``, ``tenancy/``: the web UI, the audit log of who did what,
  and users and quotas.

tests/test_architecture.py holds each room's rule."""
