"""Request shapes: how a lease is cut into pieces that each fit one node.

A request says how it may be split, in the terms Slurm users know (``Shape``); the engine
resolves it once, at request time, into a ``Demand``: a *unit* vector and a *count* of
units, with the rule for how units may be grouped into node pieces.

* ``TOTAL`` (no shape, today's behaviour): any split, but every piece keeps the request's
  ratios: 8 GPU + 64 CPU + 256 GB over two nodes is 2 x (4 GPU, 32 CPU, 128 GB). A
  multi-dimensional request of whole numbers is cut into whole multiples of its size over
  their greatest common divisor (here 1 GPU, 8 CPU, 32 GB), so that every piece holds whole
  GPUs, cores and GB; one with a fraction somewhere, into units of its first named
  dimension (``gpu``, else ``cpu``, else ``mem_gb``), whole ones when that amount is whole.
  The coarser the common divisor, the fewer splits exist: 7 GPU + 13 CPU is one piece.
  A one-dimensional request is split freely, as before shapes existed.
* ``NODES`` (``nodes`` x ``per_node``, like ``--nodes N --gpus-per-node G``): exactly N
  pieces equal to the per-node vector, on N distinct nodes.
* ``WHOLE`` (``exclusive``, like ``--exclusive``): N whole empty nodes; the lease holds
  their full capacity. The nodes are all of one kind, fixed at request time: the smallest
  node kind of the pool (by the primary dimension, then the others) that holds
  ``per_node`` (any node when it is empty), so that the lease's size is known before it is
  placed (admission, buckets and the price read it).

``cpus_per_gpu`` and ``mem_per_gpu`` (like ``--cpus-per-gpu``, ``--mem-per-gpu``) add CPUs
and memory to a request that names GPUs only (its size, or its per-node vector).

``take`` chooses nodes for a number of units: best fit (the node left with the least free
capacity after the piece, in the primary dimension, then the others; ties by node index),
partly used nodes before empty ones, empty ones before nodes that must be booted. It is
one pass over the candidates for ``TOTAL`` (two when no single node holds the whole
amount) and O(n log N) for ``NODES`` and ``WHOLE`` (the N best of n candidates).
"""

from __future__ import annotations

import enum
import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bursar.broker import dims
from bursar.broker.errors import ErrorCode, RequestError

EPS = 1e-9

MAX_NODES = 100_000
"""The most nodes one request may name (a bound for the wire; the pool bounds it too)."""


@dataclass(frozen=True, slots=True)
class Shape:
    """How a request is shaped; the default (every field at its zero) is "total units"."""

    nodes: int = 0
    """Exactly this many node pieces (0: any split). With ``exclusive``: whole nodes."""
    per_node: Mapping[str, float] = field(default_factory=dict)
    """Each piece (with ``nodes``); with ``exclusive``, what each whole node must hold."""
    exclusive: bool = False
    cpus_per_gpu: float = 0.0
    mem_per_gpu: float = 0.0
    """GB per GPU."""

    @property
    def is_default(self) -> bool:
        return (
            self.nodes == 0
            and not self.per_node
            and not self.exclusive
            and self.cpus_per_gpu == 0
            and self.mem_per_gpu == 0
        )


def shape_from_dict(d: Mapping[str, Any] | None) -> Shape | None:
    """The codec's decoder for a journaled shape (None: the request had none)."""
    if d is None:
        return None
    return Shape(
        nodes=int(d.get("nodes", 0)),
        per_node=dict(d.get("per_node", {})),
        exclusive=bool(d.get("exclusive", False)),
        cpus_per_gpu=float(d.get("cpus_per_gpu", 0.0)),
        mem_per_gpu=float(d.get("mem_per_gpu", 0.0)),
    )


class Mode(enum.Enum):
    # Identity hash: members are singletons, and Enum's own hash runs Python code on every
    # dict or set look-up (the engine keys its indexes and memos with them).
    __hash__ = object.__hash__

    TOTAL = "total"
    NODES = "nodes"
    WHOLE = "whole"


