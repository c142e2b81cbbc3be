"""The ElasticFlow traces through the real engine: elastic, deadline-aware leases in
virtual time.

Every allocation decision is the engine's (``bursar.broker.engine.Engine``); this module
is the client side of each job and the clock. A virtual-time loop in the manner of
``sim/replay/kernel.py`` takes, at each step, the earliest of: the next submission, the
engine's next timer (a ``Tick``), and the jobs' own next instants (a finish, a deadline,
a renewal just before a lease's expiry).

Per job (one campaign for the whole trace: the traces name no users; its envelope binds
nothing, as the replay's default config: sustained and burst are the cluster, no bucket):

* at its submission a ``RequestLease`` of ``min`` with an ``Intent``: min 1 GPU (what
  ElasticFlow's simulator gives every job as its lowest level, whatever the trace's
  ``num_gpu``), max the fewest GPUs at which its measured curve peaks, capped at 64, at
  its batch size (one sample per GPU at least) and at the cluster; one GPU a step; the
  measured (GPUs, iterations/s) points of its model and batch size as the curve; under
  the measured speed model (the default) its sizes are the measured counts up to max
  (max the largest of them), under the interpolated model every whole count;
  remaining work its iterations; its deadline; value 1, step decay, no degrade modes
  (the traces carry none);
* its size is followed from the decisions (``Granted``, then each ``Resized``), and its
  progress counted with the same curve and speed model as the engine's (``elastic.speed``);
* the lease is asked for a fixed term (``lease_term_s``) and renewed for another term
  just before it expires while work is left; a refused renewal ends the job with its
  lease (killed);
* released when its work is done: it *met* its deadline if that is no later than the
  deadline. A job still unfinished at its deadline has no value left (step decay), so
  it is withdrawn then (cancelled if queued, released if running), as ElasticFlow's own
  simulator declines such jobs; a request the engine refuses at admission
  (``DEADLINE_UNREACHABLE``) counts as not met.

The variants compared (``VARIANTS``): the four allocation rules, the ablations of dmug
(no elastic: max = min; no degrade; no admission control; no risk weighting), and the
trace's own fixed sizes (a plain lease of ``num_gpu``, no intent, its speed read off the
same curve, flat past the last measured count) for reference. With no
degrade modes in the traces the no-degrade ablation is the same as dmug by construction;
it is run anyway, and its decision hash shows it.

Checked at every event: every elastic lease in [min, max] and on an allowed size (a
fixed one at its size); the leases held within the cluster; every grant on the warm path
(the pool is always on); the engine's own ``check_invariants()`` as ``check`` says
(``CHECKS``), and once more at the end. The first violation stops the run with
``InvariantViolation``. Deterministic: no clock, no randomness; the SHA-256 of every
applied event with its decisions (the journal's canonical lines) is the run's hash.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bursar.broker import codec, dims
from bursar.broker.decisions import (
    Cancelled,
    Expired,
    Granted,
    Rejected,
    Released,
    Renewed,
    Resized,
    ResizeWarned,
    Revoked,
)
from bursar.broker.elastic import (
    MEASURED,
    SPEED_MODELS,
    Decay,
    DecayKind,
    Intent,
    size_ok,
    speed,
)
from bursar.broker.engine import Engine
from bursar.broker.events import CancelRequest, CreateCampaign, Release, Renew, RequestLease, Tick
from bursar.broker.journal import JOURNAL_FILENAME, Journal
from bursar.broker.policy import NodeGroup, PolicySpec, PoolSpec
from bursar.broker.reasons import Reason
from bursar.sim.elastic.trace import Curve, Curves, Job
from bursar.sim.replay.kernel import InvariantViolation
from bursar.sim.replay.mapping import Envelope
from bursar.sim.replay.policies.bursar import campaign_spec

__all__ = [
    "CHECKS",
    "CHECK_SAMPLE",
    "CLUSTERS",
    "DEFAULT_CHECK",
    "MEASURED",
    "SPEED_MODELS",
    "VARIANTS",
    "Cluster",
    "InvariantViolation",
    "RunResult",
    "UnknownCluster",
    "Variant",
    "engine_resizes",
    "intent_for",
    "parse_cluster",
    "run",
    "with_cluster",
]

CAMPAIGN = "itp"
_GPU = dims.PLACED.index("gpu")
MAX_GPUS = 64
DEFAULT_LEASE_TERM_S = 3600.0
JOURNAL_BATCH = 1000
CHECKS = ("every", "sampled", "end")
"""When the engine's full invariant check runs: after every event, after every
``CHECK_SAMPLE``-th event (and at the end), or at the end only. The run's own checks
(sizes in range and allowed, the cluster not exceeded, the jobs holding what the engine
granted) are O(1) and run after every event whatever this says."""
DEFAULT_CHECK = "sampled"
CHECK_SAMPLE = 64


@dataclass(frozen=True, slots=True)
class Cluster:
    nodes: int
    gpus_per_node: int

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def __str__(self) -> str:
        return f"{self.nodes}x{self.gpus_per_node}"


CLUSTERS: dict[str, Cluster] = {
    # ElasticFlow's scripts: the testbed trace on 16 nodes of 8 A100s; the ITP clusters
    # on 64 nodes of 8 (cluster01-03, 05), 128 for cluster04 (run_fig8b.sh).
    "195job": Cluster(16, 8),
    "cluster01": Cluster(64, 8),
    "cluster02": Cluster(64, 8),
    "cluster03": Cluster(64, 8),
    "cluster04": Cluster(128, 8),
    "cluster05": Cluster(64, 8),
}


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    rule: str = "dmug"
    elastic: bool = True
    """False: the intent's max is its min (the no-elastic ablation)."""
    risk: bool = True
    degrade: bool = True
    admission: bool = True
    fixed: bool = False
    """A plain lease of the trace's num_gpu, no intent (the original cluster's sizes)."""
    about: str = ""

    def policy(self, lease_term_s: float) -> PolicySpec:
        return PolicySpec(
            power_down_idle_s=None,  # the cluster is always on
            max_lease_s=lease_term_s,
            elastic_rule=self.rule,
            elastic_risk=self.risk,
            elastic_degrade=self.degrade,
            elastic_admission=self.admission,
            # A plain lease carries no deadline for admission control to promise: its
            # renewals may push reservations, so that no fixed job is killed by the
            # broker's own rule (the baseline runs its jobs to the end, as the trace did).
            renewals_push_reservations=self.fixed,
        )


