"""A pipeline's graph, checked at submit before anything is stored: step names unique,
every ``after`` and ``init_from`` naming a step that exists (or a job id), no cycle, the
step count within RAYDOCK_MAX_PIPELINE_STEPS, and every step in the pipeline's project.
Each refusal is a 422 with its own code and says what to change. Returns the steps in an
order where each comes after those it names, so each step's job is stored after theirs."""

from __future__ import annotations

from api.errors import InvalidSpec
from api.schemas.pipelines import PipelineSpec, PipelineStep


def _refuse(message: str, code: str, loc: list) -> InvalidSpec:
    return InvalidSpec(message, code=code, details=[{"loc": loc, "msg": code}])


def refs(step: PipelineStep) -> list[tuple[str, str | None, str | None]]:
    """(where, step name, job id) of every dependency of ``step``, init_from's included."""
    out = [(f"after[{i}]", a.step, a.job) for i, a in enumerate(step.after)]
    if step.init_from is not None:
        out.append(("init_from", step.init_from.step, step.init_from.job))
    return out


def check(spec: PipelineSpec, project: str, max_steps: int) -> list[PipelineStep]:
    """The steps in dependency order, or the first problem as InvalidSpec (422)."""
    if len(spec.steps) > max_steps:
        raise _refuse(
            f"The pipeline has {len(spec.steps)} steps; this server takes at most {max_steps} "
            "(RAYDOCK_MAX_PIPELINE_STEPS). Split it into pipelines that run after each other.",
            "too_many_steps",
            ["steps"],
        )
    by_name: dict[str, int] = {}
    for i, step in enumerate(spec.steps):
        if step.name in by_name:
            raise _refuse(
                f"steps[{i}].name {step.name!r} is also the name of steps[{by_name[step.name]}]; give each step its "
                "own name.",
                "duplicate_step",
                ["steps", i, "name"],
            )
        by_name[step.name] = i
    for i, step in enumerate(spec.steps):
        if step.job.after or step.job.init_from is not None:
            raise _refuse(
                f"steps[{i}] ({step.name}): its job's own `after` / `init_from` must stay empty in a pipeline; "
                "put them on the step (`after: [{step: NAME}]`, `init_from: {step: NAME}`).",
                "dependency_in_step_job",
                ["steps", i, "job", "after"],
            )
        if step.job.project is not None and step.job.project != project:
            raise _refuse(
                f"steps[{i}] ({step.name}) asks for project {step.job.project!r} but the pipeline runs in "
                f"{project!r}: every step runs in the pipeline's project. Remove the step's `project`, or submit "
                "the pipeline to that project.",
                "cross_project_step",
                ["steps", i, "job", "project"],
            )
        for where, name, _ in refs(step):
            if name is not None and name not in by_name:
                raise _refuse(
                    f"steps[{i}] ({step.name}).{where} names step {name!r}, which the pipeline does not have; "
                    f"its steps are {', '.join(sorted(by_name))}.",
                    "unknown_step",
                    ["steps", i, *where.replace("[", ".").replace("]", "").split(".")],
                )
            if name == step.name:
                raise _refuse(
                    f"steps[{i}] ({step.name}).{where} names the step itself; a step cannot run after itself.",
                    "pipeline_cycle",
                    ["steps", i],
                )
    return _ordered(spec.steps, by_name)


def _ordered(steps: list[PipelineStep], by_name: dict[str, int]) -> list[PipelineStep]:
    """Kahn's order over the steps (submitted order among the ready ones); a cycle is refused
    with the steps on it named."""
    needs = {s.name: {n for _, n, _ in refs(s) if n is not None} for s in steps}
    done: list[PipelineStep] = []
    placed: set[str] = set()
    while len(done) < len(steps):
        ready = [s for s in steps if s.name not in placed and needs[s.name] <= placed]
        if not ready:
            cycle = _cycle({n: d - placed for n, d in needs.items() if n not in placed})
            raise _refuse(
                f"The steps {' -> '.join(cycle)} run after each other in a circle, so none could start. Remove one "
                "of these `after` (or `init_from`) links.",
                "pipeline_cycle",
                ["steps", by_name[cycle[0]], "after"],
            )
        for s in ready:
            placed.add(s.name)
            done.append(s)
    return done


def _cycle(needs: dict[str, set[str]]) -> list[str]:
    """One cycle among ``needs`` (every step left waits on another left), as a closed walk."""
    node = next(iter(needs))
    seen: list[str] = []
    while node not in seen:
        seen.append(node)
        node = sorted(needs[node])[0]
    return seen[seen.index(node) :] + [node]
