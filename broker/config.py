"""Bursar configuration files: one pool, one policy and the campaigns it starts with.

A config is TOML (``.toml``, read with the standard library) or YAML (``.yaml``/``.yml``)
with the same shape; ``demo.toml`` next to this module documents every key. Parsing is
two passes: pydantic checks shape and types (unknown keys are errors, so a typo never
silently falls back to a default), then the rules that need the whole file (guarantees
within capacity, warm nodes within the group, ``CampaignSpec.problems()``) run on the
engine's own dataclasses. Every failure becomes one ``ConfigError(path, key, message)``
naming the dotted key and what would have been accepted.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib.resources
import os
import re
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator
from pydantic_core import PydanticCustomError

from bursar.broker import dims, power_budget
from bursar.broker.envelope import CampaignSpec, DimEnvelope, LeaseClass
from bursar.broker.errors import ConfigError
from bursar.broker.policy import Enforcement, NodeGroup, PolicySpec, PoolSpec

__all__ = [
    "BACKENDS",
    "FORMATS",
    "Backend",
    "Config",
    "Discover",
    "DiscoveryError",
    "SlurmSettings",
    "WarnSignal",
    "config_from_mapping",
    "default_config",
    "default_config_text",
    "file_backend",
    "load_config",
    "load_policy",
    "parse_config",
    "policy_from_mapping",
    "pool_capacity",
]

Format = Literal["toml", "yaml"]
FORMATS: Mapping[str, Format] = {".toml": "toml", ".yaml": "yaml", ".yml": "yaml"}
DEFAULT_RESOURCE = "demo.toml"

Backend = Literal["simulated", "local", "slurm"]
BACKENDS: tuple[Backend, ...] = ("simulated", "local", "slurm")
"""The pool backends a file can be meant for (``bursar serve --backend``, or the file's
top-level ``backend`` key). The simulated backend reads the nodes from ``[pool.groups]``;
the others discover them, so a file for them has none."""

# Where a discovering backend finds its nodes, for the messages that say why a key is refused.
_DISCOVERED_FROM = {
    "local": "the local backend discovers the nodes on this machine",
    "slurm": "the Slurm backend discovers the nodes from Slurm ([slurm] partition)",
}
_NODES_FROM = {
    "simulated": "the node groups",
    "local": "this machine",
    "slurm": "the Slurm partition",
}
_POWERS_ITS_OWN = {
    "local": "the local backend's machine is always on",
    "slurm": "Slurm powers its own nodes",
}

# Keys used for problems that are not about one key of the document.
_FILE_KEY = "(file)"
_TOP_KEY = "(top level)"


class _BackendName(enum.Enum):
    # An enum rather than a Literal so that a wrong value's message lists the allowed ones.
    SIMULATED = "simulated"
    LOCAL = "local"
    SLURM = "slurm"


class WarnSignal(enum.Enum):
    """What a Slurm allocation's steps get when its lease is warned of preemption."""

    NONE = "none"
    TERM = "TERM"
    INT = "INT"
    HUP = "HUP"
    USR1 = "USR1"
    USR2 = "USR2"
    CONT = "CONT"


@dataclass(frozen=True, slots=True)
class SlurmSettings:
    """The ``[slurm]`` table: how ``bursar serve --backend slurm`` uses a Slurm cluster."""

    partition: str | None = None
    """Where leases are allocated and whose nodes make the pool; None: the cluster's only
    partition (required when there are several)."""
    job_prefix: str = "bursar"
    """Allocations are named ``{job_prefix}-{lease id}``; jobs with the prefix that belong to
    no lease are cancelled (one broker per prefix and cluster)."""
    poll_interval_s: float = 2.0
    """How often the broker compares its leases with Slurm's jobs and nodes."""
    allocate_timeout_s: int = 10
    """How long ``salloc --immediate`` may wait for the resources the engine placed."""
    time_limit_min: int | None = None
    """Each allocation's Slurm time limit in minutes; None: the partition's default. A lease
    renewed past it loses its allocation (Slurm ends the job: the lease is revoked)."""
    warn_signal: WarnSignal = WarnSignal.NONE
    """Signal sent to an allocation's steps at its preemption warning (none: only the
    revocation, which cancels it: SIGTERM, then SIGKILL after Slurm's KillWait)."""
    account: str | None = None
    """The Slurm account each job is charged to (``salloc --account``); unset, Slurm's
    default account for the broker's user."""
    qos: str | None = None
    """The Slurm quality of service for each job (``salloc --qos``); unset, the account's
    default QOS."""


