"""Elastic, deadline-aware leases: the intent a request carries and the allocator's rules.

An intent says how far a lease may stretch (``min`` to ``max``, one ``step`` at a time,
on the sizes it allows: ``sizes`` and ``size_rule``), how fast its work goes on ``n``
units (Amdahl's law, or a measured throughput curve: known at its points only, or
interpolated between them when ``speed_model`` says so), how much work is left, its
deadline, what finishing is worth and how that value decays past the deadline, and
cheaper modes it may run in (``degrade``). The engine grants ``min`` under the envelope
rules, then hands spare capacity out among elastic leases a *jump* at a time (from one
allowed size to a larger one) by the rule named in ``PolicySpec.elastic_rule``:

* ``dmug`` (deadline-aware marginal-utility greedy, the default): first the leases whose
  deadline is lost at their size but met at a larger one (earliest deadline first, to the
  fewest units that meet it); then the lease with the highest normalised marginal utility
  per step over the allowed sizes ``m`` above its size ``n``

      NMU(n) = max_m v(m) x w(n) x (speed(m) - speed(n)) / speed(n) / (m - n)

  (the slope of the curve's upper concave envelope from ``n``, ties to the smaller
  ``m``: a plateau is jumped over) where ``v(m)`` is the value the lease can still reach
  (at the finish ``m`` gives, or at the fastest allowed size's when ``m`` does not save
  the deadline), ``w(n) = 1 / (1 + max(0, slack(n)) / time_left(n))`` the risk weight,
  ``time_left(n) = work_left / speed(n)`` and ``slack(n) = deadline - now -
  time_left(n)``. Speed gain is relative, so that jobs whose work is counted in different
  units compare;
* ``edf``: earliest deadline first; ``value``: largest value first; ``proportional``:
  the lease with the fewest steps above its min first (an equal share); each to its next
  allowed size that adds speed. These are the baselines the evaluation compares with.

Ties go to the earlier deadline, then the older lease (its request number): the order is
total, so the same state always gives the same allocation. A pass that hands out ``j``
jumps among ``E`` elastic leases with at most ``A`` allowed sizes above theirs costs
O((E + j) A log E) plus the placement of each step.

Everything here is pure: functions of the intent, the lease's model state and the time.
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
import functools
import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mypy_extensions import mypyc_attr

from bursar.broker import dims

# Snapshots pickle the engine, and the allocator's state with it. Its classes say how they
# pickle, in the form the standard library gives them as plain Python (a frozen
# dataclass: its fields' values in order; any other: its slots by name), so that the
# optional compiled build (``make accel``: mypyc's native classes pickle otherwise, and
# its frozen ones cannot be read back) writes and reads the same snapshots, old ones
# included. ``mypyc_attr(serializable=True)`` on the dataclasses: one read back is made
# without calling ``__init__`` (which needs arguments), as in Python. Not on
# ``ElasticLeases``: mypyc calls its ``__init__``, which takes none, when one is read back
# (and a compiled ``ElasticLeases()`` marked serializable was left without its fields).
# ``tests/engine/test_accel.py`` checks both builds against each other.


def _fields_state(obj: Any, names: tuple[str, ...]) -> list[Any]:
    return [getattr(obj, n) for n in names]


def _set_fields_state(obj: Any, names: tuple[str, ...], state: list[Any]) -> None:
    for name, value in zip(names, state, strict=True):
        # Past a frozen dataclass's own __setattr__, which refuses (as the standard
        # library's setstate does).
        object.__setattr__(obj, name, value)


def _slots_state(obj: Any, names: tuple[str, ...]) -> tuple[None, dict[str, Any]]:
    return None, {n: getattr(obj, n) for n in names}


def _set_slots_state(obj: Any, state: tuple[None, dict[str, Any]]) -> None:
    for name, value in state[1].items():
        object.__setattr__(obj, name, value)


RULES = ("dmug", "edf", "value", "proportional")
"""The allocation rules ``PolicySpec.elastic_rule`` may name."""

MEASURED = "measured"
INTERPOLATED = "interpolated"
SPEED_MODELS = (MEASURED, INTERPOLATED)
"""How a measured curve gives the speed between its points (``Intent.speed_model``)."""

POWERS_OF_TWO = "powers_of_two"
DIVISORS_OF = "divisors_of:"
"""The size rules an intent may name (``Intent.size_rule``): ``powers_of_two``, or
``divisors_of:B`` (the counts that divide a global batch of B)."""

_OMIT = {"omit_default": True}
"""As ``codec.OMIT_DEFAULT`` (the codec imports this module): intents journaled before a
field existed keep their bytes."""

FULL = "full"
"""The name of the mode a lease runs in before any degrade mode is picked."""

SCALE_ORDER = ("gpu", "cpu", "mem_gb")
"""The dimension an intent's units count, the first of these that its step holds."""

MAX_MODES = 8
MAX_CURVE_POINTS = 64


class DecayKind(enum.Enum):
    __hash__ = object.__hash__

    STEP = "step"
    """Nothing is left past the deadline."""
    LINEAR = "linear"
    """Falls linearly to nothing over ``window_s`` past the deadline."""
    EXPONENTIAL = "exponential"
    """Halves every ``window_s`` past the deadline."""


