"""raydock's HTTP server: ``create_app`` (app.py), the one way routes reach the service
(deps.py), the request guard (guards.py), what OpenAPI says beyond the types
(openapi.py), and one route module per resource (routes/)."""
