"""From a job table to lease requests: size, duration, holding time and campaign.

Each job becomes a lease request at its submit time: size = processors (or GPUs),
duration = requested time (the runtime when the trace has none), actual holding = its
recorded runtime, released early when the runtime is shorter than the duration. A job
that ran longer than it asked for still ran: it holds its processors for its recorded
runtime, and the requested time is only what a policy could know in advance (its
estimate). The quality report counts those jobs. Campaigns come from the trace's
users or groups, or one campaign for everything; their envelopes from a replay config
(TOML, see ``load_replay_config``).
"""

from __future__ import annotations

import hashlib
import json
import math
import tomllib
from array import array
from collections.abc import MutableSequence
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from bursar.broker.envelope import LeaseClass
from bursar.broker.errors import ConfigError
from bursar.sim.replay.table import QualityReport, Trace

CAMPAIGN_MODES = ("user", "group", "one")


@dataclass(frozen=True, slots=True)
class Envelope:
    """One campaign's envelope in the replay's single dimension; None = the default."""

    guarantee: float = 0.0
    sustained: float | None = None
    """None: the whole capacity (no campaign pays tokens)."""
    burst: float | None = None
    """None: the whole capacity."""
    bucket: float | None = None
    """Unit-seconds; None = unlimited."""
    lease_class: str = "batch"


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    campaigns: str = "user"
    default: Envelope = Envelope()
    overrides: dict[str, Envelope] = field(default_factory=dict)
    hol_patience_s: float = 300.0
    """The broker's head-of-line patience (bursar policy only)."""
    starvation_s: float = 86400.0
    """A job that waits longer than this counts as starved."""
    renew_s: float | None = None
    """How long a job past its request asks for at each renewal (bursar policies only);
    None: the whole rest of its runtime, at once. A job does not know when it will end:
    a step makes the broker see it as ending soon, as EASY does, rather than exactly."""
    renewals_push_reservations: bool = False
    """The broker policy's rule for a renewal that would push a reservation later (bursar
    policies only): refused (False, the broker's default; the job is then killed at its
    lease's expiry) or granted, the reservation moving later."""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if not self.renewals_push_reservations:
            del d["renewals_push_reservations"]  # configs from before it digest as they did
        d["overrides"] = {k: asdict(v) for k, v in sorted(self.overrides.items())}
        return d

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()


_ENV_KEYS = {"guarantee", "sustained", "burst", "bucket", "class"}
_TOP_KEYS = {
    "campaigns",
    "hol_patience_s",
    "starvation_s",
    "renew_s",
    "renewals_push_reservations",
    "envelope",
    "campaign",
}
MIN_RENEW_S = 1.0
"""The shortest renewal step a replay config may ask for (each step is an engine event)."""


def _number(path: str, key: str, value: object, allow_none: bool = False) -> float | None:
    if allow_none and value in ("unlimited", "capacity"):
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        extra = ' or "unlimited"' if allow_none else ""
        raise ConfigError(path, key, f"must be a finite number >= 0{extra} (got {value!r})")
    if value < 0:
        raise ConfigError(path, key, f"must be >= 0 (got {value!r})")
    return float(value)


def _envelope(path: str, prefix: str, raw: object, base: Envelope) -> Envelope:
    if not isinstance(raw, dict):
        raise ConfigError(path, prefix, "must be a table of guarantee/sustained/burst/bucket/class")
    unknown = sorted(set(raw) - _ENV_KEYS)
    if unknown:
        raise ConfigError(
            path, f"{prefix}.{unknown[0]}", f"unknown key; allowed: {', '.join(sorted(_ENV_KEYS))}"
        )
    cls = raw.get("class", base.lease_class)
    allowed = [c.value for c in LeaseClass]
    if cls not in allowed:
        raise ConfigError(path, f"{prefix}.class", f"got {cls!r}; allowed: {', '.join(allowed)}")
    vals: dict[str, Any] = {}
    for k in ("guarantee", "sustained", "burst", "bucket"):
        if k in raw:
            vals[k] = _number(path, f"{prefix}.{k}", raw[k], allow_none=k != "guarantee")
        else:
            vals[k] = getattr(base, k)
    return Envelope(lease_class=cls, **vals)