class DiscoveryError(Exception):
    """Raised by a pool discovery function; becomes a ConfigError naming ``key``."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


@dataclass(frozen=True, slots=True)
class Config:
    """A validated configuration, as the engine's own types."""

    pool: PoolSpec
    policy: PolicySpec
    campaigns: tuple[CampaignSpec, ...] = ()
    slurm: SlurmSettings | None = None
    """The ``[slurm]`` table, if the file has one (only the Slurm backend reads it)."""
    backend: Backend | None = None
    """The file's top-level ``backend`` key: the backend it is meant for (None: not said)."""


def pool_capacity(pool: PoolSpec) -> dict[str, float]:
    """Total capacity per dimension: placed dims summed over nodes, rate dims as declared."""
    cap = {d: 0.0 for d in dims.ALL}
    for group in pool.groups:
        for d in dims.PLACED:
            cap[d] += group.count * float(group.resources.get(d, 0.0))
    for d in dims.RATE:
        cap[d] = float(pool.rate_capacity.get(d, 0.0))
    return cap


# ---------------------------------------------------------------------------------------
# Schema (first pass). Strict, so that YAML's "yes" or a quoted "64" is not silently
# coerced; enums are the one relaxation because their values are strings in the file.

_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


class _Table(BaseModel):
    model_config = _STRICT
    KEYS_HINT: ClassVar[str | None] = None
    """Overrides the generated list of allowed keys in 'unknown key' messages."""


def _dim_table(name: str, dim_names: Sequence[str], doc: str) -> type[_Table]:
    # Built from dims.* so that adding a dimension there needs no edit here.
    fields: dict[str, Any] = {d: (float, Field(default=0.0, ge=0)) for d in dim_names}
    return create_model(name, __base__=_Table, __doc__=doc, **fields)


# Defaults are read from the dataclasses so that they are written down once.
_POOL_DEFAULTS = {f.name: f.default for f in dataclasses.fields(PoolSpec)}
_POLICY_DEFAULTS = {f.name: f.default for f in dataclasses.fields(PolicySpec)}

_PlacedTable = _dim_table("_PlacedTable", dims.PLACED, "A value per placed dimension.")
_RateTable = _dim_table("_RateTable", dims.RATE, "A value per rate dimension.")


class _GroupBase(_Table):
    count: int = Field(gt=0)
    warm: int = Field(default=0, ge=0)
    prefix: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    idle_w: float = Field(default=0.0, ge=0)
    peak_w: float = Field(default=0.0, ge=0)


_Group = create_model(
    "_Group",
    __base__=_GroupBase,
    **{d: (float, Field(default=0.0, ge=0)) for d in dims.PLACED},  # type: ignore[call-overload]
)


class _Pool(_Table):
    groups: dict[str, _Group] = Field(min_length=1)  # type: ignore[valid-type]
    boot_latency_s: float = Field(default=_POOL_DEFAULTS["boot_latency_s"], ge=0)
    rate_capacity: _RateTable = Field(default_factory=_RateTable)  # type: ignore[valid-type]