VARIANTS: tuple[Variant, ...] = (
    Variant("dmug", about="deadline-aware marginal-utility greedy (the default)"),
    Variant("edf", rule="edf", about="earliest deadline first"),
    Variant(
        "value", rule="value", about="largest value first (all values are 1: ties by deadline)"
    ),
    Variant("proportional", rule="proportional", about="fewest steps above min first"),
    Variant("dmug-no-elastic", elastic=False, about="dmug, intent max = min (1 GPU)"),
    Variant(
        "dmug-no-degrade",
        degrade=False,
        about="dmug, elastic_degrade off (equal to dmug: the traces have no degrade modes)",
    ),
    Variant("dmug-no-admission", admission=False, about="dmug, elastic_admission off"),
    Variant("dmug-no-risk", risk=False, about="dmug, elastic_risk off"),
    Variant("fixed", fixed=True, about="the trace's num_gpu, a plain lease (no intent)"),
)
BY_NAME = {v.name: v for v in VARIANTS}


def max_gpus(curve: Curve, batch_size: int, cluster: Cluster) -> int:
    """A job's max: the fewest GPUs at which its measured throughput peaks (more only
    slow it down), at most 64, its batch size (a sample per GPU) and the cluster. On the
    A100 curves of the six models in the ITP traces this is the per-model table of
    ElasticFlow's simulator, batch size by batch size."""
    peak = max(t for _, t in curve)
    at = next(g for g, t in curve if t == peak)
    return max(1, min(at, MAX_GPUS, batch_size, cluster.gpus))


def intent_for(
    job: Job, curve: Curve, cluster: Cluster, elastic: bool = True, speed_model: str = MEASURED
) -> Intent:
    """The job's intent. Under the measured model its sizes are the measured counts up to
    its max (as ElasticFlow's simulator allocates), and its max the largest of them; under
    the interpolated model every whole GPU count from 1 to max."""
    top = max_gpus(curve, job.batch_size, cluster) if elastic else 1
    sizes = None
    if speed_model == MEASURED:
        sizes = tuple(float(g) for g, _ in curve if 1 <= g <= top) or (1.0,)
        top = int(sizes[-1])
    return Intent(
        min={"gpu": 1.0},
        max={"gpu": float(top)},
        step={"gpu": 1.0} if top > 1 else {},
        curve=tuple((float(g), float(t)) for g, t in curve),
        remaining_work=job.iterations,
        deadline_s=job.deadline - job.submit,
        value=1.0,
        decay=Decay(DecayKind.STEP),
        speed_model=speed_model,
        sizes=sizes,
    )


