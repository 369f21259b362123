"""The raydock job service. The job core sits here, where a newcomer looks first: settings,
the job service (jobs.py), attempts, the monitor, the lifecycle, the queue and admission,
retention, storage and the runtime that wires them. Everything else has a room of its own:

- ``cluster/``: the Ray cluster (the only part of the server that imports ``ray``);
- ``db/``: the tables and how they are written and read (imports nothing else of service);
- ``events/``: what running jobs send (metrics, logs, trials, checkpoints), taken in;
- ``code/``: what a job runs (uploaded packages, the server-path and runtime_env policy);
- ``files/``: what jobs wrote, read by the API host without following a planted link;
- ``http/``: the REST API; ``cli/``: the ``raydock`` command;
- ``dashboard/``, ``eventlog/``, ``tenancy/``: the web UI, the audit log of who did what,
  and users and quotas.

tests/test_architecture.py holds each room's rule."""