class _Policy(_Table):
    grace_s: float = Field(default=_POLICY_DEFAULTS["grace_s"], ge=0)
    warm_headroom: _PlacedTable = Field(default_factory=_PlacedTable)  # type: ignore[valid-type]
    enforcement: Enforcement = Field(default=_POLICY_DEFAULTS["enforcement"], strict=False)
    hol_patience_s: float = Field(default=_POLICY_DEFAULTS["hol_patience_s"], ge=0)
    reservations: int = Field(default=_POLICY_DEFAULTS["reservations"], ge=1, le=64)
    fairshare_half_life_s: float | None = Field(
        default=_POLICY_DEFAULTS["fairshare_half_life_s"], gt=0
    )
    max_lease_s: float = Field(default=_POLICY_DEFAULTS["max_lease_s"], gt=0)
    min_retry_s: float = Field(default=_POLICY_DEFAULTS["min_retry_s"], ge=0)
    price_base: float = Field(default=_POLICY_DEFAULTS["price_base"], ge=0)
    price_k: float = Field(default=_POLICY_DEFAULTS["price_k"], ge=0)
    meter_window_s: float = Field(default=_POLICY_DEFAULTS["meter_window_s"], gt=0)
    # 0 is refused: a node still needed for the warm reserve would be looked at again at
    # the same instant, for ever; a short positive time gives the same effect.
    power_down_idle_s: float | None = Field(default=_POLICY_DEFAULTS["power_down_idle_s"], gt=0)
    renewals_push_reservations: bool = _POLICY_DEFAULTS["renewals_push_reservations"]
    elastic_rule: Literal["dmug", "edf", "value", "proportional"] = _POLICY_DEFAULTS["elastic_rule"]
    elastic_risk: bool = _POLICY_DEFAULTS["elastic_risk"]
    elastic_degrade: bool = _POLICY_DEFAULTS["elastic_degrade"]
    elastic_admission: bool = _POLICY_DEFAULTS["elastic_admission"]
    elastic_hysteresis: float = Field(default=_POLICY_DEFAULTS["elastic_hysteresis"], ge=1)
    power_cap_w: float | None = Field(default=None, gt=0)
    idempotency_window_s: float = Field(default=_POLICY_DEFAULTS["idempotency_window_s"], gt=0)
    idempotency_keys_kept: int = Field(default=_POLICY_DEFAULTS["idempotency_keys_kept"], ge=1)
    ended_leases_kept: int = Field(default=_POLICY_DEFAULTS["ended_leases_kept"], ge=1)

    @field_validator("fairshare_half_life_s", mode="before")
    @classmethod
    def _fairshare_off(cls, v: Any) -> Any:
        # TOML has no null: "off" orders requests within a class by arrival only.
        if v == "off":
            return None
        if isinstance(v, str):
            raise PydanticCustomError(
                "fairshare_value",
                'expected a half-life in seconds > 0 or the string "off" (got {got})',
                {"got": repr(v)},
            )
        return v


class _Envelope(_Table):
    guarantee: float = Field(default=0.0, ge=0)
    sustained: float = Field(default=0.0, ge=0)
    burst: float = Field(default=0.0, ge=0)
    bucket: float | None = Field(default=None, ge=0)

    @field_validator("bucket", mode="before")
    @classmethod
    def _unlimited(cls, v: Any) -> Any:
        if v == "unlimited":
            return None
        if isinstance(v, str):
            raise PydanticCustomError(
                "bucket_value",
                'expected a number of unit-seconds >= 0 or the string "unlimited" (got {got})',
                {"got": repr(v)},
            )
        return v


class _CampaignBase(_Table):
    KEYS_HINT = "class, preemptible, and one table per dimension: " + ", ".join(dims.ENVELOPED)
    lease_class: LeaseClass = Field(default=LeaseClass.BATCH, alias="class", strict=False)
    preemptible: bool = False


_Campaign = create_model(
    "_Campaign",
    __base__=_CampaignBase,
    **{d: (_Envelope | None, None) for d in dims.ENVELOPED},  # type: ignore[call-overload]
)


_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class _Slurm(_Table):
    partition: str | None = Field(default=None, pattern=_NAME)
    job_prefix: str = Field(default="bursar", pattern=_NAME)
    poll_interval_s: float = Field(default=2.0, gt=0)
    allocate_timeout_s: int = Field(default=10, gt=0)
    time_limit_min: int | None = Field(default=None, gt=0)
    warn_signal: WarnSignal = Field(default=WarnSignal.NONE, strict=False)
    account: str | None = Field(default=None, pattern=_NAME)
    qos: str | None = Field(default=None, pattern=_NAME)


class _DiscoveredPool(_Table):
    """``[pool]`` under the Slurm backend: the nodes come from Slurm."""

    boot_latency_s: float = Field(default=0.0, ge=0)
    rate_capacity: _RateTable = Field(default_factory=_RateTable)  # type: ignore[valid-type]