# Job states.
_WAIT, _QUEUED, _RUNNING, _MET, _LATE, _REFUSED, _REJECTED, _KILLED = range(8)
_ENDED = (_MET, _LATE, _REFUSED, _REJECTED, _KILLED)
# Order of a job's own instants when several fall at one time: a finish first (finishing
# at the deadline meets it), then the deadline, then a renewal.
_FINISH, _DEADLINE, _RENEW = 0, 1, 2


@dataclass(slots=True)
class _JobState:
    job: Job
    intent: Intent
    lo: float
    hi: float
    rid: str = ""
    state: int = _WAIT
    units: float = 0.0
    at: float = 0.0
    work_left: float = 0.0
    version: int = 0
    expires: float = math.inf
    gpu_s: float = 0.0
    finish: float = math.nan
    top: float = 0.0
    ending: int = _LATE
    """The state the job ends in once the engine confirms the end it was asked for."""


@dataclass(frozen=True, slots=True)
class RunResult:
    trace: str
    variant: str
    cluster: str
    jobs: int
    metrics: dict[str, Any]
    sha256: str
    """Of every applied event with its decisions, in order (the journal's canonical lines)."""
    wall_s: float
    outcomes: list[dict[str, Any]] = field(default_factory=list)
    """Per job: id, state, finish, deadline, largest size held."""
    journal_sha256: str | None = None
    """Of the journal's canonical form (its first line has the pool and policy), when the
    run wrote one."""
    speed_model: str = MEASURED
    """How the jobs' curves give speeds between measured points (``elastic.SPEED_MODELS``)."""


def _pool(cluster: Cluster) -> PoolSpec:
    """Every node on from the start: the cluster is always up, so every grant is warm."""
    return PoolSpec(
        groups=(
            NodeGroup(
                count=cluster.nodes,
                resources={"gpu": float(cluster.gpus_per_node)},
                warm=cluster.nodes,
            ),
        ),
        boot_latency_s=0.0,
    )


