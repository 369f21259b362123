"""The worker mesh a parallelism strategy runs on: ``data x pipeline x tensor``.

One piece of arithmetic (:func:`mesh_problems`) works out the mesh a strategy implies
on a number of workers and says why it cannot be built; :func:`resolve_mesh` (the
trainers, the batch checks) and ``validate_parallelism`` (the submit) both use it.
"""

from __future__ import annotations

from api.schemas.parallelism import MeshShape, ParallelismSpec


def resolve_mesh(par: ParallelismSpec, num_workers: int) -> MeshShape:
    """The ``data x pipeline x tensor`` mesh a strategy runs on with ``num_workers``.

    Assumes ``validate_parallelism`` found no errors; raises ``ValueError`` (saying
    why) when the strategy's mesh does not fit ``num_workers``.
    """
    shape, problems = mesh_problems(par, num_workers)
    if shape is None:
        raise ValueError("; ".join(f"parallelism.{path}: {message}" for path, message in problems))
    return shape


def mesh_problems(par: ParallelismSpec, num_workers: int) -> tuple[MeshShape | None, list[tuple[str, str]]]:
    """The mesh the strategy implies on ``num_workers``, or None with every reason it
    cannot be built, as ``(path within parallelism, message)``."""
    strategy = par.strategy
    if strategy == "tensor":
        degree = par.tensor_degree or num_workers
        if num_workers % degree:
            return None, [
                (
                    "tensor_degree",
                    f"tensor_degree {degree} does not divide the {num_workers} workers; the "
                    "workers left over would have no tensor group. Pick a divisor of the "
                    "worker count.",
                )
            ]
        return MeshShape(data=num_workers // degree, tensor=degree), []
    if strategy == "pipeline":
        stages = par.pipeline.stages or num_workers
        if num_workers % stages:
            return None, [
                (
                    "pipeline.stages",
                    f"{stages} stages do not divide the {num_workers} workers; each data "
                    "replica needs a full pipeline. Pick a divisor of the worker count.",
                )
            ]
        return MeshShape(data=num_workers // stages, pipeline=stages), []
    if strategy != "hybrid":
        return MeshShape(data=num_workers), []
    return _hybrid(par, num_workers)


def _hybrid(par: ParallelismSpec, num_workers: int) -> tuple[MeshShape | None, list[tuple[str, str]]]:
    mesh = par.mesh
    if mesh is None:
        return None, [("mesh", "strategy hybrid needs a mesh, e.g. mesh: {data: 2, tensor: 2}.")]
    problems: list[tuple[str, str]] = []
    if mesh.size != num_workers:
        problems.append(
            (
                "mesh",
                f"mesh data x pipeline x tensor = {mesh.data} x {mesh.pipeline} x "
                f"{mesh.tensor} = {mesh.size} workers, but the job has {num_workers}. "
                "Change the mesh or the number of workers so they match.",
            )
        )
    if mesh.pipeline > 1 and mesh.tensor > 1:
        problems.append(
            (
                "mesh",
                "pipeline and tensor parallelism together (3-D) are not supported; set mesh.pipeline or mesh.tensor to 1.",
            )
        )
    stages = par.pipeline.stages
    if stages is not None and stages != mesh.pipeline:
        problems.append(
            (
                "pipeline.stages",
                f"pipeline.stages ({stages}) must equal mesh.pipeline ({mesh.pipeline}) or be left out.",
            )
        )
    if par.tensor_degree is not None and par.tensor_degree != mesh.tensor:
        problems.append(
            (
                "tensor_degree",
                f"tensor_degree ({par.tensor_degree}) must equal mesh.tensor ({mesh.tensor}) or be left out.",
            )
        )
    return (None, problems) if problems else (mesh, [])
