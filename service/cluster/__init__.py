"""The Ray cluster: submitting, stopping and listing Ray jobs (ray_backend.py), what the
autoscaler can add (autoscaler.py) and the local head the server starts (local_cluster.py).
The only part of the server that imports ``ray``."""