@mypyc_attr(serializable=True)
@dataclass(frozen=True, slots=True)
class Decay:
    kind: DecayKind = DecayKind.STEP
    window_s: float = 0.0

    def __getstate__(self) -> list[Any]:
        return _fields_state(self, _DECAY_FIELDS)

    def __setstate__(self, state: list[Any]) -> None:
        _set_fields_state(self, _DECAY_FIELDS, state)

    def factor(self, late_s: float) -> float:
        """What is left of the value when the work finishes ``late_s`` after the deadline."""
        if late_s <= 0:
            return 1.0
        if self.kind is DecayKind.STEP:
            return 0.0
        if self.kind is DecayKind.LINEAR:
            return max(0.0, 1.0 - late_s / self.window_s)
        return 0.5 ** (late_s / self.window_s)


_DECAY_FIELDS = tuple(f.name for f in dataclasses.fields(Decay))


@mypyc_attr(serializable=True)
@dataclass(frozen=True, slots=True)
class DegradeMode:
    name: str
    work_factor: float
    """The work left is multiplied by this, in (0, 1]."""
    value_factor: float
    """The value is multiplied by this, in [0, 1]."""

    def __getstate__(self) -> list[Any]:
        return _fields_state(self, _DEGRADE_FIELDS)

    def __setstate__(self, state: list[Any]) -> None:
        _set_fields_state(self, _DEGRADE_FIELDS, state)


_DEGRADE_FIELDS = tuple(f.name for f in dataclasses.fields(DegradeMode))


@mypyc_attr(serializable=True)
@dataclass(frozen=True, slots=True)
class Intent:
    """What an elastic request says about itself (``AcquireRequest.intent``)."""

    min: Mapping[str, float]
    max: Mapping[str, float]
    remaining_work: float
    deadline_s: float
    """Seconds from the request's time."""
    step: Mapping[str, float] = field(default_factory=dict)
    """Empty: resolved by :func:`resolve_step`."""
    amdahl: float | None = None
    """Amdahl's serial fraction, or None with a curve."""
    curve: tuple[tuple[float, float], ...] = ()
    """(units, throughput) points, units increasing."""
    value: float = 1.0
    decay: Decay = field(default_factory=Decay)
    degrade: tuple[DegradeMode, ...] = ()
    speed_model: str = field(default=MEASURED, metadata=_OMIT)
    """``measured``: a curve is known at its points only (a lease runs at the speed of the
    largest measured count at or below its size); ``interpolated``: linear between them."""
    sizes: tuple[float, ...] | None = field(default=None, metadata=_OMIT)
    """The units of the scale dimension the job can use (None: every step from min)."""
    size_rule: str = field(default="", metadata=_OMIT)
    """A rule for the sizes: ``powers_of_two`` or ``divisors_of:B`` (with ``sizes``, a
    size must satisfy both)."""

    def __getstate__(self) -> list[Any]:
        return _fields_state(self, _INTENT_FIELDS)

    def __setstate__(self, state: list[Any]) -> None:
        _set_fields_state(self, _INTENT_FIELDS, state)


_INTENT_FIELDS = tuple(f.name for f in dataclasses.fields(Intent))


def intent_from_dict(d: Mapping[str, Any] | None) -> Intent | None:
    """The codec's decoder for a journaled intent (None: the request had none)."""
    if d is None:
        return None
    decay = d.get("decay") or {}
    return Intent(
        min=dict(d["min"]),
        max=dict(d["max"]),
        remaining_work=float(d["remaining_work"]),
        deadline_s=float(d["deadline_s"]),
        step=dict(d.get("step", {})),
        amdahl=None if d.get("amdahl") is None else float(d["amdahl"]),
        curve=tuple((float(u), float(t)) for u, t in d.get("curve", ())),
        value=float(d.get("value", 1.0)),
        decay=Decay(DecayKind(decay.get("kind", "step")), float(decay.get("window_s", 0.0))),
        degrade=tuple(
            DegradeMode(m["name"], float(m["work_factor"]), float(m["value_factor"]))
            for m in d.get("degrade", ())
        ),
        speed_model=str(d.get("speed_model", MEASURED)),
        sizes=None if d.get("sizes") is None else tuple(float(u) for u in d["sizes"]),
        size_rule=str(d.get("size_rule", "")),
    )


# --------------------------------------------------------------------------- the model


def scale_dim(step: Mapping[str, float]) -> str:
    """The dimension the speedup model counts units of."""
    for d in SCALE_ORDER:
        if step.get(d, 0) > 0:
            return d
    return next(d for d, v in sorted(step.items()) if v > 0)


def resolve_step(intent: Intent) -> dict[str, float]:
    """The intent's step, its default filled in: one unit of the first of gpu, cpu, mem_gb
    that max raises above min, with the other dimensions in proportion."""
    if intent.step:
        return {d: float(v) for d, v in intent.step.items() if v > 0}
    grows = {d: intent.max.get(d, 0.0) - intent.min.get(d, 0.0) for d in intent.max}
    lead = next((d for d in SCALE_ORDER if grows.get(d, 0) > 0), None)
    if lead is None:
        lead = next((d for d, g in sorted(grows.items()) if g > 0), None)
    if lead is None:
        return {}
    return {d: g / grows[lead] for d, g in grows.items() if g > 0}


def speed(intent: Intent, n: float) -> float:
    """Work per second on ``n`` units of the scale dimension. A measured curve under the
    measured model: the throughput of the largest measured count at or below ``n`` (none
    below the first point: 0, nothing was measured there); interpolated: linear between
    points, in proportion below the first, flat past the last."""
    if n <= 0:
        return 0.0
    if intent.amdahl is not None:
        s = intent.amdahl
        return 1.0 / (s + (1.0 - s) / n)
    pts = intent.curve
    if intent.speed_model != INTERPOLATED:
        at = 0.0
        for u, t in pts:
            if u > n + 1e-9:
                break
            at = t
        return at
    if n <= pts[0][0]:
        return pts[0][1] * n / pts[0][0]
    for (u0, t0), (u1, t1) in itertools.pairwise(pts):
        if n <= u1:
            return t0 + (t1 - t0) * (n - u0) / (u1 - u0)
    return pts[-1][1]


