"""Identity and tenancy: users and their API tokens (``users.py``, hashed by
``tokens.py``), projects and the role of each member (``projects.py``), who a request
is (``caller.py``: a ``Caller`` with its roles, and the lookup of a token), and the first
start's admin (``bootstrap.py``). The HTTP side (the guard that authenticates, the
dependencies that check a job's project) lives in ``service/http/``.
Imports only the store, the settings, the event log (every change is audited) and fair
share's terms (``service.scheduling.fair_share``: quotas and usage are counted in them)."""
