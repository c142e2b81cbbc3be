"""Bursar's envelope rule: every admission decision is the real broker engine's.

Nothing of the rule is copied here. Each job becomes a ``RequestLease`` of its size for
its requested time (its duration), sent to a ``bursar.broker.engine.Engine`` at its
submit time; the job starts when the engine grants the lease. It holds the lease for its
recorded runtime: it ends with a ``Release`` when it ran less than its lease, or at the
lease's expiry (the engine's own) when it ran exactly that. A job that ran past its
request renews its lease through the engine (``Renew``) for what remains of its runtime
(or, with the replay config's ``renew_s``, for that long at a time, again and again),
just before the lease expires; if the engine refuses (a ``Rejected`` answer, for any
reason: burst, bucket, or whatever a later engine refuses renewals for), the job is
killed at its expiry: the kernel ends it there and the metrics count it as killed.

The renewal goes in at the last instant before the expiry (the float just below it):
the engine fires every timer due by an event's time before the event itself, so at the
expiry instant the lease would already be gone, and the engine refuses a renewal of a
lease at or past its end. Asking for the remaining runtime makes the renewed lease end
no earlier than the job (the duration is rounded up by one float step where the sum of
renewal time and duration would fall short), so the engine never frees processors the
kernel still holds. A renewal longer than the engine's maximum lease (not with the
engine built here) would be asked in parts.

Campaigns (per user, per group or one) are created with the envelopes of the replay
config the first time they submit. The pool is one always-warm node of the trace's
capacity in one dimension (``cpu`` for processors, ``gpu`` for GPUs), so every grant is
on the warm path and the kernel's capacity is the engine's.

One engine setting differs from a service's defaults: nodes never power down (the trace's
machine is always on); the longest lease allowed is the trace's longest duration or
runtime, whichever is longer (so one renewal covers what remains of any job). The
engine keeps its own timers (head-of-line ageing, bucket wake-ups, expiries): the policy
is ``timed`` and the kernel wakes it at the engine's next timer or its next renewal.
"""

from __future__ import annotations

import heapq
import math
from typing import ClassVar

from bursar.broker.decisions import Granted, Queued, Renewed
from bursar.broker.engine import Engine
from bursar.broker.envelope import CampaignSpec, DimEnvelope, LeaseClass
from bursar.broker.errors import ErrorCode, RequestError
from bursar.broker.events import CreateCampaign, Release, Renew, RequestLease, Tick
from bursar.broker.outcome import Outcome
from bursar.broker.policy import NodeGroup, PolicySpec, PoolSpec
from bursar.sim.replay.mapping import Envelope, ReplayConfig, Workload

MIN_LEASE_S = 1.0
"""The engine grants leases of positive duration; a zero-length job asks for this."""


def campaign_spec(name: str, env: Envelope, dim: str, capacity: int) -> CampaignSpec:
    return CampaignSpec(
        name=name,
        envelopes={
            dim: DimEnvelope(
                guarantee=env.guarantee,
                sustained=capacity if env.sustained is None else env.sustained,
                burst=capacity if env.burst is None else env.burst,
                bucket=env.bucket,
            )
        },
        lease_class=LeaseClass(env.lease_class),
    )


def engine_for(w: Workload, config: ReplayConfig, fairshare: bool = True) -> Engine:
    dim = "gpu" if w.unit == "GPUs" else "cpu"
    pool = PoolSpec(
        groups=(NodeGroup(count=1, resources={dim: float(w.capacity)}, warm=1, prefix="pool"),),
        boot_latency_s=0.0,
    )
    # Long enough for the longest request and for one renewal to the longest runtime.
    longest = max(max(w.duration, default=0.0), max(w.hold, default=0.0))
    policy = PolicySpec(
        power_down_idle_s=None,
        max_lease_s=max(longest, MIN_LEASE_S) + 1.0,
        hol_patience_s=config.hol_patience_s,
        # With fair share on, the broker's default half-life (Slurm's 7 days).
        fairshare_half_life_s=PolicySpec().fairshare_half_life_s if fairshare else None,
        renewals_push_reservations=config.renewals_push_reservations,
    )
    return Engine(pool, policy)


