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

    def to_proto(self) -> pb.Intent:
        kind, window = (self.decay, 0.0) if isinstance(self.decay, str) else self.decay
        if kind not in _DECAY:
            raise ValueError(f"decay must be one of {', '.join(_DECAY)} (got {kind!r})")
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
        )