class _Run:
    def __init__(
        self,
        jobs: Sequence[Job],
        curves: Curves,
        variant: Variant,
        cluster: Cluster,
        lease_term_s: float,
        trace_name: str,
        journal: Journal | None = None,
        speed_model: str = MEASURED,
        check: str = DEFAULT_CHECK,
    ) -> None:
        self.variant = variant
        self.check_every = {"every": 1, "sampled": CHECK_SAMPLE, "end": 0}[check]
        self.journal = journal
        self.cluster = cluster
        self.term = lease_term_s
        self.engine = Engine(_pool(cluster), variant.policy(lease_term_s))
        self.jobs: list[_JobState] = []
        for j in jobs:
            curve = curves.for_job(j, trace_name)
            it = intent_for(j, curve, cluster, variant.elastic and not variant.fixed, speed_model)
            if variant.fixed:
                lo = hi = float(min(j.num_gpu, cluster.gpus))
            else:
                lo, hi = it.min["gpu"], it.max["gpu"]
            self.jobs.append(_JobState(j, it, lo, hi, work_left=j.iterations))
        self.by_rid: dict[str, int] = {}
        self.heap: list[tuple[float, int, int, int]] = []
        self.hash = hashlib.sha256()
        self.seq = 0
        self.held = 0.0
        self.checks = 0
        self.range_checks = 0
        self.last_end = -math.inf
        self.counts = {"resized": 0, "resize_warned": 0, "renewed": 0, "renew_refused": 0}
        self.timer: float | None = None
        self.timer_known = False

    # ---------------------------------------------------------------- the engine

    def apply(self, event: Any, job: int | None = None) -> Any:
        """Apply one event, hash it with its decisions, follow them, check. ``job``: the
        job whose request this is (its id is the engine's answer, registered before the
        decisions are followed, since its grant may be among them)."""
        out = self.engine.apply(event)
        self.timer_known = False
        if job is not None:
            own = out.own
            rid = getattr(own, "lease_id", None) or getattr(own, "request_id", None)
            if not isinstance(rid, str) or rid in self.by_rid:
                raise AssertionError(
                    f"the engine did not answer job {self.jobs[job].job.job_id}'s request"
                )
            self.jobs[job].rid = rid
            self.by_rid[rid] = job
        self.seq += 1
        if self.journal is not None:
            # One transaction per JOURNAL_BATCH entries: a simulation acknowledges nothing.
            self.journal.append(event, out.decisions, commit=self.seq % JOURNAL_BATCH == 0)
        line = codec.dumps_plain(
            {
                "seq": self.seq,
                "event": codec.to_dict(event),
                "decisions": [codec.to_dict(d) for d in out.decisions],
            }
        )
        self.hash.update(line.encode())
        self.hash.update(b"\n")
        for d in out.decisions:
            self.follow(d)
        self.check(event)
        return out

    def next_timer(self) -> float:
        if not self.timer_known:
            self.timer = self.engine.next_timer()
            self.timer_known = True
        t = self.timer
        return math.inf if t is None else t

    def fail(self, rule: str, event: str, **state: object) -> InvariantViolation:
        return InvariantViolation(
            rule, event, {"now": self.engine.now, "variant": self.variant.name, **state}
        )

    def check(self, event: Any, full: bool = False) -> None:
        """The run's checks after ``event`` (a name at the end of the trace); the engine's
        own invariants as ``check`` says, or ``full``: now."""
        name = event if isinstance(event, str) else type(event).__name__
        every = self.check_every
        if full or (every and self.seq % every == 0):
            self.checks += 1
            try:
                self.engine.check_invariants()
            except AssertionError as e:
                raise self.fail("the engine's invariants", name, detail=e) from None
        if self.held > self.cluster.gpus + 1e-9:
            raise self.fail("leases held within the cluster", name, held=self.held)
        # The sizes followed from the decisions are what the engine holds for the jobs.
        c = self.engine.campaigns.get(CAMPAIGN)
        engine_held = c.held[_GPU] if c is not None else 0.0
        if abs(engine_held - self.held) > 1e-6:
            raise self.fail(
                "the jobs hold what the engine granted them",
                name,
                followed=self.held,
                engine=engine_held,
            )

    # ---------------------------------------------------------------- decisions

    def follow(self, d: Any) -> None:
        t = type(d)
        if t is Granted:
            j = self.by_rid.get(d.lease_id)
            if j is None:
                return
            s = self.jobs[j]
            if d.starts_at != d.at:
                raise self.fail(
                    "every grant on the warm path", f"grant of {d.lease_id}", path=d.path.value
                )
            s.state = _RUNNING
            s.at = d.at
            self.resize(s, d.size.get("gpu", 0.0), f"grant of {d.lease_id}")
            self.set_expiry(j, d.expires_at)
        elif t is Resized:
            j = self.by_rid.get(d.lease_id)
            if j is None:
                return
            s = self.jobs[j]
            if s.state != _RUNNING:
                raise self.fail("only a running lease is resized", f"resize of {d.lease_id}")
            self.counts["resized"] += 1
            self.progress(s, d.at)
            self.resize(s, d.size.get("gpu", 0.0), f"resize of {d.lease_id}")
        elif t is ResizeWarned:
            if d.lease_id in self.by_rid:
                self.counts["resize_warned"] += 1
        elif t is Released or t is Cancelled:
            j = self.by_rid.get(getattr(d, "lease_id", None) or getattr(d, "request_id", ""))
            if j is None:
                return
            s = self.jobs[j]
            if s.state in (_RUNNING, _QUEUED):
                self.progress(s, d.at)
                self.stop(s, s.ending)
        elif t is Expired or t is Revoked:
            j = self.by_rid.get(d.lease_id)
            if j is None:
                return
            s = self.jobs[j]
            if s.state == _RUNNING:
                # The lease ended under a job with work left: the job is lost.
                self.progress(s, d.at)
                self.stop(s, _KILLED)

    def resize(self, s: _JobState, units: float, event: str) -> None:
        self.range_checks += 1
        if not (s.lo - 1e-9 <= units <= s.hi + 1e-9):
            raise self.fail(
                "no lease below its min or above its max",
                event,
                size=units,
                min=s.lo,
                max=s.hi,
            )
        if not self.variant.fixed and not size_ok(s.intent, units):
            raise self.fail(
                "every lease on a size its intent allows", event, size=units, sizes=s.intent.sizes
            )
        self.held += units - s.units
        s.units = units
        s.top = max(s.top, units)
        s.version += 1
        sp = speed(s.intent, units)
        s.finish = s.at + s.work_left / sp if sp > 0 else math.inf
        if s.finish < math.inf:
            heapq.heappush(self.heap, (s.finish, _FINISH, self.index(s), s.version))

    def index(self, s: _JobState) -> int:
        return self.by_rid[s.rid]

    def progress(self, s: _JobState, t: float) -> None:
        if s.state == _RUNNING and t > s.at:
            dt = t - s.at
            s.work_left = max(0.0, s.work_left - dt * speed(s.intent, s.units))
            s.gpu_s += dt * s.units
        s.at = max(s.at, t)

    def stop(self, s: _JobState, state: int) -> None:
        self.last_end = max(self.last_end, self.engine.now, s.at)
        self.held -= s.units
        s.units = 0.0
        s.state = state
        s.version += 1

    def set_expiry(self, j: int, expires: float) -> None:
        self.jobs[j].expires = expires
        # The engine fires every timer due by an event's time before the event: at the
        # expiry instant the lease is gone, so the renewal goes in just before it.
        heapq.heappush(self.heap, (math.nextafter(expires, -math.inf), _RENEW, j, -1))

    # ---------------------------------------------------------------- the jobs' instants

    def submit(self, j: int, now: float) -> None:
        s = self.jobs[j]
        v = self.variant
        if v.fixed:
            ev = RequestLease(now, campaign=CAMPAIGN, size={"gpu": s.lo}, duration_s=self.term)
        else:
            ev = RequestLease(
                now, campaign=CAMPAIGN, size=dict(s.intent.min), duration_s=self.term,
                intent=s.intent,
            )  # fmt: skip
        s.state = _QUEUED
        s.at = now
        own = self.apply(ev, job=j).own
        if type(own) is Rejected:
            s.state = _REFUSED if own.reason is Reason.DEADLINE_UNREACHABLE else _REJECTED
        heapq.heappush(self.heap, (s.job.deadline, _DEADLINE, j, -1))

    def end(self, s: _JobState, now: float, state: int) -> None:
        """End a job's lease (or withdraw its request) now. The job keeps running until the
        engine's answer."""
        s.ending = state
        if self.next_timer() <= now:
            # The engine's timers due by now first (they may resize the lease, or grant the
            # request, before it is withdrawn): then the state below is the one it ends from.
            self.apply(Tick(now))
        if s.state == _RUNNING and now < s.expires and s.rid in self.engine.leases:
            self.apply(Release(now, s.rid))  # its Released stops the job (``follow``)
        elif s.state == _QUEUED and s.rid in self.engine.pending:
            self.apply(CancelRequest(now, s.rid))  # its Cancelled stops the job
        if s.state in (_RUNNING, _QUEUED):
            # At its expiry the lease is the engine's to end (its timer is due now).
            self.progress(s, now)
            self.stop(s, state)

    def finished(self, j: int, now: float) -> None:
        s = self.jobs[j]
        self.progress(s, now)
        s.finish = now
        self.end(s, now, _MET if now <= s.job.deadline else _LATE)

    def deadline(self, j: int, now: float) -> None:
        s = self.jobs[j]
        if s.state == _RUNNING:
            self.progress(s, now)
        self.end(s, now, _LATE)

    def renew(self, j: int, now: float) -> None:
        s = self.jobs[j]
        if s.state != _RUNNING or s.rid not in self.engine.leases:
            return
        out = self.apply(Renew(now, s.rid, self.term))
        own = out.own
        if type(own) is Renewed and own.lease_id == s.rid:
            self.counts["renewed"] += 1
            self.set_expiry(j, own.expires_at)
        else:
            self.counts["renew_refused"] += 1  # the lease ends at its expiry, the job with it

    # ---------------------------------------------------------------- the loop

    def run(self, progress: Callable[[int], None] | None) -> None:
        self.apply(
            CreateCampaign(
                self.jobs[0].job.submit if self.jobs else 0.0,
                campaign_spec(CAMPAIGN, Envelope(), "gpu", self.cluster.gpus),
            )
        )
        n = len(self.jobs)
        i = 0
        heap = self.heap
        inf = math.inf
        last = -inf
        while True:
            t_sub = self.jobs[i].job.submit if i < n else inf
            t_own = heap[0][0] if heap else inf
            t_eng = self.next_timer()
            t = min(t_sub, t_own, t_eng)
            if t == inf:
                break
            if t < last:
                raise self.fail("time never goes backwards", f"next event at {t}")
            last = t
            if t_own == t:
                at, kind, j, version = heapq.heappop(heap)
                s = self.jobs[j]
                if kind == _FINISH:
                    if s.state == _RUNNING and version == s.version:
                        self.finished(j, at)
                elif kind == _DEADLINE:
                    if s.state in (_QUEUED, _RUNNING):
                        self.deadline(j, at)
                elif kind == _RENEW:
                    # Renew while work is left at the expiry (a finish at the expiry itself
                    # would find the lease gone); an entry of an earlier expiry is stale.
                    live = at == math.nextafter(s.expires, -inf)
                    if live and s.state == _RUNNING and s.finish >= s.expires:
                        self.renew(j, at)
            elif t_sub == t:
                self.submit(i, t)
                i += 1
                if progress is not None:
                    progress(1)
            else:
                self.apply(Tick(t))
        for s in self.jobs:
            if s.state not in _ENDED:
                raise self.fail(
                    "every job ends", f"end of trace: job {s.job.job_id}", state=s.state
                )
        self.check("end of trace", full=True)