def size_ok(intent: Intent, units: float) -> bool:
    """May the job run on ``units`` of its scale dimension (its sizes and size rule)?"""
    return _size_ok(intent.sizes, intent.size_rule, units)


def _size_ok(sizes: tuple[float, ...] | None, rule: str, units: float) -> bool:
    if sizes is not None and not any(abs(units - u) <= 1e-9 for u in sizes):
        return False
    if not rule:
        return True
    n = round(units)
    if abs(units - n) > 1e-9 or n < 1:
        return False
    if rule == POWERS_OF_TWO:
        return n & (n - 1) == 0
    return int(rule[len(DIVISORS_OF) :]) % n == 0


def allowed_units(intent: Intent) -> tuple[float, ...]:
    """The sizes a lease of this intent may hold, ascending: min, then min plus whole
    steps up to max, those its sizes and size rule allow."""
    step = resolve_step(intent)
    name = scale_dim(step or intent.min)
    lo = float(intent.min.get(name, 0.0))
    sizes = None if intent.sizes is None else tuple(intent.sizes)
    top = float(intent.max.get(name, lo))
    return _allowed(lo, step.get(name, 0.0), top, sizes, intent.size_rule)


@functools.lru_cache(maxsize=4096)
def _allowed(
    lo: float, per: float, top: float, sizes: tuple[float, ...] | None, rule: str
) -> tuple[float, ...]:
    """:func:`allowed_units` of the scale dimension's min, step and max, the sizes and the
    size rule. Kept for the next intent of the same shape: each elastic request asks for
    its sizes several times (its lease, admission control, each plan while it waits), and
    the scan walks every whole step from min to max."""
    out = []
    k = 0
    while True:
        n = lo + k * per
        if n > top + 1e-9:
            break
        if _size_ok(sizes, rule, n):
            out.append(n)
        if per <= 0:
            break
        k += 1
    return tuple(out)


FULL_MODE = DegradeMode(FULL, 1.0, 1.0)
"""The mode every elastic lease starts in: all its work, all its value."""


def modes(intent: Intent) -> tuple[DegradeMode, ...]:
    """The full mode, then the degrade modes in the order given."""
    return (FULL_MODE, *intent.degrade)


