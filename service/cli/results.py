"""What a job produced: its checkpoints, and a search's trials, lineage and best trial."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
import yaml
from rich import box
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from api.errors import RaydockError
from api.schemas import BestTrialPublic, CheckpointPublic, TrialPublic
from service.cli.common import DEFAULT_URL, TokenOpt, UrlOpt, client_for, console, fail
from service.cli.format import cut, num, values, when, widest
from service.stored.specs import stored_search

WIDE = 120  # from this width on, tables add the columns an 80-column terminal has no room for
TRIAL_STYLE = {"RUNNING": "cyan", "TERMINATED": "green", "ERROR": "red", "CANCELLED": "yellow"}


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
        job = client.job(job_id)
        if download is not None:
            console.print(str(job.download_checkpoint(download, dest)))
            return
        found = job.checkpoints()
    if as_json:
        console.print_json(json.dumps([c.model_dump(mode="json") for c in found]))
        return
    if not found:
        console.print(f"{job_id} has no checkpoints (yet)")
        return
    console.print(checkpoints_table(found, console.width))


def tensorboard(
    job_id: str,
    dest: Annotated[Path, typer.Option(help="Where to unpack the event files.")] = Path("."),
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Download a job's TensorBoard event files (spec tracking.tensorboard) for tensorboard --logdir."""
    with client_for(url, token) as client:
        where = client.job(job_id).download_tensorboard(dest)
    console.print(f"{where}\nView with: tensorboard --logdir {where}")


def checkpoints_table(found: list[CheckpointPublic], width: int) -> Table:
    """Id, epoch, step and time whole; the metrics (and on a wide terminal the path) cut."""
    now = datetime.now(timezone.utc)
    rows = [
        [
            str(c.id),
            num(c.epoch),
            num(c.step),
            when(c.created_at, now),
            ", ".join(f"{k}={num(v)}" for k, v in c.metrics.items() if k not in ("epoch", "step")),
            c.path,
        ]
        for c in found
    ]
    wide = width >= WIDE
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, show_edge=False)
    for i, header in enumerate(("ID", "EPOCH", "STEP", "CREATED")):
        table.add_column(header, no_wrap=True, justify="right", min_width=widest(header, [r[i] for r in rows]))
    table.add_column("METRICS")
    if wide:
        table.add_column("PATH")
    for r in rows:
        table.add_row(*r[:4], *(cut(v) for v in (r[4:] if wide else r[4:5])))
    return table


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
    """A search's trials, the best one marked, and its PBT lineage; --replay: the best as a spec.

    The lineage says who cloned whom, and when.
    --replay prints the best trial as a training spec: `raydock trials ID --replay > spec.yaml`."""
    with client_for(url, token) as client:
        if replay:
            spec = client.request("GET", f"/v1/jobs/{job_id}/best/replay").json()
            print(yaml.safe_dump(spec, sort_keys=False), end="")
            return
        job = client.job(job_id)
        if job.info.kind != "tune":
            fail(f"{job_id} is a {job.info.kind} job, not a search: `raydock status {job_id}` shows it")
        found, lineage = job.trials(), job.lineage()
        try:
            best = job.best()
        except RaydockError as exc:
            if exc.code != "no_reports":
                raise
            best = None
    if as_json:
        out = {"trials": found, "lineage": lineage, "best": best}
        console.print_json(json.dumps({k: _jsonable(v) for k, v in out.items()}))
        return
    search = stored_search(job.info.spec)
    unit, metric = search.unit, search.metric
    if not found:
        console.print(f"{job_id} has no trials yet ({job.info.status.value})")
        return
    mark = "★" if (console.encoding or "").lower().startswith("utf") else "*"
    console.print(trials_table(found, best, unit, metric, mark, console.width))
    if (phases := phases_table(found)) is not None:
        console.print()
        console.print(phases)
        console.print()
    for e in lineage:
        console.print(
            escape(
                f"{unit} {num(e.donor_time)}: {e.trial_id} cloned {e.donor_trial_id} ({metric} {num(e.donor_metric)}), "
                f"goes on with {_short_values(e.new_config)}"
            ),
            highlight=False,
        )
    if best is not None:
        where = f", checkpoint {best.checkpoint.id}" if best.checkpoint and best.checkpoint.id is not None else ""
        label = "best" if best.final else "best so far"
        console.print(
            escape(f"{mark} {label}: {best.trial_id} {metric}={num(best.value)} with {values(best.config)}{where}"),
            highlight=False,
        )