@dataclass(frozen=True, slots=True)
class Demand:
    """A request resolved against the pool: ``count`` units of ``unit`` (see the module)."""

    mode: Mode
    unit: dims.Vec
    count: float
    whole: bool
    """Pieces hold whole units (always for NODES and WHOLE, where a piece is one unit)."""
    size: dims.Vec
    """The lease's size: ``count`` x ``unit``."""

    _hash: int = field(init=False, repr=False, compare=False)
    """The hash, computed once (and again on load, never stored: member hashes differ
    between processes)."""
    ident: tuple[Any, ...] = field(init=False, repr=False, compare=False)
    """The fields as a plain tuple, equal exactly when the demands are: what the queue's
    pool keys and the pass's memos hold instead of the demand itself, since a key is
    hashed many times per event and a plain tuple hashes without calling Python code
    (``__hash__`` above does, once per look-up)."""

    def __post_init__(self) -> None:
        ident = _fields(self)
        object.__setattr__(self, "ident", ident)
        object.__setattr__(self, "_hash", hash(ident))

    def __hash__(self) -> int:
        return self._hash

    def __getstate__(self) -> tuple[Any, ...]:
        return _fields(self)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        for name, value in zip(_FIELDS, state, strict=True):
            object.__setattr__(self, name, value)
        self.__post_init__()

    @property
    def any_split(self) -> bool:
        """One dimension, split freely: every aggregate fit is a node-shaped fit."""
        return self.mode is Mode.TOTAL and sum(1 for x in self.size if x > EPS) == 1

    def units(self, v: dims.Vec) -> float:
        """How many units the part ``v`` of this demand is."""
        j = next(j for j, u in enumerate(self.unit) if u > 0)
        return v[j] / self.unit[j]


_FIELDS = ("mode", "unit", "count", "whole", "size")


def _fields(d: Demand) -> tuple[Any, ...]:
    return (d.mode, d.unit, d.count, d.whole, d.size)


def total(size: dims.Vec) -> Demand:
    """The demand of a request with no shape: any split keeping the size's ratios."""
    named = [x for x in size if x > EPS]
    if len(named) > 1 and all(abs(x - round(x)) < EPS for x in named):
        # Whole numbers in every dimension: the unit is the size over their greatest common
        # divisor, so that every piece holds whole GPUs, cores and GB in the size's ratios
        # (a resource manager allocates no fraction of a core).
        g = math.gcd(*(round(x) for x in named))
        return Demand(Mode.TOTAL, tuple(x / g for x in size), float(g), True, size)
    lead = next((j for j, x in enumerate(size) if x > EPS), 0)
    amount = size[lead]
    unit = tuple(x / amount for x in size) if amount > 0 else size
    whole = len(named) > 1 and abs(amount - round(amount)) < EPS
    return Demand(Mode.TOTAL, unit, amount, whole, size)


def units_on(free: dims.Vec, d: Demand) -> float:
    """How many of the demand's units fit in ``free`` (0 or 1 for one-piece-per-node modes)."""
    unit = d.unit
    if d.mode is not Mode.TOTAL:
        return 1.0 if dims.fits(unit, free) else 0.0
    k = math.inf
    for j in range(len(unit)):
        if unit[j] > 0.0:
            k = min(k, free[j] / unit[j])
    if k <= 0.0 or k == math.inf:
        return 0.0
    return math.floor(k + EPS) if d.whole else k


def limit_units(limit: dims.Vec, d: Demand) -> float:
    """How many units an aggregate limit (a warm limit, the cold capacity) allows."""
    if d.mode is Mode.TOTAL:
        return units_on(limit, d)
    k = math.inf
    for j, u in enumerate(d.unit):
        if u > 0.0:
            k = min(k, limit[j] / u)
    return 0.0 if k <= 0.0 else math.floor(k + EPS)


def piece(d: Demand, units: float) -> dims.Vec:
    if d.mode is Mode.TOTAL and abs(units - d.count) <= EPS:
        return d.size
    return tuple(u * units for u in d.unit)


Candidate = tuple[int, int, dims.Vec]
"""(preference group, node index, capacity available to the demand there); lower groups
are used first: partly used nodes, then empty ones, then nodes still to be booted."""


