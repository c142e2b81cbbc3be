"""Putting a new policy in force on a live engine (``events.ApplyPolicy``): each part of
the fold takes the settings it keeps from the policy, and the queue is looked at again.

What a change does to what is under way is ``broker/policy_change.py``'s docstring; this
module is how: the parts hold copies of a few settings (the patience, the grace period,
the power-down idle time, the warm headroom) so that the hot paths read a field, and every
copy is replaced here, in one place, so that none is left with the old value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bursar.broker.policy import PolicySpec

if TYPE_CHECKING:
    from bursar.broker.engine import Engine

__all__ = ["retune"]


def retune(eng: Engine, new: PolicySpec) -> None:
    """Put ``new`` in force on ``eng`` at ``eng.now`` (already validated)."""
    eng.policy = new
    eng.ledger.retune(new)
    eng.power.retune(new, eng.now)
    eng.headroom = eng.power.headroom
    eng.watts.set_cap(new.power_cap_w)
    eng.placement.retune(new)
    eng.queue.retune(new)
    eng.idempotency.retune(new.idempotency_window_s, new.idempotency_keys_kept)
    eng.ended.resize(new.ended_leases_kept)
    # Who may start now depends on the headroom, the reservations and the elastic
    # settings: the admission pass that follows the event tries every waiting head.
    eng.queue.pool_dirty = True
    eng.queue.dirty.update(p.campaign for p in eng.queue.pending.values())