def load_replay_config(path: str | Path) -> ReplayConfig:
    """Read a replay config::

    campaigns = "user"          # user | group | one
    hol_patience_s = 300
    starvation_s = 86400
    renew_s = "remaining"       # or seconds per renewal of a job past its request
    renewals_push_reservations = false  # true: a renewal may push a reservation later
    [envelope]                  # every campaign's default
    guarantee = 0
    sustained = "capacity"      # or a number of units
    burst = "capacity"
    bucket = "unlimited"        # unit-seconds
    class = "batch"
    [campaign."user-3"]         # one campaign's own envelope (same keys)
    guarantee = 32
    """
    p = str(path)
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(p, "(file)", "no such file") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(p, "(file)", f"not valid TOML: {e}") from None
    unknown = sorted(set(raw) - _TOP_KEYS)
    if unknown:
        raise ConfigError(p, unknown[0], f"unknown key; allowed: {', '.join(sorted(_TOP_KEYS))}")
    mode = raw.get("campaigns", "user")
    if mode not in CAMPAIGN_MODES:
        raise ConfigError(p, "campaigns", f"got {mode!r}; allowed: {', '.join(CAMPAIGN_MODES)}")
    default = _envelope(p, "envelope", raw.get("envelope", {}), Envelope())
    overrides = {}
    camps = raw.get("campaign", {})
    if not isinstance(camps, dict):
        raise ConfigError(p, "campaign", 'must be tables like [campaign."user-3"]')
    for name, env in camps.items():
        overrides[name] = _envelope(p, f"campaign.{name}", env, default)
    renew = raw.get("renew_s", "remaining")
    renew_s = None
    if renew != "remaining":
        if (
            isinstance(renew, bool)
            or not isinstance(renew, int | float)
            or not math.isfinite(renew)
        ):
            raise ConfigError(
                p, "renew_s", f'must be "remaining" or a finite number of seconds (got {renew!r})'
            )
        if renew < MIN_RENEW_S:
            raise ConfigError(p, "renew_s", f"must be at least {MIN_RENEW_S:g} s (got {renew!r})")
        renew_s = float(renew)
    push = raw.get("renewals_push_reservations", False)
    if not isinstance(push, bool):
        raise ConfigError(p, "renewals_push_reservations", f"got {push!r}; allowed: true, false")
    return ReplayConfig(
        campaigns=mode,
        default=default,
        overrides=overrides,
        hol_patience_s=_number(p, "hol_patience_s", raw.get("hol_patience_s", 300.0)) or 0.0,
        starvation_s=_number(p, "starvation_s", raw.get("starvation_s", 86400.0)) or 0.0,
        renew_s=renew_s,
        renewals_push_reservations=push,
    )


@dataclass(frozen=True, slots=True)
class FacilityPower:
    """A facility power cap over a replay: every node draws ``idle_w`` / capacity when
    idle, each running job ``extra_w[j]`` more (its draw above its nodes' idle), and a
    job starts only if the facility's draw stays at or under ``cap_w``. Whole watts
    (integers held as floats), so that sums are exact and a policy's own count of the
    watts free is the kernel's."""

    cap_w: float
    idle_w: float
    """The whole machine's idle draw (every node idle)."""
    extra_w: MutableSequence[float]

    @property
    def budget_w(self) -> float:
        """The watts the running jobs may draw above idle together."""
        return self.cap_w - self.idle_w


