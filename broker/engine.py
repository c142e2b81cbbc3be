"""The policy engine: a deterministic fold of events into state and decisions.

``Engine.apply(event)`` validates the event (raising ``RequestError`` before touching
anything), advances the clock to ``event.at`` (firing expiries, revocations and
wake-ups in time order), applies the event, runs the admission pass, and returns the
decisions. It never reads a clock, never does I/O and draws no random numbers, so the
same events always give the same decisions and the same state: the journal replays
and audits it.

The rules themselves live in small modules named for them: ``admission`` (order,
burst, bucket, the typed refusals, and the admission pass itself, ``AdmissionPass``),
``pool_side`` (the plan a request could be placed on now, and what a campaign may use),
``reservations`` (aged requests' reservations, backfill; ``reservation_cut`` cuts them
from the engine's state), ``renewal`` (a lease's extension, checked as a request is),
``queueing`` (what becomes of a refused request: queued or rejected, its reason and its
wake-up), ``isolation`` (the guarantee reserve), ``paths`` (warm, reclaim, cold),
``bucket``, ``price``, ``metering``, ``supply``, ``lease`` (life cycle); ``rule_inputs``
(what a decision records of them) and ``state_view`` (the state as data). The state the
fold keeps lives in modules named for what each holds: ``validation`` (whether an event
may apply, and why not), ``timers`` (what is due when, and whether it still matters),
``pending`` (the queues and the indexes the admission pass reads), ``ledger``
(holdings, reserve, reclaimable, price pressure, charges and refunds), ``placement``
(pieces on nodes, reclaim hand-over, leases waiting on boots), ``power`` (boots, idle
spells, power-off) and ``keys`` (idempotency keys). This module is the fold: the
handlers, the checks a request goes through (``_try``), grants and ends, and the
decisions they emit, in order.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from bursar.broker import (
    admission,
    dims,
    elastic,
    invariants,
    isolation,
    paths,
    policy_change,
    pool_side,
    power_budget,
    power_checks,
    queueing,
    renewal,
    reservation_cut,
    reservations,
    retune,
    rule_inputs,
    shape,
    state_view,
    validation,
)
from bursar.broker import elastic_fold as fold
from bursar.broker import price as pricing
from bursar.broker.codec import dumps, plain
from bursar.broker.decisions import (
    Allocated,
    CampaignSet,
    Cancelled,
    Decision,
    Expired,
    Granted,
    Metered,
    PolicySet,
    Queued,
    Released,
    Revoked,
)
from bursar.broker.ended import EndedLeases
from bursar.broker.events import (
    AllocationReady,
    ApplyPolicy,
    CancelRequest,
    CreateCampaign,
    Event,
    LeaseLost,
    Meter,
    NodeLost,
    NodeReady,
    Release,
    Renew,
    RequestLease,
    Tick,
    UpdateCampaign,
)
from bursar.broker.keys import KEY_WINDOW_S, KeyRecord, Keys, request_fingerprint
from bursar.broker.lease import EndedLease, Lease, LeaseState, Segment
from bursar.broker.ledger import CampaignState, Ledger
from bursar.broker.ledger import end_entry as ledger_end_entry
from bursar.broker.metering import meter
from bursar.broker.outcome import Outcome
from bursar.broker.pending import Pending, Queues
from bursar.broker.placement import Placement
from bursar.broker.policy import ENDED_LEASES_KEPT, Enforcement, PolicySpec, PoolSpec
from bursar.broker.pool import PoolState
from bursar.broker.power import PowerControl
from bursar.broker.reasons import Reason
from bursar.broker.rules_version import RULES_VERSION
from bursar.broker.timers import TimerKind, Timers

D = TypeVar("D", bound=Decision)

ENDED_KEPT = ENDED_LEASES_KEPT
"""Ended leases the engine remembers by default (the newest; the policy's
``ended_leases_kept``): enough to answer "already ended" and to
open a Watch on a lease that ended a while ago, bounded so that a long-running broker's
state does not grow with every lease it ever granted."""


class Engine:
    """One pool, its campaigns, leases and queue. Build it with the pool and policy specs."""

    def __init__(self, pool: PoolSpec, policy: PolicySpec | None = None) -> None:
        self.pool_spec = pool
        self.policy = policy or PolicySpec()
        self.pool = PoolState(pool)
        self.now = 0.0
        self.events_applied = 0
        self._seq = 0
        self.campaigns: dict[str, CampaignState] = {}
        self.leases: dict[str, Lease] = {}
        self.ended = EndedLeases(self.policy.ended_leases_kept)
        """The newest ``ended_leases_kept`` ended leases (or up to one chunk more), oldest first."""
        self.idempotency = Keys(self.policy.idempotency_window_s, self.policy.idempotency_keys_kept)
        self.elastic = elastic.ElasticLeases()
        """Elastic leases' allocator state and their extents (``broker/elastic.py``)."""
        self._primary = pricing.primary_index(self.pool.capacity)
        # The state the fold keeps, each part in the module named for it; the timers'
        # liveness reads the leases, the queue and the power state back through ``self``.
        self.timers = Timers(self)
        self.watts = power_budget.PowerBudget(pool, self.pool, self.policy.power_cap_w)
        """The facility's power cap and each campaign's watts (``broker/power_budget.py``)."""
        self.queue = Queues(
            self.campaigns,
            self._primary,
            self.policy.hol_patience_s,
            self.timers.push,
            self.watts.own_unmet,
        )
        self.ledger = Ledger(self.policy, self.pool, self._primary, self.leases)
        self.power = PowerControl(self.pool, pool.boot_latency_s, self.policy, self.timers.push)
        self.placement = Placement(
            self.pool, self.policy, self.leases, self.ledger, self.power, self.timers
        )
        self.headroom = self.power.headroom
        self._out: list[Decision] = []
        self._cut = reservations.Current()
        """The reservations as of this admission pass, built lazily (``reservation_cut.build``),
        and what they read lazily: a cache, rebuilt by every event before it is read."""
        self.exhaustive = False
        """The reference admission pass: every pool-blocked request is asked on its own, as
        if no request answered for the others of its bucket (tests compare the two)."""

    def __getstate__(self) -> dict[str, Any]:
        """The state a snapshot keeps: everything but the per-pass caches, which every
        event rebuilds before reading (``apply`` resets them)."""
        state = dict(self.__dict__)
        state.update(
            _out=[],
            _cut=reservations.Current(),
        )
        return state

    # ------------------------------------------------------------------ public API

    def apply(self, event: Event) -> Outcome:
        """Apply one event; return its outcome: every decision it caused, and apart the one
        answering its own request. Bad input raises, changing nothing."""
        demand = validation.validate(self, event)
        if isinstance(event, RequestLease):
            # The demand the checks resolved: the fold does not resolve the shape again.
            assert demand is not None
            out, own = self._fold(event.at, lambda: self._on_request(event, demand), 1)
        else:
            handler = _HANDLERS[type(event)]
            out, own = self._fold(event.at, lambda: handler(self, event), 1)
        if isinstance(own, Queued):
            # Queued, then granted by the admission pass of the same event: the grant is the
            # answer (the caller must not wait for what it already has).
            for d in out:
                if isinstance(d, Granted) and d.lease_id == own.request_id:
                    own = d
        return Outcome(tuple(out), own)

    def release_together(self, releases: Sequence[Release]) -> Outcome:
        """Release several leases at one instant with one admission pass after the last,
        as a batch scheduler looks at its queue once when jobs end together (EASY does).
        Released one ``apply`` at a time, the first lease's capacity could go to a small
        request further back before the next lease is back, where the older request that
        needs both would have started. Used by trace replay, whose jobs often end in the
        same second; a service applies what arrives one event at a time.

        Every release must be at the same time, of a different lease, and valid now; all
        are checked before any applies, and bad input raises, changing nothing. Returns
        one outcome: the Released decisions in the order given, then what the pass
        decided; ``own`` is None. One release is exactly ``apply``."""
        if not releases:
            return Outcome()
        if len(releases) == 1:
            return self.apply(releases[0])
        seen: set[str] = set()
        for e in releases:
            if not isinstance(e, Release):
                raise validation.bad("releases", f"expected Release events, got {type(e).__name__}")
            if e.at != releases[0].at:
                raise validation.bad(
                    "at", f"released together means at one time (got {releases[0].at} and {e.at})"
                )
            if e.lease_id in seen:
                raise validation.bad("lease_id", f"lease {e.lease_id!r} is released twice")
            seen.add(e.lease_id)
            validation.validate(self, e)

        def release_all() -> None:
            for e in releases:
                self._on_release(e)

        out, _ = self._fold(releases[0].at, release_all, len(releases))
        return Outcome(tuple(out))

    def _fold(
        self, at: float, act: Callable[[], Decision | None], events: int
    ) -> tuple[list[Decision], Decision | None]:
        """Run the clock to ``at``, ``act`` (the events' own handling, returning the
        decision answering the event, if any), then settle: the decisions made, in order,
        and ``act``'s own."""
        self._out = []
        self._cut.stale()
        self._advance(at)
        own = act()
        self._settle()
        self.events_applied += events
        self.idempotency.forget(self.now)
        out, self._out = self._out, []
        return out, own

    def key_record(self, campaign: str, key: str) -> KeyRecord | None:
        """What an Acquire with this idempotency key got, if one came within the window."""
        return self.idempotency.get(campaign, key)

    @property
    def keys(self) -> dict[tuple[str, str], KeyRecord]:
        """Idempotency keys seen in the window (the policy's ``idempotency_window_s``), by
        (campaign, key), oldest first."""
        return self.idempotency.records

    def next_timer(self) -> float | None:
        """When the shell should send the next ``Tick`` (an expiry, revocation or wake-up)."""
        return self.timers.next_due()

    @property
    def pending(self) -> dict[str, Pending]:
        """Every waiting request by id."""
        return self.queue.pending

    def holders_leases(self) -> Iterator[Lease]:
        """The live leases holders know of: every lease but elastic leases' extents
        (which are the engine's own, reported as part of their lease)."""
        steps = self.elastic.parent_of
        if not steps:
            return iter(self.leases.values())
        return (ls for ls in self.leases.values() if ls.id not in steps)

    def lease(self, lease_id: str) -> Lease:
        try:
            return self.leases[lease_id]
        except KeyError:
            raise validation.unknown_lease(self.ended, lease_id) from None

    def price(self) -> float:
        return self.ledger.price()

    def reservation(self, request_id: str) -> float | None:
        """When a waiting request's reservation starts, if it holds one (a pure read: see
        ``reservation_starts``)."""
        return self.reservation_starts().get(request_id)

    def reservation_starts(self) -> dict[str, float]:
        """When each reservation held now starts, by request id. A pure read: the profile is
        derived state, built afresh here from the state as it is."""
        self._cut.stale()
        profile = reservation_cut.build(self)
        if profile is None:
            return {}
        return {rid: r.at for rid, r in profile.reservations.items()}

    def estimated_wait(self, request_id: str) -> float:
        """Seconds a waiting request is expected to wait from now by the ledger's estimate
        for its reason (the estimate its Queued decision carried, made again now; a
        reservation, see ``reservation_starts``, is the better answer when it holds one).
        A pure read."""
        p = self.queue.pending[request_id]
        reason = p.reason or Reason.POOL_FULL
        c = self.campaigns[p.campaign]
        return self.ledger.estimate_wait(c, p.size, p.duration_s, reason, self.now)

    def pressure(self) -> float:
        return self.ledger.pressure()

    @property
    def reserve(self) -> dims.Vec:
        return self.ledger.reserve

    @property
    def reclaimable(self) -> dims.Vec:
        return self.ledger.reclaimable

    def bucket_level(self, campaign: str, dim: str, at: float | None = None) -> float | None:
        """The campaign's bucket level for ``dim`` at ``at`` (``state_view.bucket_level``)."""
        return state_view.bucket_level(self, campaign, dim, at)

    def bucket_levels(self, campaign: str, at: float | None = None) -> dict[str, float]:
        """Every bucket of the campaign (``state_view.bucket_levels``)."""
        return state_view.bucket_levels(self, campaign, at)

    def state_dict(self) -> dict[str, Any]:
        """The whole state as canonical JSON-able data (``state_view.state_dict``)."""
        return state_view.state_dict(self)

    def state_digest(self) -> str:
        return hashlib.sha256(dumps(plain(self.state_dict())).encode()).hexdigest()

    def check_invariants(self) -> None:
        """Raise AssertionError if the state breaks a rule the engine must always keep (see
        ``invariants.check``)."""
        invariants.check(self)

    # ------------------------------------------------------------------ time

    def _advance(self, to: float) -> None:
        """Run the clock to ``to``, firing each live timer due by then at its own time, with
        an admission pass after each instant's timers (every lease ending at an instant has
        ended before anyone is served then: a reservation counts on all of them)."""
        while True:
            t = self.timers.next_due()
            if t is None or t > to:
                break
            self.now = t
            # Every live timer at ``t``, those its handlers set for ``t`` included.
            for _, kind, ref in self.timers.due(t):
                if kind is TimerKind.EXPIRE:
                    self._end(self.leases[ref], LeaseState.EXPIRED, "expired")
                elif kind is TimerKind.DEADLINE:
                    self._end(self.leases[ref], LeaseState.REVOKED, "reclaimed")
                elif kind is TimerKind.AGE:
                    self.queue.age(ref)
                    # The next pass gives it its reservation, if it is among the first aged.
                    self.queue.dirty.add(self.queue.pending[ref].campaign)
                elif kind is TimerKind.WAKE:
                    self.queue.wake(ref)
                elif kind is TimerKind.IDLE:
                    off = self.power.power_off_if_idle(ref, self.ledger.warm_reserve(), self.now)
                    if off is not None and self.watts.cap is not None:
                        # Its idle draw is free: a request held back by the cap may fit.
                        self.queue.pool_dirty = True
                    self._emit_some(off)
                elif kind is TimerKind.RESIZE:
                    # Every step the lease was told would end by now goes in one shrink.
                    el = self.elastic.by_lease[self.elastic.parent_of[ref]]
                    due = [x for x in el.extents if el.warned.get(x, t + 1) <= t]
                    fold.shrink_now(self, el, due, "resized")
            self._settle()
        self.now = to

    # ------------------------------------------------------------------ holding

    def _set_held(self, c: CampaignState, held: dims.Vec) -> None:
        self._cut.holding_changes(c)
        self.ledger.set_held(c, held, self.now)
        self.queue.rekey(c.spec.name)

    # ------------------------------------------------------------------ handlers

    def _on_create(self, e: CreateCampaign) -> Decision:
        c = CampaignState(e.spec)
        c.set_spec(e.spec, self.now, self.pool.capacity)
        self.campaigns[e.spec.name] = c
        self.watts.set_campaign(e.spec, self.now, self.policy.enforcement)
        self.ledger.open(c)
        return self._emit(CampaignSet(self.now, e.spec.name, True))

    def _on_update(self, e: UpdateCampaign) -> Decision:
        c = self.campaigns[e.spec.name]
        self._set_held(c, c.held)  # bring buckets to now under the old rates
        self.ledger.respec(c, e.spec, self.now, self.campaigns.values())
        self.watts.set_campaign(e.spec, self.now, self.policy.enforcement)
        self.queue.rekey(c.spec.name)
        self.queue.dirty.add(c.spec.name)
        self.queue.pool_dirty = True
        return self._emit(CampaignSet(self.now, e.spec.name, False))

    def _on_apply_policy(self, e: ApplyPolicy) -> Decision:
        """A new policy from now on (``broker/policy_change.py`` says what it does to what
        is under way); the admission pass after it looks at the whole queue again."""
        changed = policy_change.changes(self.policy, e.policy)
        retune.retune(self, e.policy)
        return self._emit(PolicySet(self.now, changed))

    def _on_request(self, e: RequestLease, demand: shape.Demand) -> Decision:
        c = self.campaigns[e.campaign]
        self._seq += 1
        rid = f"L{self._seq}"
        intent = e.intent
        p = Pending(
            id=rid,
            campaign=e.campaign,
            size=demand.size,
            duration_s=float(e.duration_s),
            lease_class=e.lease_class or c.spec.lease_class,
            blocking=e.blocking,
            seq=self._seq,
            queued_at=self.now,
            labels=dict(e.labels),
            key=e.idempotency_key,
            demand=demand,
            watts=power_checks.declared(e),
        )
        self.idempotency.record(e, rid, self.now)
        if intent is not None:
            # Admission control first: a deadline no allocation can meet is refused at once.
            mode = elastic.admit(intent, self.now, self.policy.elastic_degrade)
            if self.policy.elastic_admission:
                if mode is None:
                    return fold.refuse_deadline(self, p, intent)
                crowded = fold.elastic_crowded(self, rid, intent, mode)
                if crowded is not None:
                    return fold.refuse_deadline(self, p, intent, crowded)
            self.elastic.waiting[rid] = (intent, mode or 0)
        head = self.queue.holds_back(p.campaign, p.lease_class)
        if head is not None:
            # First come, first served within a campaign and class while the head waits on
            # the campaign's own limits: wait behind it.
            return queueing.refuse(self, p, head.reason or Reason.POOL_FULL, {"behind": head.id})
        result = self._try(p, reservation_cut.build(self) if self.queue.barrier_before(p) else None)
        if isinstance(result, admission.Refusal):
            return queueing.refuse(self, p, result.reason, result.details)
        return result

    def _on_cancel(self, e: CancelRequest) -> Decision | None:
        own = self._cancel_one(e.request_id)
        for rid in e.also:
            # Queued when the event was validated; granted during the advance is handled
            # as for the first (the holder no longer wants it).
            self._cancel_one(rid)
        return own

    def _cancel_one(self, request_id: str) -> Decision | None:
        p = self.queue.pending.get(request_id)
        if p is None:
            # Granted while the clock advanced to this event: the holder no longer wants it.
            ls = self.leases.get(request_id)
            if ls is not None:
                return self._end(ls, LeaseState.RELEASED, "cancelled")
            return None
        queueing.unqueue(self, p)
        self.idempotency.withdraw(p.id)
        self.elastic.waiting.pop(p.id, None)
        self.queue.pool_dirty = True
        return self._emit(Cancelled(self.now, p.id, p.campaign))

    def _on_release(self, e: Release) -> Decision | None:
        ls = self.leases.get(e.lease_id)
        # A lease reclaimed while the clock advanced to this event has already ended
        # (its Revoked is among this event's decisions): nothing is left to release.
        if ls is not None:
            return self._end(ls, LeaseState.RELEASED, "released")
        return None

    def _on_tick(self, e: Tick) -> None:
        return None

    def _on_node_ready(self, e: NodeReady) -> None:
        i = self.pool.index[e.node]
        self.power.node_ready(i, self.now)
        self._out.extend(self.placement.node_ready(i, self.now))
        self.queue.pool_dirty = True

    def _on_node_lost(self, e: NodeLost) -> None:
        i = self.pool.index[e.node]
        for ls in self.placement.hit_by_loss(i):
            if ls.id in self.leases:
                self._end(ls, LeaseState.REVOKED, f"node {e.node} lost")
        self.placement.node_lost(i)
        self.power.node_lost(i)

    def _on_lease_lost(self, e: LeaseLost) -> Decision | None:
        ls = self.leases.get(e.lease_id)
        # The backend may notice a loss the engine has already acted on (a revoke or expiry
        # due at the same instant): nothing is left to revoke then.
        if ls is not None:
            return self._end(ls, LeaseState.REVOKED, e.cause)
        return None

    def _on_allocation_ready(self, e: AllocationReady) -> Decision | None:
        ls = self.leases.get(e.lease_id)
        if ls is None:
            return None  # ended while its allocation was being made
        return self._emit(Allocated(self.now, ls.id, ls.campaign, dict(e.allocation)))

    def _on_meter(self, e: Meter) -> Decision:
        c = self.campaigns[e.campaign]
        b = c.rate_buckets[e.dim]
        b.advance(self.now, 0.0, Enforcement.PREPAID)
        env = c.spec.envelopes[e.dim]
        out = meter(b, env, float(e.amount), self.policy.meter_window_s)
        b.take(out.granted)
        return self._emit(
            Metered(
                self.now,
                e.campaign,
                e.dim,
                float(e.amount),
                out.granted,
                out.wait_s,
                {
                    "level": None if b.unlimited else out.level_before,
                    "sustained": env.sustained,
                    "burst": env.burst,
                },
            )
        )

    # ------------------------------------------------------------------ admission

    def _try(
        self,
        p: Pending,
        behind: reservations.Profile | None,
        memo: dict[Any, Any] | None = None,
    ) -> Granted | admission.Refusal:
        """Grant ``p`` now if every rule allows; otherwise why not (``Refusal``).
        ``behind`` is the reservations ``p`` comes after, if any: it must leave them whole
        unless it fits within its campaign's own unmet guarantee. ``memo``: the admission
        pass's answers of the pool side, as of its last grant."""
        c = self.campaigns[p.campaign]
        size = p.size
        refused = admission.burst_refusal(c.held, size, c.burst_bound)
        if refused is not None:
            return refused
        rate = admission.token_need(c.held, size, c.sustained)
        enforcement = self.policy.enforcement
        refused = admission.bucket_refusal(
            admission.bucket_short(c.buckets, c.held, rate, p.duration_s, self.now, enforcement)
        )
        if refused is not None:
            return refused
        refused = power_checks.own(self, p, p.duration_s)
        if refused is not None:
            return refused
        own = c.unmet
        if behind is not None and isolation.within_own_guarantee(size, own):
            behind = None
        plan, delay = pool_side.pool_side(self, p, c, memo)
        if isinstance(plan, admission.Refusal):
            return plan
        if behind is not None:
            start = self.now + delay
            end = start + p.duration_s
            if not behind.admits(size, start, end, p.id) or reservation_cut.crowds_own_holder(
                self, p, c, end, behind
            ):
                return admission.reservations_refusal(r.at for r in behind.reservations.values())
            refused = power_checks.holders(self, p, plan, delay, behind)
            if refused is not None:
                return refused
        if delay > 0 and enforcement is Enforcement.PREPAID:
            refused = admission.bucket_refusal(
                admission.bucket_short(
                    c.buckets, c.held, rate, p.duration_s + delay, self.now, enforcement
                )
            )
            refused = refused or power_checks.own(self, p, p.duration_s + delay)
            if refused is not None:
                return refused
        return self._grant(p, c, plan, rate, own)

    # ------------------------------------------------------------------ reservations
    # (the two methods below are how ``elastic_fold`` asks the pool side and the
    # reservations; the fold itself calls the modules)

    def _charge_usage(
        self, c: CampaignState, size: dims.Vec, start: float, end: float, sign: int
    ) -> None:
        ledger = self.ledger
        if not ledger.fairshare:
            return
        if ledger.rebase_usage(self.now, self.campaigns.values()):
            for name in self.campaigns:
                self.queue.rekey(name)
        ledger.charge_usage(c, size, start, end, sign)

    def _grant(
        self, p: Pending, c: CampaignState, plan: paths.Plan, rate: dims.Vec, own: dims.Vec
    ) -> Granted:
        """Grant ``p`` on ``plan`` and record it (a Granted with the rules' inputs)."""
        inputs = rule_inputs.inputs(self, c, p.size)
        inputs["path_split"] = {
            "warm": dims.as_dict(plan.warm),
            "reclaim": dims.as_dict(plan.reclaim),
            "cold": dims.as_dict(plan.cold),
        }
        inputs["within_guarantee"] = isolation.within_own_guarantee(p.size, own)
        inputs["waited_s"] = self.now - p.queued_at
        if self.elastic.waiting and p.id in self.elastic.waiting:
            intent, mode = self.elastic.waiting[p.id]
            inputs["elastic"] = {
                "mode": elastic.modes(intent)[mode].name,
                "deadline": p.queued_at + intent.deadline_s,
            }
        ls, tokens, credits, price = self._start(p, c, plan, rate, own, inputs, False)
        nodes = self.pool.nodes
        grant = self._emit(
            Granted(
                at=self.now,
                lease_id=ls.id,
                campaign=ls.campaign,
                size=dims.as_dict(p.size),
                path=plan.path,
                starts_at=ls.starts_at,
                expires_at=ls.expires_at,
                tokens=tokens,
                price=price,
                credits=credits,
                nodes=tuple(nodes[i].name for i in sorted(ls.pieces)),
                pieces={nodes[i].name: dims.as_dict(v) for i, v in sorted(ls.pieces.items())},
                inputs={**inputs, "price": price},
            )
        )
        self.idempotency.answer(p.id, grant)
        if self.elastic.waiting:
            waiting = self.elastic.waiting.pop(p.id, None)
            if waiting is not None:
                fold.elastic_open(self, ls, p, *waiting)
        return grant

    def grant_extent(
        self, p: Pending, c: CampaignState, plan: paths.Plan, rate: dims.Vec
    ) -> tuple[float, float]:
        """Lease an elastic lease's extent ``p`` on ``plan`` as any grant, but with no
        record of its own (its lease's Resized announces it): (tokens, credits) charged."""
        _, tokens, credits, _ = self._start(p, c, plan, rate, c.unmet, {}, True)
        return tokens, credits

    def _start(
        self,
        p: Pending,
        c: CampaignState,
        plan: paths.Plan,
        rate: dims.Vec,
        own: dims.Vec,
        inputs: dict[str, Any],
        step: bool,
    ) -> tuple[Lease, float, float, float]:
        """Start the lease ``p`` asked for on ``plan``: placed, charged, held, timed; the
        reservations kept true. Returns (lease, tokens, credits, price). ``step``: an
        elastic lease's extent (see ``grant_extent``)."""
        # A new lease is priced at the pressure that includes itself, as a renewal is (its
        # holding is then counted): a queued request's demand is already counted, unless
        # it waited on its own campaign's envelope (not congestion, so not counted).
        demand = self.ledger.queued_demand
        if not c.spec.preemptible and not p.counted:
            demand = dims.add(demand, p.size)
        price = self.ledger.price(demand)
        ls = Lease(
            id=p.id,
            campaign=p.campaign,
            size=p.size,
            lease_class=p.lease_class,
            preemptible=c.spec.preemptible,
            path=plan.path,
            granted_at=self.now,
            starts_at=self.now,
            expires_at=self.now,
            state=LeaseState.STARTING,
            labels=p.labels,
        )
        starts, effects = self.placement.place(ls, plan, self.now)
        self._out.extend(effects)
        ls.starts_at = starts
        ls.expires_at = starts + p.duration_s
        span = ls.expires_at - self.now
        credit_rate = self.ledger.credit_rate(price, p.size)
        tokens, credits = self.ledger.charge(c, rate, credit_rate, span, self.now)
        power_checks.granted(self, p, ls, inputs)
        ls.segments.append(Segment(self.now, ls.expires_at, rate, credit_rate))
        self._charge_usage(c, p.size, self.now, ls.expires_at, +1)
        self._set_held(c, dims.add(c.held, p.size))
        c.leases.add(ls.id)
        self.leases[ls.id] = ls
        self.timers.push(ls.expires_at, TimerKind.EXPIRE, ls.id)
        if step:
            # An extent comes back within a grace period whenever a waiting request
            # needs it: the reservations count the steps so (``reservation_cut.build``), not as
            # capacity held to their expiry.
            self.elastic.held = dims.add(self.elastic.held, ls.size)
        else:
            self.ledger.firm_started(ls)
            if not ls.preemptible:
                # Granted past the reservations: the profile counts it with a window over
                # its span (``reservation_cut.granted``), not as capacity returning at its
                # expiry.
                self._cut.firm_granted(ledger_end_entry(ls, ls.expires_at))
        reservation_cut.granted(self, p, ls, own)
        if ls.ready:
            self.placement.activate(ls)
        return ls, tokens, credits, price

    def _end(self, ls: Lease, state: LeaseState, cause: str, quiet: bool = False) -> Decision:
        """End ``ls``. ``quiet``: an elastic lease's extent ended by the allocator or with
        its lease (the lease's own Resized or end decision reports it)."""
        el = self.elastic
        extra_tokens = extra_credits = 0.0
        if el.parent_of and not quiet:
            parent = el.parent_of.get(ls.id)
            if parent is not None:
                owner = self.leases[parent]
                if state is LeaseState.EXPIRED and owner.expires_at <= self.now:
                    return self._end(owner, state, cause)
                return fold.shrink_now(self, el.by_lease[parent], [ls.id], cause)
        if el.by_lease and ls.id in el.by_lease:
            extra_tokens, extra_credits = fold.close_extents(
                self, el.by_lease.pop(ls.id), state, cause
            )
        c = self.campaigns[ls.campaign]
        refund_tokens, refund_credits = ls.refund(self.now)
        self.watts.ended(ls.id, self.now, self.policy.enforcement)
        was = ls.state
        ls.move(state)
        ls.truncate(self.now)
        total_refund = sum(refund_tokens) + extra_tokens
        refund_credits += extra_credits
        decision: Decision
        if state is LeaseState.RELEASED:
            decision = Released(self.now, ls.id, ls.campaign, total_refund, refund_credits)
        elif state is LeaseState.EXPIRED:
            decision = Expired(self.now, ls.id, ls.campaign)
        else:
            decision = Revoked(self.now, ls.id, ls.campaign, cause, total_refund, refund_credits)
        if not quiet:
            self._emit(decision)
        if ls.expires_at > self.now:
            self._charge_usage(c, ls.size, self.now, ls.expires_at, -1)
        self._out.extend(self.placement.release(ls, self.now))
        if ls.preemptible and was is LeaseState.ACTIVE:
            self.ledger.not_reclaimable(ls)
        elif was is LeaseState.PREEMPTING:
            self.ledger.drained(ls)
        self._set_held(c, dims.vmax0(dims.sub(c.held, ls.size)))
        self.ledger.refund(c, refund_tokens, refund_credits)
        c.leases.discard(ls.id)
        del self.leases[ls.id]
        if quiet:
            # A step is part of its lease: no record of its own is kept.
            self.elastic.held = dims.vmax0(dims.sub(self.elastic.held, ls.size))
            self.queue.dirty.add(ls.campaign)
            self.queue.pool_dirty = True
            return decision
        self.ledger.firm_ended(ls)
        self.ended.add(
            EndedLease(
                ls.id,
                ls.campaign,
                state,
                self.now,
                cause,
                ls.size,
                ls.path,
                ls.granted_at,
                ls.starts_at,
                ls.lease_class,
                ls.preemptible,
                ls.labels,
            )
        )
        self.queue.dirty.add(ls.campaign)
        self.queue.pool_dirty = True
        return decision

    def _settle(self) -> None:
        """Admission pass, the elastic leases' pass, then keep the guarantee reserve and
        headroom warm."""
        self._admit()
        if self.elastic.by_lease:
            fold.elastic_pass(self)
        boot = self.power.keep_warm(
            self.ledger.warm_reserve(), self.now, self.watts.may_boot(self.pool)
        )
        if boot is not None:
            self._out.append(boot)

    def _admit(self) -> None:
        """The admission pass: consider, in admission order, the queue heads whose outcome may
        have changed: pool-blocked heads small enough for what is free (when capacity was
        freed), and the heads of campaigns whose holding, bucket or envelope changed."""
        queue = self.queue
        pending = queue.pending
        if not pending or (not queue.pool_dirty and not queue.dirty):
            queue.pool_dirty = False
            queue.dirty.clear()
            return
        scan_pool = queue.pool_dirty
        self._cut.stale()
        heap = queue.dirty_heads()
        heapq.heapify(heap)
        queue.pool_dirty = False
        queue.dirty.clear()
        barrier = queue.barrier()
        if scan_pool:
            # Heads within their own unmet guarantee are exempt from the barrier; the
            # barrier head itself is the one request of its class the scan must not skip.
            extra = [rid for rid in queue.guarantee_heads if rid in pending]
            if barrier is not None:
                extra.append(queue.barrier_head())
            for rid in extra:
                heapq.heappush(heap, (queue.key(pending[rid]), rid))
        admission.AdmissionPass(self, heap, barrier, scan_pool).run()

    def _emit(self, d: D) -> D:
        self._out.append(d)
        return d

    def _emit_some(self, d: Decision | None) -> None:
        if d is not None:
            self._out.append(d)

    # ------------------------------------------------------------------ views

    def elastic_size(self, lease_id: str) -> tuple[dims.Vec, dict[int, dims.Vec]]:
        """A live lease's whole size and pieces: its own, and for an elastic lease its extra
        steps' too (what the holder may use)."""
        return fold.elastic_size(self, lease_id)

    def elastic_size_after_shrink(self, lease_id: str) -> dims.Vec:
        """What an elastic lease holds once the shrinks announced to it have come due."""
        return fold.elastic_size_after_shrink(self, lease_id)

    def queued(self) -> Iterator[Pending]:
        """Pending requests in admission order."""
        return iter(self.queue.ordered())


_HANDLERS: dict[type[Event], Callable[[Engine, Any], Any]] = {
    CreateCampaign: Engine._on_create,
    UpdateCampaign: Engine._on_update,
    CancelRequest: Engine._on_cancel,
    Renew: renewal.renew,
    Release: Engine._on_release,
    Tick: Engine._on_tick,
    NodeReady: Engine._on_node_ready,
    NodeLost: Engine._on_node_lost,
    LeaseLost: Engine._on_lease_lost,
    AllocationReady: Engine._on_allocation_ready,
    Meter: Engine._on_meter,
    ApplyPolicy: Engine._on_apply_policy,
}

__all__ = [
    "ENDED_KEPT",
    "KEY_WINDOW_S",
    "RULES_VERSION",
    "CampaignState",
    "Engine",
    "KeyRecord",
    "Pending",
    "request_fingerprint",
]