def trials_table(
    found: list[TrialPublic], best: BestTrialPublic | None, unit: str, metric: str, mark: str, width: int
) -> Table:
    """One row per trial: its searched values one column each, the best trial marked."""
    wide = width >= WIDE
    fields = list(dict.fromkeys(k for t in found for k in t.config))
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, show_edge=False)
    table.add_column("", no_wrap=True, width=1)
    table.add_column("TRIAL", no_wrap=True, min_width=widest("TRIAL", [t.trial_id for t in found]))
    table.add_column("STATUS", no_wrap=True, min_width=widest("STATUS", [t.status for t in found]))
    for name in _short_names(fields):
        table.add_column(name, justify="right")
    table.add_column(unit.upper(), no_wrap=True, justify="right", min_width=len(unit))
    if wide:
        table.add_column(f"LAST {metric}", no_wrap=True, justify="right")
    table.add_column(f"BEST {metric}", no_wrap=True, justify="right", min_width=6)
    table.add_column("NOTE", min_width=4)
    best_id = best.trial_id if best else None
    for t in found:
        last = t.last_metrics or {}
        cells: list[Any] = [
            Text(mark if t.trial_id == best_id else "", style="bold yellow"),
            Text(t.trial_id),
            Text(t.status, style=TRIAL_STYLE.get(t.status, "")),
            *(cut(num(t.config.get(f))) for f in fields),
            Text(num(last.get(unit))),
        ]
        if wide:
            cells.append(Text(num(last.get(metric))))
        cells += [Text(num(t.best_metric)), cut(_note(t), style="dim")]
        table.add_row(*cells, style="bold" if t.trial_id == best_id else None)
    return table


PHASE_COLUMNS = ("paused", "placed", "first_step", "first_metric")


def phases_table(found: list[TrialPublic]) -> Table | None:
    """Each trial's start-up in seconds after it was queued, and each restart after a PBT
    exploit in seconds after the decision (its new run placed: restored); None before
    any trial was placed."""
    if not any(len(t.start_phases) > 1 for t in found):
        return None
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, show_edge=False, title_justify="left")
    table.title = "start-up, s after queued (after an exploit: after its decision)"
    table.add_column("TRIAL", no_wrap=True)
    table.add_column("FROM", no_wrap=True)
    for name in PHASE_COLUMNS:
        table.add_column(name.replace("_", " ").upper(), no_wrap=True, justify="right")
    for t in found:
        name = cut(trial_name(t.trial_id))
        table.add_row(name, "queued", *(num(t.start_phases.get(k)) for k in PHASE_COLUMNS))
        for n, e in enumerate(t.exploit_phases, 1):
            values = {"paused": e.paused, "placed": e.restored, "first_step": e.first_step}
            values["first_metric"] = e.first_metric
            table.add_row(name, f"exploit {n}", *(num(values[k]) for k in PHASE_COLUMNS))
    return table


def trial_name(trial_id: str) -> str:
    """Tune's ids end in the trial's number (``..._00003``): ``trial 3``."""
    head, _, tail = trial_id.rpartition("_")
    return f"trial {int(tail)}" if head and tail.isdigit() else trial_id


def _short_values(config: dict[str, Any]) -> str:
    return ", ".join(f"{k}={num(v)}" for k, v in zip(_short_names(list(config)), config.values()))


def _short_names(fields: list[str]) -> list[str]:
    """A searched field's column: its last dotted part (``lr``), the whole path where two
    fields share that part."""
    last = [f.rsplit(".", 1)[-1] for f in fields]
    return [short if last.count(short) == 1 else f for f, short in zip(fields, last)]


def _note(t: TrialPublic) -> str:
    parts = []
    if t.error:
        parts.append(t.error.strip().splitlines()[0] if t.error.strip() else "error")
    if t.stopped_early:
        parts.append("stopped early")
    if t.exploits:
        parts.append(f"cloned {t.exploits}x")
    if t.note:
        parts.append(t.note)
    return "; ".join(parts)


def _jsonable(value):
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value.model_dump(mode="json") if hasattr(value, "model_dump") else value
