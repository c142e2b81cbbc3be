"""The engine's handlers for elastic leases: admission control, the allocator's pass
(model to now, waiting requests first, grow, move), shrinks and the steps' renewal.

A part of the fold (``engine.py``), kept apart because it is one rule with its own
state (``broker/elastic.py``: the intent, the model and the rule's keys; the state is
``Engine.elastic``). It works on the engine's own state through the same handlers
(``_grant``, ``_end``) as every lease: ``Engine`` inherits it.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from bursar.broker import admission, dims, elastic, isolation
from bursar.broker.decisions import (
    Decision,
    Granted,
    LeasePath,
    Rejected,
    Resized,
    ResizeWarned,
)
from bursar.broker.lease import Lease, LeaseState, Segment
from bursar.broker.pending import Pending
from bursar.broker.reasons import Reason
from bursar.broker.timers import TimerKind

if TYPE_CHECKING:
    from bursar.broker.engine import Engine


class ElasticFold:
    """Mixed into ``Engine``; every method reads and changes the engine's state."""

    def _refuse_deadline(
        self: Engine,
        p: Pending,
        intent: elastic.Intent,
        crowded: Mapping[str, float] | None = None,
    ) -> Decision:
        """Admission control: no allocation up to the intent's max meets its deadline in any
        mode, and nothing of its value is left at the earliest finish; or (``crowded``) the
        least it needs to meet it does not fit beside what the admitted elastic leases need
        to meet theirs."""
        deadline = self.now + intent.deadline_s
        units = {
            m.name: elastic.best_finish(intent, m, self.now, elastic.fastest_units(intent))
            for m in elastic.modes(intent)
        }
        inputs: dict[str, Any] = {"deadline": deadline, "earliest_finish": units}
        if crowded is not None:
            inputs["committed"] = dict(crowded)
        reject = self._emit(
            Rejected(
                self.now,
                p.id,
                p.campaign,
                Reason.DEADLINE_UNREACHABLE,
                self.policy.min_retry_s,
                inputs,
            )
        )
        self.idempotency.answer(p.id, reject)
        return reject

    def _elastic_crowded(
        self: Engine, intent: elastic.Intent, mode: int
    ) -> dict[str, float] | None:
        """Would this request, at the fewest units that meet its deadline, crowd out what
        the elastic leases already admitted (and those still waiting) need to meet theirs?
        The capacity they share is the pool's in the scale dimension less what fixed-size
        leases hold. None when it fits (or when its deadline is lost anyway and it is
        admitted for the value left past it); else the figures, for the record."""
        name, need = elastic.needed_units(intent, mode, self.now)
        if need is None:
            return None
        el = self.elastic
        i = dims.PLACED.index(name)
        committed = need
        elastic_held = el.held[i]
        for e in el.by_lease.values():
            elastic_held += self.leases[e.lease_id].size[i]
            if e.dim != i:
                continue
            e.running = self.leases[e.lease_id].state is LeaseState.ACTIVE
            e.advance(self.now)
            n = e.needed(self.now)
            if n is not None:
                committed += n
        for rid, (other, m) in el.waiting.items():
            other_name, n = elastic.needed_units(other, m, self.pending[rid].queued_at, self.now)
            if other_name == name and n is not None:
                committed += n
        fixed = sum(c.held[i] for c in self.campaigns.values()) - elastic_held
        capacity = self.pool.capacity[i] - fixed
        if committed <= capacity + 1e-9:
            return None
        return {"needed": need, "committed": committed, "capacity": capacity}

    def _elastic_open(
        self: Engine, ls: Lease, p: Pending, intent: elastic.Intent, mode: int
    ) -> None:
        step = elastic.resolve_step(intent)
        name = elastic.scale_dim(step or intent.min)
        self.elastic.by_lease[ls.id] = elastic.ElasticLease(
            lease_id=ls.id,
            campaign=ls.campaign,
            seq=p.seq,
            intent=intent,
            step=dims.vec(step),
            dim=dims.PLACED.index(name),
            deadline=p.queued_at + intent.deadline_s,
            base_units=float(intent.min.get(name, 0.0)),
            mode=mode,
            work_left=intent.remaining_work * elastic.modes(intent)[mode].work_factor,
            at=ls.starts_at,
        )

    def elastic_size_after_shrink(self: Engine, lease_id: str) -> dims.Vec:
        """What an elastic lease holds once the shrinks announced to it have come due."""
        size, _ = self.elastic_size(lease_id)
        el = self.elastic.by_lease.get(lease_id)
        for xid in el.warned if el is not None else ():
            size = dims.sub(size, self.leases[xid].size)
        return size

    def elastic_size(self: Engine, lease_id: str) -> tuple[dims.Vec, dict[int, dims.Vec]]:
        """A live lease's whole size and pieces: its own, and for an elastic lease its extra
        steps' too (what the holder may use)."""
        ls = self.leases[lease_id]
        el = self.elastic.by_lease.get(lease_id) if self.elastic.by_lease else None
        if el is None or not el.extents:
            return ls.size, ls.pieces
        size = ls.size
        pieces = dict(ls.pieces)
        for xid in el.extents:
            x = self.leases[xid]
            size = dims.add(size, x.size)
            for i, v in x.pieces.items():
                pieces[i] = dims.add(pieces[i], v) if i in pieces else v
        return size, dict(sorted(pieces.items()))

    def _resized(
        self: Engine,
        el: elastic.ElasticLease,
        delta: dims.Vec,
        tokens: float,
        credits: float,
        extra: Mapping[str, Any],
    ) -> Resized:
        size, pieces = self.elastic_size(el.lease_id)
        nodes = self.pool.nodes
        rule, risk = self.policy.elastic_rule, self.policy.elastic_risk
        return self._emit(
            Resized(
                at=self.now,
                lease_id=el.lease_id,
                campaign=el.campaign,
                size=dims.as_dict(size),
                delta={d: v for d, v in dims.as_dict(delta).items() if v != 0},
                mode=elastic.modes(el.intent)[el.mode].name,
                tokens=tokens,
                credits=credits,
                nodes=tuple(nodes[i].name for i in pieces),
                pieces={nodes[i].name: dims.as_dict(v) for i, v in pieces.items()},
                inputs={**el.table(self.now, risk), "rule": rule, **extra},
            )
        )

    def _close_extents(
        self: Engine, el: elastic.ElasticLease, state: LeaseState, cause: str
    ) -> tuple[float, float]:
        """End an ending lease's extra steps with it; their refunds join the lease's own."""
        _, tokens, credits = self._end_steps(el, list(el.extents), state, cause)
        return tokens, credits

    def _end_steps(
        self: Engine, el: elastic.ElasticLease, extents: list[str], state: LeaseState, cause: str
    ) -> tuple[dims.Vec, float, float]:
        """End these extra steps quietly: (what they held, their refunded tokens, credits)."""
        held = dims.ZERO
        tokens = credits = 0.0
        for xid in extents:
            x = self.leases[xid]
            held = dims.add(held, x.size)
            if el.warned.pop(xid, None) is not None:
                self.elastic.warned_held = dims.vmax0(dims.sub(self.elastic.warned_held, x.size))
            d = self._end(x, state, cause, quiet=True)
            tokens += getattr(d, "refund_tokens", 0.0)
            credits += getattr(d, "refund_credits", 0.0)
            el.extents.remove(xid)
            del self.elastic.parent_of[xid]
        return held, tokens, credits

    def _shrink_now(
        self: Engine, el: elastic.ElasticLease, extents: list[str], cause: str
    ) -> Decision:
        """End extra steps of a live elastic lease (an announced shrink come due, or a node
        lost under them) and say so."""
        el.advance(self.now)
        state = LeaseState.REVOKED if cause.startswith("node ") else LeaseState.RELEASED
        held, tokens, credits = self._end_steps(el, extents, state, cause)
        return self._resized(el, dims.sub(dims.ZERO, held), -tokens, -credits, {"cause": cause})

    def _renew_extents(
        self: Engine, el: elastic.ElasticLease, new_end: float
    ) -> tuple[float, float]:
        """A renewed elastic lease's extra steps are renewed with it, prepaid as any
        renewal; a step whose extension its bucket cannot prepay is announced to end at its
        old expiry (it was prepaid until then)."""
        c = self.campaigns[el.campaign]
        tokens = credits = 0.0
        price = self.ledger.price()
        short_steps: list[str] = []
        for xid in el.extents:
            x = self.leases[xid]
            ext = new_end - x.expires_at
            if ext <= 0 or xid in el.warned:
                continue
            rate = admission.token_need(dims.sub(c.held, x.size), x.size, c.sustained)
            if admission.bucket_short(
                c.buckets, c.held, rate, ext, self.now, self.policy.enforcement
            ):
                short_steps.append(xid)
                continue
            credit_rate = self.ledger.credit_rate(price, x.size)
            t, cr = self.ledger.charge(c, rate, credit_rate, ext, self.now)
            tokens += t
            credits += cr
            x.segments.append(Segment(x.expires_at, new_end, rate, credit_rate))
            self._charge_usage(c, x.size, x.expires_at, new_end, +1)
            x.expires_at = new_end
            self.timers.push(new_end, TimerKind.EXPIRE, xid)
        if short_steps:
            self.queue.rekey(c.spec.name)
            self._warn(el, short_steps, self.leases[short_steps[0]].expires_at, "", "bucket")
        return tokens, credits

    def _warn(
        self: Engine,
        el: elastic.ElasticLease,
        extents: list[str],
        deadline: float,
        for_request: str,
        why: str,
    ) -> None:
        """Announce that these extra steps end at ``deadline``: the holder drains them."""
        for xid in extents:
            el.warned[xid] = deadline
            self.timers.push(deadline, TimerKind.RESIZE, xid)
            self.elastic.warned_held = dims.add(self.elastic.warned_held, self.leases[xid].size)
        size = self.elastic_size_after_shrink(el.lease_id)
        rule, risk = self.policy.elastic_rule, self.policy.elastic_risk
        self._emit(
            ResizeWarned(
                self.now,
                el.lease_id,
                el.campaign,
                deadline,
                dims.as_dict(size),
                for_request,
                {**el.table(self.now, risk), "rule": rule, "why": why},
            )
        )

    def _elastic_pass(self: Engine) -> None:
        """Bring every elastic lease's model to now (work done, mode), make room for a
        waiting request the extra steps keep out, else hand spare capacity out one step at
        a time in the rule's order, and move a step from one lease to another where the
        rule says it is worth more there (``broker/elastic.py``)."""
        el = self.elastic
        now = self.now
        policy = self.policy
        changed: dict[str, list[Any]] = {}
        for e in el.by_lease.values():
            ls = self.leases[e.lease_id]
            e.running = ls.state is LeaseState.ACTIVE
            e.advance(now)
            if not e.intent.degrade:
                continue
            mode = elastic.repick(e, now, policy.elastic_degrade)
            if mode != e.mode:
                ms = elastic.modes(e.intent)
                e.work_left *= ms[mode].work_factor / ms[e.mode].work_factor
                e.mode = mode
                changed[e.lease_id] = [dims.ZERO, 0.0, 0.0]
        wanted = self._elastic_wanted()
        if wanted is not None:
            rid, need = wanted
            if not dims.is_zero(need):
                self._elastic_yield(rid, need)
        else:
            self._elastic_grow(changed)
        for lid, (delta, tokens, credits) in changed.items():
            self._resized(el.by_lease[lid], delta, tokens, credits, {})

    def _elastic_wanted(self: Engine) -> tuple[str, dims.Vec] | None:
        """The first request, in admission order, waiting on the pool that the extra steps
        could make room for, and what it still needs beyond free capacity and what is
        already announced to return; None when no such request waits (steps may grow)."""
        pending = self.queue.pending
        if not pending:
            return None
        el = self.elastic
        inflight = el.warned_held
        spare = dims.vmax0(dims.sub(el.held, inflight))
        limits: dict[Any, dims.Vec] = {}
        queue = self.queue
        best: tuple[Any, Pending, dims.Vec] | None = None
        for p in pending.values():
            if not p.counted:
                continue
            c = self.campaigns[p.campaign]
            # The warm limit depends on the campaign's group only (as the pass's memo).
            group = (c.spec.preemptible, c.spec.lease_class, c.unmet)
            limit = limits.get(group)
            if limit is None:
                limit = limits[group] = dims.vmax0(self._capacity_for(c)[0])
            if dims.fits(p.size, dims.add(dims.add(limit, spare), inflight)):
                # The first such request in admission order (keys are looked at only for
                # the requests the steps could serve).
                key = queue.key(p)
                if best is None or key < best[0]:
                    best = (key, p, limit)
        if best is None:
            return None
        _, p, limit = best
        return p.id, dims.vmax0(dims.sub(p.size, dims.add(limit, inflight)))

    def _elastic_yield(self: Engine, rid: str, need: dims.Vec) -> None:
        """Announce the shrink of the extra steps worth least where they are, until what
        they return covers ``need`` (for request ``rid``)."""
        now, risk = self.now, self.policy.elastic_risk
        heap: list[tuple[float, float, float, str]] = []
        left: dict[str, int] = {}
        for e in self.elastic.by_lease.values():
            k = len(e.extents) - len(e.warned)
            if k > 0:
                left[e.lease_id] = k
                heapq.heappush(heap, (e.nmu(now, risk, k - 1), -e.deadline, -e.seq, e.lease_id))
        chosen: dict[str, list[str]] = {}
        got = dims.ZERO
        while heap and not dims.fits(need, got):
            _, _, _, lid = heapq.heappop(heap)
            e = self.elastic.by_lease[lid]
            free = [x for x in e.extents if x not in e.warned and x not in chosen.get(lid, [])]
            xid = free[-1]  # the youngest step goes first
            chosen.setdefault(lid, []).append(xid)
            got = dims.add(got, self.leases[xid].size)
            left[lid] -= 1
            if left[lid] > 0:
                heapq.heappush(heap, (e.nmu(now, risk, left[lid] - 1), -e.deadline, -e.seq, lid))
        deadline = now + self.policy.grace_s
        for lid, xs in chosen.items():
            self._warn(self.elastic.by_lease[lid], xs, deadline, rid, "request")

    def _elastic_grow(self: Engine, changed: dict[str, list[Any]]) -> None:
        """Hand spare warm capacity out one step at a time, best first by the rule; then,
        with nothing announced in flight, move steps from where they are worth least to the
        best lease that could not grow."""
        now = self.now
        rule, risk = self.policy.elastic_rule, self.policy.elastic_risk
        heap: list[tuple[tuple[float, ...], str]] = []
        for e in self.elastic.by_lease.values():
            if (
                not e.warned
                and self.leases[e.lease_id].state is LeaseState.ACTIVE
                and e.wants(rule, now, risk)
            ):
                heap.append((e.priority(rule, now, risk), e.lease_id))
        heapq.heapify(heap)
        blocked: list[tuple[tuple[float, ...], str]] = []
        while heap:
            key, lid = heapq.heappop(heap)
            e = self.elastic.by_lease[lid]
            grant = self._grow_step(e)
            if grant is None:
                blocked.append((key, lid))
                continue
            acc = changed.setdefault(lid, [dims.ZERO, 0.0, 0.0])
            acc[0] = dims.add(acc[0], e.step)
            acc[1] += grant.tokens
            acc[2] += grant.credits
            if e.wants(rule, now, risk):
                heapq.heappush(heap, (e.priority(rule, now, risk), lid))
        if blocked and not any(e.warned for e in self.elastic.by_lease.values()):
            self._rebalance(min(blocked)[1])

    def _grow_step(self: Engine, e: elastic.ElasticLease) -> Granted | None:
        """One more step for ``e`` now, on warm capacity, under its campaign's envelope, the
        isolation rule and the reservations; None if any says no."""
        ls = self.leases[e.lease_id]
        c = self.campaigns[e.campaign]
        span = ls.expires_at - self.now
        size = e.step
        if span <= 0 or admission.over_burst(c.held, size, c.burst):
            return None
        rate = admission.token_need(c.held, size, c.sustained)
        if admission.bucket_short(c.buckets, c.held, rate, span, self.now, self.policy.enforcement):
            return None
        p = Pending(
            id="",
            campaign=e.campaign,
            size=size,
            duration_s=span,
            lease_class=ls.lease_class,
            blocking=False,
            seq=0,
            queued_at=self.now,
            labels=ls.labels,
        )
        limit, _ = self._capacity_for(c)
        plan = self.placement.plan(p, limit, dims.ZERO, c.spec.preemptible, dims.ZERO)
        if plan is None or plan.path is not LeasePath.WARM:
            return None
        profile = self._reservations()
        if (
            profile is not None
            and not isolation.within_own_guarantee(size, c.unmet)
            and not profile.admits(size, self.now, ls.expires_at, "")
        ):
            return None
        self._seq += 1
        p.id = f"L{self._seq}"
        p.seq = self._seq
        grant = self._grant(p, c, plan, rate, c.unmet, quiet=True)
        self.elastic.parent_of[p.id] = e.lease_id
        e.extents.append(p.id)
        return grant

    def _rebalance(self: Engine, lid: str) -> None:
        """Announce the shrink of steps held elsewhere that the rule says are worth more to
        lease ``lid`` (which could not grow): under dmug, only where its marginal utility is
        at least ``elastic_hysteresis`` times what the step is worth where it is."""
        now, policy = self.now, self.policy
        rule, risk = policy.elastic_rule, policy.elastic_risk
        b = self.elastic.by_lease[lid]
        k = b.steps
        chosen: dict[str, list[str]] = {}
        held = {x.lease_id: x.steps for x in self.elastic.by_lease.values() if x is not b}
        while k < b.max_steps:
            gain = b.nmu(now, risk, k)
            best: tuple[float, str] | None = None
            for xl, xk in held.items():
                if xk <= 0:
                    continue
                x = self.elastic.by_lease[xl]
                if rule == "dmug":
                    worth = x.nmu(now, risk, xk - 1)
                    ok = gain > 0 and gain >= policy.elastic_hysteresis * worth
                elif rule == "edf":
                    worth, ok = -x.deadline, b.deadline < x.deadline
                elif rule == "value":
                    worth, ok = x.intent.value, b.intent.value > x.intent.value
                else:
                    worth, ok = -float(xk), k + 1 < xk
                if ok and (best is None or worth < best[0]):
                    best = (worth, xl)
            if best is None:
                break
            xl = best[1]
            x = self.elastic.by_lease[xl]
            chosen.setdefault(xl, []).append(x.extents[held[xl] - 1])
            held[xl] -= 1
            k += 1
        deadline = now + policy.grace_s
        for xl, xs in chosen.items():
            self._warn(self.elastic.by_lease[xl], xs, deadline, "", f"to {lid}")
