"""Power as a leased dimension: the facility cap no grant or boot crosses, and each
campaign's watts (guarantee, sustained, burst, and a bucket in joules).

**The draw.** The pool draws each powered or booting node's idle watts (a booting node
draws from its boot's start), plus each live lease's watts above idle. A lease's watts are
fixed when it is asked for: ``size["power"]`` if the request declares it (its power limit,
which a backend enforces, e.g. ``nvidia-smi -pl``), otherwise its primary units (GPUs,
else cores) times the most any node type draws per unit above idle, ``(peak_w - idle_w)
/ units``: an upper bound wherever the lease lands, so the default never understates. A
lease's watts count from its grant until it ends, whatever its state (a lease waiting on a
boot or a reclaim is counted from its grant, and so is the victim it waits on until it
ends), so the cap never depends on when a backend reports.

**The cap** (``policy.power_cap_w``). A lease is granted only if the draw plus its watts,
plus the idle draw of the cold nodes its plan boots, stays within the cap less the watts
kept for other campaigns' unmet power guarantees; the nodes kept warm for the guarantee
reserve are booted only where their idle draw fits the same way. The check runs on every
path: warm, reclaim and cold (the boots' idle draw), and on an elastic lease's growth.
Renewals add no watts. A lowered cap stops new grants and boots until the draw falls
under it; nothing running is revoked.

**A campaign's envelope in watts**: ``burst`` bounds its leases' watts at once; the part
above ``sustained`` is paid from a bucket of ``bucket`` joules (watt-seconds) for the
lease's whole term at grant (prepaid enforcement; the unused part is refunded when it ends
early) or drained while held (grant-instant); ``guarantee`` watts are kept for it: no
other campaign's lease or boot may use them while it holds less.

**Reservations in watts.** A reservation holder (an aged request, ``reservations.py``)
holds its watts too: from the start its reservation of nodes gives it, or the first
instant after at which its watts fit beside the leases still running (each ends by its
expiry) and the earlier holders. A request or renewal behind it may take watts only where
it leaves those whole (``holders_refusal``), as it must leave the holder's nodes whole.

**Reclaim.** A reclaim's claimant draws nothing until its victims have ended, and they
draw until then: at the warning their watts are handed over to it, up to its own, and
counted once, as its (``granted``'s ``victims``); if it goes away first, they count them
again until they end. Where the cap alone refuses a firm request, the pool side warns
preemptible leases for their watts (``pool_side.watt_victims``). The idle draw is taken
as it is now when holders' watts are planned.

Part of the engine's state (pickled with it in snapshots); every method is a pure update
of this state or a read, given the engine's clock.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bursar.broker import dims
from bursar.broker.admission import Refusal, Side
from bursar.broker.bucket import Bucket, above_rate
from bursar.broker.envelope import CampaignSpec, DimEnvelope
from bursar.broker.policy import Enforcement, PolicySpec, PoolSpec
from bursar.broker.pool import DRAWING, NodeState, PoolState
from bursar.broker.reasons import Reason

EPS = 1e-9


@dataclass(slots=True)
class _Held:
    """One live lease's watts, and the joules it prepaid per second of its term."""

    campaign: str
    watts: float
    end: float
    """When it expires (renewals move it)."""
    paid: list[tuple[float, float, float]]
    """(start, end, joules per second) per prepaid stretch: the grant's, then renewals'."""
    handed: float = 0.0
    """A warned victim's watts handed over to its claimants (counted as theirs)."""
    took: list[tuple[str, float]] = field(default_factory=list)
    """A claimant's watts handed over by its victims: (victim, watts) each."""

    @property
    def counted(self) -> float:
        """The watts this lease counts in the draw: its own, less what it handed over."""
        return self.watts - self.handed


@dataclass(slots=True)
class _Account:
    """One campaign's power envelope and what it holds."""

    envelope: DimEnvelope | None
    preemptible: bool
    held: float = 0.0
    bucket: Bucket | None = None

    @property
    def guarantee(self) -> float:
        """Its power guarantee, watts; 0 if preemptible (it can hold none)."""
        env = self.envelope
        return 0.0 if env is None or self.preemptible else env.guarantee

    @property
    def unmet(self) -> float:
        """Watts of its guarantee it does not hold (kept for it); 0 if preemptible."""
        env = self.envelope
        if env is None or self.preemptible or env.guarantee <= self.held:
            return 0.0
        return env.guarantee - self.held


