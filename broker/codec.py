"""Canonical JSON for events and decisions: the journal's byte format.

Keys are sorted and floats are written with ``repr`` so the same values always give the
same bytes. Mappings in events and decisions are plain dicts of str → scalar.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import re
from collections.abc import Mapping
from typing import Any

import orjson

from bursar.broker.decisions import DECISION_TYPES, Decision, LeasePath
from bursar.broker.elastic import intent_from_dict
from bursar.broker.envelope import CampaignSpec, DimEnvelope, LeaseClass
from bursar.broker.events import EVENT_TYPES, Event
from bursar.broker.policy import PolicySpec
from bursar.broker.reasons import Reason
from bursar.broker.shape import shape_from_dict
from bursar.broker.specs import spec_from_dict, spec_to_dict

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
            (k if type(k) is str else str(k)): (
                v if (tv := type(v)) in _PASS or (tv is float and v - v == 0.0) else plain(v)
            )
            for k, v in x.items()
        }
    names = _FIELDS.get(t)
    if names is not None or (dataclasses.is_dataclass(x) and not isinstance(x, type)):
        if t is CampaignSpec:
            return _campaign(x)
        if t is PolicySpec:
            # As the journal's meta stores a policy: every key, values by declared type.
            return spec_to_dict(x)
        if names is None:
            names = _field_names(t)
        out = {}
        for name in names:
            v = getattr(x, name)
            tv = type(v)
            out[name] = v if tv in _PASS or (tv is float and v - v == 0.0) else plain(v)
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


def reference_dumps(obj: Any) -> str:
    """The canonical form by definition: the standard library's encoder, keys sorted, no
    spaces, ASCII only, floats as ``repr``, NaN and infinity refused. :func:`dumps` gives
    the same text faster; this one is what it is checked against."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


# orjson writes the same text as the reference for almost everything the journal holds,
# and an entry takes a third of the time (the checks below included). Where it may not,
# its output shows it, and the reference writes that value instead:
# * floats under 1e-4: ``repr`` writes ``1e-05`` and ``1e-07``, orjson ``0.00001`` and
#   ``1e-7`` (a fixed form with four or more zeros after the point, or a one-digit negative
#   exponent; every other float is written alike, checked over millions of them and by
#   the property test);
# * characters outside printable ASCII: the reference escapes them (``\u00e9``, and DEL
#   as ``\u007f``), orjson writes them as they are (any byte from 0x7f up);
# * NaN and infinity, which the reference refuses and orjson writes as ``null``: only
#   :func:`dumps` looks for ``null`` (a value given to it may hold them); the journal's
#   path goes through :func:`plain` first, which has turned them into strings;
# * what orjson cannot write at all (integers past 64 bits, keys that are not strings,
#   lone surrogates, float subclasses) raises, and the reference decides. One difference
#   stays: an enum that is neither a str nor an int, which the reference refuses, orjson
#   writes as its value; :func:`plain` has turned every enum into its value before.
_FLOAT_FORMS = re.compile(rb"0\.0000|e-\d(?!\d)")
_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME


def _refuse(obj: Any) -> Any:
    # orjson's hook for what it does not write itself: the reference decides (it refuses
    # it with its own error, or writes it its own way).
    raise TypeError


def _fast(obj: Any, nulls: bool) -> str:
    try:
        out = orjson.dumps(obj, default=_refuse, option=_OPTIONS)
    except TypeError:
        return reference_dumps(obj)
    # Plain substring tests first (a regular expression over every entry costs more than
    # the encoding saves); the float forms' expression only runs when one may be there.
    if (
        not out.isascii()
        or b"\x7f" in out
        or ((b"e-" in out or b"0.0000" in out) and _FLOAT_FORMS.search(out) is not None)
        or (nulls and b"null" in out)
    ):
        return reference_dumps(obj)
    return out.decode("ascii")


def dumps(obj: Any) -> str:
    """Canonical JSON: the same text as :func:`reference_dumps`, faster."""
    return _fast(obj, True)


def dumps_plain(obj: Any) -> str:
    """:func:`dumps` for what :func:`plain` returned (no NaN or infinity left in it)."""
    return _fast(obj, False)


def encode(obj: Event | Decision) -> str:
    return dumps_plain(to_dict(obj))


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
    "intent": intent_from_dict,
    "policy": lambda v: spec_from_dict(PolicySpec, v),
    "changes": lambda v: {k: tuple(x) for k, x in v.items()},
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
