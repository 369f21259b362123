"""The built-in loops' data, generated or read where the workers run (nothing downloaded).

- ``trainers.data.tabular``: the classifiers' data (digits, synthetic, user tables read
  with Ray Data), each worker on its own shard;
- ``trainers.data.text``: the GPT's character-level corpus from a small English grammar,
  batches chosen by step number;
- ``trainers.data.cache``, ``sources``, ``tables``, ``cache_keeper``: the node's dataset
  cache, which these read through when the server turned it on (``RAYDOCK_DATA_CACHE_BYTES``).
"""