def _metrics(r: _Run, start: float, end: float) -> dict[str, Any]:
    jobs = r.jobs
    n = len(jobs)
    count = {
        name: sum(1 for s in jobs if s.state == k)
        for name, k in (
            ("met", _MET),
            ("late", _LATE),
            ("refused", _REFUSED),
            ("rejected", _REJECTED),
            ("killed", _KILLED),
        )
    }
    # Step decay: a job is worth its value if it meets its deadline, nothing after.
    value = sum(s.intent.value for s in jobs if s.state == _MET)
    total_value = sum(s.intent.value for s in jobs)
    gpu_s = sum(s.gpu_s for s in jobs)
    met_gpu_s = sum(s.gpu_s for s in jobs if s.state == _MET)
    span = max(end - start, 0.0)
    cap_s = r.cluster.gpus * span
    elastic = [s for s in jobs if s.top > 0]
    return {
        "jobs": n,
        **count,
        "met_share": count["met"] / n if n else 0.0,
        "value": value,
        "value_share": value / total_value if total_value else 0.0,
        "utilisation": gpu_s / cap_s if cap_s > 0 else 0.0,
        "met_gpu_share": met_gpu_s / gpu_s if gpu_s > 0 else 0.0,
        "gpu_hours": gpu_s / 3600.0,
        "span_h": span / 3600.0,
        "mean_peak_gpus": sum(s.top for s in elastic) / len(elastic) if elastic else 0.0,
        "max_gpus_held_by_a_lease": max((s.top for s in jobs), default=0.0),
        "lease_range_checks": r.range_checks,
        "invariant_checks": r.checks,
        "events": r.seq,
        **r.counts,
    }


