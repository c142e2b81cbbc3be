"""The pool and policy parameters the engine is built with (pure data)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from bursar.broker import dims

IDEMPOTENCY_WINDOW_S = 86_400.0
"""The default of ``PolicySpec.idempotency_window_s``: a day."""
IDEMPOTENCY_KEYS_KEPT = 200_000
"""The default of ``PolicySpec.idempotency_keys_kept``."""
ENDED_LEASES_KEPT = 100_000
"""The default of ``PolicySpec.ended_leases_kept``."""


class Enforcement(enum.Enum):
    """How bucket tokens are charged (prepaid by default; see docs/concepts.md)."""

    # Identity hash: members are singletons, and Enum's own hash runs Python code on every
    # dict or set look-up (the engine keys its indexes and memos with them).
    __hash__ = object.__hash__

    PREPAID = "prepaid"
    """Default: the above-R part of a lease is paid for its whole duration at grant."""
    GRANT_INSTANT = "grant_instant"
    """Tokens only checked at grant instants; leaks burst through lease length. For experiments."""


@dataclass(frozen=True, slots=True)
class NodeGroup:
    """``count`` identical nodes named ``{prefix}{index:03d}``; the first ``warm`` start powered."""

    count: int
    resources: Mapping[str, float]
    warm: int = 0
    prefix: str = "node"
    idle_w: float = field(default=0.0, metadata={"omit_default": True})
    """Each node's draw when powered and unused, watts (0: not known)."""
    peak_w: float = field(default=0.0, metadata={"omit_default": True})
    """Each node's draw when all its primary units (GPUs, else cores) run flat out, watts;
    a lease draws its share of ``peak_w - idle_w`` above idle (``power_budget.py``)."""


@dataclass(frozen=True, slots=True)
class PoolSpec:
    groups: tuple[NodeGroup, ...]
    boot_latency_s: float = 60.0
    rate_capacity: Mapping[str, float] = field(default_factory=dict)

    def node_names(self) -> list[tuple[str, dims.Vec, bool]]:
        out = []
        for g in self.groups:
            v = dims.vec(g.resources)
            for i in range(g.count):
                out.append((f"{g.prefix}{i:03d}", v, i < g.warm))
        return out


@dataclass(frozen=True, slots=True)
class PolicySpec:
    grace_s: float = 30.0
    """Preempt warning → revoke. Reclaimed capacity becomes usable after this."""
    warm_headroom: Mapping[str, float] = field(default_factory=dict)
    """Idle powered capacity beyond the guarantee reserve that preemptible leases may not fill."""
    enforcement: Enforcement = Enforcement.PREPAID
    hol_patience_s: float = 300.0
    """A pool-blocked request older than this is *aged*: it may hold a reservation."""
    reservations: int = 1
    """How many aged requests hold a reservation (``reservations.py``): 1 is EASY backfill,
    more is conservative backfill for the first N aged requests."""
    fairshare_half_life_s: float | None = 604800.0
    """Half-life of the decayed usage that orders requests within a class (Slurm's
    ``PriorityDecayHalfLife``, 7 days by default); None orders them by arrival only."""
    max_lease_s: float = 86400.0
    min_retry_s: float = 1.0
    price_base: float = 1.0
    """Credits per unit-hour at zero pressure."""
    price_k: float = 2.0
    """Steepness: price = base * exp(k * pressure)."""
    meter_window_s: float = 1.0
    """A meter grant never exceeds burst * window units at once."""
    power_down_idle_s: float | None = 600.0
    """Power a node down after it has been idle this long, if the warm reserve and headroom
    stay covered without it; None keeps idle nodes on."""
    renewals_push_reservations: bool = field(default=False, metadata={"omit_default": True})
    """Off (the default), a renewal that would push a reservation later is refused unless
    its campaign is within its guarantee: the reservation holder was promised the lease's
    capacity at its old expiry. On, every renewal the envelope allows is granted and the
    reservations move later (as Slurm lets an operator extend a running job's time limit);
    a reservation holder then waits until the leases it waits on end of their own."""
    elastic_rule: str = field(default="dmug", metadata={"omit_default": True})
    """How spare capacity is handed out among elastic leases (``broker/elastic.py``):
    ``dmug`` (marginal utility), or the baselines ``edf``, ``value``, ``proportional``."""
    elastic_risk: bool = field(default=True, metadata={"omit_default": True})
    """Weigh marginal utility by deadline risk (off: an ablation)."""
    elastic_degrade: bool = field(default=True, metadata={"omit_default": True})
    """Let a lease whose deadline is otherwise lost run in a degrade mode (off: an ablation)."""
    elastic_admission: bool = field(default=True, metadata={"omit_default": True})
    """Refuse at once an elastic request no allocation can serve by its deadline (off: an
    ablation; such a request is then served as any other)."""
    elastic_hysteresis: float = field(default=2.0, metadata={"omit_default": True})
    """A step is taken from one elastic lease for another only when the other's marginal
    utility is at least this many times what the step is worth where it is (>= 1; keeps
    two leases from trading a step back and forth)."""
    idempotency_window_s: float = field(
        default=IDEMPOTENCY_WINDOW_S, metadata={"omit_default": True}
    )
    """How long an Acquire's idempotency key is remembered (seconds, > 0): a retry with
    the same key within it gets the first call's answer instead of a second lease."""
    idempotency_keys_kept: int = field(
        default=IDEMPOTENCY_KEYS_KEPT, metadata={"omit_default": True}
    )
    """At most how many idempotency keys are remembered (>= 1; the newest, or up to 100
    more, ``broker/keys.py``): a key is forgotten at the end of its window or once this
    many newer keyed Acquires came, whichever is first. This bounds the keys' memory (about
    250 bytes a key) however busy the broker is."""
    power_cap_w: float | None = field(default=None, metadata={"omit_default": True})
    """The facility's power cap, watts: no grant and no boot may take the pool's draw (each
    powered or booting node's idle draw plus each lease's watts) above it, nor into the
    watts kept for unmet power guarantees (``power_budget.py``). None: no cap."""
    ended_leases_kept: int = field(default=ENDED_LEASES_KEPT, metadata={"omit_default": True})
    """How many ended leases the engine remembers (>= 1; the newest, or up to 1,000 more):
    enough to answer "already ended" and to open a Watch on a lease that ended a while
    ago."""
