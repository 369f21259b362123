"""Named datasets for user code, as a Ray Train loop reads them: ``datasets`` maps the
name the loop passes to ``ray.train.get_dataset_shard(NAME)`` to a table (csv, parquet or
json, read with Ray Data on the cluster) or to a share split off another one. Nothing is
assumed about the columns. The datasets named in ``datasets_to_split`` (default
``train``) are split across the workers; the others reach every worker whole (Ray's
``DataConfig``)."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import ConfigDict, Field, StringConstraints

from api.schemas.common import Strict

MAX_DATASETS = 16
DatasetName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")]


class TableSource(Strict):
    format: Literal["csv", "parquet", "json"] = Field(description="How the table is stored (Ray Data's reader).")
    path: str = Field(
        min_length=1,
        max_length=4096,
        pattern=r"^[^\x00-\x1f\x7f]+$",
        description=(
            "File, directory or URI (s3://, gs://, ...) of the table, read by the job on the cluster (never by the "
            "API server): it must be reachable from the cluster's nodes."
        ),
    )
    cache: bool = Field(
        default=True,
        description="Keep the table in the node's data cache for later jobs and trials (when the server's "
        "RAYDOCK_DATA_CACHE_BYTES is set); false: Ray Data reads the source every time.",
    )


class SplitFrom(Strict):
    # "from" is a Python keyword: the field is from_, and reads and writes as "from".
    model_config = ConfigDict(**Strict.model_config, serialize_by_alias=True, validate_by_name=True)

    from_: DatasetName = Field(alias="from", description="The dataset (a table) this share is taken from.")
    fraction: float = Field(gt=0.0, lt=1.0, description="Share of its rows taken (shuffled by the job's seed).")


class SplitSource(Strict):
    split: SplitFrom = Field(description="A share of another dataset's rows, which that dataset then no longer has.")


DatasetSource = Annotated[Union[TableSource, SplitSource], Field(union_mode="left_to_right")]


Datasets = Annotated[dict[DatasetName, DatasetSource], Field(max_length=MAX_DATASETS)]


def dataset_problems(tables: dict[str, TableSource | SplitSource], to_split: list[str] | None) -> list[str]:
    """What makes a ``datasets`` section (and its ``datasets_to_split``) unusable."""
    problems, taken = [], {}
    for name, source in tables.items():
        if isinstance(source, SplitSource):
            origin = source.split.from_
            if not isinstance(tables.get(origin), TableSource):
                problems.append(
                    f"datasets.{name}.split.from: {origin!r} is not a table of this job's datasets "
                    f"(its tables: {sorted(n for n, s in tables.items() if isinstance(s, TableSource))})"
                )
                continue
            taken[origin] = taken.get(origin, 0.0) + source.split.fraction
            if taken[origin] >= 1.0:
                problems.append(f"datasets: the shares split off {origin!r} add up to 1 or more; nothing would be left")
    unknown = [n for n in to_split or [] if n not in tables]
    if unknown:
        problems.append(f"datasets_to_split: {unknown} are not datasets of this job (it has {sorted(tables)})")
    return problems


def splits(tables: dict[str, TableSource | SplitSource]) -> list[tuple[str, str, float]]:
    """(name, taken from, fraction) of each share, in the order given."""
    return [(n, s.split.from_, s.split.fraction) for n, s in tables.items() if isinstance(s, SplitSource)]
