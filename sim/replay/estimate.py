"""Runtime estimates for the backfill policies: what a policy believes a job will take.

Every backfill decision rests on when the running jobs end. A policy reads its estimate
from the workload's ``duration`` column; ``--estimate`` chooses what fills it:

* ``requested``: the job's requested time (the default, and the replay's rule before
  estimates existed);
* ``tsafrir``: the average runtime of the user's two most recent jobs that have ended,
  capped at the job's request (one such job: its runtime; none: the request). This is
  the predictor of Tsafrir, Etsion and Feitelson, "Backfilling using system-generated
  predictions rather than user runtime estimates", IEEE TPDS 18(6), 2007. "The user" is
  the job's campaign: the trace's user under the default ``campaigns = "user"``.
* ``p50``, ``p10``: a linear quantile regression (scikit-learn's ``QuantileRegressor``,
  the ``predict`` extra) of log runtime on the log request, the log size and the user's
  last and last-two-average log runtimes, trained in time order: refitted after every
  ``RETRAIN`` ended jobs on the last ``WINDOW`` of them, and used, capped at the request,
  from its first fit on (the request before). A linear model, not gradient boosting:
  one estimate per submission must cost microseconds, and a boosted model's single-row
  prediction costs milliseconds.

The estimate is made at the job's submission from what has happened by then: only jobs
that ended in the replay at or before that instant (the kernel applies every end before
every submission of an instant) count as history, so no job's estimate uses
information from after its submission. A job that outlives its estimate is never killed:
at that instant its estimate is extended to its request (the correction of Tsafrir et
al., and of EASY's literature with predictions): EASY's shadow time moves, conservative
backfill places its reservations again. Past its request too, a job is taken to end at
any moment, as without estimates; the kernel holds every job to its recorded runtime.
The broker's policies and plug-ins take the request only (see ``check_estimate``).

The metrics keep counting "ran past request" against the requested time.
"""

from __future__ import annotations

import dataclasses
import heapq
from array import array
from collections import deque
from collections.abc import Callable
from math import expm1, log1p

from bursar.sim.replay.mapping import Workload
from bursar.sim.replay.policies.base import Policy

ESTIMATES = ("requested", "tsafrir", "p50", "p10")
"""The estimates a replay accepts, the default first."""
EXTENDS = ("easy", "sjf", "conservative")
"""The policies that take an estimate other than the request (see ``Estimated``)."""


def check_estimate(name: str, policy: str) -> None:
    """ValueError naming the allowed estimates, or why this policy cannot take one."""
    if name not in ESTIMATES:
        raise ValueError(f"unknown estimate {name!r}; allowed: {', '.join(ESTIMATES)}")
    if name != "requested" and policy not in EXTENDS:
        # The broker's policies would ask for a lease of the estimate and renew it when
        # the job outlives it; a renewal the engine refused would kill the job. A plug-in
        # reads a copy of the workload made before any estimate.
        raise ValueError(
            f"--estimate {name} is for the policies that extend an estimate a job "
            f"outlives ({', '.join(EXTENDS)}); {policy!r} cannot take it"
        )


class Tsafrir:
    """The average of the user's last two ended runtimes, capped at the request."""

    def __init__(self, w: Workload) -> None:
        self.request = w.duration
        self.user = w.campaign
        self.last: dict[int, tuple[float, float | None]] = {}
        """Per user: the latest ended runtime and the one before it (None if none)."""

    def predict(self, j: int) -> float:
        req = self.request[j]
        seen = self.last.get(self.user[j])
        if seen is None:
            return req
        a, b = seen
        guess = a if b is None else (a + b) / 2
        return min(guess, req) if guess > 0 else req

    def observe(self, j: int, runtime: float) -> None:
        u = self.user[j]
        seen = self.last.get(u)
        self.last[u] = (runtime, None if seen is None else seen[0])


RETRAIN = 2000
"""Ended jobs between two fits of a quantile model."""
WINDOW = 2000
"""The most recent ended jobs a quantile model is fitted on (a fit of 2,000 takes about
half a second)."""