class _File(_Table):
    pool: _Pool
    policy: _Policy = Field(default_factory=_Policy)
    campaigns: dict[str, _Campaign] = Field(default_factory=dict)  # type: ignore[valid-type]
    slurm: _Slurm | None = None
    backend: _BackendName | None = Field(default=None, strict=False)


class _SlurmFile(_File):
    pool: _DiscoveredPool = Field(default_factory=_DiscoveredPool)  # type: ignore[assignment]
    slurm: _Slurm = Field(default_factory=_Slurm)  # type: ignore[assignment]


Discover = typing.Callable[[SlurmSettings], PoolSpec]


# ---------------------------------------------------------------------------------------
# Public entry points


def load_config(
    path: str | os.PathLike[str],
    *,
    discover: Discover | None = None,
    backend: Backend | None = None,
) -> Config:
    """Read and validate a config file; the extension (.toml, .yaml, .yml) picks the format.

    ``backend`` is the backend the file is checked for (None: ``slurm`` with ``discover``,
    else ``simulated``). For ``local`` and ``slurm`` the nodes are not read from
    ``[pool.groups]`` but asked of ``discover`` with the file's ``[slurm]`` settings;
    without ``discover`` (checking a file away from the machine or cluster it is for) the
    pool is left empty and the rules that need its capacity are skipped."""
    source, fmt, text = _read(path)
    return parse_config(text, fmt, source=source, discover=discover, backend=backend)


def file_backend(path: str | os.PathLike[str]) -> Backend | None:
    """The backend a config file says it is for (its top-level ``backend`` key), or None.
    Raises ConfigError for an unreadable file or a value that is not a backend."""
    source, fmt, text = _read(path)
    data = _document(text, fmt, source)
    value = data.get("backend") if isinstance(data, dict) else None
    if value is None:
        return None
    for b in BACKENDS:
        if value == b:
            return b
    raise ConfigError(
        source, "backend", f"unknown value {_show(value)}; allowed: {', '.join(BACKENDS)}"
    )


def _read(path: str | os.PathLike[str]) -> tuple[str, Format, str]:
    p = Path(path)
    source = str(p)
    fmt = FORMATS.get(p.suffix.lower())
    if fmt is None:
        raise ConfigError(
            source,
            _FILE_KEY,
            f"unknown file type {p.suffix or '(none)'!r}; allowed: {', '.join(FORMATS)}",
        )
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(source, _FILE_KEY, "no such file") from None
    except UnicodeDecodeError as e:
        raise ConfigError(source, _FILE_KEY, f"not UTF-8 text ({e.reason})") from None
    except OSError as e:
        raise ConfigError(source, _FILE_KEY, f"cannot read: {e.strerror or e}") from None
    return source, fmt, text


def parse_config(
    text: str,
    fmt: Format,
    *,
    source: str = "<string>",
    discover: Discover | None = None,
    backend: Backend | None = None,
) -> Config:
    """Validate config ``text`` in format ``fmt``; ``source`` names it in errors."""
    data = _document(text, fmt, source)
    return config_from_mapping(data, source=source, discover=discover, backend=backend)


def _document(text: str, fmt: Format, source: str) -> Any:
    if fmt == "toml":
        try:
            data: Any = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(source, *_toml_syntax(e)) from None
    elif fmt == "yaml":
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(source, *_yaml_syntax(e)) from None
    else:
        raise ValueError(f"unknown config format {fmt!r}; allowed: toml, yaml")
    return data


def config_from_mapping(
    data: Any,
    *,
    source: str = "<mapping>",
    discover: Discover | None = None,
    backend: Backend | None = None,
) -> Config:
    """Validate an already parsed document (nested dicts/lists/scalars) for ``backend``
    (see :func:`load_config`)."""
    if data is None:
        data = {}
    if backend is None:
        backend = "slurm" if discover is not None else "simulated"
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; allowed: {', '.join(BACKENDS)}")
    if backend != "simulated":
        return _from_discovered(data, source, discover, backend)
    if discover is not None:
        raise ValueError("the simulated backend reads its nodes from the file: no discover")
    try:
        model = _File.model_validate(data)
    except ValidationError as e:
        raise _error(source, [(_key(err["loc"]), _message(err)) for err in e.errors()]) from None
    return _build(model, source)