class BursarPolicy:
    name: ClassVar[str] = "bursar"
    timed: ClassVar[bool] = True
    kills: ClassVar[bool] = True

    def __init__(
        self, w: Workload, config: ReplayConfig | None = None, fairshare: bool = True
    ) -> None:
        self.w = w
        self.config = config or ReplayConfig()
        self.dim = "gpu" if w.unit == "GPUs" else "cpu"
        self.engine = engine_for(w, self.config, fairshare)
        self.max_lease_s = self.engine.policy.max_lease_s
        self.created: set[int] = set()
        self.requests = 0
        self.lease: dict[int, str] = {}
        self.job: dict[str, int] = {}
        self.end: dict[int, float] = {}
        """A running job's recorded end (start + runtime, the kernel's end)."""
        self.due: list[int] = []
        self.renewals: list[tuple[float, str]] = []
        """(renew at, lease): a heap; the instant just before each lease's expiry."""
        self.kill: list[tuple[int, float]] = []
        self.ending: list[Release] = []
        """Releases of the jobs that ended at this instant, not yet sent."""
        self.renewed = 0
        self.refused = 0
        self.refused_at_submit = 0
        # The engine's next timer changes only when an event applies: asked once per
        # change, though the kernel asks for it at every step.
        self._next_timer: float | None = None
        self._timer_known = False

    def _apply(self, event: object) -> Outcome:
        return self._took(self.engine.apply(event))  # type: ignore[arg-type]

    def _took(self, out: Outcome) -> Outcome:
        """What the engine decided: its timers may have moved, and its grants start jobs."""
        self._timer_known = False
        for d in out.decisions:
            if type(d) is Granted:
                self._granted(d)
        return out

    def _granted(self, d: Granted) -> None:
        if d.starts_at != d.at:
            raise AssertionError(
                f"the engine granted {d.lease_id} on the {d.path.value} path starting "
                f"at {d.starts_at}, not now ({d.at}); the replay pool is always warm"
            )
        j = self.job[d.lease_id]
        self.due.append(j)
        # The kernel ends the job at exactly this sum: compare with the same float.
        end = self.end[j] = d.at + self.w.hold[j]
        if end > d.expires_at:
            self._renew_before(d.expires_at, d.lease_id)

    def _renew_before(self, expires_at: float, rid: str) -> None:
        heapq.heappush(self.renewals, (math.nextafter(expires_at, -math.inf), rid))

    def _renew(self, now: float, rid: str) -> None:
        ls = self.engine.leases.get(rid)
        j = self.job.get(rid)
        if ls is None or j is None:
            return  # ended already: nothing to renew
        end = self.end[j]
        ask = end - now
        if now + ask < end:
            ask = math.nextafter(ask, math.inf)
        step = self.config.renew_s
        if step is not None and ls.expires_at + step < end:
            # One step on from the expiry (renewed again before it runs out): counted from
            # the expiry, not from this instant just before it, the steps stay whole.
            ask = ls.expires_at + step - now
        ask = min(ask, self.max_lease_s)
        expires_at = ls.expires_at
        out = self._apply(Renew(now, rid, ask))
        own = out.own
        if type(own) is Renewed:
            self.renewed += 1
            if own.expires_at < end:
                self._renew_before(own.expires_at, rid)
        else:
            # Refused (or nothing to renew): the job ends with its lease.
            self.refused += 1
            self.kill.append((j, expires_at))

    def submit(self, j: int, now: float) -> bool:
        self._release_ending()
        w = self.w
        c = w.campaign[j]
        name = w.campaign_names[c]
        if not self.created:
            # Campaigns holding a guarantee exist from the start, as an admin's configured
            # ones do: created only when their first job came, their reserve would appear
            # under requests already waiting, and could strand them.
            for k, n in enumerate(w.campaign_names):
                if self._envelope(n).guarantee > 0:
                    self._create(k, now)
        if c not in self.created:
            self._create(c, now)
        # The engine numbers requests L1, L2, ... in arrival order; this policy is its only
        # client, so the n-th request is L<n>. Checked against the answer below.
        self.requests += 1
        rid = f"L{self.requests}"
        self.lease[j] = rid
        self.job[rid] = j
        try:
            own = self._apply(
                RequestLease(
                    now,
                    campaign=name,
                    size={self.dim: float(w.size[j])},
                    duration_s=max(w.duration[j], MIN_LEASE_S),
                )
            ).own
        except RequestError as exc:
            if exc.code is not ErrorCode.OUT_OF_RANGE:
                raise
            # Larger than the pool can ever give the campaign (beside the other campaigns'
            # guarantees): the broker refuses it, so the job never runs.
            # The engine numbered nothing: the next request takes this one's id.
            self.requests -= 1
            del self.lease[j], self.job[rid]
            self.refused_at_submit += 1
            return False
        if not (
            (type(own) is Granted and own.lease_id == rid)
            or (type(own) is Queued and own.request_id == rid)
        ):
            raise AssertionError(f"the engine did not answer request {rid} (job {w.job_id[j]})")
        return True

    def _envelope(self, name: str) -> Envelope:
        return self.config.overrides.get(name, self.config.default)

    def _create(self, c: int, now: float) -> None:
        name = self.w.campaign_names[c]
        spec = campaign_spec(name, self._envelope(name), self.dim, self.w.capacity)
        self._apply(CreateCampaign(now, spec))
        self.created.add(c)

    def finish(self, j: int, now: float) -> None:
        rid = self.lease.pop(j)
        del self.job[rid]
        del self.end[j]
        ls = self.engine.leases.get(rid)
        if ls is None:
            return  # expired at its end while the clock advanced to an earlier event
        if now < ls.expires_at:
            # Released with the other jobs ending at this instant, in one engine call
            # before anything else happens at it (``_release_ending``).
            self.ending.append(Release(now, rid))
        # Else it ends with its lease: the engine's expiry is due now, and ``schedule``
        # runs it (one Tick for every expiry of the instant).

    def _release_ending(self) -> None:
        """The jobs that ended at this instant release their leases together: the engine
        looks at its queue once with all their processors back, as EASY does, not after
        each (where a small request further back could take the first job's processors
        before the second's were back for an older request that needs both)."""
        if self.ending:
            ending, self.ending = self.ending, []
            self._took(self.engine.release_together(ending))

    def schedule(self, now: float, free: int) -> list[int]:
        self._release_ending()
        r = self.renewals
        while r and r[0][0] <= now:
            _, rid = heapq.heappop(r)
            self._renew(now, rid)
        t = self._timer()
        if t is not None and t <= now:
            self._apply(Tick(now))
        out, self.due = self.due, []
        return out

    def _timer(self) -> float | None:
        if not self._timer_known:
            self._next_timer = self.engine.next_timer()
            self._timer_known = True
        return self._next_timer

    def killed(self) -> list[tuple[int, float]]:
        out, self.kill = self.kill, []
        return out

    def wakeup(self) -> float | None:
        t = self._timer()
        if self.renewals:
            r = self.renewals[0][0]
            if t is None or r < t:
                return r
        return None if t is None or math.isinf(t) else t