@mypyc_attr(serializable=True)
@dataclass(slots=True)
class ElasticLease:
    """The allocator's state of one elastic lease (the engine keeps one per lease)."""

    lease_id: str
    campaign: str
    seq: int
    intent: Intent
    step: dims.Vec
    dim: int
    """Index of the scale dimension in ``dims.PLACED``."""
    deadline: float
    base_units: float
    """Units of the scale dimension in ``min``."""
    mode: int = 0
    """Index into :func:`modes`."""
    work_left: float = 0.0
    """In the full mode's work units scaled by the mode's work factor, as of ``at``."""
    at: float = 0.0
    running: bool = False
    """Progress counts only while the lease's resources are usable."""
    extents: list[str] = field(default_factory=list)
    """The lease's extents, oldest first: each a lease of the engine's own holding one or
    more whole steps, granted for one jump between allowed sizes (so the steps held up to
    each extent make an allowed size, and a shrink to the next allowed size below ends
    the youngest extent)."""
    counts: dict[str, int] = field(default_factory=dict)
    """Extent id -> the steps it holds."""
    held_steps: int = 0
    """The steps its extents hold, together: the sum of ``counts``, kept as extents come
    and go because the allocator reads it for every lease at every event."""
    warned: dict[str, float] = field(default_factory=dict)
    """Extent id -> the deadline it ends at (announced by a ResizeWarned)."""
    allowed: tuple[int, ...] = (0,)
    """The step counts above min it may hold (its allowed sizes), ascending."""
    speeds: dict[int, float] = field(default_factory=dict, repr=False, compare=False)
    """Speed by step count, as worked out (the intent does not change: a cache)."""
    fastest: int = field(default=-1, repr=False, compare=False)
    """:meth:`fastest_steps`, once worked out (-1: not yet; it depends on the intent only)."""
    all_modes: tuple[DegradeMode, ...] = field(default=(), repr=False, compare=False)
    """:func:`modes` of the intent (the intent does not change)."""
    curve_kept: tuple[Any, ...] = field(default=(), repr=False, compare=False)
    """:meth:`plan_curve`, once worked out."""

    def __getstate__(self) -> tuple[None, dict[str, Any]]:
        return _slots_state(self, _LEASE_SLOTS)

    def __setstate__(self, state: tuple[None, dict[str, Any]]) -> None:
        _set_slots_state(self, state)

    def __post_init__(self) -> None:
        per = self.step[self.dim]
        if per > 0:
            self.allowed = tuple(
                round((u - self.base_units) / per) for u in allowed_units(self.intent)
            ) or (0,)
        self.all_modes = modes(self.intent)
        for k in self.allowed:
            self.speed(k)  # every allowed size's speed, once: the pass reads them at every event

    @property
    def steps(self) -> int:
        return self.held_steps

    def steps_in(self, extents: Iterable[str]) -> int:
        """The steps these extents of the lease hold, together."""
        counts = self.counts
        return sum(counts[x] for x in extents)

    def youngest(self, extents: list[str], n: int) -> list[str]:
        """The youngest of ``extents`` (oldest first) that hold at least ``n`` steps, the
        youngest first."""
        out: list[str] = []
        got = 0
        counts = self.counts
        for x in reversed(extents):
            if got >= n:
                break
            out.append(x)
            got += counts[x]
        return out

    def kept(self, extents: list[str], limit: int) -> int:
        """How many of ``extents`` (oldest first) the lease keeps when it must hold an
        allowed size of at most ``limit`` steps: the longest run from the oldest whose
        steps make an allowed size at every extent and at most ``limit`` in all."""
        allowed = self.allowed
        total = 0
        keep = 0
        counts = self.counts
        for i, x in enumerate(extents):
            total += counts[x]
            if total > limit:
                break
            if total in allowed:
                keep = i + 1
        return keep

    @property
    def max_steps(self) -> int:
        """The most steps it may hold: its largest allowed size."""
        return self.allowed[-1]

    def ups(self, k: int) -> tuple[int, ...]:
        """The allowed step counts above ``k``."""
        return self.allowed[bisect.bisect_right(self.allowed, k) :]

    def down(self, k: int) -> int:
        """The largest allowed step count below ``k`` (0, min, when none)."""
        i = bisect.bisect_left(self.allowed, k)
        return self.allowed[i - 1] if i else 0

    def floor(self, k: int) -> int:
        """The largest allowed step count at or below ``k``."""
        i = bisect.bisect_right(self.allowed, k)
        return self.allowed[i - 1] if i else 0

    def units(self, steps: int | None = None) -> float:
        k = self.steps if steps is None else steps
        return self.base_units + k * self.step[self.dim]

    def speed(self, steps: int | None = None) -> float:
        k = self.held_steps if steps is None else steps
        sp = self.speeds.get(k)
        if sp is None:
            sp = self.speeds[k] = speed(self.intent, self.units(k))
        return sp

    def advance(self, t: float) -> None:
        """Count the work done up to ``t`` at the units held."""
        at = self.at
        if t > at:
            if self.running:
                sp = self.speeds.get(self.held_steps)
                if sp is None:
                    sp = self.speed()
                w = self.work_left - (t - at) * sp
                self.work_left = w if w > 0.0 else 0.0  # max(0.0, w), without a call
            self.at = t

    def time_left(self, steps: int | None = None) -> float:
        sp = self.speed(steps)
        return math.inf if sp <= 0 else self.work_left / sp

    def slack(self, now: float, steps: int | None = None) -> float:
        return self.deadline - now - self.time_left(steps)

    def value_at(self, finish: float) -> float:
        m = self.all_modes[self.mode]
        return self.intent.value * m.value_factor * self.intent.decay.factor(finish - self.deadline)

    def risk(self, now: float, use_risk: bool = True, k: int | None = None) -> float:
        """The risk weight at ``k`` steps (default: those held), in (0, 1]."""
        if not use_risk:
            return 1.0
        tl = self.time_left(k)
        if math.isinf(tl) or tl <= 0:
            return 1.0
        return 1.0 / (1.0 + max(0.0, self.deadline - now - tl) / tl)

    def gain(self, now: float, use_risk: bool, k: int, to: int) -> float:
        """The normalised marginal utility per step of the jump from ``k`` to ``to``
        steps: 0 when it buys no speed or value. (:meth:`value_at` and :meth:`risk` written
        out, as the pass weighs every lease's last jump at every event: the same numbers.)"""
        speeds = self.speeds
        sp = speeds.get(k)
        if sp is None:
            sp = self.speed(k)
        sp1 = speeds.get(to)
        if sp1 is None:
            sp1 = self.speed(to)
        if sp <= 0 or sp1 <= sp or to <= k:
            return 0.0
        intent = self.intent
        w = self.work_left
        v = (
            intent.value
            * self.all_modes[self.mode].value_factor
            * intent.decay.factor(now + w / sp1 - self.deadline)
        )
        if v <= 0:
            # The jump does not save the deadline: what the lease can still reach at its
            # fastest allocation.
            v = self.value_at(now + self.time_left(self.fastest_steps()))
        return v * self._risk(now, use_risk, w / sp) * (sp1 - sp) / sp / (to - k)

    def _risk(self, now: float, use_risk: bool, tl: float) -> float:
        """:meth:`risk` of the time left ``tl`` at the size it is asked for."""
        if not use_risk or tl <= 0 or tl == math.inf:
            return 1.0
        slack = self.deadline - now - tl
        return 1.0 / (1.0 + (slack if slack > 0.0 else 0.0) / tl)

    def jumps(self, now: float, use_risk: bool, k: int) -> list[tuple[float, int]]:
        """Every allowed jump up from ``k`` that gains: (gain per step, target), best
        first, ties to the smaller jump. (:meth:`gain` for each, with what they share
        worked out once: the same numbers.)"""
        return self._jumps(now, use_risk, k)[0]

    def _jumps(self, now: float, use_risk: bool, k: int) -> tuple[list[tuple[float, int]], int]:
        """:meth:`jumps`, and :meth:`rescue` at ``k`` worked out in the same walk (-1: no
        rescue; -2: not worked out, as the speed at ``k`` is 0). The walk reads every
        larger allowed size's finish: a size no faster than ``k`` cannot save a deadline
        ``k`` loses, so skipping it for the jumps skips nothing the rescue needs."""
        w = self.work_left
        if w <= 0:
            return [], -1
        speeds = self.speeds
        sp = speeds.get(k)
        if sp is None:
            sp = self.speed(k)
        if sp <= 0:
            return [], -2
        out: list[tuple[float, int]] = []
        deadline = self.deadline
        save = -1 if now + w / sp <= deadline else -3  # -3: lost at k, not yet saved
        intent = self.intent
        vv = intent.value * self.all_modes[self.mode].value_factor
        factor = intent.decay.factor
        r = -1.0
        far = -1.0
        allowed = self.allowed
        for a in allowed[bisect.bisect_right(allowed, k) :]:
            sp1 = speeds.get(a)
            if sp1 is None:
                sp1 = self.speed(a)
            if sp1 <= sp:
                continue
            finish = now + w / sp1
            if save == -3 and finish <= deadline:
                save = a
            v = vv * factor(finish - deadline)
            if v <= 0:
                if far < 0:
                    far = self.value_at(now + self.time_left(self.fastest_steps()))
                v = far
            if r < 0:
                r = self._risk(now, use_risk, w / sp)
            g = v * r * (sp1 - sp) / sp / (a - k)
            if g > 0:
                out.append((g, a))
        if len(out) > 1:
            out.sort(key=_best_first)
        return out, (-1 if save == -3 else save)

    def nmu(self, now: float, use_risk: bool = True, k: int | None = None) -> float:
        """The normalised marginal utility per step of the best jump up from ``k`` steps
        (default: those held): the slope of the curve's upper concave envelope there; 0
        at max, once the work is done, or when no allowed size buys speed or value."""
        if k is None:
            k = self.steps
        if k >= self.max_steps or k < 0:
            return 0.0
        best = self.jumps(now, use_risk, k)
        return best[0][0] if best else 0.0

    def worth(self, now: float, use_risk: bool, k: int) -> float:
        """What the last jump to ``k`` steps is worth per step where it is: the gain per
        step from the next allowed size below (what a shrink to it gives up)."""
        return self.gain(now, use_risk, self.down(k), k)

    def targets(self, rule: str, now: float, use_risk: bool = True) -> list[int]:
        """The sizes (step counts) the lease would grow to, in the order to try them: under
        dmug every gaining jump, best per step first; under the other rules the next
        allowed size that adds speed."""
        return self.keyed_targets(rule, now, use_risk)[1]

    def keyed_targets(
        self, rule: str, now: float, use_risk: bool = True
    ) -> tuple[tuple[float, ...], list[int]]:
        """:meth:`priority` and :meth:`targets` together, the jumps worked out once (the
        key is meaningless when the targets are empty)."""
        k = self.held_steps
        if k >= self.allowed[-1] or self.work_left <= 0:
            return (), []
        if rule == "dmug":
            jumps, found = self._jumps(now, use_risk, k)
            save = found if found >= 0 else (None if found == -1 else self.rescue(now))
            if save is not None:
                key = (0.0, self.deadline, self.deadline, float(self.seq))
                return key, [save, *(a for _, a in jumps if a != save)]
            if not jumps:
                return (), []
            return (1.0, -jumps[0][0], self.deadline, float(self.seq)), [a for _, a in jumps]
        sp = self.speed(k)
        ts = next(([a] for a in self.ups(k) if self.speed(a) > sp), [])
        return self.priority(rule, now, use_risk, ts), ts

    def rescue(self, now: float) -> int | None:
        """The fewest allowed steps above those held at which the work left meets the
        deadline, when the steps held do not (None: they do, or no allowed size does)."""
        k = self.steps
        if self.work_left <= 0 or now + self.time_left(k) <= self.deadline:
            return None
        return next((a for a in self.ups(k) if now + self.time_left(a) <= self.deadline), None)

    def priority(
        self, rule: str, now: float, use_risk: bool = True, targets: list[int] | None = None
    ) -> tuple[float, ...]:
        """Heap key of the next jump under ``rule`` (smaller first), ties by deadline, then
        age (``targets``: as :meth:`targets` gave them now, to work the best out once).
        Under dmug a lease whose deadline is lost at its size but saved by a larger one
        comes first, earliest deadline first (its jump is to the fewest units that save
        it); then the others by their best gain per step. NaN never appears: every term
        is finite."""
        tier = 0.0
        if rule == "dmug":
            if self.rescue(now) is not None:
                return (0.0, self.deadline, self.deadline, float(self.seq))
            tier = 1.0
            if targets:
                head = -self.gain(now, use_risk, self.steps, targets[0])
            else:
                head = -self.nmu(now, use_risk)
        elif rule == "edf":
            head = self.deadline
        elif rule == "value":
            head = -self.intent.value
        else:
            head = float(self.steps)
        return (tier, head, self.deadline, float(self.seq))

    def wants(self, rule: str, now: float, use_risk: bool = True) -> bool:
        """Would a larger allowed size help this lease at all? Under every rule it must add
        speed to work not yet done; under dmug it must also add utility."""
        return bool(self.targets(rule, now, use_risk))

    def plan_curve(
        self,
    ) -> tuple[tuple[float, ...], tuple[float, ...], tuple[tuple[float, ...], tuple[float, ...]]]:
        """Its allowed sizes in units, the speed at each, and :func:`fastest_upto` of them,
        as the admission plan reads them (they depend on the intent only)."""
        if not self.curve_kept:
            sizes = tuple(self.units(k) for k in self.allowed)
            speeds = tuple(self.speed(k) for k in self.allowed)
            self.curve_kept = (sizes, speeds, fastest_upto(sizes, speeds))
        return self.curve_kept

    def fastest_steps(self) -> int:
        """The allowed steps at which the work goes fastest (see :func:`fastest_units`)."""
        if self.fastest >= 0:
            return self.fastest
        best, best_k = self.speed(0), 0
        for k in self.allowed:
            sp = self.speed(k)
            if sp > best:
                best, best_k = sp, k
        self.fastest = best_k
        return best_k

    def needed(self, now: float) -> float | None:
        """The fewest units (an allowed size up to max) at which the work left is done by
        the deadline; None when even max is too few."""
        for k in self.allowed:
            if now + self.time_left(k) <= self.deadline:
                return self.units(k)
        return None

    def table(self, now: float, use_risk: bool = True) -> dict[str, Any]:
        """The allocator's view, as decisions record it."""
        return {
            "units": self.units(),
            "mode": modes(self.intent)[self.mode].name,
            "work_left": self.work_left,
            "slack_s": _finite(self.slack(now)),
            "risk": self.risk(now, use_risk),
            "nmu": self.nmu(now, use_risk),
        }


