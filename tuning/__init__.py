"""What runs on the cluster for a hyperparameter search (``kind: tune`` jobs): the Ray
Tune setup built from a ``TuneSpec`` (``search``), the trial trainable that runs one
distributed ``TorchTrainer`` per trial (``trial``), PBT schedulers that record their
exploits (``schedulers``), the events a search sends the server (``events``), its Ray
job entrypoint (``driver``), and the cluster budget check the server runs at submit
(``budget``). Depends on ``api`` only, and on ``trainers`` for building the trainers.
"""
