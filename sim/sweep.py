"""Run independent cells on Dask distributed, with a progress bar.

By default a ``LocalCluster`` of one single-threaded worker process per core (the
simulator is pure Python: threads would only contend for the GIL), dashboard off;
with ``scheduler`` set, any running Dask scheduler (``dask scheduler``, dask-jobqueue,
a Kubernetes cluster), whose workers must have Bursar installed. Each cell is one
future; results come back in completion order and are returned in cell order.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bursar.broker.errors import require

__all__ = ["SweepError", "cores", "run_cells"]


class SweepError(RuntimeError):
    """A cell failed, or the scheduler could not be reached; says which and what to do."""


def cores() -> int:
    """CPU cores this process may use (the affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _label(cell: dict[str, Any]) -> str:
    params = " ".join(f"{k}={v}" for k, v in cell.get("params", {}).items())
    return f"{cell.get('sweep')} seed={cell.get('seed')} {params}"


def run_cells(
    fn: Callable[[dict[str, Any]], dict[str, Any]],
    cells: Sequence[dict[str, Any]],
    *,
    scheduler: str | None = None,
    workers: int | None = None,
    console: Console | None = None,
    description: str = "cells",
) -> list[dict[str, Any]]:
    """``[fn(c) for c in cells]``, computed on Dask."""
    console = console or Console(stderr=True)
    # distributed logs every worker's start and stop at INFO; quiet unless it matters.
    log = logging.getLogger("distributed")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        return _run(fn, cells, scheduler, workers, console, description)
    finally:
        log.setLevel(level)


def _run(
    fn: Callable[[dict[str, Any]], dict[str, Any]],
    cells: Sequence[dict[str, Any]],
    scheduler: str | None,
    workers: int | None,
    console: Console,
    description: str,
) -> list[dict[str, Any]]:
    require("dask.distributed", extra="dask", feature="the simulator's parallel sweeps (on Dask)")
    from dask.distributed import Client, LocalCluster, as_completed

    cluster = None
    try:
        if scheduler:
            try:
                client = Client(scheduler, timeout="15s")
            except (OSError, TimeoutError) as exc:
                raise SweepError(
                    f"cannot reach the Dask scheduler at {scheduler!r} ({exc}); start one "
                    "(`dask scheduler`, then `dask worker ADDRESS` where Bursar is installed) "
                    "or leave out --scheduler to use a local cluster"
                ) from None
        else:
            cluster = LocalCluster(
                n_workers=workers or cores(),
                threads_per_worker=1,
                processes=True,
                # The scheduler's HTTP server (health, metrics) on a free port: other
                # clusters may run on this machine.
                dashboard_address=":0",
                silence_logs=logging.ERROR,
            )
            client = Client(cluster)
    except BaseException:
        if cluster is not None:
            cluster.close()
        raise
    results: list[dict[str, Any] | None] = [None] * len(cells)
    try:
        futures = [client.submit(fn, cell, pure=False) for cell in cells]
        index = {f.key: i for i, f in enumerate(futures)}
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[last]}"),
            console=console,
            transient=True,
        ) as progress:
            task = progress.add_task(description, total=len(cells), last="")
            for fut in as_completed(futures):
                i = index[fut.key]
                try:
                    results[i] = fut.result()
                except Exception as exc:
                    raise SweepError(
                        f"cell {_label(cells[i])} failed: {type(exc).__name__}: {exc}"
                    ) from exc
                progress.update(task, advance=1, last=_label(cells[i]))
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    return [r for r in results if r is not None]
