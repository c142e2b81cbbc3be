"""The ``jobqueue.bursar`` dask config section: shipped defaults (``bursar.yaml``, merged
on import, the dask-jobqueue way) and checks that name the key, where its value came
from and what is allowed."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import dask
import dask.config
import yaml

from bursar.providers.elastic import ALLOWED, Elastic

__all__ = [
    "CONFIG_NAME",
    "ConfigError",
    "Elastic",
    "elastic_setting",
    "load_defaults",
    "setting",
    "walltime_s",
]

CONFIG_NAME = "bursar"
DEFAULTS = Path(__file__).with_name("bursar.yaml")


class ConfigError(ValueError):
    """A BursarCluster setting is wrong; the message names the key, its source and what
    is allowed."""


def load_defaults() -> None:
    """Merge the shipped ``bursar.yaml`` under the user's dask config (never over it)."""
    with open(DEFAULTS) as f:
        dask.config.update_defaults(yaml.safe_load(f))


def _nested(d: Any, parts: Iterable[str]) -> bool:
    for p in parts:
        if not isinstance(d, Mapping):
            return False
        hit = [k for k in d if str(k).replace("_", "-") == p]
        if not hit:
            return False
        d = d[hit[0]]
    return True


def source_of(key: str, paths: Iterable[str] | None = None) -> str:
    """Where ``jobqueue.bursar.<key>`` was set: an environment variable, the first dask
    config file that sets it, or the shipped defaults."""
    env = f"DASK_JOBQUEUE__BURSAR__{key.upper().replace('-', '_')}"
    if env in os.environ:
        return f"the environment variable {env}"
    parts = ["jobqueue", CONFIG_NAME, key]
    for base in paths if paths is not None else dask.config.paths:
        p = Path(base)
        files = sorted(p.glob("*.y*ml")) if p.is_dir() else [p] if p.is_file() else []
        for fn in files:
            if fn.resolve() == DEFAULTS.resolve():
                continue
            try:
                data = yaml.safe_load(fn.read_text())
            except (OSError, yaml.YAMLError):
                continue
            if _nested(data, parts):
                return f"the dask config file {fn}"
    return f"the dask config (dask.config.set, or the defaults in {DEFAULTS})"


def setting(key: str, given: Any, *, kwarg: str | None = None) -> tuple[Any, str]:
    """The value of ``key``: ``given`` when it is not None (a keyword argument), else the
    dask config's ``jobqueue.bursar.<key>``; with a description of where it came from."""
    if given is not None:
        return given, f"BursarCluster({kwarg or key.replace('-', '_')}=...)"
    return dask.config.get(f"jobqueue.{CONFIG_NAME}.{key}", None), source_of(key)


def bad(key: str, value: Any, source: str, allowed: str) -> ConfigError:
    return ConfigError(
        f"jobqueue.{CONFIG_NAME}.{key} = {value!r} (from {source}) is not valid; allowed: {allowed}"
    )


def walltime_s(walltime: str | float) -> float:
    """``"HH:MM:SS"`` (or ``"MM:SS"``, or seconds, as a number or a string) in seconds;
    ValueError for anything else."""
    if isinstance(walltime, bool):
        raise ValueError(f"not a duration: {walltime!r}")
    if isinstance(walltime, int | float):
        secs = float(walltime)
    else:
        parts = str(walltime).strip().split(":")
        if not 1 <= len(parts) <= 3:
            raise ValueError(f"not a duration: {walltime!r}")
        secs = 0.0
        for p in parts:
            secs = secs * 60 + float(p)
    if not (math.isfinite(secs) and secs > 0):
        raise ValueError(f"not a positive duration: {walltime!r}")
    return secs


def elastic_setting(value: Any, source: str) -> Elastic | None:
    """``jobqueue.bursar.elastic`` checked: None (a fixed-size job) or an
    :class:`~bursar.providers.elastic.Elastic` mapping (``min``, ``max``, ``work``,
    ``deadline``, ``amdahl``, ``value``)."""
    if value is None:
        return None
    try:
        return Elastic.parse(value)
    except ValueError as exc:
        shown = dict(value) if isinstance(value, Mapping) else value
        raise bad("elastic", shown, source, f"null, or {ALLOWED} [{exc}]") from None
