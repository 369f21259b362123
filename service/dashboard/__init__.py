"""The web dashboard: pages and the static files they load, served by ``service.http``.
Reads jobs only through the job service, as the REST routes do."""
