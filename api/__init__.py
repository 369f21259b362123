"""raydock's HTTP boundary: the contract (``api.schemas``), the errors (``api.errors``),
the Python SDK (``api.client``) and the FastAPI app (``api.app``).

Kept light on purpose: ``from api.client import Client`` needs neither FastAPI nor Ray.
"""
