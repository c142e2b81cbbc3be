"""Placement: a granted plan's pieces on nodes, reclaim hand-over, leases waiting on boots.

A plan (``paths.plan``) splits a lease into warm, reclaimed and cold parts. The warm part
is placed on powered nodes at once; the reclaimed part is claimed from preemptible
victims, which are warned and handed over at their deadline (when they end, their pieces
move to the claimants); the cold part is placed on booting nodes, and the lease waits for
each of them to be ready. A lease is active once it waits for nothing. Each operation
returns the decisions it caused, in order, for the engine to emit.
"""

from __future__ import annotations

from collections.abc import Mapping

from bursar.broker import dims, paths
from bursar.broker.decisions import Activated, Decision, PreemptWarned
from bursar.broker.lease import Lease, LeaseState
from bursar.broker.ledger import Ledger, id_order
from bursar.broker.policy import PolicySpec
from bursar.broker.pool import NodeState, PoolState
from bursar.broker.power import PowerControl
from bursar.broker.timers import TimerKind, Timers


class Placement:
    """Where leases' pieces lie, and which leases wait for which booting node."""

    __slots__ = ("_grace_s", "_leases", "_ledger", "_pool", "_power", "_timers", "node_waiters")

    def __init__(
        self,
        pool: PoolState,
        policy: PolicySpec,
        leases: Mapping[str, Lease],
        ledger: Ledger,
        power: PowerControl,
        timers: Timers,
    ) -> None:
        self._pool = pool
        self._grace_s = policy.grace_s
        self._leases = leases
        self._ledger = ledger
        self._power = power
        self._timers = timers
        self.node_waiters: dict[int, set[str]] = {}
        """Booting nodes (by index) and the leases waiting for them."""

    def place(self, ls: Lease, plan: paths.Plan, now: float) -> tuple[float, list[Decision]]:
        """Place a new lease's plan; returns when it can start and the decisions caused
        (the victims' warnings, then the boot)."""
        pool = self._pool
        out: list[Decision] = []
        if not dims.is_zero(plan.warm):
            ls.pieces = pool.place(plan.warm, (NodeState.ON,))
            self._power.in_use(ls.pieces)
        starts = now
        if not dims.is_zero(plan.reclaim):
            starts = now + self._grace_s
            out.extend(self._reclaim(ls, plan.reclaim, starts, now))
        if not dims.is_zero(plan.cold):
            need = plan.cold
            boot = self._power.boot_for(need, now)
            if boot is not None:
                out.append(boot)
            for i, piece in pool.place(need, (NodeState.BOOTING,)).items():
                ls.pieces[i] = dims.add(ls.pieces.get(i, dims.ZERO), piece)
                ls.waiting_nodes.add(i)
                self.node_waiters.setdefault(i, set()).add(ls.id)
                starts = max(starts, pool.nodes[i].ready_at or now)
        return starts, out

    def _reclaim(
        self, claimant: Lease, need: dims.Vec, deadline: float, now: float
    ) -> list[PreemptWarned]:
        leases = self._leases
        candidates = sorted(
            (ls for ls in leases.values() if ls.preemptible and ls.state is LeaseState.ACTIVE),
            key=lambda ls: (ls.lease_class.rank, -ls.granted_at, -id_order(ls.id)),
        )
        out = []
        for victim_id, take in paths.choose_victims(need, ((v.id, v.size) for v in candidates)):
            victim = leases[victim_id]
            victim.move(LeaseState.PREEMPTING)
            victim.preempt_deadline = deadline
            victim.claimed_by[claimant.id] = take
            claimant.claims[victim_id] = take
            self._ledger.not_reclaimable(victim)
            self._timers.push(deadline, TimerKind.DEADLINE, victim_id)
            out.append(PreemptWarned(now, victim_id, victim.campaign, deadline, claimant.id))
        return out

    def activate(self, ls: Lease) -> None:
        ls.move(LeaseState.ACTIVE)
        # Only active preemptible leases are reclaimable: a starting one sits on booting
        # nodes or on capacity still being handed over.
        self._ledger.activated(ls)

    def maybe_activate(self, ls: Lease, now: float) -> Activated | None:
        """Activate a starting lease that waits for nothing any more."""
        if ls.state is LeaseState.STARTING and ls.ready:
            self.activate(ls)
            nodes = self._pool.nodes
            names = tuple(nodes[i].name for i in sorted(ls.pieces))
            pieces = {nodes[i].name: dims.as_dict(v) for i, v in sorted(ls.pieces.items())}
            return Activated(now, ls.id, ls.campaign, names, pieces)
        return None

    def node_ready(self, i: int, now: float) -> list[Activated]:
        """Node ``i`` finished booting: the leases waiting only for it become active."""
        out = []
        for lid in sorted(self.node_waiters.pop(i, set()), key=id_order):
            ls = self._leases.get(lid)
            if ls is None:
                continue
            ls.waiting_nodes.discard(i)
            activated = self.maybe_activate(ls, now)
            if activated is not None:
                out.append(activated)
        return out

    def hit_by_loss(self, i: int) -> list[Lease]:
        """The leases that lose capacity with node ``i``, with the claimants of any of them,
        in lease order."""
        leases = self._leases
        hit = [ls for ls in leases.values() if i in ls.pieces or i in ls.waiting_nodes]
        hit_ids = {ls.id for ls in hit}
        claimants = [
            leases[cid]
            for ls in hit
            for cid in ls.claimed_by
            if cid in leases and cid not in hit_ids
        ]
        return sorted({x.id: x for x in claimants + hit}.values(), key=lambda x: id_order(x.id))

    def node_lost(self, i: int) -> None:
        self.node_waiters.pop(i, None)

    def release(self, ls: Lease, now: float) -> list[Activated]:
        """Free an ending lease's pieces: claimed ones go to their claimants (which may then
        become active), the rest back to the pool."""
        leases = self._leases
        # A STARTING claimant that goes away gives up its claims; victims still end at their
        # deadline (they were warned and are draining).
        for victim_id in ls.claims:
            victim = leases.get(victim_id)
            if victim is not None:
                victim.claimed_by.pop(ls.id, None)
        ls.claims.clear()
        for i in ls.waiting_nodes:
            self.node_waiters.get(i, set()).discard(ls.id)
        out = []
        # Hand claimed capacity over to the leases that reclaimed it.
        for cid, take in sorted(ls.claimed_by.items(), key=lambda kv: id_order(kv[0])):
            claimant = leases.get(cid)
            if claimant is None:
                continue
            rest = take
            for i in sorted(ls.pieces):
                if dims.is_zero(rest):
                    break
                move = dims.vmin(rest, ls.pieces[i])
                if dims.is_zero(move):
                    continue
                ls.pieces[i] = dims.vmax0(dims.sub(ls.pieces[i], move))
                claimant.pieces[i] = dims.add(claimant.pieces.get(i, dims.ZERO), move)
                rest = dims.vmax0(dims.sub(rest, move))
            claimant.claims.pop(ls.id, None)
            activated = self.maybe_activate(claimant, now)
            if activated is not None:
                out.append(activated)
        ls.claimed_by.clear()
        self._pool.free_pieces(ls.pieces)
        for i in ls.pieces:
            self._power.watch_idle(i, now)
        return out