def _bucket_refusal(
    a: _Account, above: float, span: float, now: float, enforcement: Enforcement
) -> Refusal | None:
    """The campaign's joules for ``above`` watts over its sustained for ``span`` seconds
    (prepaid), or any left at all (grant-instant)."""
    b = a.bucket
    if above <= 0 or b is None or b.unlimited:
        return None
    level = b.level_at(now, a.held, enforcement)
    need = above * span if enforcement is Enforcement.PREPAID else 0.0
    if level + EPS < need or (enforcement is not Enforcement.PREPAID and level <= EPS):
        return Refusal(
            Reason.BUCKET_EMPTY, {"bucket_short": {"power": {"level": level, "need": need}}}
        )
    return None


def problems(
    pool: PoolSpec, policy: PolicySpec, campaigns: Sequence[CampaignSpec]
) -> list[tuple[str, str]]:
    """The power cap must cover what the pool draws before any lease (its warm nodes' idle
    draw), and, where campaigns hold power guarantees, every node's idle draw plus the
    guarantees: a guaranteed lease may need a node booted, and a boot draws too."""
    out: list[tuple[str, str]] = []
    cap = policy.power_cap_w
    guaranteed = [
        (s.name, s.envelopes[dims.POWER].guarantee)
        for s in campaigns
        if dims.POWER in s.envelopes and s.envelopes[dims.POWER].guarantee > 0
    ]
    idle_all = sum(g.count * g.idle_w for g in pool.groups)
    idle_warm = sum(min(g.warm, g.count) * g.idle_w for g in pool.groups)
    if cap is None:
        if guaranteed:
            out.append(
                (
                    "policy.power_cap_w",
                    "campaigns hold power guarantees but the pool has no power cap to keep "
                    "them under; allowed: a cap in watts",
                )
            )
        return out
    if idle_warm > cap + 1e-9:
        out.append(
            (
                "policy.power_cap_w",
                f"{cap:g} W is below the warm nodes' idle draw ({idle_warm:g} W), so no lease "
                f"could ever start; allowed: at least {idle_warm:g}",
            )
        )
    total = sum(g for _, g in guaranteed)
    if guaranteed and total + idle_all > cap + 1e-9:
        out.append(
            (
                "campaigns.*.power.guarantee",
                f"power guarantees add up to {total:g} W "
                f"({', '.join(f'{n} {g:g}' for n, g in guaranteed)}) and every node's idle "
                f"draw to {idle_all:g} W, more than the cap of {cap:g} W; allowed: "
                f"guarantees of at most {max(0.0, cap - idle_all):g} W in all",
            )
        )
    return out


