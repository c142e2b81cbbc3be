"""The pool-over-time chart's data: every change of a campaign's holdings, at its time, from
the journal.

A campaign's holdings change only with a decision: a grant adds the lease's size, an
elastic lease's resize adds its ``delta``, and a release, expiry or revocation takes the
lease's size at its end away. So the chart is a step function read from the journal's
decision index, never a sample taken when a page happened to ask: it survives a page
reload and a broker restart, and it shows a lease from its grant to its end.

:func:`build` reads the window's decisions (the last ``WINDOW_S`` seconds, at most
``ENTRY_WINDOW`` journal entries) and anchors them on what the engine holds now: the level
at the window's start is the holdings now less every change inside the window.
:meth:`Series.extend` then folds in each decision committed since, read from the same
index. The fold itself (:func:`fold_change`) is a pure function of a decision and the
sizes of the leases it knows.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bursar.broker import dims
from bursar.broker.service.auth import Principal
from bursar.broker.service.core import ServiceCore

__all__ = [
    "CHANGES",
    "ENTRY_WINDOW",
    "MAX_POINTS",
    "WINDOW_S",
    "Point",
    "Series",
    "build",
    "fold_change",
]

WINDOW_S = 3600.0
"""How far back the chart reaches (seconds before now)."""

ENTRY_WINDOW = 50_000
"""Journal entries looked back through at most when the chart is first built: on a busy
broker the window then starts later than ``WINDOW_S`` ago (and says so: ``start``)."""

MAX_POINTS = 1500
"""Changes kept; older ones are folded into the level at the start (which moves up)."""

CHANGES = frozenset({"grant", "resize", "release", "expire", "revoke"})
"""The decision kinds that change a campaign's holdings (the engine's ``_set_held`` runs
for a grant and a lease's end; an elastic lease's quiet steps are reported by its
``resize``)."""

_PAGE = 5000

Held = dict[str, float]
SizeOf = Callable[[str, int], Held]
"""A lease's size just before journal entry ``seq`` (for a lease granted before what the
series has read)."""


@dataclass(frozen=True, slots=True)
class Point:
    """One change: after decision ``kind`` of lease ``lease_id`` (journal entry ``seq``) at
    ``at``, ``campaign`` holds ``held``."""

    seq: int
    at: float
    campaign: str
    kind: str
    lease_id: str
    held: Held


def _plus(a: Mapping[str, float], b: Mapping[str, float], sign: float = 1.0) -> Held:
    out = dict(a)
    for d, v in b.items():
        out[d] = out.get(d, 0.0) + sign * float(v)
    # Nothing held is no entry (as ``dims.as_dict`` says it), and rounding of repeated sums
    # must not show as a sliver of a GPU held.
    return {d: v for d, v in out.items() if abs(v) >= 1e-9}


def fold_change(d: Mapping[str, Any], sizes: dict[str, Held], seq: int, size_of: SizeOf) -> Held:
    """What decision ``d`` adds to its campaign's holdings (negative for an end), keeping
    ``sizes`` (live lease id → its size) up to date."""
    kind, lid = d["kind"], d.get("lease_id", "")
    if kind == "grant":
        sizes[lid] = {k: float(v) for k, v in d["size"].items()}
        return dict(sizes[lid])
    if kind == "resize":
        sizes[lid] = {k: float(v) for k, v in d["size"].items()}
        return {k: float(v) for k, v in d.get("delta", {}).items()}
    size = sizes.pop(lid, None)
    if size is None:
        size = size_of(lid, seq)
    return {k: -v for k, v in size.items()}


@dataclass
class Series:
    """Every campaign's holdings from ``start`` on: ``base`` at ``start``, then ``points``
    (oldest first); ``seq`` is the last journal entry read."""

    start: float
    base: dict[str, Held]
    points: deque[Point]
    seq: int
    sizes: dict[str, Held] = field(default_factory=dict)
    level: dict[str, Held] = field(default_factory=dict)
    """Each campaign's holdings after the last point."""
    window_s: float = WINDOW_S

    def add(self, seq: int, d: Mapping[str, Any], delta: Held) -> None:
        """Decision ``d`` of entry ``seq`` changed its campaign's holdings by ``delta``."""
        c = str(d["campaign"])
        held = _plus(self.level.get(c, {}), delta)
        self.push(Point(seq, float(d["at"]), c, d["kind"], d.get("lease_id", ""), held))

    def push(self, p: Point) -> None:
        if len(self.points) == self.points.maxlen:
            self._drop()
        self.points.append(p)
        self.level[p.campaign] = p.held

    def _drop(self) -> None:
        """The oldest point becomes the level at the start."""
        old = self.points.popleft()
        self.base[old.campaign] = old.held
        self.start = old.at

    def trim(self, t: float) -> None:
        """Start at ``t`` at the latest: what changed before it is the level at the start (as
        a series built afresh then would say)."""
        while self.points and self.points[0].at < t:
            self._drop()
        self.start = max(self.start, t)

    def extend(self, core: ServiceCore) -> None:
        """Fold in the decisions committed since ``seq`` (only committed ones are indexed)."""
        journal = core.runtime.journal
        settled_end = journal.last_seq if not core.runtime.uncommitted else 0
        rows = _rows(core, self.seq + 1, 0.0)
        size_of = _size_of(core)
        for seq, d in rows:
            self.add(seq, d, fold_change(d, self.sizes, seq, size_of))
        self.seq = max(self.seq, settled_end, rows[-1][0] if rows else 0)
        self.trim(core.now() - self.window_s)

    def view(self, who: Principal, now: float) -> dict[str, Any]:
        """The series as the page reads it, with only the campaigns ``who`` may see."""
        return {
            "start": self.start,
            "now": now,
            "base": {c: h for c, h in sorted(self.base.items()) if who.may_see(c)},
            "points": [
                {
                    "seq": p.seq,
                    "at": p.at,
                    "campaign": p.campaign,
                    "kind": p.kind,
                    "lease_id": p.lease_id,
                    "held": p.held,
                }
                for p in self.points
                if who.may_see(p.campaign)
            ],
        }


