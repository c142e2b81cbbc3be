"""The pool and policy specs as canonical JSON-able dicts, and where two of them differ.

The journal stores its specs in this form (``meta``), and a policy change carries the new
policy in it (``events.ApplyPolicy``), so that the same spec always gives the same bytes.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from bursar.broker.errors import JournalError
from bursar.broker.policy import NodeGroup, PolicySpec, PoolSpec

__all__ = ["Spec", "shown", "spec_diff", "spec_from_dict", "spec_to_dict"]

Spec = PoolSpec | PolicySpec | NodeGroup
S = TypeVar("S", PoolSpec, PolicySpec, NodeGroup)


def _encode_value(value: Any, hint: Any) -> Any:
    """Normalise by the declared type, so that ``60`` and ``60.0`` store the same bytes."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return _encode_value(value, inner)
    if hint is float:
        x = float(value)
        if not math.isfinite(x):
            # Canonical JSON forbids NaN/Infinity; spell them as the codec does.
            return "inf" if x > 0 else ("-inf" if x < 0 else "nan")
        return x
    if hint is int:
        return int(value)
    if hint is bool:
        return bool(value)
    if hint is str:
        return str(value)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(value).value
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return spec_to_dict(value)
    if origin is tuple:
        (inner, _ellipsis) = typing.get_args(hint)
        return [_encode_value(v, inner) for v in value]
    if origin is Mapping or origin is dict:
        _key, inner = typing.get_args(hint)
        return {str(k): _encode_value(v, inner) for k, v in sorted(value.items())}
    raise TypeError(f"cannot store a spec field of type {hint!r}")


def _decode_value(value: Any, hint: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return _decode_value(value, inner)
    if hint is float:
        return float(value)  # float("inf") / float("nan") read the spelled-out forms back
    if hint in (int, bool, str):
        return hint(value)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(value)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return spec_from_dict(hint, value)
    if origin is tuple:
        (inner, _ellipsis) = typing.get_args(hint)
        return tuple(_decode_value(v, inner) for v in value)
    if origin is Mapping or origin is dict:
        _key, inner = typing.get_args(hint)
        return {str(k): _decode_value(v, inner) for k, v in value.items()}
    raise TypeError(f"cannot read a spec field of type {hint!r}")


def spec_to_dict(spec: Spec) -> dict[str, Any]:
    """A PoolSpec, PolicySpec or NodeGroup as a canonical JSON-able dict.

    Every field is written, defaults included, so a journal keeps meaning the same thing
    if a later version changes a default; only a field marked ``omit_default`` (added
    after journals existed) is left out while it holds its default. Values are normalised to their declared types
    (ints for counts, floats for quantities, enum values for enums).
    """
    if not (dataclasses.is_dataclass(spec) and not isinstance(spec, type)):
        raise TypeError(f"expected a spec dataclass, got {type(spec).__name__}")
    hints = typing.get_type_hints(type(spec))
    return {
        f.name: _encode_value(getattr(spec, f.name), hints[f.name])
        for f in dataclasses.fields(spec)
        # A setting added later is written only once it differs from its default, so that
        # journals written before it existed keep their bytes.
        if not (f.metadata.get("omit_default") and getattr(spec, f.name) == f.default)
    }


_MISSING = object()


def spec_diff(stored: Mapping[str, Any], given: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """Where two :func:`spec_to_dict` forms differ: ``(dotted.key, stored, given)`` per
    differing leaf, sorted by key; a key one side lacks has ``None`` on that side."""
    out: list[tuple[str, Any, Any]] = []

    def walk(prefix: str, a: Any, b: Any) -> None:
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            for k in sorted(set(a) | set(b)):
                walk(f"{prefix}{k}.", a.get(k, _MISSING), b.get(k, _MISSING))
            return
        if a != b:
            key = prefix[:-1]
            out.append((key, None if a is _MISSING else a, None if b is _MISSING else b))

    walk("", stored, given)
    return out


def shown(value: Any) -> str:
    """A spec value as an error message shows it: JSON for tables, ``repr`` for scalars."""
    if isinstance(value, Mapping | list | tuple):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return repr(value)


def spec_from_dict(cls: type[S], d: Mapping[str, Any]) -> S:
    """Inverse of :func:`spec_to_dict`. Missing keys take the dataclass default.

    Unknown keys are refused: they mean the journal was written by a version with
    settings this one does not have, and replaying without them would decide differently.
    """
    if not isinstance(d, Mapping):
        raise JournalError(f"{cls.__name__}: expected an object, got {type(d).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise JournalError(
            f"{cls.__name__}: unknown field(s) {', '.join(unknown)}; the journal was written "
            "by a newer Bursar"
        )
    try:
        kwargs = {k: _decode_value(v, hints[k]) for k, v in d.items()}
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise JournalError(f"{cls.__name__}: cannot read stored spec: {exc}") from exc
