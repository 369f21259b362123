"""What a job produced: its checkpoints, and a search's trials, lineage and best trial."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
import yaml
from rich.table import Table

from api.errors import RaydockError
from service.cli.common import DEFAULT_URL, TokenOpt, UrlOpt, client_for, console, fail
from service.db.specs import stored_search


def checkpoints(
    job_id: str,
    download: Annotated[Optional[int], typer.Option(help="Download this checkpoint id.")] = None,
    dest: Annotated[Path, typer.Option(help="Where to unpack a download.")] = Path("."),
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """List a job's checkpoints, or download one with --download ID."""
    with client_for(url, token) as client:
        try:
            job = client.job(job_id)
            if download is not None:
                console.print(str(job.download_checkpoint(download, dest)))
                return
            found = job.checkpoints()
            if as_json:
                console.print_json(json.dumps([c.model_dump(mode="json") for c in found]))
                return
            table = Table("ID", "EPOCH", "STEP", "METRICS", "PATH")
            for c in found:
                table.add_row(
                    str(c.id),
                    str(c.epoch),
                    str(c.step),
                    json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in c.metrics.items()}),
                    c.path,
                )
            console.print(table)
        except RaydockError as exc:
            fail(exc.message)


# --- a search's trials (kind: tune jobs)


def trials(
    job_id: str,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    replay: Annotated[
        bool,
        typer.Option("--replay", help="Print the best trial as a kind: train spec (YAML) with its schedule of values."),
    ] = False,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """A search's trials, its PBT lineage (who cloned whom, when) and its best trial;
    with --replay, the best trial as a training spec: `raydock trials ID --replay > spec.yaml`."""
    with client_for(url, token) as client:
        try:
            if replay:
                spec = client.request("GET", f"/v1/jobs/{job_id}/best/replay").json()
                print(yaml.safe_dump(spec, sort_keys=False), end="")
                return
            job = client.job(job_id)
            found, lineage = job.trials(), job.lineage()
            try:
                best = job.best()
            except RaydockError as exc:
                if exc.code != "no_reports":
                    raise
                best = None
        except RaydockError as exc:
            fail(exc.message)
    if as_json:
        out = {"trials": found, "lineage": lineage, "best": best}
        console.print_json(json.dumps({k: _jsonable(v) for k, v in out.items()}))
        return
    search = stored_search(job.info.spec)
    unit, metric = search.unit, search.metric
    table = Table("TRIAL", "STATUS", "VALUES", unit.upper(), f"LAST {metric}", f"BEST {metric}", "EXPLOITS")
    for t in found:
        last = (t.last_metrics or {}).get(metric)
        status = t.status + (" (stopped early)" if t.stopped_early else "")
        table.add_row(
            t.trial_id,
            status,
            _values(t.config),
            str((t.last_metrics or {}).get(unit, "")),
            _num(last),
            _num(t.best_metric),
            str(t.exploits),
        )
    console.print(table)
    for e in lineage:
        console.print(
            f"{unit} {_num(e.donor_time)}: {e.trial_id} cloned {e.donor_trial_id} ({metric} {_num(e.donor_metric)}) "
            f"and goes on with {_values(e.new_config)}"
        )
    if best is not None:
        where = f", checkpoint {best.checkpoint.id}" if best.checkpoint and best.checkpoint.id is not None else ""
        label = "best" if best.final else "best so far"
        console.print(f"{label}: {best.trial_id} {metric}={_num(best.value)} with {_values(best.config)}{where}")


def _values(config: dict) -> str:
    return ", ".join(f"{k}={_num(v)}" for k, v in config.items())


def _num(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else ("" if v is None else str(v))


def _jsonable(value):
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value.model_dump(mode="json") if hasattr(value, "model_dump") else value