def load_policy(path: str | os.PathLike[str]) -> PolicySpec:
    """The policy a config file gives, as ``bursar serve --config`` would serve it.

    A file with ``[pool.groups]`` is checked whole (``load_config``). A file without them is
    for a backend that discovers its nodes (Slurm, local): its pool cannot be known here,
    so only its ``[policy]`` table is checked, with idle nodes kept on as those backends
    keep them (``power_down_idle_s`` off)."""
    p = Path(path)
    config = None
    try:
        config = load_config(p)
    except ConfigError as exc:
        if exc.key != "pool" and not exc.key.startswith("pool.groups"):
            raise
        text = p.read_text(encoding="utf-8")
        data: Any = (
            tomllib.loads(text) if FORMATS[p.suffix.lower()] == "toml" else yaml.safe_load(text)
        )
        pool = data.get("pool") if isinstance(data, dict) else None
        if isinstance(pool, dict) and "groups" in pool:
            raise
        table = data.get("policy", {}) if isinstance(data, dict) else {}
        return policy_from_mapping(table, source=str(p), keep_nodes_on=True)
    return config.policy


def policy_from_mapping(
    table: Any,
    *,
    source: str = "<mapping>",
    base: PolicySpec | None = None,
    keep_nodes_on: bool = False,
) -> PolicySpec:
    """Validate a ``[policy]`` table on its own (errors name ``policy.KEY``). The keys it
    leaves out take ``base``'s values (None: the defaults); a table it names
    (``warm_headroom``) replaces ``base``'s whole. ``keep_nodes_on``: a backend that powers
    its own nodes (``power_down_idle_s`` must be left out, and is off)."""
    if not isinstance(table, dict):
        raise ConfigError(source, "policy", f"expected a table (got {_show(table)})")
    if keep_nodes_on and table.get("power_down_idle_s") is not None:
        raise ConfigError(
            source,
            "policy.power_down_idle_s",
            "this broker's backend powers its own nodes, so the broker never powers them "
            "down; allowed: leave it out",
        )
    merged: dict[str, Any] = {}
    if base is not None:
        merged = {f.name: getattr(base, f.name) for f in dataclasses.fields(PolicySpec)}
        merged["warm_headroom"] = dict(base.warm_headroom)
    merged.update(table)
    try:
        p = _Policy.model_validate(merged)
    except ValidationError as e:
        raise _error(
            source,
            [(_key(("policy", *err["loc"])), _message_at(err, "policy")) for err in e.errors()],
        ) from None
    return _policy_spec(p, keep_nodes_on=keep_nodes_on)


def _message_at(err: Any, prefix: str) -> str:
    # The schema resolver reads locations from the file's top: put the table's in front.
    return _message({**err, "loc": (prefix, *err["loc"])})


def _policy_spec(p: _Policy, *, keep_nodes_on: bool) -> PolicySpec:
    return PolicySpec(
        grace_s=p.grace_s,
        # Only the dimensions named in the file: an absent dimension has no headroom.
        warm_headroom=p.warm_headroom.model_dump(exclude_unset=True),
        enforcement=p.enforcement,
        hol_patience_s=p.hol_patience_s,
        reservations=p.reservations,
        fairshare_half_life_s=p.fairshare_half_life_s,
        max_lease_s=p.max_lease_s,
        min_retry_s=p.min_retry_s,
        price_base=p.price_base,
        price_k=p.price_k,
        meter_window_s=p.meter_window_s,
        power_down_idle_s=None if keep_nodes_on else p.power_down_idle_s,
        renewals_push_reservations=p.renewals_push_reservations,
        elastic_rule=p.elastic_rule,
        elastic_risk=p.elastic_risk,
        elastic_degrade=p.elastic_degrade,
        elastic_admission=p.elastic_admission,
        elastic_hysteresis=p.elastic_hysteresis,
        power_cap_w=p.power_cap_w,
        idempotency_window_s=p.idempotency_window_s,
        idempotency_keys_kept=p.idempotency_keys_kept,
        ended_leases_kept=p.ended_leases_kept,
    )


def _slurm_settings(s: _Slurm) -> SlurmSettings:
    return SlurmSettings(
        partition=s.partition,
        job_prefix=s.job_prefix,
        poll_interval_s=s.poll_interval_s,
        allocate_timeout_s=s.allocate_timeout_s,
        time_limit_min=s.time_limit_min,
        warn_signal=s.warn_signal,
        account=s.account,
        qos=s.qos,
    )


