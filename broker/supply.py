"""Supply signals: what the pool can give, how soon, at what price; and each campaign's
bucket. Published to everyone (pull and stream) so adaptive agents can plan.

``supply(engine)`` is a pure read of the engine's state at its current clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bursar.broker import dims
from bursar.broker import price as pricing
from bursar.broker.engine import Engine
from bursar.broker.policy import Enforcement


@dataclass(frozen=True, slots=True)
class DimSupply:
    capacity: float
    warm_free: float
    """Idle powered capacity, including the guarantee reserve."""
    reserve: float
    """Unmet guarantees (kept warm; only their owners may use them)."""
    available_warm: float
    """Warm capacity beyond the reserve: what a request above its guarantee gets at once."""
    reclaimable: float
    """Held by active preemptible leases: available after the grace period."""
    cold: float
    """On cold or booting nodes: available after (at most) the boot latency."""
    stranded: float = 0.0
    """Free on powered nodes but unusable at the pool's typical ratio (free GPUs next to
    no free cores or memory, and the reverse; see ``PoolState.fragmentation``)."""
    partial_free: float = 0.0
    """Free on partly used powered nodes: out of reach of whole-node requests."""
    lendable: float = 0.0
    """Free warm capacity of the reserve that preemptible leases may fill beyond
    ``available_warm``: batch-class campaigns' unmet guarantees, reclaimed from them within
    a grace period when their owners ask (``isolation.py``)."""


@dataclass(frozen=True, slots=True)
class PowerSupply:
    """The facility's power (``power_budget.py``), watts; published while power is leased."""

    cap_w: float
    """The facility cap; +inf when there is none (campaign envelopes only)."""
    draw_w: float
    """What the pool draws now: powered and booting nodes' idle draw plus the leases' watts."""
    idle_w: float
    """The idle part of ``draw_w``."""
    reserved_w: float
    """Kept for unmet power guarantees (only their owners may use them)."""
    headroom_w: float
    """What a lease above its campaign's guarantee may add now: cap - draw - reserved."""
    reclaimable_w: float
    """What a firm request could reclaim, a grace period away: the watts counted by active
    preemptible leases (not yet warned)."""
    price: float
    """Credits per kWh on the pool price's curve over the power pressure (draw plus the
    queued firm requests' watts, over the cap): a signal to ask for a lower power limit
    (``size["power"]``) rather than wait; nothing is charged on it."""


@dataclass(frozen=True, slots=True)
class CampaignSupply:
    held: dict[str, float]
    bucket: dict[str, float | None]
    """Bucket level per dimension (unit-seconds); None = unlimited."""
    time_to_empty_s: dict[str, float | None]
    """At the current holding; None when the bucket is not draining."""
    headroom_to_burst: dict[str, float]
    unmet_guarantee: dict[str, float]
    credits: float
    queued: int


@dataclass(frozen=True, slots=True)
class Supply:
    at: float
    price: float
    """Credits per unit-hour of the primary dimension (see price.py)."""
    pressure: float
    dims: dict[str, DimSupply]
    campaigns: dict[str, CampaignSupply]
    grace_s: float
    boot_latency_s: float
    power: PowerSupply | None = None
    """Set while power is leased (a cap, or a campaign with a power envelope)."""

    def time_to(
        self, n: float, dim: str = "gpu", campaign: str | None = None
    ) -> dict[str, float | None]:
        """Expected seconds until ``n`` units are usable on each path (None: not on that path).

        Without ``campaign``, for a request entirely above its campaign's guarantee. With
        it, the campaign's own unmet guarantee (kept warm for it) counts as warm capacity.
        """
        d = self.dims[dim]
        warm = d.available_warm
        c = self.campaigns.get(campaign) if campaign is not None else None
        if c is not None:
            warm += c.unmet_guarantee.get(dim, 0.0)
        return {
            "warm": 0.0 if n <= warm else None,
            "reclaim": self.grace_s if n <= warm + d.reclaimable else None,
            "cold": self.boot_latency_s if n <= warm + d.cold else None,
        }