class PowerBudget:
    """The pool's draw, the cap, and each campaign's watts and joules."""

    __slots__ = (
        "_leases",
        "_plans",
        "_unit_w",
        "_version",
        "accounts",
        "cap",
        "guarantee_w",
        "lease_w",
        "leased",
        "unmet_w",
    )

    def __init__(self, pool_spec: PoolSpec, pool: PoolState, cap: float | None) -> None:
        self.cap = cap
        unit_w = 0.0
        primary = pool.primary
        for g in pool_spec.groups:
            units = float(g.resources.get(dims.PLACED[primary], 0.0))
            if units > 0:
                unit_w = max(unit_w, (g.peak_w - g.idle_w) / units)
        self._unit_w = unit_w
        self.accounts: dict[str, _Account] = {}
        self.leased = cap is not None
        """Power is leased here: a cap, or a campaign with a power envelope (the checks run
        only then; the leases' watts are kept always, so a cap set later counts them)."""
        self._leases: dict[str, _Held] = {}
        self.lease_w = 0.0
        """The live leases' watts above idle, summed."""
        self.unmet_w = 0.0
        """Watts kept for unmet power guarantees, summed over the campaigns."""
        self.guarantee_w = 0.0
        """The campaigns' power guarantees, summed."""
        self._version = 0
        """Counts the changes the holders' plan reads (leases' watts and ends, holdings,
        envelopes, the cap)."""
        self._plans: dict[Any, Any] = {}
        """The holders' watts windows and the lease ends' running sums, by what they were
        made from (a cache: every entry is keyed by ``_version``)."""

    # ------------------------------------------------------------------ reads

    def watts_of(self, declared: float | None, size: dims.Vec, primary: int) -> float:
        """A lease's watts: as its request declared, else its primary units at the most
        any node type draws per unit above idle."""
        return declared if declared is not None else size[primary] * self._unit_w

    def leases(self) -> Iterable[str]:
        return self._leases.keys()

    def lease_watts(self, lease_id: str) -> float:
        h = self._leases.get(lease_id)
        return h.watts if h is not None else 0.0

    def handed(self, victims: Iterable[str]) -> float:
        """The watts ``victims`` would hand over to a claimant: what they still count."""
        leases = self._leases
        return sum(leases[v].counted for v in victims if v in leases)

    def counted(self, lease_id: str) -> float:
        """What ``lease_id`` counts in the draw (0 if none)."""
        h = self._leases.get(lease_id)
        return h.counted if h is not None else 0.0

    def handed_to(self, lease_id: str) -> float:
        """The watts ``lease_id``'s victims handed over to it (still theirs to draw)."""
        h = self._leases.get(lease_id)
        return sum(t for _, t in h.took) if h is not None else 0.0

    def draw(self, pool: PoolState) -> float:
        """What the pool draws now, watts."""
        return pool.idle_draw + self.lease_w

    def reserved(self, but: str | None = None) -> float:
        """Watts kept for unmet power guarantees (of every campaign but ``but``)."""
        a = self.accounts.get(but) if but is not None else None
        return self.unmet_w - (a.unmet if a is not None else 0.0)

    def own_unmet(self, campaign: str) -> float:
        """Watts of ``campaign``'s own power guarantee it does not hold: the part of the kept
        watts its own leases may draw on (the cap's answer for it depends on it)."""
        a = self.accounts.get(campaign)
        return a.unmet if a is not None else 0.0

    def room_for(self, pool_spec: PoolSpec, campaign: str) -> float | None:
        """The most watts a lease of ``campaign`` could ever get: the cap less one node's
        idle draw (a lease runs on at least one node; the others may be powered down) and
        the other campaigns' power guarantees. None: no cap."""
        if self.cap is None:
            return None
        idle_one = min((g.idle_w for g in pool_spec.groups if g.count > 0), default=0.0)
        a = self.accounts.get(campaign)
        own = a.guarantee if a is not None else 0.0
        return self.cap - idle_one - (self.guarantee_w - own)

    def boot_watts(self, pool: PoolState, nodes: Iterable[int]) -> float:
        """The idle draw the cold ones among ``nodes`` add when booted."""
        idle = pool.idle_w
        return sum(idle[i] for i in nodes if pool.nodes[i].power is NodeState.COLD)

    def bucket_level(self, campaign: str, at: float, enforcement: Enforcement) -> float | None:
        a = self.accounts.get(campaign)
        if a is None or a.bucket is None:
            return None
        return a.bucket.level_at(at, a.held, enforcement)

    # ------------------------------------------------------------------ checks

    def campaign_refusal(
        self, campaign: str, watts: float, span: float, now: float, enforcement: Enforcement
    ) -> Refusal | None:
        """The campaign's own limits in watts: its burst, then its bucket over ``span``."""
        a = self.accounts.get(campaign)
        if a is None or a.envelope is None or watts <= 0:
            return None
        env = a.envelope
        if a.held + watts > env.burst + EPS:
            return Refusal(
                Reason.ABOVE_BURST,
                {"power": {"held_w": a.held, "watts": watts, "burst_w": env.burst}},
            )
        return _bucket_refusal(a, above_rate(a.held, watts, env.sustained), span, now, enforcement)

    def cap_refusal(
        self, pool: PoolState, campaign: str, watts: float, boots: float, handed: float = 0.0
    ) -> Refusal | None:
        """The facility cap: ``watts`` more for a lease of ``campaign`` and ``boots`` watts
        of idle draw for the nodes it boots must fit under the cap less the watts kept for
        the other campaigns' unmet guarantees. ``handed``: what the victims it waits for
        hand over (up to its own watts: the lease draws nothing until they have ended)."""
        cap = self.cap
        if cap is None:
            return None
        draw = self.draw(pool)
        reserved = self.reserved(but=campaign)
        need = watts + boots
        if draw + need - min(watts, handed) <= cap - reserved + EPS:
            return None
        reason = (
            Reason.GUARANTEE_RESERVED
            if draw + need - min(watts, handed) <= cap + EPS
            else Reason.POOL_FULL
        )
        details = {
            "power": {
                "need_w": watts,
                "boot_w": boots,
                "draw_w": draw,
                "cap_w": cap,
                "reserved_w": reserved,
            }
        }
        if handed:
            details["power"]["handed_w"] = min(watts, handed)
        return Refusal(reason, details, Side.POOL)

    def short_of(self, pool: PoolState, campaign: str, watts: float, boots: float) -> float:
        """How many watts a lease of ``campaign`` (``watts``, and ``boots`` of idle draw)
        would need handed over by victims to fit under the cap; +inf where even all of its
        own watts would not do (the boots and the kept guarantees alone do not fit)."""
        cap = self.cap
        if cap is None:
            return 0.0
        over = self.draw(pool) + watts + boots - (cap - self.reserved(but=campaign))
        return over if over <= watts + EPS else math.inf

    def holders_refusal(
        self,
        pool: PoolState,
        campaign: str,
        watts: float,
        start: float,
        end: float,
        holders: Sequence[tuple[str, float, float, float]],
        lease_id: str = "",
    ) -> Refusal | None:
        """Backfill in watts: a lease of ``watts`` over [``start``, ``end``) must leave the
        watts of the reservation holders ahead of it whole, as it must leave their nodes.

        ``holders`` is (campaign, the start its reservation of nodes gives it, watts,
        span) per holder, in reservation order. Each holder's watts start at the first
        instant at or after that start at which they fit under the cap (less the others'
        kept guarantees) beside the leases still running then (each until its expiry;
        ``lease_id``'s, a renewal's, until ``start``) and the earlier holders' windows;
        the idle draw is taken as it is now. The lease may not overlap a holder's window
        where it would crowd it out."""
        cap = self.cap
        if cap is None or not holders or watts <= 0:
            return None
        ends, after = self._ends(lease_id, start)
        idle = pool.idle_draw

        def leases_at(t: float) -> float:
            return idle + after[bisect.bisect_right(ends, t)]

        key = (self._version, idle, lease_id, start if lease_id else None, tuple(holders))
        windows = self._plans.get(key)
        if windows is None:
            windows = self._plans[key] = self._windows(cap, holders, ends, leases_at)

        def held_at(t: float) -> float:
            return sum(w for s, e, w in windows if s <= t < e)

        room = cap - self.reserved(but=campaign)
        for s, e, _ in windows:
            if e <= start or s >= end:
                continue
            lo = max(start, s)
            for t in (lo, *(x for x, _, _ in windows if lo < x < min(end, e))):
                if leases_at(t) + held_at(t) + watts > room + EPS:
                    return Refusal(
                        Reason.HEAD_OF_LINE,
                        {"reserved_from": s, "power": {"need_w": watts, "reserved_w_at": t}},
                        Side.RESERVATIONS,
                    )
        return None

    def _ends(self, lease_id: str, start: float) -> tuple[list[float], list[float]]:
        """The live leases' expiries in order and, at each position, the watts of the
        leases from there on (a renewal's lease counted to ``start``, its old expiry)."""
        key = (self._version, "ends", lease_id, start if lease_id else None)
        got = self._plans.get(key)
        if got is None:
            if len(self._plans) > 64:
                self._plans.clear()  # entries of older versions are never read again
            pairs = sorted(
                (start if k == lease_id else h.end, h.counted) for k, h in self._leases.items()
            )
            after = [0.0] * (len(pairs) + 1)
            for i in range(len(pairs) - 1, -1, -1):
                after[i] = after[i + 1] + pairs[i][1]
            got = self._plans[key] = ([e for e, _ in pairs], after)
        return got

    def _windows(
        self,
        cap: float,
        holders: Sequence[tuple[str, float, float, float]],
        ends: list[float],
        leases_at: Callable[[float], float],
    ) -> list[tuple[float, float, float]]:
        windows: list[tuple[float, float, float]] = []
        for campaign, at, w_h, span in holders:
            room = cap - self.reserved(but=campaign)
            k = bisect.bisect_right(ends, at)
            cands = sorted({at, *ends[k:], *(e for _, e, _ in windows if e > at)})
            for t in cands:
                checks = (t, *(x for x, _, _ in windows if t < x < t + span))
                if all(
                    leases_at(x) + sum(w for s, e, w in windows if s <= x < e) + w_h <= room + EPS
                    for x in checks
                ):
                    windows.append((t, t + span, w_h))
                    break
        return windows

    def may_boot(self, pool: PoolState) -> Callable[[int], bool] | None:
        """A gate for boots that keep capacity warm: each cold node boots only if its idle
        draw still fits under the cap less every unmet guarantee. None: no cap."""
        if self.cap is None:
            return None
        cap = self.cap
        room: list[float] = []
        idle = pool.idle_w

        def gate(i: int) -> bool:
            if not room:  # worked out only when a boot is considered
                room.append(cap - self.draw(pool) - self.unmet_w)
            if idle[i] > room[0] + EPS:
                return False
            room[0] -= idle[i]
            return True

        return gate

    # ------------------------------------------------------------------ changes

    def set_cap(self, cap: float | None) -> None:
        self.cap = cap
        self._relook()

    def _relook(self) -> None:
        self._version += 1
        self.leased = self.cap is not None or any(
            a.envelope is not None for a in self.accounts.values()
        )

    def _hold(self, a: _Account, held: float) -> None:
        self.unmet_w -= a.unmet
        a.held = held
        self.unmet_w += a.unmet
        if self.unmet_w < EPS:
            self.unmet_w = 0.0

    def set_campaign(self, spec: CampaignSpec, now: float, enforcement: Enforcement) -> None:
        """A campaign was created or its envelopes changed; a bucket of the same size keeps
        its level (as the other dimensions' do)."""
        name, preemptible = spec.name, spec.preemptible
        env = spec.envelopes.get(dims.POWER)
        a = self.accounts.get(name)
        if a is None:
            a = self.accounts[name] = _Account(None, preemptible)
        if a.bucket is not None:
            a.bucket.advance(now, a.held, enforcement)
        self.unmet_w -= a.unmet
        self.guarantee_w -= a.guarantee
        a.envelope, a.preemptible = env, preemptible
        self.unmet_w += a.unmet
        self.guarantee_w += a.guarantee
        if env is None:
            a.bucket = None
        elif a.bucket is None or a.bucket.capacity != env.bucket:
            a.bucket = Bucket.full(env.bucket, env.sustained, now)
        else:
            a.bucket.rate = env.sustained
        self._relook()

    def granted(
        self,
        lease_id: str,
        campaign: str,
        watts: float,
        start: float,
        end: float,
        enforcement: Enforcement,
        victims: Iterable[str] = (),
    ) -> float:
        """A lease of ``watts`` runs from ``start`` (now) to ``end``; the joules it prepaid.

        ``victims``: the leases it waits for (warned for it, by reclaim). It draws nothing
        until they have ended, and they draw until then: their watts are handed over to it,
        up to its own, and counted once (as its), so the draw counted never falls below the
        draw there is. A campaign's own holding (its burst, its bucket) is not moved."""
        a = self.accounts.get(campaign)
        paid: list[tuple[float, float, float]] = []
        joules = 0.0
        if a is not None:
            joules = self._charge(a, watts, 0.0, start, end, enforcement, paid)
            self._hold(a, a.held + watts)
        held = self._leases[lease_id] = _Held(campaign, watts, end, paid)
        self.lease_w += watts
        left = watts
        for vid in victims:
            v = self._leases.get(vid)
            take = min(left, v.counted) if v is not None else 0.0
            if v is None or take <= 0:
                continue
            v.handed += take
            held.took.append((vid, take))
            self.lease_w -= take
            left -= take
        self._version += 1
        return joules

    def renewed(
        self, lease_id: str, old_end: float, new_end: float, now: float, enforcement: Enforcement
    ) -> float:
        """A lease runs on from ``old_end`` to ``new_end``; the joules it prepaid for that."""
        h = self._leases.get(lease_id)
        if h is None or new_end <= old_end:
            return 0.0
        h.end = new_end
        self._version += 1
        a = self.accounts.get(h.campaign)
        if a is None:
            return 0.0
        return self._charge(a, h.watts, h.watts, now, new_end, enforcement, h.paid, old_end)

    def renewal_refusal(
        self, lease_id: str, ext: float, now: float, enforcement: Enforcement
    ) -> Refusal | None:
        """The bucket over a renewal's extension (its watts are already held)."""
        h = self._leases.get(lease_id)
        a = self.accounts.get(h.campaign) if h is not None else None
        if h is None or a is None or a.envelope is None or ext <= 0:
            return None
        above = above_rate(a.held - h.watts, h.watts, a.envelope.sustained)
        return _bucket_refusal(a, above, ext, now, enforcement)

    def ended(self, lease_id: str, now: float, enforcement: Enforcement) -> float:
        """A lease ended at ``now``: its watts are free, its unused joules refunded."""
        h = self._leases.pop(lease_id, None)
        if h is None:
            return 0.0
        self._version += 1
        self.lease_w -= h.counted
        for vid, took in h.took:
            # A claimant gone before its victims: they count their watts again until they end.
            v = self._leases.get(vid)
            if v is not None:
                v.handed -= took
                self.lease_w += took
        if self.lease_w < EPS:
            self.lease_w = 0.0
        a = self.accounts.get(h.campaign)
        if a is None:
            return 0.0
        refund = sum(rate * max(0.0, end - max(start, now)) for start, end, rate in h.paid)
        if a.bucket is not None:
            a.bucket.advance(now, a.held, enforcement)
            if refund > 0:
                a.bucket.give(refund)
        self._hold(a, max(0.0, a.held - h.watts))
        return refund

    def _charge(
        self,
        a: _Account,
        watts: float,
        counted: float,
        now: float,
        end: float,
        enforcement: Enforcement,
        paid: list[tuple[float, float, float]],
        start: float | None = None,
    ) -> float:
        """Charge ``a`` for ``watts`` from ``start`` (default now) to ``end``; ``counted``:
        how much of ``watts`` is already in ``a.held``."""
        env, b = a.envelope, a.bucket
        if b is not None:
            b.advance(now, a.held, enforcement)
        if env is None or b is None or enforcement is not Enforcement.PREPAID:
            return 0.0
        rate = above_rate(a.held - counted, watts, env.sustained)
        begin = now if start is None else start
        if rate <= 0 or end <= begin:
            return 0.0
        joules = rate * (end - begin)
        b.take(joules)
        paid.append((begin, end, rate))
        return joules

    # ------------------------------------------------------------------ views

    def state(self, pool: PoolState, now: float, enforcement: Enforcement) -> dict[str, Any]:
        """What the state digest and the dashboard read (only while power is leased)."""
        return {
            "cap_w": self.cap,
            "draw_w": self.draw(pool),
            "leases_w": self.lease_w,
            "reserved_w": self.reserved(),
            "leases": {k: h.watts for k, h in sorted(self._leases.items())},
            "campaigns": {
                name: {
                    "held_w": a.held,
                    "bucket_j": (
                        None
                        if a.bucket is None or a.bucket.unlimited
                        else a.bucket.level_at(now, a.held, enforcement)
                    ),
                }
                for name, a in sorted(self.accounts.items())
                if a.envelope is not None or a.held
            },
        }

    def check(self, pool: PoolState) -> None:
        """The sums kept incrementally agree with the leases (``Engine.check_invariants``)."""
        total = sum(h.counted for h in self._leases.values())
        gave: dict[str, float] = {}
        for c in self._leases.values():
            for v, t in c.took:
                gave[v] = gave.get(v, 0.0) + t
        for k, h in self._leases.items():
            assert 0 <= h.handed <= h.watts + 1e-6, (k, h.handed, h.watts)
            got = gave.get(k, 0.0)
            assert math.isclose(got, h.handed, rel_tol=1e-9, abs_tol=1e-6), (k, got, h.handed)
        assert math.isclose(total, self.lease_w, rel_tol=1e-9, abs_tol=1e-6), (total, self.lease_w)
        for name, a in self.accounts.items():
            held = sum(h.watts for h in self._leases.values() if h.campaign == name)
            assert math.isclose(held, a.held, rel_tol=1e-9, abs_tol=1e-6), (name, held, a.held)
        unmet = sum(a.unmet for a in self.accounts.values())
        assert math.isclose(unmet, self.unmet_w, rel_tol=1e-9, abs_tol=1e-6), (unmet, self.unmet_w)
        idle = sum(w for w, n in zip(pool.idle_w, pool.nodes, strict=True) if n.power in DRAWING)
        assert math.isclose(idle, pool.idle_draw, rel_tol=1e-9, abs_tol=1e-6), (
            idle,
            pool.idle_draw,
        )
