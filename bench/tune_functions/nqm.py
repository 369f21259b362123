"""The noisy quadratic's trial as user code, the working_dir of ``bench.pbt_warm``'s raydock
search (``trainable: function``, entrypoint ``nqm:train``): the very function the
hand-written Tune script searches (``bench.pbt_tasks.nqm_function``)."""

from bench.pbt_tasks import nqm_function as train

__all__ = ["train"]
