"""The parallelism section of a job spec: what it accepts and how it explains refusals."""

import pytest
from pydantic import ValidationError

from api.schemas import MeshShape, ParallelismSpec, resolve_mesh, validate_parallelism


def check(par, *, num_workers=2, use_gpu=False, n_layers=2, n_heads=2, user_code=False):
    return validate_parallelism(
        par, num_workers=num_workers, use_gpu=use_gpu, n_layers=n_layers, n_heads=n_heads, user_code=user_code
    )


def paths(errors):
    return [path for path, _ in errors]


@pytest.mark.parametrize(
    "par",
    [
        ParallelismSpec(),
        ParallelismSpec(strategy="fsdp", grad_accumulation_steps=4, precision="bf16"),
        ParallelismSpec(strategy="ddp", grad_compression="powersgd"),
        ParallelismSpec(strategy="tensor", tensor_degree=2),
        ParallelismSpec(strategy="pipeline", pipeline={"stages": 2, "microbatches": 2}),
        ParallelismSpec(strategy="hybrid", mesh={"data": 1, "tensor": 2}),
    ],
)
def test_valid_specs_have_no_errors(par):
    assert check(par) == []


def test_unknown_fields_and_values_are_refused():
    with pytest.raises(ValidationError) as e:
        ParallelismSpec.model_validate({"strategy": "ddp", "microbatch": 4})
    assert e.value.errors()[0]["loc"] == ("microbatch",)
    with pytest.raises(ValidationError) as e:
        ParallelismSpec.model_validate({"strategy": "zero3"})
    assert e.value.errors()[0]["loc"] == ("strategy",)
    with pytest.raises(ValidationError) as e:
        ParallelismSpec.model_validate({"grad_accumulation_steps": 0})
    assert e.value.errors()[0]["loc"] == ("grad_accumulation_steps",)


def test_every_field_is_described():
    for model in (ParallelismSpec, MeshShape):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name}"


def test_more_stages_than_layers():
    errors = check(ParallelismSpec(strategy="pipeline", pipeline={"stages": 4, "microbatches": 4}), num_workers=4)
    assert errors == [
        (
            "parallelism.pipeline.stages",
            "4 pipeline stages but the model has 2 layers; every stage needs at least one "
            "layer. Use fewer stages or a deeper model.",
        )
    ]


def test_tensor_degree_must_divide_heads():
    errors = check(ParallelismSpec(strategy="tensor", tensor_degree=2), n_heads=3)
    assert paths(errors) == ["parallelism.tensor_degree"]
    assert "3 heads do not divide by 2" in errors[0][1]


def test_hybrid_mesh_must_cover_the_workers():
    errors = check(ParallelismSpec(strategy="hybrid", mesh={"data": 2, "tensor": 2}), num_workers=2)
    assert errors == [
        (
            "parallelism.mesh",
            "mesh data x pipeline x tensor = 2 x 1 x 2 = 4 workers, but the job has 2. "
            "Change the mesh or the number of workers so they match.",
        )
    ]
    assert paths(check(ParallelismSpec(strategy="hybrid"))) == ["parallelism.mesh"]


def test_fp16_needs_a_gpu_and_ddp():
    errors = check(ParallelismSpec(precision="fp16"), use_gpu=False)
    assert paths(errors) == ["parallelism.precision"]
    assert "Use bf16 on CPU" in errors[0][1]
    assert check(ParallelismSpec(precision="fp16"), use_gpu=True) == []
    assert paths(check(ParallelismSpec(strategy="fsdp", precision="fp16"), use_gpu=True)) == ["parallelism.precision"]


def test_user_code_jobs_cannot_use_model_parallel_strategies():
    for strategy, extra in [("tensor", {}), ("pipeline", {}), ("hybrid", {"mesh": {"data": 2}})]:
        errors = check(ParallelismSpec(strategy=strategy, **extra), user_code=True, n_layers=None, n_heads=None)
        assert paths(errors) == ["parallelism.strategy"], strategy
        assert "Use ddp, or fsdp" in errors[0][1]
    # sharding needs no knowledge of the model's structure
    assert check(ParallelismSpec(strategy="fsdp"), user_code=True, n_layers=None, n_heads=None) == []


def test_all_problems_are_reported_at_once():
    par = ParallelismSpec(
        strategy="pipeline",
        pipeline={"stages": 2, "microbatches": 1, "schedule": "1f1b"},
        grad_accumulation_steps=2,
        grad_compression="bf16",
        precision="fp16",
    )
    assert paths(check(par)) == [
        "parallelism.pipeline.microbatches",
        "parallelism.grad_accumulation_steps",
        "parallelism.precision",
        "parallelism.precision",
        "parallelism.grad_compression",
    ]


def test_options_for_another_strategy_are_refused():
    errors = check(ParallelismSpec(strategy="ddp", tensor_degree=2, pipeline={"microbatches": 8}))
    assert paths(errors) == ["parallelism.tensor_degree", "parallelism.pipeline"]


def test_parameter_server_runs_the_builtin_classifiers_only():
    par = ParallelismSpec(strategy="parameter_server", parameter_server={"mode": "sync", "staleness": 2})
    gpt = check(par)
    user = check(par, n_layers=None, n_heads=None, user_code=True)
    classifier = check(par, n_layers=None, n_heads=None)
    assert paths(gpt) == ["parallelism.strategy", "parallelism.parameter_server.staleness"]
    assert "model.type gpt" in gpt[0][1]
    assert paths(user) == ["parallelism.strategy", "parallelism.parameter_server.staleness"]
    assert "user code" in user[0][1]
    assert paths(classifier) == ["parallelism.parameter_server.staleness"]


@pytest.mark.parametrize(
    ("par", "workers", "shape"),
    [
        (ParallelismSpec(strategy="ddp"), 4, (4, 1, 1)),
        (ParallelismSpec(strategy="fsdp"), 2, (2, 1, 1)),
        (ParallelismSpec(strategy="tensor"), 2, (1, 1, 2)),
        (ParallelismSpec(strategy="tensor", tensor_degree=2), 4, (2, 1, 2)),
        (ParallelismSpec(strategy="pipeline", pipeline={"stages": 2}), 4, (2, 2, 1)),
        (ParallelismSpec(strategy="hybrid", mesh={"data": 2, "pipeline": 2}), 4, (2, 2, 1)),
    ],
)
def test_resolve_mesh(par, workers, shape):
    assert check(par, num_workers=workers) == []
    mesh = resolve_mesh(par, workers)
    assert (mesh.data, mesh.pipeline, mesh.tensor) == shape


def test_spec_module_does_not_import_torch():
    import subprocess
    import sys
    from pathlib import Path

    code = "import sys, api.schemas, api.client; print(sorted(m for m in ('torch', 'ray', 'fastapi', 'sqlalchemy') if m in sys.modules))"
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.strip() == "[]"