@dataclass(slots=True)
class Workload:
    """Lease requests in submit order: what the replay kernel and every policy read.

    The columns are lists or, as ``to_workload`` makes them, compact arrays (8 bytes a
    job each, not a Python object): a million-job trace's workload is then tens of MB."""

    capacity: int
    unit: str
    job_id: MutableSequence[int]
    submit: MutableSequence[float]
    size: MutableSequence[int]
    duration: MutableSequence[float]
    """The lease's duration: the requested time, else the runtime."""
    hold: MutableSequence[float]
    """How long the job actually held its processors: its recorded runtime, which may be
    longer than ``duration`` (the job ran past its request)."""
    campaign: MutableSequence[int]
    campaign_names: list[str]
    power: FacilityPower | None = None
    """The facility power cap the policy must keep (``policies.powercap``); None: none."""
    measured_w: MutableSequence[float] | None = None
    """Each job's measured draw (W), where the trace records it (``JobTable.power``)."""

    def __len__(self) -> int:
        return len(self.job_id)


def campaign_name(
    mode: str, user: int, group: int, names: tuple[list[str], list[str]] = ([], [])
) -> str:
    """``user-3`` for a numeric id, ``user-alice`` where the trace records names."""
    if mode == "one":
        return "all"
    who = user if mode == "user" else group
    if who < 0:
        return f"{mode}-unknown"
    table = names[0] if mode == "user" else names[1]
    return f"{mode}-{table[who]}" if who < len(table) else f"{mode}-{who}"


def to_workload(
    trace: Trace, capacity: int, mode: str = "user", quality: QualityReport | None = None
) -> Workload:
    """Map the kept jobs to lease requests, sorted by (submit, file order).

    Jobs larger than ``capacity`` could never start: they are dropped and counted.
    """
    if mode not in CAMPAIGN_MODES:
        raise ValueError(f"campaign mode {mode!r}; allowed: {', '.join(CAMPAIGN_MODES)}")
    t = trace.jobs
    q = quality if quality is not None else trace.quality
    # A stable sort by submit time keeps file order among equal submit times; a trace
    # already in submit order (most are) needs no index list of its own.
    sub = t.submit
    in_order = all(a <= b for a, b in pairwise(sub))
    order = range(len(t)) if in_order else sorted(range(len(t)), key=sub.__getitem__)
    names: dict[str, int] = {}
    who: dict[tuple[int, int], int] = {}
    w = Workload(
        capacity,
        t.unit,
        array("q"),
        array("d"),
        array("q"),
        array("d"),
        array("d"),
        array("q"),
        [],
    )
    base = min(t.submit) if len(t) else 0.0
    too_big = past = 0
    procs, req_procs, runs, reqs = t.procs, t.req_procs, t.run, t.req_time
    users, groups, ids, submits = t.user, t.group, t.id, t.submit
    measured = t.power
    if measured is not None:
        w.measured_w = array("d")
    for i in order:
        p = procs[i]
        size = math.ceil(p if p > 0 else req_procs[i])
        if size > capacity:
            too_big += 1
            continue
        run = float(runs[i])
        req = float(reqs[i])
        dur = req if req > 0 else run
        if run > dur:
            past += 1
        key = (users[i], groups[i])
        c = who.get(key)
        if c is None:
            name = campaign_name(mode, *key, (t.user_names, t.group_names))
            c = who[key] = names.setdefault(name, len(names))
        w.job_id.append(ids[i])
        # Times from the first submit: replays of one trace start at 0 whatever its epoch.
        w.submit.append(float(submits[i]) - base)
        w.size.append(size)
        w.duration.append(dur)
        w.hold.append(run)
        w.campaign.append(c)
        if measured is not None:
            w.measured_w.append(measured[i])  # type: ignore[union-attr]
    w.campaign_names = list(names)
    if too_big:
        q.dropped[f"larger than the capacity ({capacity})"] += too_big
        q.kept -= too_big
    if past:
        q.notes.append(f"{past} jobs ran past request (held to its recorded runtime)")
    return w