def take(
    d: Demand,
    cands: Sequence[Candidate],
    want: float,
    limit: float,
    primary: int,
    best_fit: bool = True,
) -> list[tuple[int, float]]:
    """Choose nodes for up to ``min(want, limit)`` units: (node index, units there).

    Best fit first (see the module); a ``TOTAL`` amount no single node holds is split over
    partly used nodes in index order, then empty ones, then nodes to boot. Without
    ``best_fit`` a ``TOTAL`` amount is always split in group order (the reclaim path's
    groups are the victims' order). May come back short: the caller compares the sum with
    what it needs.
    """
    goal = min(want, limit)
    if d.mode is Mode.TOTAL and d.whole:
        goal = float(math.floor(goal + EPS))
    if goal <= EPS:
        return []
    if d.mode is not Mode.TOTAL:
        n = round(goal)
        keyed = []
        for g, i, avail in cands:
            if dims.fits(d.unit, avail):
                left = dims.sub(avail, d.unit)
                keyed.append((g, left[primary], left[0], left[1], left[2], i))
        return [(k[-1], 1.0) for k in heapq.nsmallest(n, keyed)]
    # One pass: each candidate's room in units (inline: this runs on every placement),
    # the best single node that holds everything, and the rooms for a split.
    need = piece(d, goal)
    named = [(j, u) for j, u in enumerate(d.unit) if u > 0.0]
    whole = d.whole
    rooms: list[tuple[int, int, float]] = []
    best: tuple[Any, ...] | None = None
    for g, i, avail in cands:
        k = math.inf
        for j, u in named:
            x = avail[j] / u
            if x < k:
                k = x
        if whole:
            k = float(math.floor(k + EPS))
        if k <= EPS or k == math.inf:
            continue
        rooms.append((g, i, k))
        if best_fit and k + EPS >= goal:
            left = (avail[0] - need[0], avail[1] - need[1], avail[2] - need[2])
            key = (g, left[primary], left[0], left[1], left[2], i)
            if best is None or key < best:
                best = key
    if best is not None:
        return [(best[-1], goal)]
    rooms.sort(key=_group)  # stable: index order within a group
    out = []
    rest = goal
    for _, i, k in rooms:
        t = min(k, rest)
        out.append((i, t))
        rest -= t
        if rest <= EPS:
            break
    return out


def _group(room: tuple[int, int, float]) -> int:
    return room[0]


def total_units(takes: Iterable[tuple[int, float]]) -> float:
    return sum(u for _, u in takes)


# --------------------------------------------------------------------------- resolution


def _bad(field_: str, message: str) -> RequestError:
    return RequestError(ErrorCode.INVALID_ARGUMENT, field_, message)


def _number(x: object, field_: str) -> float:
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x) or x < 0:
        raise _bad(field_, f"must be a finite number >= 0 (got {x!r})")
    return float(x)


def _vector(m: object, field_: str) -> dims.Vec:
    if not isinstance(m, Mapping):
        raise _bad(field_, "give units per dimension, e.g. {'gpu': 4}")
    for d, x in m.items():
        if d not in dims.PLACED:
            raise _bad(field_, f"unknown dimension {d!r}; allowed: {', '.join(dims.PLACED)}")
        _number(x, f"{field_}.{d}")
    return dims.vec(m)


def _with_ratios(v: dims.Vec, shape: Shape) -> dims.Vec:
    out = list(v)
    for j, ratio, name in (
        (1, shape.cpus_per_gpu, "cpus_per_gpu"),
        (2, shape.mem_per_gpu, "mem_per_gpu"),
    ):
        if ratio <= 0:
            continue
        f = f"shape.{name}"
        if v[0] <= EPS:
            raise _bad(f, "applies to a request that names GPUs; this one names none")
        if v[j] > EPS:
            raise _bad(f, f"the request names {dims.PLACED[j]} itself; give one or the other")
        out[j] = v[0] * ratio
    return tuple(out)


def _describe(v: dims.Vec) -> str:
    return ", ".join(f"{x:g} {dims.UNITS[d]}" for d, x in dims.as_dict(v).items()) or "nothing"