_LEASE_SLOTS = tuple(f.name for f in dataclasses.fields(ElasticLease))


def _best_first(jump: tuple[float, int]) -> tuple[float, int]:
    """Jumps best per step first, ties to the smaller jump."""
    return (-jump[0], jump[1])


def _finite(x: float) -> float:
    return -1e18 if x == -math.inf else (1e18 if x == math.inf else x)


def best_finish(intent: Intent, mode: DegradeMode, now: float, units: float) -> float:
    sp = speed(intent, units)
    return math.inf if sp <= 0 else now + intent.remaining_work * mode.work_factor / sp


def fastest_units(intent: Intent) -> float:
    """The allowed units (min, then whole steps up to max) at which the work goes fastest:
    the first at the peak, for a measured curve that slows down past a point (Amdahl's law
    only rises, so there it is the largest allowed size)."""
    sizes = allowed_units(intent) or (fallback_units(intent),)
    best, best_n = speed(intent, sizes[0]), sizes[0]
    for n in sizes[1:]:
        sp = speed(intent, n)
        if sp > best:
            best, best_n = sp, n
    return best_n


def fallback_units(intent: Intent) -> float:
    """min in the scale dimension (what a lease holds when no size is allowed: validation
    refuses such an intent, so only an unchecked one meets this)."""
    step = resolve_step(intent)
    return float(intent.min.get(scale_dim(step or intent.min), 0.0))


