"""The raydock job service: settings, store, lifecycle, the Ray backend, the job
monitor and the CLI. ``service.ray_backend`` is the only module that talks to Ray."""
