"""Background work as named periodic units (``periodic.Periodic``) and the runner that
starts and stops them (``runner.Runner``). The composition root (service/runtime.py)
builds the units; this room imports nothing else of the server."""
