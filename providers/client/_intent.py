"""The client's elastic intent: what an elastic, deadline-aware Acquire says about itself.

Written as a flat record rather than derived from ``bursar.v1.Intent`` like the other
client types: the wire's oneof (Amdahl or a curve) and its nested decay message read
better as keywords, and the record only ever goes one way (to the broker).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bursar.protos.bursar.v1 import broker_pb2 as pb

__all__ = ["Intent"]

_SPEED_MODEL = {
    "measured": pb.Intent.SPEED_MODEL_MEASURED,
    "interpolated": pb.Intent.SPEED_MODEL_INTERPOLATED,
}

_DECAY = {
    "step": pb.Decay.KIND_STEP,
    "linear": pb.Decay.KIND_LINEAR,
    "exponential": pb.Decay.KIND_EXPONENTIAL,
}


@dataclass(frozen=True)
class Intent:
    """An elastic request: granted at ``min``, grown toward ``max`` while spare capacity
    lasts, shrunk (after a RESIZE_WARNING and the grace period) when others need it.

    ``amdahl`` (a serial fraction in [0, 1]) or ``curve`` (``(units, throughput)`` points
    spanning min to max) says how fast ``work`` goes on n units; ``deadline_s`` is from
    now; ``value`` what finishing by then is worth, ``decay`` what is left past it
    (``"step"``: nothing; ``("linear", window_s)``, ``("exponential", half_life_s)``);
    ``degrade``: ``(name, work_factor, value_factor)`` modes to fall back to.
    ``speed_model``: ``"measured"`` (a curve is known at its points only: n units run at
    the speed of the largest point at or below n) or ``"interpolated"`` (linear between
    them). ``sizes`` (units of the speedup dimension) and ``size_rule``
    (``"powers_of_two"`` or ``"divisors_of:B"``) limit the sizes the lease may hold; min
    must be one of them.
    The broker checks every field and names the one it refuses."""

    min: Mapping[str, float]
    max: Mapping[str, float]
    work: float
    deadline_s: float
    amdahl: float | None = None
    curve: Sequence[tuple[float, float]] = ()
    step: Mapping[str, float] = field(default_factory=dict)
    value: float = 1.0
    decay: str | tuple[str, float] = "step"
    degrade: Sequence[tuple[str, float, float]] = ()
    speed_model: str = "measured"
    sizes: Sequence[float] = ()
    size_rule: str = ""

    def to_proto(self) -> pb.Intent:
        kind, window = (self.decay, 0.0) if isinstance(self.decay, str) else self.decay
        if kind not in _DECAY:
            raise ValueError(f"decay must be one of {', '.join(_DECAY)} (got {kind!r})")
        if self.speed_model not in _SPEED_MODEL:
            raise ValueError(
                f"speed_model must be one of {', '.join(_SPEED_MODEL)} (got {self.speed_model!r})"
            )
        speedup = pb.Speedup()
        if self.amdahl is not None:
            speedup.amdahl_serial_fraction = self.amdahl
        if self.curve:
            speedup.curve.points.extend(
                pb.ThroughputPoint(units=u, throughput=t) for u, t in self.curve
            )
        return pb.Intent(
            min=dict(self.min),
            max=dict(self.max),
            step=dict(self.step),
            speedup=speedup,
            remaining_work=self.work,
            deadline_s=self.deadline_s,
            value=self.value,
            decay=pb.Decay(kind=_DECAY[kind], window_s=window),
            degrade=[
                pb.DegradeMode(name=n, work_factor=w, value_factor=v) for n, w, v in self.degrade
            ],
            speed_model=_SPEED_MODEL[self.speed_model],
            sizes=list(self.sizes),
            size_rule=self.size_rule,
        )
