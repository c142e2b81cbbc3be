"""Fair-share backfill: EASY backfill over a queue ordered by each account's decayed usage,
as Slurm's multifactor priority with only the fair-share factor.

An account is the job's campaign (the user, by default). Its usage is the
processor-seconds its jobs have used, halved every ``half_life_s`` (Slurm's
PriorityDecayHalfLife, 7 days by default there and here): a finished job adds what it
used, and a running job counts its elapsed processor-seconds so far, undecayed (the
policy sees a job's runtime only once it ends; the running share is small next to a
history of days). The queue is ordered by the account's usage at the instant of the pass
(least first), then by submit order; the head holds EASY's one reservation.

Usage changes with time, so the order is not fixed at submission: every submission and
every end re-sorts the queue and runs a full EASY pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from bursar.sim.replay.mapping import ReplayConfig, Workload
from bursar.sim.replay.policies.easy import Easy

DEFAULT_HALF_LIFE_S = 7 * 86400.0


class FairShare(Easy):
    name: ClassVar[str] = "fairshare"

    def __init__(
        self,
        w: Workload,
        config: ReplayConfig | None = None,
        half_life_s: float = DEFAULT_HALF_LIFE_S,
    ) -> None:
        if not half_life_s > 0:
            raise ValueError(f"the fair-share half-life must be > 0 seconds (got {half_life_s})")
        super().__init__(w, config)
        self.half_life_s = half_life_s
        self.account = w.campaign
        accounts = len(w.campaign_names)
        self.used = [0.0] * accounts
        """Finished jobs' processor-seconds, decayed to ``stamp``."""
        self.stamp = [0.0] * accounts
        self.run_size = [0] * accounts
        """Processors of the account's running jobs; with ``run_size_start`` the elapsed
        processor-seconds at any instant: run_size * now - run_size_start."""
        self.run_size_start = [0.0] * accounts
        self.started: dict[int, float] = {}

    def _decayed(self, a: int, now: float) -> float:
        u = self.used[a]
        if u and now > self.stamp[a]:
            u *= 0.5 ** ((now - self.stamp[a]) / self.half_life_s)
            self.used[a] = u
        self.stamp[a] = now
        return u

    def usage(self, a: int, now: float) -> float:
        """The account's decayed usage at ``now`` (running jobs' elapsed share included)."""
        return self._decayed(a, now) + self.run_size[a] * now - self.run_size_start[a]

    def submit(self, j: int, now: float) -> None:
        self.queue.append(j)
        self.fresh.append(j)
        self.dirty = True

    def finish(self, j: int, now: float) -> None:
        super().finish(j, now)
        a, s = self.account[j], self.size[j]
        t0 = self.started.pop(j)
        self.run_size[a] -= s
        self.run_size_start[a] -= s * t0
        self.used[a] = self._decayed(a, now) + s * (now - t0)

    def _start(self, j: int, now: float, out: list[int]) -> None:
        super()._start(j, now, out)
        a, s = self.account[j], self.size[j]
        self.started[j] = now
        self.run_size[a] += s
        self.run_size_start[a] += s * now

    def order(self) -> Callable[[int], Any] | None:
        return None

    def schedule(self, now: float, free: int) -> list[int]:
        if self.queue and (self.dirty or self.recheck_at <= now):
            # The order of the pass: usage as it stands at this instant, one lookup each.
            acct = self.account
            at = {a: self.usage(a, now) for a in {acct[j] for j in self.queue}}
            self.queue.sort(key=lambda j: (at[acct[j]], j))
        return super().schedule(now, free)
