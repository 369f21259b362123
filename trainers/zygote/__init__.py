"""Warm starts: a long-lived process per node that has imported torch, ray.train and
raydock's drivers, and forks a fresh child to be each job's driver.

- ``client``: the Ray job's entrypoint (``python -m trainers.zygote.client train|tune``),
  standard library only; it hands its stdio, cwd and environment to the node's warm
  process, or runs the cold driver when there is none.
- ``server``: the warm process; ``child``: what a forked child does to become the driver
  exactly as ``python -m <driver>`` would have started.
- ``supervisor``: the detached Ray actor per node that keeps the warm process alive and
  lets it go when idle; ``protocol``: the socket's messages and where the socket lives.
"""
