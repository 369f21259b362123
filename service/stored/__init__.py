"""What the store keeps in a job's JSON columns, read back as typed values: its spec as the
contract's model (``specs.py``) and its start-up phases (``phases.py``). Pure functions
over ``api/``; imports nothing of the service."""
