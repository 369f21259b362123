"""The one checkpoint format of raydock's training loops, and its save/restore pair.

Every built-in loop (the classifiers under ddp, fsdp, parameter_server, any precision;
the GPT under every strategy) and every search trial reads and writes this format.
One checkpoint is one directory:

    shards/      every worker's model + optimizer state, written with
                 torch.distributed.checkpoint (DCP): each worker writes what it holds
                 (an FSDP shard, a tensor-parallel slice, a pipeline stage; replicated
                 tensors once), under the plain model's parameter names, plus one
                 ``.metadata`` file. Flattened optimizer state (``state.<param>.exp_avg``,
                 ``param_groups.<param>.lr``), the optimizer ``step`` count and, under
                 fp16, the loss scaler. DCP reshards on load, so a checkpoint restores
                 under another worker count (an elastic resize) or strategy.
    model.pt     the consolidated weights (``torch.save`` of a plain ``state_dict``),
                 written by global rank 0: ``build_model(...)`` / ``build_gpt(...)``
                 then ``model.load_state_dict(torch.load("model.pt"))``.
    state.json   written by global rank 0 (see :func:`describe`): ``format`` (1),
                 ``step`` (optimizer steps done), ``epoch`` (epochs done), ``world_size``,
                 ``strategy``, ``precision``, ``hyperparameters`` (optimizer settings and
                 batch size the state was trained with), ``spec`` (the whole job spec),
                 and what a model needs to be rebuilt (``n_features``, ``n_classes`` for
                 the classifiers).

:func:`save` and :func:`restore` are collectives: every worker calls them with its own
directory (Ray Train merges the workers' directories into one checkpoint, so file names
are unique per worker). Restoring brings back optimizer hyperparameters too; a loop that
must keep its own (a PBT clone with a perturbed lr) re-applies them afterwards, see
``trainers.skeleton.resume``. The built-in loops write it through
``trainers.checkpoint_writer`` (a CPU snapshot, then an upload sealed by a
``manifest.json`` of every file's size, written last); :func:`restore` refuses a folder
whose manifest does not hold. Nothing here imports Ray: the format works in any
``torch.distributed`` program.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from api import checkpoint_manifest

if TYPE_CHECKING:  # the parallel package imports nothing from here; keep it one-way at runtime too
    from api.schemas import TrainSpec
    from trainers.parallel.base import ParallelModel

FORMAT = 1
SHARDS_DIR = "shards"
WEIGHTS_FILE = "model.pt"
META_FILE = "state.json"

PathLike = str | os.PathLike


def save(directory: PathLike, pm: ParallelModel, meta: dict[str, Any]) -> None:
    """Write ``pm``'s checkpoint under ``directory``: shards from every worker, weights
    and ``meta`` (see :func:`describe`) from global rank 0. A collective."""
    save_shards(pm, os.path.join(directory, SHARDS_DIR))
    weights = pm.full_model_state_dict()  # a collective; the weights land on rank 0
    if _global_rank() == 0:
        torch.save(weights, os.path.join(directory, WEIGHTS_FILE))
        with open(os.path.join(directory, META_FILE), "w") as f:
            json.dump({"format": FORMAT, **meta}, f)


def restore(directory: PathLike, pm: ParallelModel) -> dict[str, Any]:
    """Load :func:`save`'s directory into ``pm`` in place; return its meta. A collective.
    A half-written checkpoint (``api.checkpoint_manifest``) is refused before anything loads."""
    check_complete(directory)
    meta = read_meta(directory)
    if meta.get("format") != FORMAT:
        raise ValueError(
            f"checkpoint {os.fspath(directory)} has format {meta.get('format')!r}, this raydock reads "
            f"format {FORMAT}; resume it with the raydock version that wrote it, or start a new job"
        )
    load_shards(pm, os.path.join(directory, SHARDS_DIR))
    return meta


def describe(spec: TrainSpec, pm: ParallelModel, *, epoch: int, **extra: Any) -> dict[str, Any]:
    """The ``state.json`` of a checkpoint taken now."""
    return {
        "step": pm.step,
        "epoch": epoch,
        "world_size": dist.get_world_size() if dist.is_initialized() else 1,
        "strategy": spec.parallelism.strategy,
        "precision": spec.parallelism.precision,
        "hyperparameters": {"optimizer": spec.optimizer.model_dump(mode="json"), "batch_size": spec.batch_size},
        "spec": spec.model_dump(mode="json"),
        **extra,
    }


def check_complete(directory: PathLike) -> None:
    """Raise ``ValueError`` unless ``directory`` holds a complete checkpoint: its manifest's
    files at their sizes (or, written before manifests, its ``state.json``)."""
    root = os.fspath(directory)
    listing: dict[str, int] = {}
    for parent, _, names in os.walk(root):
        for name in names:
            path = os.path.join(parent, name)
            listing[os.path.relpath(path, root).replace(os.sep, "/")] = os.path.getsize(path)
    manifest = None
    if checkpoint_manifest.MANIFEST_FILE in listing:
        with open(os.path.join(root, checkpoint_manifest.MANIFEST_FILE), "rb") as f:
            manifest = f.read(checkpoint_manifest.MAX_MANIFEST_BYTES + 1)
    if not checkpoint_manifest.complete(listing, manifest):
        raise ValueError(
            f"checkpoint {root} is not complete (its upload never finished: no manifest, or not the files "
            "it names); resume from an earlier checkpoint of the run"
        )


def read_meta(directory: PathLike) -> dict[str, Any]:
    with open(os.path.join(directory, META_FILE)) as f:
        return json.load(f)


def load_weights(directory: PathLike) -> dict[str, torch.Tensor]:
    """The consolidated weights, on CPU, for ``model.load_state_dict`` of a fresh model."""
    return torch.load(os.path.join(directory, WEIGHTS_FILE), map_location="cpu")


def save_shards(pm: ParallelModel, path: PathLike) -> None:
    """Write every worker's model, optimizer and step under ``path`` (DCP). A collective."""
    dcp.save(pm.state_dict(), checkpoint_id=os.fspath(path))


def load_shards(pm: ParallelModel, path: PathLike) -> None:
    """Restore ``pm`` in place from :func:`save_shards`'s directory. A collective."""
    # DCP loads into the tensors of a state dict of the right layout, so ask the model
    # for one (this also materialises the optimizer's state to receive the values).
    sd = pm.state_dict()
    dcp.load(sd, checkpoint_id=os.fspath(path))
    pm.load_state_dict(sd)


def _global_rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0