def supply(engine: Engine) -> Supply:
    on_free, boot_free, cold, _ = engine.pool.totals()
    reserve = engine.reserve
    stranded, partial = engine.pool.fragmentation()
    batch = engine.ledger.batch_reserve
    out_dims = {}
    for i, d in enumerate(dims.PLACED):
        if engine.pool.capacity[i] <= 0:
            continue
        out_dims[d] = DimSupply(
            capacity=engine.pool.capacity[i],
            warm_free=on_free[i],
            reserve=reserve[i],
            available_warm=max(0.0, on_free[i] - reserve[i]),
            reclaimable=engine.reclaimable[i],
            cold=boot_free[i] + cold[i],
            stranded=stranded[i],
            partial_free=partial[i],
            lendable=max(0.0, on_free[i] - (reserve[i] - batch[i]))
            - max(0.0, on_free[i] - reserve[i]),
        )
    queued: dict[str, int] = {}
    for p in engine.pending.values():
        queued[p.campaign] = queued.get(p.campaign, 0) + 1
    camps = {}
    for name, c in sorted(engine.campaigns.items()):
        levels: dict[str, float | None] = {}
        empty: dict[str, float | None] = {}
        for i, d in enumerate(dims.PLACED):
            b = c.buckets.get(d)
            if b is None:
                continue
            level = engine.bucket_level(name, d)
            levels[d] = None if b.unlimited else level
            drain = c.held[i] - b.rate
            prepaid = engine.policy.enforcement is Enforcement.PREPAID
            # Under prepaid leases the running level does not drain: above-R use was paid
            # at grant, so "time to empty" is about grant-instant buckets only.
            empty[d] = (
                None
                if b.unlimited or prepaid or drain <= 0 or level is None
                else (level / drain if math.isfinite(level) else None)
            )
        for d in dims.RATE:
            if d in c.rate_buckets:
                b = c.rate_buckets[d]
                levels[d] = None if b.unlimited else engine.bucket_level(name, d)
        held = dims.as_dict(c.held)
        headroom = {
            d: max(0.0, c.burst[i] - c.held[i])
            for i, d in enumerate(dims.PLACED)
            if d in c.spec.envelopes
        }
        unmet = dims.as_dict(c.unmet)
        account = engine.watts.accounts.get(name)
        env = c.spec.envelopes.get(dims.POWER)
        if account is not None and env is not None:
            held[dims.POWER] = account.held
            headroom[dims.POWER] = max(0.0, env.burst - account.held)
            if not c.spec.preemptible and env.guarantee > account.held:
                unmet[dims.POWER] = env.guarantee - account.held
            b = account.bucket
            if b is not None:
                levels[dims.POWER] = None if b.unlimited else engine.bucket_level(name, dims.POWER)
        camps[name] = CampaignSupply(
            held=held,
            bucket=levels,
            time_to_empty_s=empty,
            headroom_to_burst=headroom,
            unmet_guarantee=unmet,
            credits=c.credits,
            queued=queued.get(name, 0),
        )
    return Supply(
        power=_power(engine),
        at=engine.now,
        price=engine.price(),
        pressure=engine.pressure(),
        dims=out_dims,
        campaigns=camps,
        grace_s=engine.policy.grace_s,
        boot_latency_s=engine.pool_spec.boot_latency_s,
    )


def _power(engine: Engine) -> PowerSupply | None:
    budget = engine.watts
    if not budget.leased:
        return None
    pool = engine.pool
    idle = pool.idle_draw
    draw = idle + budget.lease_w
    reserved = budget.reserved()
    cap = budget.cap if budget.cap is not None else math.inf
    queued = sum(
        budget.watts_of(p.watts, p.size, engine.pool.primary)
        for p in engine.pending.values()
        if not engine.campaigns[p.campaign].spec.preemptible
    )
    pressure = (draw + queued) / cap if math.isfinite(cap) and cap > 0 else 0.0
    policy = engine.policy
    return PowerSupply(
        cap_w=cap,
        draw_w=draw,
        idle_w=idle,
        reserved_w=reserved,
        headroom_w=max(0.0, cap - draw - reserved),
        reclaimable_w=budget.handed(ls.id for ls in engine.placement.watt_victims(())),
        price=pricing.price(policy.price_base, policy.price_k, pressure),
    )