def run(
    jobs: Sequence[Job],
    curves: Curves,
    variant: Variant | str,
    cluster: Cluster,
    *,
    trace_name: str = "trace",
    lease_term_s: float = DEFAULT_LEASE_TERM_S,
    progress: Callable[[int], None] | None = None,
    state_dir: Path | None = None,
    speed_model: str = MEASURED,
    check: str = DEFAULT_CHECK,
) -> RunResult:
    """Replay ``jobs`` under one variant. With ``state_dir`` every event is journaled
    there (``bursar journal audit --state-dir`` re-derives every decision); it must hold
    no journal yet. Raises ``InvariantViolation`` on the first broken rule, ``TraceError``
    for a job with no curve."""
    v = BY_NAME[variant] if isinstance(variant, str) else variant
    if speed_model not in SPEED_MODELS:
        raise ValueError(f"speed model {speed_model!r}: allowed {', '.join(SPEED_MODELS)}")
    if check not in CHECKS:
        raise ValueError(f"check {check!r}: allowed {', '.join(CHECKS)}")
    if not (lease_term_s > 0 and math.isfinite(lease_term_s)):
        raise ValueError(f"the lease term must be a finite number of seconds > 0 ({lease_term_s})")
    t0 = time.perf_counter()
    journal = None
    if state_dir is not None:
        path = state_dir / JOURNAL_FILENAME
        if path.exists():
            raise ValueError(f"{path} exists: give an empty or new directory for the journals")
        state_dir.mkdir(parents=True, exist_ok=True)
        journal = Journal.open(path, _pool(cluster), v.policy(lease_term_s))
    try:
        r = _Run(jobs, curves, v, cluster, lease_term_s, trace_name, journal, speed_model, check)
        r.run(progress)
        journal_sha = None
        if journal is not None:
            journal.commit()
            journal_sha = journal.sha256()
    finally:
        if journal is not None:
            journal.close()
    start = min((j.submit for j in jobs), default=0.0)
    m = _metrics(r, start, max(r.last_end, start))
    outcomes = [
        {
            "job_id": s.job.job_id,
            "state": ("wait", "queued", "running", "met", "late", "refused", "rejected", "killed")[
                s.state
            ],
            "finish": None if math.isnan(s.finish) else s.finish,
            "deadline": s.job.deadline,
            "peak_gpus": s.top,
        }
        for s in r.jobs
    ]
    return RunResult(
        trace_name, v.name, str(cluster), len(jobs), m, r.hash.hexdigest(),
        time.perf_counter() - t0, outcomes, journal_sha, speed_model,
    )  # fmt: skip