def _from_discovered(data: Any, source: str, discover: Discover | None, backend: Backend) -> Config:
    """A file for a backend that discovers its nodes (local, slurm)."""
    # The keys a file for the simulated backend has and these backends refuse, all in one
    # message: a file started from `bursar config show-default` has several.
    problems: list[tuple[str, str]] = []
    table = data if isinstance(data, dict) else {}
    pool_table, policy_table = table.get("pool"), table.get("policy")
    if isinstance(pool_table, dict) and "groups" in pool_table:
        problems.append(
            (
                "pool.groups",
                f"{_DISCOVERED_FROM[backend]}; allowed: no [pool.groups] "
                "(keep it for the simulated backend in another file)",
            )
        )
    if isinstance(policy_table, dict) and policy_table.get("power_down_idle_s") is not None:
        problems.append(
            (
                "policy.power_down_idle_s",
                f"{_POWERS_ITS_OWN[backend]}, so the broker never powers nodes down; "
                "allowed: leave it out (or null)",
            )
        )
    if backend == "local" and "slurm" in table:
        problems.append(
            ("slurm", "only the Slurm backend reads the [slurm] table; allowed: leave it out")
        )
    if problems:
        raise _error(source, problems)
    try:
        model = _SlurmFile.model_validate(data)
    except ValidationError as e:
        raise _error(source, [(_key(err["loc"]), _message(err)) for err in e.errors()]) from None
    settings = _slurm_settings(model.slurm)
    if discover is None:
        found = PoolSpec(groups=())
    else:
        try:
            found = discover(settings)
        except DiscoveryError as e:
            raise ConfigError(source, e.key, e.message) from None
    pool = PoolSpec(
        groups=found.groups,
        boot_latency_s=model.pool.boot_latency_s,
        rate_capacity={
            d: float(v) for d, v in model.pool.rate_capacity.model_dump(exclude_unset=True).items()
        },
    )
    return _build(
        model,
        source,
        pool=pool,
        slurm=settings if backend == "slurm" else None,
        keep_nodes_on=True,
        nodes_known=discover is not None,
        nodes_from=_NODES_FROM[backend],
    )


def default_config_text() -> str:
    """The packaged demo config, verbatim (comments included)."""
    return (
        importlib.resources.files("bursar.broker")
        .joinpath(DEFAULT_RESOURCE)
        .read_text(encoding="utf-8")
    )


def default_config() -> Config:
    """The flagship demo pool (64 nodes x 8 GPUs, five campaigns)."""
    return parse_config(default_config_text(), "toml", source=f"bursar.broker/{DEFAULT_RESOURCE}")


# ---------------------------------------------------------------------------------------
# Second pass: whole-file rules, on the engine's dataclasses.


def _build(
    model: _File,
    source: str,
    *,
    pool: PoolSpec | None = None,
    slurm: SlurmSettings | None = None,
    keep_nodes_on: bool = False,
    nodes_known: bool = True,
    nodes_from: str = _NODES_FROM["simulated"],
) -> Config:
    problems: list[tuple[str, str]] = []
    if pool is None:
        pool = _file_pool(model, problems)
        if model.slurm is not None:
            slurm = _slurm_settings(model.slurm)
    policy = _policy_spec(model.policy, keep_nodes_on=keep_nodes_on)
    config = _check(
        model, source, pool, policy, slurm, problems, nodes_known=nodes_known, nodes_from=nodes_from
    )
    backend = model.backend.value if model.backend is not None else None
    return dataclasses.replace(config, backend=backend)


