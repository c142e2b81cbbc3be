"""Bursar's envelope rule: every admission decision is the real broker engine's.

Nothing of the rule is copied here. Each job becomes a ``RequestLease`` of its size for
its duration, sent to a ``bursar.broker.engine.Engine`` at its submit time; the job starts
when the engine grants the lease, and ends with a ``Release`` at its runtime (early
release) or, when it runs its whole duration, with the engine's own expiry. Campaigns
(per user, per group or one) are created with the envelopes of the replay config the
first time they submit. The pool is one always-warm node of the trace's capacity in one
dimension (``cpu`` for processors, ``gpu`` for GPUs), so every grant is on the warm path
and the kernel's capacity is the engine's.

One engine setting differs from a service's defaults: nodes never power down (the trace's
machine is always on); the longest lease allowed is the trace's longest duration. The
engine keeps its own timers (head-of-line ageing, bucket wake-ups): the policy is
``timed`` and the kernel wakes it at the engine's next timer, where it sends a ``Tick``.
"""

from __future__ import annotations

import math
from typing import ClassVar

from bursar.broker.decisions import Granted, Queued
from bursar.broker.engine import Engine
from bursar.broker.envelope import CampaignSpec, DimEnvelope, LeaseClass
from bursar.broker.events import CreateCampaign, Release, RequestLease, Tick
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


def engine_for(w: Workload, config: ReplayConfig) -> Engine:
    dim = "gpu" if w.unit == "GPUs" else "cpu"
    pool = PoolSpec(
        groups=(NodeGroup(count=1, resources={dim: float(w.capacity)}, warm=1, prefix="pool"),),
        boot_latency_s=0.0,
    )
    longest = max(w.duration, default=0.0)
    policy = PolicySpec(
        power_down_idle_s=None,
        max_lease_s=max(longest, MIN_LEASE_S) + 1.0,
        hol_patience_s=config.hol_patience_s,
    )
    return Engine(pool, policy)


class BursarPolicy:
    name: ClassVar[str] = "bursar"
    timed: ClassVar[bool] = True

    def __init__(self, w: Workload, config: ReplayConfig | None = None) -> None:
        self.w = w
        self.config = config or ReplayConfig()
        self.dim = "gpu" if w.unit == "GPUs" else "cpu"
        self.engine = engine_for(w, self.config)
        self.created: set[int] = set()
        self.requests = 0
        self.lease: dict[int, str] = {}
        self.job: dict[str, int] = {}
        self.due: list[int] = []
        self.decisions = 0

    def _apply(self, event: object) -> list[object]:
        out = self.engine.apply(event)  # type: ignore[arg-type]
        self.decisions += len(out)
        for d in out:
            if isinstance(d, Granted):
                if d.starts_at != d.at:
                    raise AssertionError(
                        f"the engine granted {d.lease_id} on the {d.path.value} path starting "
                        f"at {d.starts_at}, not now ({d.at}); the replay pool is always warm"
                    )
                self.due.append(self.job[d.lease_id])
        return out

    def submit(self, j: int, now: float) -> None:
        w = self.w
        c = w.campaign[j]
        name = w.campaign_names[c]
        if c not in self.created:
            env = self.config.overrides.get(name, self.config.default)
            self._apply(CreateCampaign(now, campaign_spec(name, env, self.dim, w.capacity)))
            self.created.add(c)
        # The engine numbers requests L1, L2, ... in arrival order; this policy is its only
        # client, so the n-th request is L<n>. Checked against the decision below.
        self.requests += 1
        rid = f"L{self.requests}"
        self.lease[j] = rid
        self.job[rid] = j
        out = self._apply(
            RequestLease(
                now,
                campaign=name,
                size={self.dim: float(w.size[j])},
                duration_s=max(w.duration[j], MIN_LEASE_S),
            )
        )
        if not any(
            (isinstance(d, Granted) and d.lease_id == rid)
            or (isinstance(d, Queued) and d.request_id == rid)
            for d in out
        ):
            raise AssertionError(f"the engine did not answer request {rid} (job {w.job_id[j]})")

    def finish(self, j: int, now: float) -> None:
        rid = self.lease.pop(j)
        del self.job[rid]
        ls = self.engine.leases.get(rid)
        if ls is None:
            return  # expired at its duration while the clock advanced to an earlier event
        if now < ls.expires_at:
            self._apply(Release(now, rid))
        else:
            self._apply(Tick(now))

    def schedule(self, now: float, free: int) -> list[int]:
        t = self.engine.next_timer()
        if t is not None and t <= now:
            self._apply(Tick(now))
        out, self.due = self.due, []
        return out

    def wakeup(self) -> float | None:
        t = self.engine.next_timer()
        return None if t is None or math.isinf(t) else t
