"""The engine's handlers for elastic leases: admission control, the allocator's pass
(model to now, waiting requests first, grow, move), shrinks and the extents' renewal.

A part of the fold (``engine.py``), kept apart because it is one rule with its own
state (``broker/elastic.py``: the intent, the model and the rule's keys; the state is
``Engine.elastic``). It works on the engine's own state through the same handlers as
every lease (``grant_extent`` leases an extent as ``_grant`` leases a request; ``_end``).
Functions of the engine rather than a class it inherits, so that mypyc can compile them
(it cannot compile a mixin typed by its host). The optional accelerated build (``make
accel``) compiles ``broker/elastic.py`` but neither this module nor the engine, which were
measured compiled and gained nothing or lost (``broker/compiled.py`` says why).
"""

from __future__ import annotations

import bisect
import heapq
import operator
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from bursar.broker import admission, dims, elastic, isolation, pool_side, reservation_cut
from bursar.broker.decisions import (
    Decision,
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


def refuse_deadline(
    eng: Engine,
    p: Pending,
    intent: elastic.Intent,
    crowded: Mapping[str, Any] | None = None,
) -> Decision:
    """Admission control: no allocation up to the intent's max meets its deadline in any
    mode, and nothing of its value is left at the earliest finish; or (``crowded``) no
    plan over time keeps both its deadline and those of the elastic leases admitted
    (``plan`` in the inputs: the binding deadline, whose job it is)."""
    deadline = eng.now + intent.deadline_s
    units = {
        m.name: elastic.best_finish(intent, m, eng.now, elastic.fastest_units(intent))
        for m in elastic.modes(intent)
    }
    inputs: dict[str, Any] = {"deadline": deadline, "earliest_finish": units}
    if crowded is not None:
        inputs["plan"] = dict(crowded)
    reject = eng._emit(
        Rejected(
            eng.now,
            p.id,
            p.campaign,
            Reason.DEADLINE_UNREACHABLE,
            eng.policy.min_retry_s,
            inputs,
        )
    )
    eng.idempotency.answer(p.id, reject)
    return reject


def elastic_crowded(
    eng: Engine, rid: str, intent: elastic.Intent, mode: int
) -> dict[str, Any] | None:
    """Would this request make a deadline miss, its own or an admitted one's? Admission
    control plans over time (:func:`elastic.admission_plan`): the elastic leases already
    admitted and the requests still waiting, each from now with the work it has left, and
    this one, on the capacity of the scale dimension that fixed-size leases leave. None
    when a plan keeps every deadline (or when this one's is lost anyway and it is admitted
    for the value left past it); else the binding deadline, for the record."""
    name, need = elastic.needed_units(intent, mode, eng.now)
    if need is None:
        return None
    el = eng.elastic
    i = dims.PLACED.index(name)
    now = eng.now
    admitted: list[elastic.PlanJob] = []
    needs: list[float | None] = []
    lost: list[tuple[float, float]] = []
    elastic_held = el.held[i]
    for e in el.by_lease.values():
        ls = eng.leases[e.lease_id]
        elastic_held += ls.size[i]
        if e.dim != i:
            continue
        e.running = ls.state is LeaseState.ACTIVE
        e.advance(now)
        sizes, speeds, upto = e.plan_curve()
        needed = e.needed(now)
        if needed is None:
            # Lost anyway: it keeps its smallest size to its deadline, outside the plan.
            if e.work_left > 0:
                lost.append((sizes[0], e.deadline))
            continue
        admitted.append(
            elastic.PlanJob(e.lease_id, e.deadline, e.work_left, sizes, speeds, e.seq, upto)
        )
        needs.append(needed)
    cache = el.plan_jobs
    if len(cache) > 2 * len(el.waiting) + 64:
        # Requests no longer waiting leave the cache (it stays within twice the queue).
        for wid in [w for w in cache if w not in el.waiting]:
            del cache[wid]
    for wid, (other, m) in el.waiting.items():
        hit = cache.get(wid)
        asked = eng.pending[wid]
        if (
            hit is None
            or hit[0] is not other
            or hit[1] != m
            or hit[2].order != asked.seq
            or hit[2].deadline != asked.queued_at + other.deadline_s
        ):
            job = _waiting_job(wid, asked.seq, asked.queued_at, other, m)
            hit = cache[wid] = (
                other,
                m,
                job,
                elastic.scale_dim(elastic.resolve_step(other) or other.min),
            )
        job = hit[2]
        if hit[3] != name:
            continue
        needed = elastic.constant_need(job, now)
        if needed is None:
            if job.sizes:
                lost.append((job.sizes[0], job.deadline))
            continue
        admitted.append(job)
        needs.append(needed)
    fixed = sum(c.held[i] for c in eng.campaigns.values()) - elastic_held
    capacity = eng.pool.capacity[i] - fixed
    new = _waiting_job(rid, eng._seq, now, intent, mode)
    binding = elastic.admission_plan(admitted, new, capacity, now, tuple(lost), needs)
    if binding is None:
        return None
    deadline = next((j.deadline for j in [*admitted, new] if j.key == binding), new.deadline)
    return {"binding": binding, "binding_deadline": deadline, "needed": need, "capacity": capacity}


def _waiting_job(
    rid: str, seq: int, asked_at: float, intent: elastic.Intent, mode: int
) -> elastic.PlanJob:
    """A request not granted yet as the plan sees it: all its work left, from now."""
    sizes = elastic.allowed_units(intent)
    speeds = tuple(elastic.speed(intent, u) for u in sizes)
    return elastic.PlanJob(
        rid,
        asked_at + intent.deadline_s,
        intent.remaining_work * elastic.modes(intent)[mode].work_factor,
        sizes,
        speeds,
        seq,
        elastic.fastest_upto(sizes, speeds),
    )


def deadline_promise(eng: Engine, lease_id: str) -> float | None:
    """The deadline this lease was granted for (its renewals are part of the plan until
    then: admission control counted its units to its deadline), or None: not an elastic
    lease, or past it. With admission control off the lease was still granted for its
    deadline, and the broker does not end it before then by a rule of its own either."""
    el = eng.elastic.by_lease.get(lease_id) if eng.elastic.by_lease else None
    if el is None or eng.now >= el.deadline:
        return None
    return el.deadline


def elastic_open(eng: Engine, ls: Lease, p: Pending, intent: elastic.Intent, mode: int) -> None:
    step = elastic.resolve_step(intent)
    name = elastic.scale_dim(step or intent.min)
    eng.elastic.by_lease[ls.id] = elastic.ElasticLease(
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


def elastic_size_after_shrink(eng: Engine, lease_id: str) -> dims.Vec:
    """What an elastic lease holds once the shrinks announced to it have come due."""
    size, _ = elastic_size(eng, lease_id)
    el = eng.elastic.by_lease.get(lease_id)
    for xid in el.warned if el is not None else ():
        size = dims.sub(size, eng.leases[xid].size)
    return size


def elastic_size(eng: Engine, lease_id: str) -> tuple[dims.Vec, dict[int, dims.Vec]]:
    """A live lease's whole size and pieces: its own, and for an elastic lease its
    extents' too (what the holder may use)."""
    ls = eng.leases[lease_id]
    el = eng.elastic.by_lease.get(lease_id) if eng.elastic.by_lease else None
    if el is None or not el.extents:
        return ls.size, ls.pieces
    size = ls.size
    pieces = dict(ls.pieces)
    for xid in el.extents:
        x = eng.leases[xid]
        size = dims.add(size, x.size)
        for i, v in x.pieces.items():
            pieces[i] = dims.add(pieces[i], v) if i in pieces else v
    return size, dict(sorted(pieces.items()))


def resized(
    eng: Engine,
    el: elastic.ElasticLease,
    delta: dims.Vec,
    tokens: float,
    credits: float,
    extra: Mapping[str, Any],
) -> Resized:
    size, pieces = elastic_size(eng, el.lease_id)
    nodes = eng.pool.nodes
    rule, risk = eng.policy.elastic_rule, eng.policy.elastic_risk
    return eng._emit(
        Resized(
            at=eng.now,
            lease_id=el.lease_id,
            campaign=el.campaign,
            size=dims.as_dict(size),
            delta={d: v for d, v in dims.as_dict(delta).items() if v != 0},
            mode=elastic.modes(el.intent)[el.mode].name,
            tokens=tokens,
            credits=credits,
            nodes=tuple(nodes[i].name for i in pieces),
            pieces={nodes[i].name: dims.as_dict(v) for i, v in pieces.items()},
            inputs={**el.table(eng.now, risk), "rule": rule, **extra},
        )
    )


def close_extents(
    eng: Engine, el: elastic.ElasticLease, state: LeaseState, cause: str
) -> tuple[float, float]:
    """End an ending lease's extents with it; their refunds join the lease's own."""
    _, tokens, credits = end_extents(eng, el, list(el.extents), state, cause)
    return tokens, credits


def end_extents(
    eng: Engine, el: elastic.ElasticLease, extents: list[str], state: LeaseState, cause: str
) -> tuple[dims.Vec, float, float]:
    """End these extents quietly: (what they held, their refunded tokens, credits)."""
    held = dims.ZERO
    tokens = credits = 0.0
    for xid in extents:
        x = eng.leases[xid]
        held = dims.add(held, x.size)
        if el.warned.pop(xid, None) is not None:
            eng.elastic.warned_held = dims.vmax0(dims.sub(eng.elastic.warned_held, x.size))
        d = eng._end(x, state, cause, quiet=True)
        tokens += getattr(d, "refund_tokens", 0.0)
        credits += getattr(d, "refund_credits", 0.0)
        el.extents.remove(xid)
        el.held_steps -= el.counts.pop(xid)
        del eng.elastic.parent_of[xid]
    return held, tokens, credits


def shrink_now(eng: Engine, el: elastic.ElasticLease, extents: list[str], cause: str) -> Decision:
    """End extents of a live elastic lease (an announced shrink come due, or a node lost
    under them) and say so."""
    el.advance(eng.now)
    state = LeaseState.REVOKED if cause.startswith("node ") else LeaseState.RELEASED
    held, tokens, credits = end_extents(eng, el, extents, state, cause)
    keep = el.kept(el.extents, el.floor(el.steps))
    if keep < len(el.extents):
        # A lost extent can leave a size the job cannot use: the youngest others go, down
        # to the extents that still make an allowed size at each one.
        more = el.extents[keep:]
        more_held, more_tokens, more_credits = end_extents(
            eng, el, more, LeaseState.RELEASED, f"{cause}: to an allowed size"
        )
        held = dims.add(held, more_held)
        tokens += more_tokens
        credits += more_credits
    return resized(eng, el, dims.sub(dims.ZERO, held), -tokens, -credits, {"cause": cause})


def renew_extents(eng: Engine, el: elastic.ElasticLease, new_end: float) -> tuple[float, float]:
    """A renewed elastic lease's extents are renewed with it, prepaid as any renewal; an
    extent whose extension its bucket cannot prepay is announced to end at its old expiry
    (it was prepaid until then). An extent already announced to end lives until its
    announced end and no longer: the holder was told that instant, and without the
    renewal the extent would have ended earlier, with the lease, unannounced."""
    c = eng.campaigns[el.campaign]
    tokens = credits = 0.0
    price = eng.ledger.price()
    enforcement = eng.policy.enforcement
    leased = eng.watts.leased
    short: list[str] = []
    # An extent's prepaid rate and credit rate depend on its size, the campaign's holding
    # and the price, none of which a renewal changes: worked out once per size, not once
    # per extent.
    rates: dict[dims.Vec, tuple[dims.Vec, float]] = {}
    for xid in el.extents:
        x = eng.leases[xid]
        warned = el.warned.get(xid)
        end = new_end if warned is None else min(new_end, warned)
        ext = end - x.expires_at
        if ext <= 0:
            continue
        known = rates.get(x.size)
        if known is None:
            known = rates[x.size] = (
                admission.token_need(dims.sub(c.held, x.size), x.size, c.sustained),
                eng.ledger.credit_rate(price, x.size),
            )
        rate, credit_rate = known
        if admission.bucket_short(c.buckets, c.held, rate, ext, eng.now, enforcement) or (
            leased and eng.watts.renewal_refusal(xid, ext, eng.now, enforcement) is not None
        ):
            if warned is not None:
                # Announced again, earlier, for its bucket: the first announcement goes.
                del el.warned[xid]
                eng.elastic.warned_held = dims.vmax0(dims.sub(eng.elastic.warned_held, x.size))
            short.append(xid)
            continue
        t, cr = eng.ledger.charge(c, rate, credit_rate, ext, eng.now)
        tokens += t
        credits += cr
        x.segments.append(Segment(x.expires_at, end, rate, credit_rate))
        eng.watts.renewed(xid, x.expires_at, end, eng.now, enforcement)
        eng._charge_usage(c, x.size, x.expires_at, end, +1)
        x.expires_at = end
        eng.timers.push(end, TimerKind.EXPIRE, xid)
    if short:
        keep = [x for x in el.extents if x not in el.warned and x not in short]
        # The extents left must make an allowed size: the youngest others go with them.
        short.extend(keep[el.kept(keep, el.floor(el.steps_in(keep))) :])
        eng.queue.rekey(c.spec.name)
        warn(eng, el, short, eng.leases[short[0]].expires_at, "", "bucket")
    return tokens, credits


def warn(
    eng: Engine,
    el: elastic.ElasticLease,
    extents: list[str],
    deadline: float,
    for_request: str,
    why: str,
) -> None:
    """Announce that these extents end at ``deadline``: the holder drains them."""
    for xid in extents:
        el.warned[xid] = deadline
        eng.timers.push(deadline, TimerKind.RESIZE, xid)
        eng.elastic.warned_held = dims.add(eng.elastic.warned_held, eng.leases[xid].size)
    size = elastic_size_after_shrink(eng, el.lease_id)
    rule, risk = eng.policy.elastic_rule, eng.policy.elastic_risk
    eng._emit(
        ResizeWarned(
            eng.now,
            el.lease_id,
            el.campaign,
            deadline,
            dims.as_dict(size),
            for_request,
            {**el.table(eng.now, risk), "rule": rule, "why": why},
        )
    )


def elastic_pass(eng: Engine) -> None:
    """Bring every elastic lease's model to now (work done, mode), make room for a
    waiting request the extents keep out, else hand spare capacity out a jump at a time
    in the rule's order, and move steps from one lease to another where the rule says
    they are worth more there (``broker/elastic.py``)."""
    el = eng.elastic
    now = eng.now
    policy = eng.policy
    changed: dict[str, list[Any]] = {}
    for e in el.by_lease.values():
        ls = eng.leases[e.lease_id]
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
    wanted = elastic_wanted(eng)
    if wanted is not None:
        rid, need = wanted
        if not dims.is_zero(need):
            elastic_yield(eng, rid, need)
    else:
        elastic_grow(eng, changed)
    for lid, (delta, tokens, credits) in changed.items():
        resized(eng, el.by_lease[lid], delta, tokens, credits, {})


def elastic_wanted(eng: Engine) -> tuple[str, dims.Vec] | None:
    """The first request, in admission order, waiting on the pool that the extents could
    make room for, and what it still needs beyond free capacity and what is
    already announced to return; None when no such request waits (steps may grow)."""
    pending = eng.queue.pending
    if not pending:
        return None
    el = eng.elastic
    inflight = el.warned_held
    spare = dims.vmax0(dims.sub(el.held, inflight))
    limits: dict[Any, dims.Vec] = {}
    queue = eng.queue
    best: tuple[Any, Pending, dims.Vec] | None = None
    for p in pending.values():
        if not p.counted:
            continue
        c = eng.campaigns[p.campaign]
        # The warm limit depends on the campaign's group only (as the pass's memo).
        group = (c.spec.preemptible, c.spec.lease_class, c.unmet)
        limit = limits.get(group)
        if limit is None:
            limit = limits[group] = dims.vmax0(pool_side.capacity_for(eng, c)[0])
        if dims.fits(p.size, dims.add(dims.add(limit, spare), inflight)):
            # The first such request in admission order (keys are looked at only for
            # the requests the steps could serve).
            key = queue.key(p)
            if best is None or key < best[0]:
                best = (key, p, limit)
    if best is None:
        return None
    _, p, limit = best
    total = p.size
    if eng.policy.elastic_rule == "dmug":
        # Under dmug, room for the requests behind it too, in admission order, as far as
        # the steps reach: a burst of arrivals is served in one grace period, not one
        # request per grace period (while requests wait, no lease grows).
        room = dims.add(dims.add(limit, spare), inflight)
        first = queue.key(p)
        # Each key worked out once (a key is unique: it ends with the request number).
        behind = [
            (key, q)
            for q in pending.values()
            if q.counted
            and q is not p
            and q.campaign == p.campaign
            and (key := queue.key(q)) > first
        ]
        behind.sort(key=operator.itemgetter(0))
        for _, q in behind:
            more = dims.add(total, q.size)
            if not dims.fits(more, room):
                break
            total = more
    return p.id, dims.vmax0(dims.sub(total, dims.add(limit, inflight)))


def elastic_yield(eng: Engine, rid: str, need: dims.Vec) -> None:
    """Announce the shrink of the extents worth least where they are, until what
    they return covers ``need`` (for request ``rid``). A lease shrinks a jump at a time,
    to its next allowed size below."""
    now, risk = eng.now, eng.policy.elastic_risk
    heap: list[tuple[float, float, float, str]] = []
    left: dict[str, int] = {}
    for e in eng.elastic.by_lease.values():
        k = e.steps - e.steps_in(e.warned) if e.warned else e.steps
        if k > 0:
            left[e.lease_id] = k
            heapq.heappush(heap, (e.worth(now, risk, k), -e.deadline, -e.seq, e.lease_id))
    chosen: dict[str, list[str]] = {}
    got = dims.ZERO
    while heap and not dims.fits(need, got):
        _, _, _, lid = heapq.heappop(heap)
        e = eng.elastic.by_lease[lid]
        mine = chosen.setdefault(lid, [])
        free = [x for x in e.extents if x not in e.warned and x not in mine]
        to = e.down(left[lid])
        for xid in e.youngest(free, left[lid] - to):  # the youngest extents go first
            mine.append(xid)
            got = dims.add(got, eng.leases[xid].size)
            left[lid] -= e.counts[xid]
        to = left[lid]
        if to > 0:
            heapq.heappush(heap, (e.worth(now, risk, to), -e.deadline, -e.seq, lid))
    deadline = now + eng.policy.grace_s
    for lid, xs in chosen.items():
        warn(eng, eng.elastic.by_lease[lid], xs, deadline, rid, "request")


def elastic_grow(eng: Engine, changed: dict[str, list[Any]]) -> None:
    """Hand spare warm capacity out a jump at a time (to a larger allowed size), best
    first by the rule; then, with nothing announced in flight, move steps from where
    they are worth least to the best lease that could not grow. Each lease's jumps are
    worked out once per turn; a jump larger than its campaign's spare warm capacity is
    not tried (no placement is planned for it). When no lease's smallest jump fits the
    spare capacity (a full pool: the common case), no grant can happen in the turn, and
    only what the moves read is worked out (:func:`_grow_none`): the same decisions."""
    now = eng.now
    rule, risk = eng.policy.elastic_rule, eng.policy.elastic_risk
    # ``running`` is whether the lease is active: :func:`elastic_pass` has just set it for
    # every lease, and nothing since has started or ended one.
    live = [e for e in eng.elastic.by_lease.values() if e.running and not e.warned]
    if _no_jump_fits(eng, live):
        _grow_none(eng, live)
        return
    heap: list[tuple[tuple[float, ...], str, list[int]]] = []
    for e in live:
        key, ts = e.keyed_targets(rule, now, risk)
        if ts:
            heap.append((key, e.lease_id, ts))
    heapq.heapify(heap)
    blocked: list[tuple[tuple[float, ...], str]] = []
    spare: dict[str, float] = {}
    while heap:
        key, lid, ts = heapq.heappop(heap)
        e = eng.elastic.by_lease[lid]
        k = e.steps
        per = e.step[e.dim]
        free = spare.get(e.campaign)
        if free is None:
            free = spare[e.campaign] = pool_side.capacity_for(eng, eng.campaigns[e.campaign])[0][
                e.dim
            ]
        grants = None
        for to in ts:
            if (to - k) * per <= free + 1e-9:
                grants = grow_to(eng, e, to - k)
                if grants is not None:
                    break
        if grants is None:
            blocked.append((key, lid))
            continue
        spare.clear()  # a grant changes every campaign's spare capacity
        acc = changed.setdefault(lid, [dims.ZERO, 0.0, 0.0])
        for size, tokens, credits in grants:
            acc[0] = dims.add(acc[0], size)
            acc[1] += tokens
            acc[2] += credits
        key, ts = e.keyed_targets(rule, now, risk)
        if ts:
            heapq.heappush(heap, (key, lid, ts))
    if not blocked:
        return
    if not any(e.warned for e in eng.elastic.by_lease.values()):
        rebalance(eng, min(blocked)[1])
    elif rule == "dmug":
        # Shrinks are in flight: only leases whose deadline is lost at their size move
        # more steps (each once what is in flight and free is counted for those before).
        rescue_all(eng, [lid for key, lid in sorted(blocked) if key[0] == 0.0])


def _no_jump_fits(eng: Engine, live: list[elastic.ElasticLease]) -> bool:
    """Is every live lease's smallest jump up larger than the most spare warm capacity its
    campaign has in any dimension? Then :func:`elastic_grow` grants nothing this turn
    (the spare it compares a jump with is one of those, and a larger jump needs more)."""
    most: dict[str, float] = {}
    for e in live:
        k = e.held_steps
        allowed = e.allowed
        i = bisect.bisect_right(allowed, k)  # its smallest jump up: to allowed[i]
        per = e.step[e.dim]
        if i == len(allowed) or per <= 0:
            continue  # no jump up at all (at max): it tries none
        free = most.get(e.campaign)
        if free is None:
            free = most[e.campaign] = max(pool_side.capacity_for(eng, eng.campaigns[e.campaign])[0])
        if (allowed[i] - k) * per <= free + 1e-9:
            return False
    return True


def _grow_none(eng: Engine, live: list[elastic.ElasticLease]) -> None:
    """:func:`elastic_grow`'s turn when no jump fits: every lease that wants to grow is
    blocked, in the rule's order. With no shrink in flight the first of them is
    rebalanced (a lease whose deadline is lost at its size comes first under dmug, so the
    others' gains are worked out only when there is none); with shrinks in flight, under
    dmug, those whose deadline is lost at their size are rescued (their keys need no
    gains); else nothing moves."""
    now = eng.now
    rule, risk = eng.policy.elastic_rule, eng.policy.elastic_risk
    in_flight = any(e.warned for e in eng.elastic.by_lease.values())
    if in_flight and rule != "dmug":
        return
    if rule == "dmug":
        first: list[tuple[tuple[float, ...], str]] = []
        for e in live:
            if e.steps < e.max_steps and e.rescue(now) is not None:
                first.append(((0.0, e.deadline, e.deadline, float(e.seq)), e.lease_id))
        if in_flight:
            if first:
                rescue_all(eng, [lid for _, lid in sorted(first)])
            return
        if first:
            rebalance(eng, min(first)[1])
            return
    best: tuple[tuple[float, ...], str] | None = None
    for e in live:
        key, ts = e.keyed_targets(rule, now, risk)
        if ts and (best is None or (key, e.lease_id) < best):
            best = (key, e.lease_id)
    if best is not None:
        rebalance(eng, best[1])


def rescue_all(eng: Engine, lids: list[str]) -> None:
    """With shrinks already announced, save the deadlines of ``lids`` (blocked leases
    whose deadline is lost at their size but met at a larger one, earliest deadline
    first): the units free and those announced to return are counted for them in turn;
    a lease they do not cover takes whole shrinks (each to the next allowed size below,
    least worth first) of steps not yet announced, from leases that still meet their
    deadlines at the smaller size, all it needs or none."""
    now, risk = eng.now, eng.policy.elastic_risk
    el = eng.elastic
    coming: dict[int, float] = {}
    taken: dict[str, list[str]] = {}
    for lid in lids:
        b = el.by_lease[lid]
        save = b.rescue(now)
        if save is None:
            continue
        per = b.step[b.dim]
        if b.dim not in coming:
            free = pool_side.capacity_for(eng, eng.campaigns[b.campaign])[0][b.dim]
            coming[b.dim] = max(0.0, free) + el.warned_held[b.dim]
        need = (save - b.steps) * per - coming[b.dim]
        if need <= 1e-9:
            coming[b.dim] = -need
            continue
        got = 0.0
        mine: dict[str, list[str]] = {}
        while got < need - 1e-9:
            best: tuple[float, float, float, str] | None = None
            for x in el.by_lease.values():
                if x is b or x.dim != b.dim or x.lease_id in lids:
                    continue
                xk = x.steps_in(_unclaimed(x, taken, mine))
                if xk > 0 and now + x.time_left(x.down(xk)) <= x.deadline:
                    key = (x.worth(now, risk, xk), -x.deadline, -x.seq, x.lease_id)
                    if best is None or key < best:
                        best = key
            if best is None:
                break
            x = el.by_lease[best[3]]
            unclaimed = _unclaimed(x, taken, mine)
            xk = x.steps_in(unclaimed)
            shrink = x.youngest(unclaimed, xk - x.down(xk))  # the youngest extents first
            mine.setdefault(x.lease_id, []).extend(shrink)
            got += x.steps_in(shrink) * x.step[x.dim]
        coming[b.dim] = 0.0
        if got < need - 1e-9:
            continue
        for xl, xs in mine.items():
            taken.setdefault(xl, []).extend(xs)
        coming[b.dim] = got - need
        deadline = now + eng.policy.grace_s
        for xl, xs in mine.items():
            warn(eng, el.by_lease[xl], xs, deadline, "", f"to {lid}")


def _unclaimed(x: elastic.ElasticLease, *claims: Mapping[str, list[str]]) -> list[str]:
    """The extents of ``x`` not announced to end and not in ``claims``, oldest first."""
    out = [s for s in x.extents if s not in x.warned]
    for c in claims:
        if x.lease_id in c:
            out = [s for s in out if s not in c[x.lease_id]]
    return out


def grow_to(
    eng: Engine, e: elastic.ElasticLease, n: int
) -> list[tuple[dims.Vec, float, float]] | None:
    """``n`` more steps for ``e`` now, all or none, as one extent per allowed size crossed
    (so that a shrink to the next allowed size below ends the youngest extent): each on
    warm capacity, under its campaign's envelope, the isolation rule and the reservations.
    The (size, tokens, credits) of each extent granted; None if any says no (the extents
    granted before the one refused end at once, unannounced)."""
    ls = eng.leases[e.lease_id]
    c = eng.campaigns[e.campaign]
    if n <= 0 or ls.expires_at <= eng.now:
        return None
    total = tuple(v * n for v in e.step)
    limit, _ = pool_side.capacity_for(eng, c)
    if not dims.fits(total, limit) or admission.over_burst(c.held, total, c.burst_bound):
        return None
    k = e.steps
    grants: list[tuple[dims.Vec, float, float]] = []
    for to in e.ups(k):
        if to > k + n:
            break
        grant = grow_extent(eng, e, to - e.steps)
        if grant is None:
            end_extents(eng, e, e.extents[len(e.extents) - len(grants) :], LeaseState.RELEASED, "")
            return None
        grants.append(grant)
    return grants


def grow_extent(
    eng: Engine, e: elastic.ElasticLease, count: int
) -> tuple[dims.Vec, float, float] | None:
    """An extent of ``count`` more steps for ``e`` now, on warm capacity, under its
    campaign's envelope, the isolation rule and the reservations: (its size, the tokens
    and credits it was charged); None if any says no."""
    ls = eng.leases[e.lease_id]
    c = eng.campaigns[e.campaign]
    span = ls.expires_at - eng.now
    size = e.step if count == 1 else tuple(v * count for v in e.step)
    if span <= 0 or admission.over_burst(c.held, size, c.burst_bound):
        return None
    rate = admission.token_need(c.held, size, c.sustained)
    if admission.bucket_short(c.buckets, c.held, rate, span, eng.now, eng.policy.enforcement):
        return None
    p = Pending(
        id="",
        campaign=e.campaign,
        size=size,
        duration_s=span,
        lease_class=ls.lease_class,
        blocking=False,
        seq=0,
        queued_at=eng.now,
        labels=ls.labels,
    )
    limit, _ = pool_side.capacity_for(eng, c)
    plan = eng.placement.plan(p, limit, dims.ZERO, c.spec.preemptible, dims.ZERO)
    if plan is None or plan.path is not LeasePath.WARM:
        return None
    budget = eng.watts
    if budget.leased:
        watts = budget.watts_of(None, size, eng._primary)
        if (
            budget.campaign_refusal(e.campaign, watts, span, eng.now, eng.policy.enforcement)
            is not None
            or budget.cap_refusal(eng.pool, e.campaign, watts, 0.0) is not None
        ):
            return None
    profile = reservation_cut.build(eng)
    if (
        profile is not None
        and not isolation.within_own_guarantee(size, c.unmet)
        and not profile.admits(size, eng.now, ls.expires_at, "")
    ):
        return None
    eng._seq += 1
    p.id = f"L{eng._seq}"
    p.seq = eng._seq
    tokens, credits = eng.grant_extent(p, c, plan, rate)
    eng.elastic.parent_of[p.id] = e.lease_id
    e.extents.append(p.id)
    e.counts[p.id] = count
    e.held_steps += count
    return size, tokens, credits


def rebalance(eng: Engine, lid: str) -> None:
    """Announce the shrink of steps held elsewhere that the rule says are worth more to
    lease ``lid`` (which could not grow), a jump at a time: each of ``lid``'s jumps to
    its next target takes whole shrinks of others (each to their next allowed size
    below, least worth first) until they cover it with the spare units; a jump they
    cannot cover takes nothing. Under dmug a shrink is taken only where the jump's gain
    per step is at least ``elastic_hysteresis`` times what the shrink gives up per step."""
    now, policy = eng.now, eng.policy
    rule, risk = policy.elastic_rule, policy.elastic_risk
    b = eng.elastic.by_lease[lid]
    per = b.step[b.dim]
    limit, _ = pool_side.capacity_for(eng, eng.campaigns[b.campaign])
    spare = int(max(0.0, limit[b.dim]) // per + 1e-9) if per > 0 else 0
    k = b.steps
    chosen: dict[str, list[str]] = {}
    held = {x.lease_id: x.steps for x in eng.elastic.by_lease.values() if x is not b}
    while True:
        save = None
        if rule == "dmug":
            jumps = b.jumps(now, risk, k)
            if not jumps:
                break
            gain, to = jumps[0]
            if k == b.steps:
                # A deadline lost at the size held but saved by a larger one: the jump to the
                # fewest units that save it, taken from leases that still meet theirs.
                save = b.rescue(now)
                to = to if save is None else save
        else:
            sp = b.speed(k)
            to = next((a for a in b.ups(k) if b.speed(a) > sp), -1)
            if to < 0:
                break
            gain = 0.0
        got = spare
        taken: dict[str, int] = {}
        if got < to - k:
            # The shrinks least worth first, ties to the lease granted first (``held``'s
            # order): a heap of each lease's next shrink, changed only where one is taken.
            judge = _judge(eng, b, save, gain, to)
            heap = [
                (w, pos, xl)
                for pos, (xl, xk) in enumerate(held.items())
                if xk > 0 and (w := judge(xl, xk)) is not None
            ]
            heapq.heapify(heap)
            while got < to - k and heap:
                _, pos, xl = heapq.heappop(heap)
                xk = held[xl] - taken.get(xl, 0)
                d = eng.elastic.by_lease[xl].down(xk)
                taken[xl] = taken.get(xl, 0) + xk - d
                got += xk - d
                if d > 0 and (w := judge(xl, d)) is not None:
                    heapq.heappush(heap, (w, pos, xl))
        if got < to - k:
            break
        for xl, n in taken.items():
            x = eng.elastic.by_lease[xl]
            # The youngest extents not yet chosen, for the n steps taken (no shrink is in
            # flight when a lease is rebalanced, so every extent is free to take).
            left = x.extents[: len(x.extents) - len(chosen.get(xl, ()))]
            picked = x.youngest(left, n)
            chosen.setdefault(xl, []).extend(picked)
            held[xl] -= x.steps_in(picked)
        spare = got - (to - k)
        k = to
    deadline = now + policy.grace_s
    for xl, xs in chosen.items():
        warn(eng, eng.elastic.by_lease[xl], xs, deadline, "", f"to {lid}")


def _judge(
    eng: Engine, b: elastic.ElasticLease, save: int | None, gain: float, to: int
) -> Callable[[str, int], float | None]:
    """How :func:`rebalance` weighs taking a shrink from lease ``xl`` at ``xk`` steps for
    ``b``'s jump to ``to``: what the shrink gives up (least first), or None when the rule
    does not take it."""
    now, policy = eng.now, eng.policy
    rule, risk = policy.elastic_rule, policy.elastic_risk
    by_lease = eng.elastic.by_lease
    if save is None and rule == "dmug":
        # Nearly every rebalance, weighed for every other lease, so on its own: a shrink
        # is taken where the jump's gain per step is at least ``elastic_hysteresis`` times
        # what it gives up per step.
        hysteresis = policy.elastic_hysteresis

        def judge_dmug(xl: str, xk: int) -> float | None:
            worth = by_lease[xl].worth(now, risk, xk)
            return worth if gain >= hysteresis * worth else None

        return judge_dmug

    def judge(xl: str, xk: int) -> float | None:
        x = by_lease[xl]
        if save is not None:
            worth = x.worth(now, risk, xk)
            ok = now + x.time_left(x.down(xk)) <= x.deadline
        elif rule == "edf":
            worth, ok = -x.deadline, b.deadline < x.deadline
        elif rule == "value":
            worth, ok = x.intent.value, b.intent.value > x.intent.value
        else:
            worth, ok = -float(xk), to <= x.down(xk)
        return worth if ok else None

    return judge
