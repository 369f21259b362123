"""What runs on the cluster for a hyperparameter search (``kind: tune`` jobs): its Ray
job driver (``search_driver``, ``python -m tuning.search_driver``), the Ray Tune setup
built from a ``TuneSpec`` (``search``), the trial trainable that runs one distributed
``TorchTrainer`` per trial (``trial``), PBT schedulers that record their exploits
(``schedulers``), a PBT population kept in step (``population``), the events a search
sends the server (``search_events``). Depends on ``api``, and on ``trainers`` for the
job's trainer, its failure classification and the events transport; ``trainers``
never imports ``tuning``.
"""

import trainers  # noqa: F401,E402 - first: raydock's package names import raydock's packages (trainers/own_imports.py)
