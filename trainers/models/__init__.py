"""Built-in models, each beside what parallelism needs to know about it.

- ``trainers.models.classifiers``: the mlp and cnn classifiers (``build_model``, also
  importable from here, where it has always been);
- ``trainers.models.gpt``: the GPT, with its tensor and pipeline plans
  (``trainers.models.gpt.parallelize``), as torchtitan keeps ``parallelize_llama`` with
  Llama. ``trainers.parallel`` stays model-agnostic: it applies a plan, it never names
  a model.
"""

from trainers.models.classifiers import CNN, MLP, build_model

__all__ = ["CNN", "MLP", "build_model"]
