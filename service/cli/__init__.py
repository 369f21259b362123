"""The ``raydock`` command: ``serve`` runs the server; every other command is a thin
layer over the SDK (``api.client``)."""

from service.cli.main import app