class Quantile:
    """A linear quantile model of log runtime, refitted in time order as jobs end."""

    def __init__(self, w: Workload, q: float) -> None:
        try:
            from sklearn.linear_model import QuantileRegressor
        except ImportError:
            raise ValueError(
                f"--estimate p{round(q * 100)} needs scikit-learn: "
                "pip install 'bursar-broker[predict]'"
            ) from None
        self.fit_model = lambda: QuantileRegressor(quantile=q, alpha=0.0, solver="highs")
        self.history = Tsafrir(w)
        self.request = w.duration
        self.size = w.size
        self.features: dict[int, tuple[float, ...]] = {}
        self.rows: deque[tuple[tuple[float, ...], float]] = deque(maxlen=WINDOW)
        self.ended = 0
        self.coef: tuple[float, ...] | None = None
        self.intercept = 0.0

    def _features(self, j: int) -> tuple[float, ...]:
        req = log1p(self.request[j])
        seen = self.history.last.get(self.history.user[j])
        if seen is None:
            return (req, log1p(self.size[j]), req, req, 0.0)
        a, b = seen
        last = log1p(a)
        two = last if b is None else log1p((a + b) / 2)
        return (req, log1p(self.size[j]), last, two, 1.0)

    def predict(self, j: int) -> float:
        x = self.features[j] = self._features(j)
        req = self.request[j]
        if self.coef is None:
            return req
        guess = expm1(self.intercept + sum(c * v for c, v in zip(self.coef, x, strict=True)))
        return min(req, max(1.0, guess))

    def observe(self, j: int, runtime: float) -> None:
        self.history.observe(j, runtime)
        self.rows.append((self.features.pop(j), log1p(max(runtime, 0.0))))
        self.ended += 1
        if self.ended % RETRAIN == 0:
            xs = [r[0] for r in self.rows]
            ys = [r[1] for r in self.rows]
            m = self.fit_model().fit(xs, ys)
            self.coef = tuple(float(c) for c in m.coef_)
            self.intercept = float(m.intercept_)


class Estimated:
    """A policy whose workload's ``duration`` is the estimate, filled at each submission
    by a predictor that learns from each job's end. A running job still running at the
    end of an estimate shorter than its request has its estimate extended to the request
    (the policy's ``extend``), at that instant. Everything else is the policy's."""

    timed = True

    def __init__(
        self,
        w: Workload,
        make: Callable[[Workload], Policy],
        predictor: Tsafrir | Quantile,
    ) -> None:
        self.est = array("d", w.duration)
        self.request = w.duration
        self.predictor = predictor
        inner = make(dataclasses.replace(w, duration=self.est))
        self.inner = inner
        self.name = inner.name
        self.kills = inner.kills
        self.killed = inner.killed
        self.extend = inner.extend  # type: ignore[attr-defined]
        self.started: dict[int, float] = {}
        self.expiries: list[tuple[float, int]] = []
        """(estimated end, job) of the running jobs whose estimate is short of the request."""

    def wakeup(self) -> float | None:
        ex = self.expiries
        while ex and ex[0][1] not in self.started:
            heapq.heappop(ex)  # ended before its estimate ran out
        inner = self.inner.wakeup() if self.inner.timed else None
        if not ex:
            return inner
        return ex[0][0] if inner is None or ex[0][0] < inner else inner

    def submit(self, j: int, now: float) -> bool | None:
        self.est[j] = self.predictor.predict(j)
        return self.inner.submit(j, now)

    def finish(self, j: int, now: float) -> None:
        # The runtime it had in this replay (a killed job's is cut short).
        self.predictor.observe(j, now - self.started.pop(j))
        self.inner.finish(j, now)

    def schedule(self, now: float, free: int) -> list[int]:
        ex, started = self.expiries, self.started
        while ex and ex[0][0] <= now:
            _, j = heapq.heappop(ex)
            if j in started:  # outlived its estimate: extended to its request
                self.extend(j, started[j] + self.request[j], now)
                self.est[j] = self.request[j]
        out = self.inner.schedule(now, free)
        for j in out:
            started[j] = now
            if self.est[j] < self.request[j]:
                heapq.heappush(ex, (now + self.est[j], j))
        return out


def estimated(w: Workload, estimate: str, make: Callable[[Workload], Policy]) -> Policy:
    """The policy ``make`` builds, over the estimate ``estimate`` (``ESTIMATES``)."""
    if estimate == "requested":
        return make(w)
    predictor = Tsafrir(w) if estimate == "tsafrir" else Quantile(w, int(estimate[1:]) / 100)
    return Estimated(w, make, predictor)  # type: ignore[return-value]
