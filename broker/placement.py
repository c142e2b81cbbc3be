"""Placement: a plan's pieces on nodes, reclaim hand-over, leases waiting on boots.

``plan`` makes a plan only when its pieces can be placed: the aggregate check
(``paths.plan``) first, as the cheap filter (nothing is scanned when it says no), then
node pieces chosen with ``shape.take``: every piece fits one node, a GPU with its CPUs and
memory, in the request's shape. The parts, in the order tried:

* warm: pieces on powered nodes, within the warm limit (the guarantee reserve and the
  headroom are pool-wide amounts, so the limit caps the number of units placed warm);
* reclaim: pieces made of active preemptible victims' pieces, on the victims' nodes.
  Victims are taken whole in order (lowest class, youngest first) until their pieces can
  hold the rest; only victims a piece draws from are warned. Approximations: a reclaimed
  piece is made of victims' capacity only (free capacity next to it on the same node is
  not added to it: that is warm capacity, under the warm limit), and whole-node
  (exclusive) requests never reclaim: they are served warm or cold;
* cold: pieces on booting nodes and on cold nodes booted for them at grant.

The warm part is placed on powered nodes at once; the reclaimed part is claimed from the
victims, which are warned and handed over at their deadline (when they end, their pieces
on the claimed nodes move to the claimants); the cold part is placed on booting nodes, and
the lease waits for each of them to be ready. A lease is active once it waits for nothing.
Each operation returns the decisions it caused, in order, for the engine to emit.

Cost: ``plan`` is O(1) when the aggregate says no; otherwise, per part tried, a look-up in
the pool's node index (``PoolState.candidates_for``: O(log n) for a best fit, plus the
nodes a split or an N-node shape takes), and for the reclaim part a pass over the victims,
in the ledger's order, until they suffice.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from bursar.broker import dims, paths, shape
from bursar.broker.decisions import Activated, Decision, LeasePath, PreemptWarned
from bursar.broker.lease import Lease, LeaseState
from bursar.broker.ledger import Ledger, id_order
from bursar.broker.pending import Pending
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

    def retune(self, policy: PolicySpec) -> None:
        """A new policy is in force: reclaims decided from now on warn with its grace
        period (warnings already sent keep their deadlines)."""
        self._grace_s = policy.grace_s

    # ------------------------------------------------------------------ planning

    def plan(
        self,
        p: Pending,
        warm_limit: dims.Vec,
        cold_avail: dims.Vec,
        preemptible: bool,
        reclaimable: dims.Vec | None = None,
        reclaim_first: bool = False,
    ) -> paths.Plan | None:
        """The cheapest plan whose pieces can all be placed now, or None (see the module).
        Preemptible requests never reclaim; ``reclaimable`` (default: all the ledger's) is
        what this request may reclaim."""
        size = p.size
        if reclaimable is None:
            reclaimable = self._ledger.reclaimable
        agg = paths.plan(size, warm_limit, reclaimable, cold_avail, preemptible, reclaim_first)
        if agg is None:
            return None
        d = p.demand if p.demand is not None else shape.total(size)
        if d.any_split:
            # The aggregate split is exact: choose the pieces only if the plan is placed
            # (most plans the admission pass makes are not), keeping this call O(1).
            return paths.Plan(agg.path, agg.warm, agg.reclaim, agg.cold, later=d)
        pool = self._pool
        primary = pool.primary
        count = d.count
        warm: list[tuple[int, float]] = []
        warm_avail = dims.vmax0(warm_limit)
        if not dims.is_zero(dims.vmin(size, warm_avail)):
            limit = shape.limit_units(warm_avail, d)
            cands = pool.candidates_for(d, (NodeState.ON,), count, limit)
            warm = shape.take(d, cands, count, limit, primary)
        warm_pieces = {i: shape.piece(d, u) for i, u in warm}
        rest = count - shape.total_units(warm)
        if rest <= shape.EPS:
            return paths.Plan(LeasePath.WARM, size, dims.ZERO, dims.ZERO, warm_pieces)
        warm_vec = _sum(warm_pieces.values())
        need = dims.vmax0(dims.sub(size, warm_vec))
        # One piece per node: a reclaimed piece may not share a node with a warm one.
        exclude = set(warm_pieces) if d.mode is not shape.Mode.TOTAL else set()
        can_reclaim = not preemptible and d.mode is not shape.Mode.WHOLE
        if can_reclaim and dims.fits(need, reclaimable):
            claims, got = self._plan_reclaim(d, rest, exclude, everything=False)
            if got + shape.EPS >= rest:
                return paths.Plan(LeasePath.RECLAIM, warm_vec, need, dims.ZERO, warm_pieces, claims)
        cold_units = shape.limit_units(cold_avail, d)
        if dims.fits(need, cold_avail) and not (reclaim_first and can_reclaim):
            cold = self._plan_cold(d, rest, cold_units)
            if cold is not None:
                return paths.Plan(LeasePath.COLD, warm_vec, dims.ZERO, need, warm_pieces, (), cold)
        if can_reclaim and dims.fits(need, dims.add(reclaimable, cold_avail)):
            claims, got = self._plan_reclaim(d, rest, exclude, everything=True)
            cold = self._plan_cold(d, rest - got, cold_units)
            if claims and cold is not None:
                reclaim = _sum(t for _, _, t in claims)
                return paths.Plan(
                    LeasePath.COLD,
                    warm_vec,
                    reclaim,
                    _sum(cold.values()),
                    warm_pieces,
                    claims,
                    cold,
                )
        return None

    def _victims(self) -> Iterator[Lease]:
        """Reclaimable leases in the order they are taken: lowest class, youngest first."""
        leases = self._leases
        return (leases[entry[3]] for entry in self._ledger.victims)

    def plan_draining(self, p: Pending) -> paths.Plan | None:
        """A plan made of what warned preemptible leases return at their deadline and no
        claimant has taken yet, or None. For a batch campaign taking back its own lent
        reserve when the lease backing it is already draining for another request and
        nothing else can serve it (every node warm: no boot to fall back on). Victims in
        the reclaim order; nobody is warned again and no deadline moves."""
        d = p.demand if p.demand is not None else shape.total(p.size)
        if d.mode is shape.Mode.WHOLE:
            return None
        room: dict[int, dims.Vec] = {}
        owners: dict[int, list[tuple[str, dims.Vec]]] = {}
        first: dict[int, int] = {}
        draining = sorted(
            (
                ls
                for ls in self._leases.values()
                if ls.preemptible and ls.state is LeaseState.PREEMPTING
            ),
            key=lambda ls: (ls.lease_class.rank, -ls.granted_at, -id_order(ls.id)),
        )
        for k, v in enumerate(draining):
            for i, part in v.pieces.items():
                left = part
                for on in v.claimed_by.values():
                    left = dims.vmax0(dims.sub(left, on.get(i, dims.ZERO)))
                if dims.is_zero(left):
                    continue
                room[i] = dims.add(room.get(i, dims.ZERO), left)
                owners.setdefault(i, []).append((v.id, left))
                first.setdefault(i, k)
        cands = [(first[i], i, room[i]) for i in sorted(room)]
        takes = shape.take(d, cands, d.count, d.count, self._pool.primary, best_fit=False)
        if shape.total_units(takes) + shape.EPS < d.count:
            return None
        claims = _claims(d, takes, owners)
        return paths.Plan(LeasePath.RECLAIM, dims.ZERO, p.size, dims.ZERO, {}, claims)

    def _plan_reclaim(
        self, d: shape.Demand, rest: float, exclude: set[int], everything: bool
    ) -> tuple[tuple[tuple[str, int, dims.Vec], ...], float]:
        """Pieces for up to ``rest`` units made of victims' pieces on their nodes: the
        claims (victim, node, part) and the units they make. Victims are taken in order
        until they suffice (``everything``: all of them, for a plan that boots the rest)."""
        room: dict[int, dims.Vec] = {}
        owners: dict[int, list[tuple[str, dims.Vec]]] = {}
        first: dict[int, int] = {}
        """Node → the position of the first victim with a piece there."""
        have = 0.0
        for k, v in enumerate(self._victims()):
            for i, part in v.pieces.items():
                if i in exclude or dims.is_zero(part):
                    continue
                before = shape.units_on(room.get(i, dims.ZERO), d)
                room[i] = dims.add(room.get(i, dims.ZERO), part)
                owners.setdefault(i, []).append((v.id, part))
                first.setdefault(i, k)
                have += shape.units_on(room[i], d) - before
            if not everything and have + shape.EPS >= rest:
                break
        # Pieces draw on victims in their order (the first victims' nodes first), not on
        # the best-fitting node: a later victim is not preempted to spare an earlier one.
        cands = [(first[i], i, room[i]) for i in sorted(room)]
        takes = shape.take(d, cands, rest, rest, self._pool.primary, best_fit=False)
        return _claims(d, takes, owners), shape.total_units(takes)

    def _plan_cold(self, d: shape.Demand, rest: float, limit: float) -> dict[int, dims.Vec] | None:
        """Pieces for ``rest`` units on booting nodes and cold ones to boot, or None."""
        if rest <= shape.EPS:
            return {}
        cands = self._pool.candidates_for(d, (NodeState.BOOTING, NodeState.COLD), rest, limit)
        takes = shape.take(d, cands, rest, limit, self._pool.primary)
        if shape.total_units(takes) + shape.EPS < rest:
            return None
        return {i: shape.piece(d, u) for i, u in takes}

    def _pieces(self, plan: paths.Plan, d: shape.Demand) -> paths.Plan:
        """The node pieces of an aggregate plan of an any-split demand (same choices as
        ``plan`` makes for other demands: best fit warm, victims in order, then boots)."""
        pool = self._pool
        inf = float("inf")
        warm: dict[int, dims.Vec] = {}
        if not dims.is_zero(plan.warm):
            want = d.units(plan.warm)
            cands = pool.candidates_for(d, (NodeState.ON,), want, inf)
            takes = shape.take(d, cands, want, inf, pool.primary)
            warm = {i: shape.piece(d, u) for i, u in takes}
        claims: tuple[tuple[str, int, dims.Vec], ...] = ()
        if not dims.is_zero(plan.reclaim):
            claims, _ = self._plan_reclaim(d, d.units(plan.reclaim), set(), everything=False)
        cold: dict[int, dims.Vec] = {}
        if not dims.is_zero(plan.cold):
            cold = self._plan_cold(d, d.units(plan.cold), inf) or {}
        return paths.Plan(
            plan.path,
            plan.warm,
            plan.reclaim,
            plan.cold,
            warm,
            claims,
            cold,
            None,
            plan.watt_victims,
        )

    def boots(self, plan: paths.Plan) -> Iterable[int]:
        """The nodes ``plan`` puts pieces on that are booting or cold (``place`` boots the
        cold ones): chosen as ``place`` will choose them."""
        if plan.cold_pieces:
            return plan.cold_pieces.keys()
        if plan.later is not None and not dims.is_zero(plan.cold):
            return self._pieces(plan, plan.later).cold_pieces.keys()
        return ()

    def victims(self, plan: paths.Plan) -> tuple[str, ...]:
        """The leases ``plan`` would warn or claim from: the victims of its pieces (chosen
        as ``place`` will choose them), then those warned for their watts alone."""
        if dims.is_zero(plan.reclaim):
            return plan.watt_victims
        claims = plan.claims
        if plan.later is not None:
            d = plan.later
            claims, _ = self._plan_reclaim(d, d.units(plan.reclaim), set(), everything=False)
        return (*dict.fromkeys(vid for vid, _, _ in claims), *plan.watt_victims)

    def watt_victims(self, skip: tuple[str, ...]) -> Iterator[Lease]:
        """Reclaimable leases a plan may warn for their watts, in the reclaim order (lowest
        class, youngest first), leaving out ``skip`` (the plan's own victims)."""
        return (ls for ls in self._victims() if ls.id not in skip)

    def warned(self, plan: paths.Plan) -> dims.Vec:
        """What the victims a plan would warn hold in all: whole leases, not only the parts
        taken over (a warned lease's remainder is neither free nor reclaimable)."""
        total = dims.ZERO
        for vid in self.victims(plan):
            total = dims.add(total, self._leases[vid].size)
        return total

    # ------------------------------------------------------------------ committing

    def place(self, ls: Lease, plan: paths.Plan, now: float) -> tuple[float, list[Decision]]:
        """Place a new lease's plan; returns when it can start and the decisions caused
        (the victims' warnings, then the boot)."""
        pool = self._pool
        out: list[Decision] = []
        if plan.later is not None:
            plan = self._pieces(plan, plan.later)
        if plan.warm_pieces:
            pool.put(plan.warm_pieces)
            ls.pieces = dict(plan.warm_pieces)
            self._power.in_use(ls.pieces)
        starts = now
        if plan.claims:
            leases = self._leases
            if any(leases[vid].state is LeaseState.ACTIVE for vid, _, _ in plan.claims):
                starts = now + self._grace_s
            else:
                # Only leases already draining: handed over at their deadlines.
                starts = max(leases[vid].preempt_deadline or now for vid, _, _ in plan.claims)
            out.extend(self._reclaim(ls, plan.claims, now + self._grace_s, now))
        if plan.watt_victims:
            # Victims warned for their watts are active: the lease starts at their deadline.
            starts = max(starts, now + self._grace_s)
            out.extend(
                self._reclaim(ls, (), now + self._grace_s, now, watts_only=plan.watt_victims)
            )
        if plan.cold_pieces:
            boot = self._power.boot_nodes(sorted(plan.cold_pieces), now)
            if boot is not None:
                out.append(boot)
            pool.put(plan.cold_pieces)
            for i, part in sorted(plan.cold_pieces.items()):
                ls.pieces[i] = dims.add(ls.pieces.get(i, dims.ZERO), part)
                ls.waiting_nodes.add(i)
                self.node_waiters.setdefault(i, set()).add(ls.id)
                starts = max(starts, pool.nodes[i].ready_at or now)
        return starts, out

    def _reclaim(
        self,
        claimant: Lease,
        claims: tuple[tuple[str, int, dims.Vec], ...],
        deadline: float,
        now: float,
        watts_only: tuple[str, ...] = (),
    ) -> list[PreemptWarned]:
        """Warn the victims of ``claims`` (and those of ``watts_only``, none of whose pieces
        is taken over: the claimant waits for them to end, for their watts) and record
        what each hands over at its deadline."""
        leases = self._leases
        by_victim: dict[str, dict[int, dims.Vec]] = {vid: {} for vid in watts_only}
        for vid, i, part in claims:
            on = by_victim.setdefault(vid, {})
            on[i] = dims.add(on.get(i, dims.ZERO), part)
        out = []
        for victim_id, on in by_victim.items():
            victim = leases[victim_id]
            if victim.state is LeaseState.PREEMPTING:
                # Already warned and draining: its unclaimed remainder goes to this
                # claimant at the deadline it already has.
                claimed = _sum(on.values())
                victim.claimed_by[claimant.id] = on
                claimant.claims[victim_id] = claimed
                self._ledger.claimed_draining(victim, claimed)
                continue
            victim.move(LeaseState.PREEMPTING)
            victim.preempt_deadline = deadline
            victim.claimed_by[claimant.id] = on
            claimant.claims[victim_id] = _sum(on.values())
            self._ledger.warned(victim, _sum(on.values()))
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
        # Hand claimed capacity over to the leases that reclaimed it: each claimed part moves
        # on its own node, so the claimant's pieces stay node-shaped.
        for cid, on in sorted(ls.claimed_by.items(), key=lambda kv: id_order(kv[0])):
            claimant = leases.get(cid)
            if claimant is None:
                continue
            for i, part in sorted(on.items()):
                have = ls.pieces.get(i, dims.ZERO)
                move = dims.vmin(part, have)
                if dims.is_zero(move):
                    continue
                ls.pieces[i] = dims.vmax0(dims.sub(have, move))
                claimant.pieces[i] = dims.add(claimant.pieces.get(i, dims.ZERO), move)
            claimant.claims.pop(ls.id, None)
            activated = self.maybe_activate(claimant, now)
            if activated is not None:
                out.append(activated)
        ls.claimed_by.clear()
        self._pool.free_pieces(ls.pieces)
        for i in ls.pieces:
            self._power.watch_idle(i, now)
        return out


def _claims(
    d: shape.Demand,
    takes: list[tuple[int, float]],
    owners: dict[int, list[tuple[str, dims.Vec]]],
) -> tuple[tuple[str, int, dims.Vec], ...]:
    """The (victim, node, part) claims that make the pieces ``takes`` chose, each node's
    piece drawn from its owners in their order."""
    claims = []
    for i, units in takes:
        want = shape.piece(d, units)
        for vid, part in owners[i]:
            t = dims.vmin(want, part)
            if dims.is_zero(t):
                continue
            claims.append((vid, i, t))
            want = dims.vmax0(dims.sub(want, t))
            if dims.is_zero(want):
                break
    return tuple(claims)


def _sum(vs: object) -> dims.Vec:
    total = dims.ZERO
    for v in vs:  # type: ignore[attr-defined]
        total = dims.add(total, v)
    return total