def admit(intent: Intent, now: float, degrade: bool = True) -> int | None:
    """Admission control: the mode a new elastic request starts in, or None when no
    allocation up to its max meets the deadline in any mode and nothing of its value is
    left at the earliest finish. The first mode (full, then the degrade modes in order)
    that meets the deadline at the fastest allocation up to max; when none does, the one
    that keeps the most value at its finish."""
    top = fastest_units(intent)
    deadline = now + intent.deadline_s
    ms = modes(intent) if degrade else modes(intent)[:1]
    best: tuple[float, int] | None = None
    for i, m in enumerate(ms):
        finish = best_finish(intent, m, now, top)
        if finish <= deadline:
            return i
        v = intent.value * m.value_factor * intent.decay.factor(finish - deadline)
        if v > 0 and (best is None or v > best[0]):
            best = (v, i)
    return None if best is None else best[1]


def needed_units(
    intent: Intent, mode: int, asked_at: float, start: float | None = None
) -> tuple[str, float | None]:
    """For a request asked at ``asked_at`` (its deadline counts from then) whose work
    starts at ``start`` (default: then): its scale dimension, and the fewest units (min,
    then whole steps up to max) at which it finishes by its deadline in ``mode`` (None:
    not even at max)."""
    begin = asked_at if start is None else start
    step = resolve_step(intent)
    name = scale_dim(step or intent.min)
    work = intent.remaining_work * modes(intent)[mode].work_factor
    for n in allowed_units(intent):
        sp = speed(intent, n)
        if sp > 0 and begin + work / sp <= asked_at + intent.deadline_s:
            return name, n
    return name, None


def repick(el: ElasticLease, now: float, degrade: bool = True) -> int:
    """The mode a running lease should be in: it only moves to a later (cheaper) mode, and
    only when the deadline is lost at max units in its own mode but met in that one."""
    if not degrade:
        return el.mode
    top = el.units(el.fastest_steps())
    ms = modes(el.intent)
    cur = ms[el.mode]
    sp = speed(el.intent, top)
    if sp <= 0 or now + el.work_left / sp <= el.deadline:
        return el.mode
    base = el.work_left / cur.work_factor
    for i in range(el.mode + 1, len(ms)):
        if now + base * ms[i].work_factor / sp <= el.deadline:
            return i
    return el.mode


_LEASES_SLOTS = ("by_lease", "held", "parent_of", "plan_jobs", "waiting", "warned_held")


class ElasticLeases:
    """Every elastic lease's allocator state, the extra steps each holds, and the intents
    of elastic requests still waiting. The one place the engine keeps them."""

    __slots__ = _LEASES_SLOTS

    def __getstate__(self) -> tuple[None, dict[str, Any]]:
        return _slots_state(self, _LEASES_SLOTS)

    def __setstate__(self, state: tuple[None, dict[str, Any]]) -> None:
        _set_slots_state(self, state)

    def __init__(self) -> None:
        self.by_lease: dict[str, ElasticLease] = {}
        """Lease id -> its state, in grant order (the order every pass walks them in)."""
        self.parent_of: dict[str, str] = {}
        """Extent (a lease of the engine's own holding whole steps) -> the lease it belongs
        to."""
        self.waiting: dict[str, tuple[Intent, int]] = {}
        """Request id -> its intent and the mode admission control picked."""
        self.held: dims.Vec = dims.ZERO
        """What every extent holds, together."""
        self.warned_held: dims.Vec = dims.ZERO
        """What the extents announced to end hold, together."""
        self.plan_jobs: dict[str, tuple[Intent, int, PlanJob, str]] = {}
        """Request id -> a waiting request as admission control plans it (its intent, mode,
        plan job and scale dimension): a cache, rebuilt when the intent or mode differs."""

    def warned_at(self, extent: str) -> float | None:
        """When an announced shrink ends this extent (None: not announced)."""
        parent = self.parent_of.get(extent)
        el = None if parent is None else self.by_lease.get(parent)
        return None if el is None else el.warned.get(extent)

    def state(self) -> dict[str, Any]:
        """Canonical JSON-able form, for state digests."""
        return {
            "leases": {
                lid: [
                    [[x, el.counts[x]] for x in el.extents],
                    sorted(el.warned.items()),
                    el.mode,
                    el.work_left,
                    el.at,
                ]
                for lid, el in self.by_lease.items()
            },
            "waiting": sorted(self.waiting),
        }


