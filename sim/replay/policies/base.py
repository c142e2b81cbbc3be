"""The one interface every replay policy implements (a new policy is one small module).

The kernel owns time, capacity and the invariants; a policy owns its queue. The kernel
calls ``submit`` for each arriving job and ``finish`` for each ending one (after it has
freed the job's processors), then ``schedule(now, free)`` once per instant: the policy
returns the queued jobs to start now, which must fit in ``free`` together. Jobs are
workload indices (``Workload`` columns). A policy with timers of its own (the broker's
bucket wake-ups) sets ``timed`` and returns its next one from ``wakeup``.

A job holds its processors for its recorded runtime (``Workload.hold``); its duration
(``Workload.duration``: the requested time, or the replay's ``--estimate``, see
``estimate``) is all a policy may use as an estimate, and a job may run past it. A policy that ends running jobs before their runtime (the broker, when it
refuses a renewal) sets ``kills``: after each ``schedule`` the kernel reads ``killed``,
the jobs to end early with the instant each ends (not before now). A policy that can
never run a job (the broker, for one larger than the pool can ever give its campaign)
refuses it by returning False from ``submit``.

A policy from another distribution (a plug-in, see ``plugins``) implements the same
interface, over a read-only copy of the workload, behind a referee that checks its answers.
"""

from __future__ import annotations

from typing import ClassVar, Protocol

from bursar.sim.replay.mapping import ReplayConfig, Workload


class Policy(Protocol):
    name: ClassVar[str]
    timed: ClassVar[bool]
    kills: ClassVar[bool]

    def submit(self, j: int, now: float) -> bool | None:
        """Take job ``j`` into the queue; False refuses it for good (it never runs)."""
        ...

    def finish(self, j: int, now: float) -> None: ...

    def schedule(self, now: float, free: int) -> list[int]: ...

    def wakeup(self) -> float | None: ...

    def killed(self) -> list[tuple[int, float]]:
        """Running jobs to end early, each with its end; read only when ``kills`` is set."""
        ...


class PolicyFactory(Protocol):
    def __call__(self, w: Workload, config: ReplayConfig) -> Policy: ...
