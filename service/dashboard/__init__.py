"""The web dashboard: the single-page app's files (``static/``) and the routes that serve
them (``pages.py``). Served without the API token, so it holds no data: the browser reads
every number from ``/v1`` with the token, and this room imports nothing of the server."""