# --------------------------------------------------------------------------- admission plan


@mypyc_attr(serializable=True)
@dataclass(slots=True)
class PlanJob:
    """One deadline job as the admission plan sees it: the work it has left from now, the
    sizes it may hold (ascending) and its speed at each, its deadline. (Not frozen: the
    admission plan makes one per elastic lease for every deadline request, and a frozen
    dataclass's constructor costs about five times as much; nothing changes one once made.)"""

    key: str
    """Its lease or request id (a refusal names the binding one)."""
    deadline: float
    work: float
    sizes: tuple[float, ...]
    speeds: tuple[float, ...]
    order: int
    """Its request number: ties of deadline go to the older."""
    upto: tuple[tuple[float, ...], tuple[float, ...]] | None = field(default=None, compare=False)
    """:func:`_fastest_upto` of its sizes and speeds, when the caller keeps it (it depends
    on them only)."""

    def __getstate__(self) -> tuple[None, dict[str, Any]]:
        return _slots_state(self, _PLAN_JOB_SLOTS)

    def __setstate__(self, state: tuple[None, dict[str, Any]]) -> None:
        _set_slots_state(self, state)


_PLAN_JOB_SLOTS = tuple(f.name for f in dataclasses.fields(PlanJob))


@dataclass(frozen=True, slots=True)
class Piece:
    """A share of a plan: ``units`` from ``start`` to ``end``."""

    start: float
    end: float
    units: float


