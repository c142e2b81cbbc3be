"""The congestion price, in credits per unit-hour of the pool's primary dimension.

    pressure = (units held by non-preemptible leases + units asked for by queued
                requests) / pool capacity,  in the primary dimension (gpu, else cpu)
    price    = base * exp(k * min(pressure, MAX_PRESSURE))

At zero pressure the price is ``base``; with the whole pool held it is ``base * e^k``
(7.4x for the default k = 2), and queued demand pushes it further. Preemptible use does
not raise the price: it yields on demand, so it is not scarcity. A lease is charged
price x units x hours at grant, for its whole span, and the unused part is refunded on
early release or revocation. The pressure saturates at ``MAX_PRESSURE`` (16 pools'
worth of firm demand): beyond it the signal says nothing more, and the exponential would
overflow a float once queued demand passes ~355 pools' worth at k = 2, which replayed
real traces reach. Multi-dimensional leases are charged on their dominant
share: units = max over dimensions of (size / capacity) x primary capacity.
"""

from __future__ import annotations

import math

from bursar.broker import dims


def primary_index(capacity: dims.Vec) -> int:
    return 0 if capacity[0] > 0 else 1


def pressure(held_firm: dims.Vec, queued: dims.Vec, capacity: dims.Vec) -> float:
    i = primary_index(capacity)
    if capacity[i] <= 0:
        return 0.0
    return (held_firm[i] + queued[i]) / capacity[i]


MAX_PRESSURE = 16.0
"""Pressure above which the price stops rising (see the module docstring)."""


def price(base: float, k: float, rho: float) -> float:
    return base * math.exp(k * min(rho, MAX_PRESSURE))


def charged_units(size: dims.Vec, capacity: dims.Vec) -> float:
    share = max((s / c for s, c in zip(size, capacity, strict=True) if c > 0), default=0.0)
    return share * capacity[primary_index(capacity)]