def _file_pool(model: _File, problems: list[tuple[str, str]]) -> PoolSpec:
    groups = []
    for gname, g in model.pool.groups.items():
        if g.warm > g.count:
            problems.append(
                (
                    f"pool.groups.{gname}.warm",
                    f"{g.warm} warm nodes but the group has {g.count}; allowed: 0 to {g.count}",
                )
            )
        if g.peak_w < g.idle_w:
            problems.append(
                (
                    f"pool.groups.{gname}.peak_w",
                    f"{g.peak_w:g} W is below the idle draw ({g.idle_w:g} W); "
                    f"allowed: at least idle_w",
                )
            )
        resources = {d: float(getattr(g, d)) for d in dims.PLACED}
        groups.append(
            NodeGroup(
                count=g.count,
                resources=resources,
                warm=g.warm,
                prefix=g.prefix if g.prefix is not None else gname,
                idle_w=g.idle_w,
                peak_w=g.peak_w,
            )
        )
    rate_capacity = {
        d: float(v) for d, v in model.pool.rate_capacity.model_dump(exclude_unset=True).items()
    }
    pool = PoolSpec(
        groups=tuple(groups),
        boot_latency_s=model.pool.boot_latency_s,
        rate_capacity=rate_capacity,
    )

    # Names are generated per group; two prefixes can still collide ("n" + "100" vs "n1" +
    # "00"), and the backends key everything by name.
    seen: dict[str, str] = {}
    for (gname, g), ng in zip(model.pool.groups.items(), groups, strict=True):
        for i in range(g.count):
            name = f"{ng.prefix}{i:03d}"
            if name in seen and seen[name] != gname:
                problems.append(
                    (
                        f"pool.groups.{gname}.prefix",
                        f"node name {name!r} is also generated by group {seen[name]!r}; "
                        "allowed: a prefix no other group's names start with",
                    )
                )
                break
            seen[name] = gname
    return pool


def _check(
    model: _File,
    source: str,
    pool: PoolSpec,
    policy: PolicySpec,
    slurm: SlurmSettings | None,
    problems: list[tuple[str, str]],
    *,
    nodes_known: bool = True,
    nodes_from: str = _NODES_FROM["simulated"],
) -> Config:
    campaigns = []
    for cname, c in model.campaigns.items():
        envelopes = {}
        for d in dims.ENVELOPED:
            e = getattr(c, d)
            if e is not None:
                envelopes[d] = DimEnvelope(
                    guarantee=e.guarantee, sustained=e.sustained, burst=e.burst, bucket=e.bucket
                )
        spec = CampaignSpec(
            name=cname, envelopes=envelopes, lease_class=c.lease_class, preemptible=c.preemptible
        )
        problems.extend((f"campaigns.{cname}", msg) for msg in spec.problems())
        campaigns.append(spec)

    cap = pool_capacity(pool)
    # Without the nodes, only the rate dimensions' capacity (from the file) is known.
    checked = dims.ALL if nodes_known else dims.RATE
    for d in checked:
        holders = [
            (s.name, s.envelopes[d].guarantee)
            for s in campaigns
            if d in s.envelopes and s.envelopes[d].guarantee > 0
        ]
        total = sum(g for _, g in holders)
        if total > cap[d] + 1e-9:
            where = "pool.rate_capacity." + d if d in dims.RATE else nodes_from
            problems.append(
                (
                    f"campaigns.*.{d}.guarantee",
                    f"guarantees add up to {total:g} {dims.UNITS[d]} "
                    f"({', '.join(f'{n} {g:g}' for n, g in holders)}) but the pool has "
                    f"{cap[d]:g} {dims.UNITS[d]} (from {where}); "
                    f"allowed: a total of at most {cap[d]:g}",
                )
            )
    problems.extend(power_budget.problems(pool, policy, campaigns))
    for d, h in policy.warm_headroom.items():
        if d in checked and h > cap[d] + 1e-9:
            problems.append(
                (
                    f"policy.warm_headroom.{d}",
                    f"{h:g} {dims.UNITS[d]} of headroom in a pool of {cap[d]:g}; "
                    f"allowed: 0 to {cap[d]:g}",
                )
            )

    if problems:
        raise _error(source, problems)
    return Config(pool=pool, policy=policy, campaigns=tuple(campaigns), slurm=slurm)


# ---------------------------------------------------------------------------------------
# Turning parser and pydantic errors into ConfigError


def _error(source: str, problems: Sequence[tuple[str, str]]) -> ConfigError:
    # ConfigError carries one key; the rest ride along in the message so that a user fixes
    # a file in one round trip rather than one error per run.
    key, message = problems[0]
    if len(problems) > 1:
        message += "".join(f"\n  also {k}: {m}" for k, m in problems[1:])
    return ConfigError(source, key, message)


