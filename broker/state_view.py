"""The engine's whole state as canonical JSON-able data: what replay checks and the
state digest compare (``Engine.state_dict``, ``Engine.state_digest``), and the campaigns'
bucket levels as of an instant. Pure reads."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bursar.broker import dims
from bursar.broker.policy import Enforcement

if TYPE_CHECKING:
    from bursar.broker.engine import Engine


def state_dict(eng: Engine) -> dict[str, Any]:
    """The whole state as canonical JSON-able data (for replay checks and digests)."""
    d = {
        "now": eng.now,
        "seq": eng._seq,
        "nodes": [[n.name, n.power.value, list(n.used), n.ready_at] for n in eng.pool.nodes],
        "campaigns": {
            name: {
                "held": list(c.held),
                "credits": c.credits,
                "buckets": {d: [b.level, b.at] for d, b in sorted(c.buckets.items())},
                "rate_buckets": {d: [b.level, b.at] for d, b in sorted(c.rate_buckets.items())},
                "leases": sorted(c.leases),
                "usage": c.usage,
            }
            for name, c in sorted(eng.campaigns.items())
        },
        "leases": {
            lid: {
                "campaign": ls.campaign,
                "state": ls.state.value,
                "size": list(ls.size),
                "path": ls.path.value,
                "starts_at": ls.starts_at,
                "expires_at": ls.expires_at,
                "pieces": {str(i): list(p) for i, p in sorted(ls.pieces.items())},
                "claims": {k: list(v) for k, v in sorted(ls.claims.items())},
                "waiting": sorted(ls.waiting_nodes),
                "deadline": ls.preempt_deadline,
            }
            for lid, ls in sorted(eng.leases.items())
        },
        "ended": {k: [v.state.value, v.at, v.cause] for k, v in sorted(eng.ended.items())},
        "keys": sorted(
            [c, k, r.request_id, r.at, r.answer.kind if r.answer else None]
            for (c, k), r in eng.keys.items()
        ),
        "pending": [
            [p.id, p.campaign, list(p.size), p.duration_s, p.queued_at]
            for p in sorted(eng.queue.pending.values(), key=lambda p: p.seq)
        ],
        "aged": sorted(eng.queue.aged),
        "usage_ref": eng.ledger.usage_ref,
    }
    if eng.elastic.by_lease or eng.elastic.waiting:
        # Only with elastic leases: a state without them keeps the digest it had.
        d["elastic"] = eng.elastic.state()
    if eng.watts.leased:
        # Only while power is leased: a state without it keeps the digest it had.
        d["power"] = eng.watts.state(eng.pool, eng.now, eng.policy.enforcement)
    return d


def bucket_level(eng: Engine, campaign: str, dim: str, at: float | None = None) -> float | None:
    """The campaign's bucket level for ``dim`` at ``at`` (default: the engine's clock;
    never earlier), +Inf if unlimited, None if it has no bucket there. A pure read: a
    quiet broker still reports how far a bucket has refilled by ``at``."""
    c = eng.campaigns[campaign]
    t = eng.now if at is None else max(at, eng.now)
    if dim in c.buckets:
        i = dims.PLACED.index(dim)
        return c.buckets[dim].level_at(t, c.held[i], eng.policy.enforcement)
    if dim in c.rate_buckets:
        return c.rate_buckets[dim].level_at(t, 0.0, Enforcement.PREPAID)
    if dim == dims.POWER:
        return eng.watts.bucket_level(campaign, t, eng.policy.enforcement)
    return None


def bucket_levels(eng: Engine, campaign: str, at: float | None = None) -> dict[str, float]:
    """Every bucket of the campaign: placed dimensions first, then metered ones, then
    power (joules)."""
    c = eng.campaigns[campaign]
    names = [d for d in dims.PLACED if d in c.buckets] + list(c.rate_buckets)
    if eng.watts.bucket_level(campaign, eng.now, eng.policy.enforcement) is not None:
        names.append(dims.POWER)
    return {d: bucket_level(eng, campaign, d, at) for d in names}  # type: ignore[misc]