def _rows(core: ServiceCore, start_seq: int, since: float) -> list[tuple[int, dict[str, Any]]]:
    """The holdings-changing decisions from entry ``start_seq`` (at or after ``since``)."""
    out: list[tuple[int, dict[str, Any]]] = []
    while start_seq:
        page, start_seq = core.runtime.journal.find_decisions(
            start_seq=start_seq, kinds=CHANGES, since=since, limit=_PAGE
        )
        out.extend((seq, d) for seq, _i, d in page)
    return out


def _size_of(core: ServiceCore) -> SizeOf:
    """A lease's size before entry ``seq`` from its own decisions in the journal (its grant
    and resizes, by the index on the lease id); the engine's record of the ended lease if
    the journal no longer has them (archived)."""

    def size_of(lease_id: str, seq: int) -> Held:
        history, _ = core.runtime.journal.find_decisions(
            ref=lease_id, kinds={"grant", "resize"}, limit=_PAGE
        )
        sizes = [d["size"] for s, _i, d in history if s < seq and d.get("lease_id") == lease_id]
        if sizes:
            return {k: float(v) for k, v in sizes[-1].items()}
        ended = core.engine.ended.get(lease_id)
        return dims.as_dict(ended.size) if ended is not None else {}

    return size_of


def _now_held(core: ServiceCore) -> dict[str, Held]:
    return {n: dims.as_dict(c.held) for n, c in core.engine.campaigns.items()}


def _start(core: ServiceCore, first_seq: int, since: float, now: float) -> float:
    """Where the chart begins: ``since``, or later where the journal read begins later (a
    young journal, or the entry window cut it there); ``now`` for an empty journal."""
    first, _ = core.runtime.journal.find_decisions(start_seq=first_seq, limit=1)
    return max(since, float(first[0][2]["at"])) if first else now


def build(core: ServiceCore, *, window_s: float = WINDOW_S, max_points: int = MAX_POINTS) -> Series:
    """The series of the last ``window_s`` seconds, from the journal, anchored on the
    engine's holdings now. Call it with nothing uncommitted (``core.settled()``), so that
    the engine and the journal's index say the same."""
    journal = core.runtime.journal
    now = core.now()
    last = journal.last_seq
    first_seq = max(1, last - ENTRY_WINDOW + 1)
    since = now - window_s
    rows = _rows(core, first_seq, since)
    size_of = _size_of(core)
    sizes: dict[str, Held] = {}
    deltas = [(seq, d, fold_change(d, sizes, seq, size_of)) for seq, d in rows]
    # The level at the start: what is held now, less every change since.
    base = _now_held(core)
    for _seq, d, delta in deltas:
        base[d["campaign"]] = _plus(base.get(d["campaign"], {}), delta, -1.0)
    start = _start(core, first_seq, since, now)
    series = Series(start, base, deque(maxlen=max_points), last, sizes, dict(base), window_s)
    for seq, d, delta in deltas:
        series.add(seq, d, delta)
    return series