def engine_resizes() -> bool:
    """Does this build's engine hand out spare capacity to elastic leases? One elastic
    lease alone on an idle node, whose work gains from every GPU: an engine with an
    elastic pass grows it (a ``Resized``); one without leaves it at min."""
    eng = Engine(
        PoolSpec(groups=(NodeGroup(count=1, resources={"gpu": 8.0}, warm=1),), boot_latency_s=0),
        PolicySpec(power_down_idle_s=None),
    )
    eng.apply(CreateCampaign(0.0, campaign_spec("probe", Envelope(), "gpu", 8)))
    it = Intent(
        min={"gpu": 1.0},
        max={"gpu": 8.0},
        step={"gpu": 1.0},
        amdahl=0.0,
        remaining_work=1000.0,
        deadline_s=500.0,
    )
    out = eng.apply(RequestLease(1.0, campaign="probe", size={"gpu": 1.0}, duration_s=100.0,
                                 intent=it))  # fmt: skip
    seen = any(type(d) is Resized for d in out.decisions)
    t = eng.next_timer()
    if not seen and t is not None and t < 2.0:
        seen = any(type(d) is Resized for d in eng.apply(Tick(t)).decisions)
    return seen


class UnknownCluster(ValueError):
    """A trace whose cluster size is neither ElasticFlow's (``CLUSTERS``) nor given."""


def parse_cluster(text: str) -> Cluster:
    """``64x8``: 64 nodes of 8 GPUs."""
    nodes, x, gpus = text.strip().lower().partition("x")
    try:
        if not x:
            raise ValueError
        cluster = Cluster(int(nodes), int(gpus))
    except ValueError:
        raise ValueError(f"{text!r} is not NODESxGPUS (e.g. 64x8: 64 nodes of 8 GPUs)") from None
    if cluster.nodes < 1 or cluster.gpus_per_node < 1:
        raise ValueError(f"{text!r}: nodes and GPUs per node must be at least 1")
    return cluster


def with_cluster(
    name: str,
    nodes: int | None,
    gpus_per_node: int | None,
    given: Mapping[str, Cluster] | None = None,
) -> Cluster:
    """The cluster for a trace: ``given[name]`` if there, else ElasticFlow's for it
    (``CLUSTERS``) with ``nodes`` and ``gpus_per_node`` overriding its figures (8 GPUs a
    node when only ``nodes`` is known). A trace with none of these has no size to
    guess: :class:`UnknownCluster` (a silent default would make its numbers mean
    nothing)."""
    if given and name in given:
        return given[name]
    base = CLUSTERS.get(name)
    if base is None:
        if nodes is None:
            raise UnknownCluster(
                f"no cluster size for trace {name!r}: ElasticFlow's are known for "
                f"{', '.join(CLUSTERS)} only"
            )
        base = Cluster(nodes, 8)
    if nodes is not None:
        base = replace(base, nodes=nodes)
    if gpus_per_node is not None:
        base = replace(base, gpus_per_node=gpus_per_node)
    return base