def resolve(
    size: Mapping[str, float], shape: Shape | None, kinds: Sequence[tuple[dims.Vec, int]]
) -> Demand:
    """The demand of a request of ``size`` (checked per dimension by the caller) shaped by
    ``shape`` on a pool whose node kinds are ``kinds`` (capacity, count); RequestError
    (the field and its allowed range) for a shape that cannot be met."""
    base = dims.vec(size)
    if shape is None:
        return total(base)
    if not isinstance(shape, Shape):
        raise _bad("shape", "expected a Shape")
    n_nodes = sum(c for _, c in kinds)
    nodes = shape.nodes
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 0 <= nodes <= n_nodes:
        raise _bad(
            "shape.nodes",
            f"must be a whole number from 0 to {n_nodes}, the pool's node count (got {nodes!r})",
        )
    per = _vector(shape.per_node, "shape.per_node")
    _number(shape.cpus_per_gpu, "shape.cpus_per_gpu")
    _number(shape.mem_per_gpu, "shape.mem_per_gpu")
    if not isinstance(shape.exclusive, bool):
        raise _bad("shape.exclusive", "must be true or false")
    largest = max((cap for cap, _ in kinds), key=_size_key, default=dims.ZERO)
    if shape.exclusive:
        if shape.cpus_per_gpu or shape.mem_per_gpu:
            raise _bad(
                "shape.exclusive",
                "a whole node comes with all its CPUs and memory; drop cpus_per_gpu and mem_per_gpu",
            )
        if not dims.is_zero(base):
            raise _bad(
                "size",
                "leave it empty for an exclusive request: the lease holds its nodes' whole capacity",
            )
        n = nodes or 1
        fitting = sorted((cap for cap, _ in kinds if dims.fits(per, cap)), key=_size_key)
        if not fitting:
            raise _bad(
                "shape.per_node",
                f"{_describe(per)} fits no node; the largest node has {_describe(largest)}",
            )
        kind = fitting[0]
        have = sum(c for cap, c in kinds if cap == kind)
        if n > have:
            raise _bad(
                "shape.nodes",
                f"must be from 1 to {have}: the pool has {have} nodes of the smallest kind that holds the request ({_describe(kind)})",
            )
        return Demand(Mode.WHOLE, kind, float(n), True, tuple(x * n for x in kind))
    if nodes == 0:
        if not dims.is_zero(per):
            raise _bad("shape.nodes", f"give the number of nodes (1 to {n_nodes}) with per_node")
        return total(_with_ratios(base, shape))
    if dims.is_zero(per):
        if dims.is_zero(base):
            raise _bad("size", "give a size or shape.per_node")
        per = tuple(x / nodes for x in base)
    elif not dims.is_zero(base):
        want = tuple(x * nodes for x in per)
        if not (dims.fits(base, want) and dims.fits(want, base)):
            raise _bad("size", f"must be nodes x per_node ({_describe(want)}) or left empty")
    per = _with_ratios(per, shape)
    if dims.is_zero(per):
        raise _bad("shape.per_node", "at least one dimension must be greater than zero")
    holding = sum(c for cap, c in kinds if dims.fits(per, cap))
    if holding == 0:
        raise _bad(
            "shape.per_node",
            f"{_describe(per)} fits no node; the largest node has {_describe(largest)}",
        )
    if nodes > holding:
        raise _bad(
            "shape.nodes",
            f"must be from 1 to {holding}: only {holding} nodes hold {_describe(per)}",
        )
    return Demand(Mode.NODES, per, float(nodes), True, tuple(x * nodes for x in per))


def check_pool(d: Demand, kinds: Sequence[tuple[dims.Vec, int]]) -> None:
    """RequestError when no placement on the whole, empty pool could hold ``d``."""
    if d.mode is not Mode.TOTAL:
        return  # ``resolve`` counted the nodes that hold a piece
    room = sum(units_on(cap, d) * c for cap, c in kinds)
    if room + EPS < d.count:
        largest = max((cap for cap, _ in kinds), key=_size_key, default=dims.ZERO)
        raise _bad(
            "size",
            f"{_describe(d.size)} cannot be cut into pieces that each fit one node and keep "
            f"its ratios; the largest node has {_describe(largest)}",
        )


def _size_key(v: dims.Vec) -> tuple[float, ...]:
    return (v[0], v[1], v[2]) if v[0] > 0 else (v[1], v[2], v[0])
