"""raydock's HTTP boundary: the contract (``api.schemas``), the errors (``api.errors``)
and the Python SDK (``api.client``). The server that serves it lives in ``service/http/``.

Kept light on purpose: ``from api.client import Client`` needs neither FastAPI nor Ray.
"""