def _toml_syntax(e: tomllib.TOMLDecodeError) -> tuple[str, str]:
    text = str(e)
    m = re.search(r"\(at line (\d+), column (\d+)\)", text)
    if m is None:
        m = re.search(r"\(at (end of document)\)", text)
        key = m.group(1) if m else _FILE_KEY
    else:
        key = f"line {m.group(1)}, column {m.group(2)}"
    reason = re.sub(r"\s*\(at [^)]*\)", "", text)
    return key, f"invalid TOML: {reason}; allowed: TOML 1.0 syntax"


def _yaml_syntax(e: yaml.YAMLError) -> tuple[str, str]:
    mark = getattr(e, "problem_mark", None)
    key = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else _FILE_KEY
    problem = getattr(e, "problem", None) or str(e)
    return key, f"invalid YAML: {problem}; allowed: YAML 1.1 syntax"


def _key(loc: Sequence[int | str]) -> str:
    return ".".join(str(p) for p in loc) if loc else _TOP_KEY


def _show(x: Any) -> str:
    s = repr(x)
    return s if len(s) <= 60 else s[:57] + "..."


def _message(err: Any) -> str:
    kind: str = err["type"]
    loc = tuple(err["loc"])
    got = err.get("input")
    ctx = err.get("ctx") or {}
    if kind == "extra_forbidden":
        return f"unknown key {loc[-1]!r}; allowed: {_allowed_keys(_resolve(loc[:-1]))}"
    if kind == "missing":
        target = _resolve(loc)
        keys = f"; a table with keys: {_allowed_keys(target)}" if _is_model(target) else ""
        return f"required key is missing{keys}"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        target = _resolve(loc)
        keys = f"; allowed keys: {_allowed_keys(target)}" if _is_model(target) else ""
        return f"expected a table (got {_show(got)}){keys}"
    if kind == "enum":
        target = _resolve(loc)
        allowed = (
            ", ".join(str(m.value) for m in target)
            if isinstance(target, type) and issubclass(target, enum.Enum)
            else ctx.get("expected", "?")
        )
        return f"unknown value {_show(got)}; allowed: {allowed}"
    if kind == "float_type":
        hint = ""
        if isinstance(got, str) and _looks_numeric(got):
            hint = (
                "; write numbers without quotes (YAML reads an exponent without a dot,"
                " like 3e5, as a string: write 3.0e+5 or 300000)"
            )
        return f"expected a number, got {_show(got)}{hint}"
    if kind in ("int_type", "int_from_float"):
        return f"expected a whole number, got {_show(got)}"
    if kind == "bool_type":
        return f"expected true or false, got {_show(got)}"
    if kind == "string_type":
        return f"expected a string, got {_show(got)}"
    if kind == "string_pattern_mismatch":
        return f"{_show(got)} is not allowed; allowed: letters, digits, '.', '_', '-'"
    if kind == "greater_than_equal":
        return f"must be >= {ctx['ge']:g}, got {_show(got)}; allowed: numbers >= {ctx['ge']:g}"
    if kind == "greater_than":
        return f"must be > {ctx['gt']:g}, got {_show(got)}; allowed: numbers > {ctx['gt']:g}"
    if kind == "finite_number":
        return f"must be a finite number, got {_show(got)}"
    if kind == "too_short":
        return "must not be empty; allowed: at least one entry"
    return str(err.get("msg", kind))


# Resolving a pydantic error location back to the schema, so that messages can list the
# keys or values that were expected at that spot.


def _looks_numeric(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _strip_optional(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _resolve(loc: Sequence[int | str]) -> Any:
    tp: Any = _File
    for part in loc:
        tp = _strip_optional(tp)
        if _is_model(tp):
            field = next(
                (f for name, f in tp.model_fields.items() if (f.alias or name) == part), None
            )
            if field is None:
                return None
            tp = field.annotation
        elif typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1]
        else:
            return None
    return _strip_optional(tp)


def _allowed_keys(model: Any) -> str:
    if not _is_model(model):
        return "?"
    hint = getattr(model, "KEYS_HINT", None)
    if hint:
        return hint
    return ", ".join(f.alias or name for name, f in model.model_fields.items())
