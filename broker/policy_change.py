"""Changing the policy of a live broker: which settings may change, what a change does to
what is under way, and whether a new policy is one the engine can run.

A policy change is an input like any other (``events.ApplyPolicy``, journaled, so a replay
changes policy at the same entry and decides as the broker did). Most settings are knobs
the rules read when they decide: the new value counts from the change on, and nothing
already decided is decided again. What is under way keeps the terms it was given:

* leases keep their sizes, ends and prepaid tokens (``max_lease_s`` bounds only requests
  and renewals made after the change);
* a preemption warning already sent keeps its deadline (``grace_s`` counts for reclaims
  decided after the change);
* a waiting request whose head-of-line patience is running keeps the time it ages at
  (``hol_patience_s`` counts for requests that start waiting on the pool after);
* an idle node's power-down check keeps its time; with ``power_down_idle_s`` turned off
  the checks are dropped (idle nodes stay on), turned on, idle nodes start a spell now;
* a change of ``warm_headroom`` boots nodes at once if more is to be kept warm, and lets
  preemptible leases use what is no longer kept idle;
* the queue is looked at again at the change (``reservations``, the headroom and the
  elastic settings change who may start now).

Two settings change what state already recorded means, and are refused (``FIXED``): to
serve another value, start a broker on a new state directory.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from bursar.broker import dims
from bursar.broker.elastic import RULES
from bursar.broker.policy import Enforcement, PolicySpec
from bursar.broker.specs import spec_diff, spec_to_dict

__all__ = ["FIXED", "changes", "problems"]

FIXED: Mapping[str, str] = {
    "enforcement": (
        "the running leases' bucket tokens were charged under the current rule (prepaid "
        "for the whole lease, or only at grant instants), and their refunds would be "
        "counted under another"
    ),
    "fairshare_half_life_s": (
        "the campaigns' fair-share usage is kept scaled by the half-life, and the usage "
        "charged ahead for the running leases would be given back under another one"
    ),
}
"""The settings a live broker may not change, each with why."""

_RANGES: Mapping[str, tuple[float, bool, bool]] = {
    # key: (lowest, whether the lowest itself is refused, whether None is allowed)
    "grace_s": (0.0, False, False),
    "hol_patience_s": (0.0, False, False),
    "fairshare_half_life_s": (0.0, True, True),
    "max_lease_s": (0.0, True, False),
    "min_retry_s": (0.0, False, False),
    "price_base": (0.0, False, False),
    "price_k": (0.0, False, False),
    "meter_window_s": (0.0, True, False),
    "power_down_idle_s": (0.0, True, True),  # 0 would recheck a needed node at one instant for ever
    "elastic_hysteresis": (1.0, False, False),
    "power_cap_w": (0.0, True, True),
    "idempotency_window_s": (0.0, True, False),
}
"""The numeric settings' ranges (the config file's are the same, ``broker/config.py``)."""

MAX_RESERVATIONS = 64

_COUNTS = ("idempotency_keys_kept", "ended_leases_kept")
"""The settings that count records kept (a smaller count forgets the oldest at once)."""

_FLAGS = ("renewals_push_reservations", "elastic_risk", "elastic_degrade", "elastic_admission")


def changes(old: PolicySpec, new: PolicySpec) -> dict[str, tuple[Any, Any]]:
    """Each setting that differs, dotted (``warm_headroom.gpu``), as (old, new) in the
    journal's spelling of a policy; sorted by key."""
    return {k: (a, b) for k, a, b in spec_diff(spec_to_dict(old), spec_to_dict(new))}


def problems(old: PolicySpec, new: PolicySpec, capacity: dims.Vec) -> list[tuple[str, str]]:
    """Why ``new`` may not replace ``old`` on a pool of ``capacity`` (placed dimensions):
    (key, message saying what is allowed) per problem, empty when it may. Pure."""
    out: list[tuple[str, str]] = []
    for key, (lo, lo_open, optional) in _RANGES.items():
        v = getattr(new, key)
        if v is None and optional:
            continue
        bound = f"> {lo:g}" if lo_open else f">= {lo:g}"
        none = " or off" if optional else ""
        if (
            isinstance(v, bool)
            or not isinstance(v, int | float)
            or not math.isfinite(v)
            or v < lo
            or (lo_open and v == lo)
        ):
            out.append((key, f"got {v!r}; allowed: a finite number {bound}{none}"))
    r = new.reservations
    if isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= MAX_RESERVATIONS:
        out.append(("reservations", f"got {r!r}; allowed: a whole number 1 to {MAX_RESERVATIONS}"))
    for key in _COUNTS:
        n = getattr(new, key)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            out.append((key, f"got {n!r}; allowed: a whole number >= 1"))
    if new.elastic_rule not in RULES:
        out.append(("elastic_rule", f"got {new.elastic_rule!r}; allowed: {', '.join(RULES)}"))
    for key in _FLAGS:
        if not isinstance(getattr(new, key), bool):
            out.append((key, f"got {getattr(new, key)!r}; allowed: true, false"))
    if not isinstance(new.enforcement, Enforcement):
        allowed = ", ".join(e.value for e in Enforcement)
        out.append(("enforcement", f"got {new.enforcement!r}; allowed: {allowed}"))
    for d, h in sorted(new.warm_headroom.items()):
        key = f"warm_headroom.{d}"
        if d not in dims.PLACED:
            out.append((key, f"unknown dimension; allowed: {', '.join(dims.PLACED)}"))
            continue
        cap = capacity[dims.PLACED.index(d)]
        if isinstance(h, bool) or not isinstance(h, int | float) or not 0 <= h <= cap + 1e-9:
            out.append((key, f"got {h!r} in a pool of {cap:g}; allowed: 0 to {cap:g}"))
    if not out:
        for key, why in FIXED.items():
            if getattr(old, key) != getattr(new, key):
                was, given = _spelled(old, key), _spelled(new, key)
                out.append(
                    (
                        key,
                        f"cannot change on a live broker ({was} in force, {given} given): "
                        f"{why}; allowed: {was}. To serve {given}, start a broker on a new "
                        "state directory",
                    )
                )
    return out


def _spelled(policy: PolicySpec, key: str) -> str:
    v = spec_to_dict(policy).get(key)
    return "off" if v is None else str(v)
