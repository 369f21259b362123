"""The raydock contract: pydantic models shared by the server, the SDK and the CLI, one
module per subject. Import names from here (``from api.schemas import TrainSpec``).

This package imports nothing heavy (no torch, no ray, no fastapi, no sqlalchemy).
"""

from api.schemas.cluster import (
    AutoscalerPublic,
    ClusterInfo,
    DataCachePublic,
    HealthPublic,
    LeasePublic,
    NodeInfo,
    NodeTypeCapacity,
    ReplicaPublic,
    ReplicasPublic,
    WarmProcessPublic,
    WorkerGroupPublic,
    WorkerPlacement,
)
from api.schemas.code import CODE_REF_PREFIX, CODE_REF_RE, SHA256_RE, CodeLimits, CodePackagePublic
from api.schemas.common import (
    ENTRYPOINT_RE,
    INT64_MAX,
    LABEL_KEY_RE,
    MAX_LABELS,
    NAME_RE,
    ErrorBody,
    ErrorResponse,
    FailureCause,
    Int64,
    JobStatus,
    Labels,
    NonNegInt64,
    Strict,
    TrialStatus,
)
from api.schemas.data import DataSpec, DigitsData, SyntheticData, TabularData, TextData
from api.schemas.events import (
    BestTrialEvent,
    CheckpointEvent,
    ErrorEvent,
    Event,
    ExploitEvent,
    JobEvent,
    MetricEvent,
    PhaseEvent,
    ResultEvent,
    StartedEvent,
    TrialEvent,
    TrialMetricEvent,
    WorkerFailureEvent,
    WorkerGroupEvent,
    WorkerNode,
    event_json,
    event_line,
    jsonable,
    parse_event,
)
from api.schemas.job_common import DEFAULT_PROJECT, MAX_DURATION_S, PROJECT_RE, JobCommon, JobName, ProjectName
from api.schemas.job_spec import JOB_KINDS, JobSpec, code_spec, job_kind, job_spec_adapter, parse_job_spec
from api.schemas.jobs import (
    MAX_CANCEL_IDS,
    CancelJobs,
    CancelledJobs,
    CancelRefusal,
    CheckpointPublic,
    JobList,
    JobPublic,
    MetricPoint,
    RestartInfo,
)
from api.schemas.mesh import mesh_problems, resolve_mesh
from api.schemas.models import CNNModel, GPTModel, MLPModel, ModelSpec
from api.schemas.parallelism import (
    CLASSIFIER_ONLY_STRATEGIES,
    MODEL_AWARE_STRATEGIES,
    MeshShape,
    ParallelismSpec,
    ParameterServerOptions,
    PipelineOptions,
)
from api.schemas.parallelism_checks import validate_parallelism
from api.schemas.quotas import JobUsage, QuotaPublic, QuotaSpec, UsagePublic, UsageRow
from api.schemas.scaling import (
    ELASTIC_DEFAULT_MAX_RETRIES,
    ELASTIC_STRATEGIES,
    MAX_WORKERS,
    ScalingSpec,
    WorkerRange,
    coerce_num_workers,
    elastic_problems,
)
from api.schemas.search_options import REPORTS_UNIT, ASHAOptions, PBTOptions, TrialBudget
from api.schemas.search_space import (
    CONTINUOUS,
    Choice,
    Distribution,
    Grid,
    LogUniform,
    Uniform,
    apply_values,
    clip_to_space,
)
from api.schemas.tracking import MlflowTracking, TrackingSpec
from api.schemas.train import CheckpointSpec, FailureSpec, OptimizerSpec, ReportSpec, TrainSpec
from api.schemas.trials import BestTrialPublic, ExploitPublic, TrialCheckpoint, TrialMetricPoint, TrialPublic
from api.schemas.tune import CLASSIFIER_METRICS, FIXED_FIELDS, MAX_TRIALS, TuneSpec

__all__ = [
    name
    for name in dir()
    if not name.startswith("_")
    and name[0].isupper()
    or name
    in {
        "apply_values",
        "clip_to_space",
        "code_spec",
        "coerce_num_workers",
        "elastic_problems",
        "event_json",
        "event_line",
        "job_kind",
        "job_spec_adapter",
        "jsonable",
        "mesh_problems",
        "parse_event",
        "parse_job_spec",
        "resolve_mesh",
        "validate_parallelism",
    }
]