def fastest_upto(
    sizes: tuple[float, ...], speeds: tuple[float, ...]
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """For each allowed size, the fastest allowed size at or below it and its speed (ties
    to the smaller): what a job capped there runs at, on a curve that may slow down."""
    best_u: list[float] = []
    best_s: list[float] = []
    bu, bs = 0.0, 0.0
    for u, s in zip(sizes, speeds, strict=True):
        if s > bs:
            bu, bs = u, s
        best_u.append(bu)
        best_s.append(bs)
    return tuple(best_u), tuple(best_s)


def _fastest_upto(job: PlanJob) -> tuple[tuple[float, ...], tuple[float, ...]]:
    return job.upto if job.upto is not None else fastest_upto(job.sizes, job.speeds)


class _Free:
    """The units free over time: piecewise constant, ``free[i]`` on ``[ts[i], ts[i+1])``,
    the last piece to infinity."""

    __slots__ = ("free", "ts")

    def __init__(self, ts: list[float], free: list[float]) -> None:
        self.ts = ts
        self.free = free

    def cut(self, t: float) -> int:
        """The index of the piece starting at ``t`` (split there if needed)."""
        i = bisect.bisect_right(self.ts, t) - 1
        if self.ts[i] == t:
            return i
        self.ts.insert(i + 1, t)
        self.free.insert(i + 1, self.free[i])
        return i + 1

    def copy(self) -> _Free:
        return _Free(list(self.ts), list(self.free))

    def take(self, start: float, end: float, units: float) -> None:
        if end <= start or units <= 0:
            return
        i, j = self.cut(start), self.cut(end)
        for k in range(i, j):
            self.free[k] -= units


def _fill(
    job: PlanJob,
    free: _Free,
    best_u: tuple[float, ...],
    best_s: tuple[float, ...],
    cap: int,
) -> list[Piece] | None:
    """The job capped at its ``cap``-th allowed size, on the earliest units free: in each
    piece of time it runs on the fastest allowed size up to the cap that the free units
    hold. Its pieces (one per run at one size: consecutive pieces of time at the same
    size make one) when its work is done by its deadline, else None."""
    done = 0.0
    out: list[Piece] = []
    ts, fr = free.ts, free.free
    sizes = job.sizes
    deadline, work = job.deadline, job.work
    smallest = sizes[0]
    last = len(ts) - 1
    # The run at one size under way: its start, its end so far and its size. A job's
    # share crosses every later job's change of size, so runs save a piece (and a take
    # from the profile) per crossing; the profile left is the same.
    run_start = run_end = run_u = -1.0
    # The loop below runs once per piece of the profile for every share tried: ``min``
    # is written out as comparisons, and a piece that holds the cap needs no bisection
    # (the cap's own size is the largest up to the cap that it holds).
    cap_u = sizes[cap]
    for i, t0 in enumerate(ts):
        if t0 >= deadline:
            break
        f = fr[i]
        if f + 1e-9 < smallest:
            # Fewer units free than the smallest allowed size: no size fits (the
            # bisection below would find none), so it is passed over at once.
            continue
        if i < last:
            t1 = ts[i + 1]
            if deadline < t1:
                t1 = deadline
        else:
            t1 = deadline
        if f < cap_u:
            k = bisect.bisect_right(sizes, f + 1e-9) - 1
            if k < 0:
                continue
            at = k if k < cap else cap
        else:
            at = cap
        sp = best_s[at]
        if sp <= 0:
            continue
        u = best_u[at]
        end = t0 + (work - done) / sp
        if u != run_u or t0 != run_end:
            if run_u >= 0:
                out.append(Piece(run_start, run_end, run_u))
            run_start, run_u = t0, u
        if end <= t1 + 1e-9:
            out.append(Piece(run_start, end if end < t1 else t1, u))
            return out
        done += (t1 - t0) * sp
        run_end = t1
    return None


def _order(job: PlanJob) -> tuple[float, int]:
    return (job.deadline, job.order)


def _share(job: PlanJob, free: _Free, now: float) -> tuple[Piece, ...] | None:
    """One job's minimum satisfactory share on what ``free`` leaves (taken from it), or
    None when no cap saves it (it takes nothing)."""
    if job.work <= 0:
        return ()
    best_u, best_s = _fastest_upto(job)
    span = job.deadline - now
    for cap in range(len(job.sizes)):
        if best_s[cap] <= 0 or (cap and best_s[cap] == best_s[cap - 1]):
            continue  # no speed there, or none more than the smaller cap's
        if best_s[cap] * span < job.work * (1 - 1e-12):
            continue  # not even with every piece at this cap
        pieces = _fill(job, free, best_u, best_s, cap)
        if pieces is not None:
            for p in pieces:
                free.take(p.start, p.end, p.units)
            return tuple(pieces)
    return None


def _held_free(now: float, capacity: float, held: tuple[tuple[float, float], ...]) -> _Free:
    free = _Free([now], [capacity])
    for units, until in held:
        free.take(now, until, units)
    return free


def plan(
    jobs: list[PlanJob],
    capacity: float,
    now: float,
    held: tuple[tuple[float, float], ...] = (),
) -> tuple[dict[str, tuple[Piece, ...]], tuple[str, ...]]:
    """A plan over time in which each job meets its deadline, as ElasticFlow's admission
    control plans: earliest deadline first (ties to the older), each job takes its
    *minimum satisfactory share*, the fewest units it is capped at (over its allowed sizes,
    ascending) with which it finishes by its deadline running on the earliest units the jobs
    before it leave free (progressive filling: where fewer are free it runs on the largest
    allowed size they hold, and catches up later). ``held``: (units, until) taken from now
    before any job (leases whose deadline the plan does not keep). Returns each planned
    job's pieces, and the jobs no cap saves (in deadline order; they take nothing)."""
    free = _held_free(now, capacity, held)
    shares: dict[str, tuple[Piece, ...]] = {}
    failed: list[str] = []
    for job in sorted(jobs, key=_order):
        pieces = _share(job, free, now)
        if pieces is None:
            failed.append(job.key)
        else:
            shares[job.key] = pieces
    return shares, tuple(failed)


def constant_need(job: PlanJob, now: float) -> float | None:
    """The fewest allowed units at which the job, held there from now, meets its deadline
    (None: none does)."""
    for u, s in zip(job.sizes, job.speeds, strict=True):
        if s > 0 and now + job.work / s <= job.deadline:
            return u
    return None


def admission_plan(
    admitted: list[PlanJob],
    new: PlanJob,
    capacity: float,
    now: float,
    lost: tuple[tuple[float, float], ...] = (),
    needs: list[float | None] | None = None,
) -> str | None:
    """Admission control over time: None when a plan (:func:`plan`) exists in which the new
    job and every admitted job the plan keeps without it meet their deadlines; else the key
    of the first job (in deadline order) that the new one would make miss, or the new one's
    own when it cannot be planned. Admitted jobs that no plan saves even without the new job
    (they fell behind) hold their smallest size to their deadline and bind nothing;
    ``lost``: other (units, until) holdings outside the plan. Held constant from now at the
    fewest units that meet each deadline, the jobs fit side by side when those units sum to
    the capacity or less; that plan is tried first (the filling plan finds one whenever it
    does, so the answer is the same, only cheaper). ``needs``: each admitted job's
    :func:`constant_need`, when the caller has them.

    Cost: the plan without the new job is made once; when every admitted job is kept in
    it (the common case), the plan with the new job shares its part before the new job's
    place in deadline order (the same jobs on the same free units take the same shares),
    so only the new job and those after it are planned again. O(J · A · P) for J jobs of
    at most A sizes on a profile of P pieces (P grows with J)."""
    if needs is None:
        needs = [constant_need(j, now) for j in admitted]
    new_need = constant_need(new, now)
    if (
        new_need is not None
        and all(n is not None for n in needs)
        and sum(n or 0.0 for n in needs) + new_need + sum(u for u, _ in lost) <= capacity + 1e-9
    ):
        return None
    order = sorted(admitted, key=_order)
    # The new one goes after every admitted job of its (deadline, order), as the stable
    # sort of the admitted jobs followed by it places it.
    at = bisect.bisect_right([_order(j) for j in order], _order(new))
    free = _held_free(now, capacity, lost)
    fork: _Free | None = None
    behind: list[str] = []
    for i, job in enumerate(order):
        if i == at:
            fork = free.copy()
        if _share(job, free, now) is None:
            behind.append(job.key)
    if not behind:
        free = free if fork is None else fork
        for job in [new, *order[at:]]:
            if _share(job, free, now) is None:
                return job.key
        return None
    skip = set(behind)
    held = lost + tuple((j.sizes[0], j.deadline) for j in admitted if j.key in skip)
    _, failed = plan([j for j in admitted if j.key not in skip] + [new], capacity, now, held)
    return failed[0] if failed else None
