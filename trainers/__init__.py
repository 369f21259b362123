"""What runs on the Ray cluster for a training job: the job driver, the per-worker
training loop, built-in models and datasets, and the event protocol back to the server."""

from trainers.own_imports import pin

pin()  # raydock's package names import raydock's packages, whatever the job's directory holds
