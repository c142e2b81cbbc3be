"""Canonical JSON for events and decisions: the journal's byte format.

Keys are sorted and floats are written with ``repr`` so the same values always give the
same bytes. Mappings in events and decisions are plain dicts of str → scalar.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections.abc import Mapping
from typing import Any

from bursar.broker.decisions import DECISION_TYPES, Decision, LeasePath
from bursar.broker.envelope import CampaignSpec, DimEnvelope, LeaseClass
from bursar.broker.events import EVENT_TYPES, Event
from bursar.broker.reasons import Reason
from bursar.broker.shape import shape_from_dict

_SCALARS = (str, int, bool, type(None))
_FIELDS: dict[type, tuple[str, ...]] = {}


_OMITTED: dict[type, tuple[tuple[str, Any], ...]] = {}

OMIT_DEFAULT = {"omit_default": True}
"""Field metadata: leave the field out of the canonical form while it holds its default.
A field added to an event later is marked so, and journals written before it existed keep
their bytes (and hashes); decoding a missing field gives the default."""


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        fields = dataclasses.fields(cls)
        names = _FIELDS[cls] = tuple(f.name for f in fields)
        _OMITTED[cls] = tuple((f.name, f.default) for f in fields if f.metadata.get("omit_default"))
    return names


_PASS = frozenset({str, int, bool, type(None)})
"""Types written as they are (exact types: an enum built on int or str is not one of them)."""


def _finite(v: Any) -> bool:
    return type(v) is float and v - v == 0.0


def plain(x: Any) -> Any:
    """Enums to values, dataclasses and mappings to dicts, non-finite floats to strings."""
    # This runs on every journal append: exact-type checks first, and the scalars of a
    # dict or list are taken as they are without a call per value.
    t = type(x)
    if t in _PASS:
        return x
    if t is float:
        if x - x == 0.0:  # finite
            return x
        return "inf" if x > 0 else ("-inf" if x < 0 else "nan")
    if t is dict:
        return {
            (k if type(k) is str else str(k)): (v if type(v) in _PASS or _finite(v) else plain(v))
            for k, v in x.items()
        }
    names = _FIELDS.get(t)
    if names is not None or (dataclasses.is_dataclass(x) and not isinstance(x, type)):
        if t is CampaignSpec:
            return _campaign(x)
        if names is None:
            names = _field_names(t)
        out = {name: plain(getattr(x, name)) for name in names}
        for name, default in _OMITTED[t]:
            if out[name] == default:
                del out[name]
        return out
    if isinstance(x, _SCALARS):
        return x
    if isinstance(x, float):
        return plain(float(x))
    if isinstance(x, enum.Enum):
        return x.value
    if isinstance(x, tuple | list):
        return [v if type(v) in _PASS or _finite(v) else plain(v) for v in x]
    if isinstance(x, dict | Mapping):
        return {str(k): plain(v) for k, v in x.items()}
    return x


def _campaign(x: CampaignSpec) -> dict[str, Any]:
    return {
        "name": x.name,
        "lease_class": x.lease_class.value,
        "preemptible": x.preemptible,
        "envelopes": {d: plain(e) for d, e in sorted(x.envelopes.items())},
    }


def to_dict(obj: Event | Decision) -> dict[str, Any]:
    d = plain(obj)
    d["kind"] = obj.kind
    return d


def json_safe(x: Any) -> Any:
    """``x`` with every infinite or NaN float (nested in dicts, lists, tuples) as None:
    JSON has no infinity or NaN, and reports write e.g. an unmeasured latency as null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [json_safe(v) for v in x]
    return x


def dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def encode(obj: Event | Decision) -> str:
    return dumps(to_dict(obj))


def campaign_from_dict(d: Mapping[str, Any]) -> CampaignSpec:
    return CampaignSpec(
        name=d["name"],
        lease_class=LeaseClass(d["lease_class"]),
        preemptible=bool(d["preemptible"]),
        envelopes={k: DimEnvelope(**v) for k, v in d["envelopes"].items()},
    )


_FIELD_DECODERS = {
    "spec": campaign_from_dict,
    "lease_class": lambda v: None if v is None else LeaseClass(v),
    "reason": Reason,
    "path": LeasePath,
    "nodes": tuple,
    "also": tuple,
    "shape": shape_from_dict,
}


def _num(v: Any) -> Any:
    if v == "inf":
        return math.inf
    return v


def _from_dict(types: Mapping[str, type], d: Mapping[str, Any]) -> Any:
    d = dict(d)
    cls = types[d.pop("kind")]
    kwargs = {}
    for k, v in d.items():
        dec = _FIELD_DECODERS.get(k)
        kwargs[k] = dec(v) if dec is not None else _num(v)
    return cls(**kwargs)


def event_from_dict(d: Mapping[str, Any]) -> Event:
    return _from_dict(EVENT_TYPES, d)


def decision_from_dict(d: Mapping[str, Any]) -> Decision:
    return _from_dict(DECISION_TYPES, d)


def decode_event(s: str) -> Event:
    return event_from_dict(json.loads(s))


def decode_decision(s: str) -> Decision:
    return decision_from_dict(json.loads(s))
