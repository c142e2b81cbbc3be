"""One life cycle for a block of workers on a Bursar lease, shared by the workflow plugins:
a Parsl block, a Dask job and a Ray node are each one :class:`Block`, and keep only their
engine's translation (what Parsl's ``status`` says, how Dask retires workers, how Ray is
told a node is being preempted) in :class:`Hooks`.

A block is a state machine with one transition table (:data:`TRANSITIONS`; an input the
table does not name for the current state raises :class:`IllegalTransition`)::

    REQUESTED ──ask──► ACQUIRING ──granted──► STARTING ──active──► RUNNING
    REQUESTED ──adopted (a live lease and its running workers, left by a process
                that is gone, taken over: :meth:`Block.adopt`)──────────► RUNNING
        ▲                  │                     │                    │
        └─refused/unreachable (again after       │ preempted,         │ preempted,
          the broker's retry_after, bounded)     │ unrenewable        │ unrenewable
                           │                     ▼                    ▼
              refused (no retry) ─► ENDED     DRAINING ◄──────────────┘
              cancel (call cut) ──► ENDED        │ drained, lease ended, workers exited,
              rejected ───────────► FAILED       │ cancel
    STARTING / RUNNING ──lease ended, workers exited, cancel, error──► STOPPING
    STOPPING ──stopped──► ENDED        STOPPING ──error──► FAILED
    REQUESTED ──cancel──► ENDED
    STARTING / RUNNING / DRAINING / STOPPING ──resize-warning, resized──► (stays)

An elastic lease (``LeaseSpec.intent``) changes size while the block stays where it is:
the broker grows it at once (RESIZED) and shrinks it after a warning (RESIZE_WARNING:
shrink to ``resize_to`` at ``deadline``, then RESIZED). Both are inputs of the table, not
bare hook calls, so that they queue behind the inputs before them (a warning never
overtakes the ACTIVE that starts the workers) and the table says where they count: only
a RUNNING block calls :meth:`Hooks.resize` (stop using what the warning takes away,
before its deadline, as a task of its own so that the block keeps hearing its lease) and
:meth:`Hooks.resized` (use the new whole; after a shrink, stop what is still on the
units it lost). A STARTING block starts its workers on :attr:`Block.usable` (the lease
less what a pending warning takes); a DRAINING or STOPPING one is letting go of all.

It is driven by events, never by polling: the client's Watch stream (through the
:class:`~bursar.providers.client.LeaseHandle`'s listener: active, preemption warning,
renewal, end), the workers' exit (a pidfd on the loop), timers on a
:class:`~bursar.broker.clock.Clock` (retry after a refusal, the margin before an
unrenewable lease expires) and the engine's cancel. The client renews the lease while the
block lives (``renew_margin_s``); when renewals keep failing, a block with an
``expiry_margin_s`` drains that long before the lease would expire.

Workers are a :class:`ProcessTree`: a process started in a session of its own and
everything under it (its descendants, its session, processes carrying its marker in
their environment), stopped by TERM, a grace period, then KILL for what is left; nothing
outside the tree is ever signalled.

Blocks run on an asyncio loop: the cluster's for Dask, a :class:`LoopThread` for the
synchronous plugin APIs of Parsl and Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import math
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psutil

from bursar.broker.clock import SYSTEM, Clock, wait_event_until
from bursar.cli.console import human_duration
from bursar.providers.client import (
    AsyncBrokerClient,
    BursarClientError,
    DeadlineExceeded,
    Intent,
    Lease,
    LeaseClass,
    LeaseEvent,
    LeaseEventKind,
    LeaseHandle,
    LoopThread,
    Refused,
    Unavailable,
)

__all__ = [
    "TRANSITIONS",
    "Block",
    "Cause",
    "Hooks",
    "IllegalTransition",
    "Input",
    "LeaseSpec",
    "LoopThread",
    "ProcessTree",
    "Retry",
    "State",
    "in_thread",
    "transition",
]

log = logging.getLogger("bursar.providers.block")

T = TypeVar("T")


class State(enum.StrEnum):
    REQUESTED = "requested"
    """Wants a lease; about to ask, or waiting to ask again after a refusal."""
    ACQUIRING = "acquiring"
    """A non-blocking Acquire is in flight."""
    STARTING = "starting"
    """Granted; waiting for the lease to become usable (reclaim grace, node boot)."""
    RUNNING = "running"
    """The workers were started on the active lease."""
    DRAINING = "draining"
    """Preempted, or not renewable: the engine drains the workers until a deadline."""
    STOPPING = "stopping"
    """Stopping the workers and releasing the lease."""
    ENDED = "ended"
    FAILED = "failed"
    """The request was rejected (an error retrying cannot fix) or the plugin failed."""

    @property
    def terminal(self) -> bool:
        return self in (State.ENDED, State.FAILED)


class Input(enum.StrEnum):
    ASK = "ask"
    GRANTED = "granted"
    REFUSED = "refused"
    UNREACHABLE = "unreachable"
    GIVE_UP = "give-up"
    """Refused, and the block does not ask again (the engine retries: Ray)."""
    REJECTED = "rejected"
    """An error that asking again cannot fix (bad token, a size no pool can hold)."""
    ADOPTED = "adopted"
    """A lease granted before, still live, taken over with its workers still running."""
    ACTIVE = "active"
    UPDATED = "updated"
    """The lease changed otherwise (renewed, its state mirrored)."""
    PREEMPTED = "preempted"
    UNRENEWABLE = "unrenewable"
    LEASE_ENDED = "lease-ended"
    WORKERS_EXITED = "workers-exited"
    DRAINED = "drained"
    CANCEL = "cancel"
    STOPPED = "stopped"
    ERROR = "error"
    RESIZE_WARNING = "resize-warning"
    """An elastic lease will shrink (``Block.warned_to``) at ``Block.resize_deadline``."""
    RESIZED = "resized"
    """An elastic lease's size changed (grown, or the announced shrink done)."""


class Cause(enum.StrEnum):
    """Why a block drained or stopped (the first reason wins)."""

    CANCELLED = "cancelled"
    REFUSED = "refused"
    REJECTED = "rejected"
    PREEMPTED = "preempted"
    UNRENEWABLE = "unrenewable"
    REVOKED = "revoked"
    EXPIRED = "expired"
    RELEASED = "released"
    """Released by someone else (another client of the campaign)."""
    EXITED = "exited"
    ERROR = "error"


S, I = State, Input  # noqa: E741  (the table reads as one)
_LIVE_LEASE = {
    I.ACTIVE: None,
    I.UPDATED: None,
    I.PREEMPTED: S.DRAINING,
    I.UNRENEWABLE: S.DRAINING,
    I.LEASE_ENDED: S.STOPPING,
    I.CANCEL: S.STOPPING,
    I.ERROR: S.STOPPING,
    I.RESIZE_WARNING: None,
    I.RESIZED: None,
}
"""What a block holding a live lease does with each input (None: stays)."""


def _table() -> dict[tuple[State, Input], State]:
    t: dict[tuple[State, Input], State] = {
        (S.REQUESTED, I.ASK): S.ACQUIRING,
        (S.REQUESTED, I.CANCEL): S.ENDED,
        (S.REQUESTED, I.ADOPTED): S.RUNNING,
        (S.REQUESTED, I.ERROR): S.FAILED,
        (S.ACQUIRING, I.GRANTED): S.STARTING,
        (S.ACQUIRING, I.REFUSED): S.REQUESTED,
        (S.ACQUIRING, I.UNREACHABLE): S.REQUESTED,
        (S.ACQUIRING, I.GIVE_UP): S.ENDED,
        (S.ACQUIRING, I.REJECTED): S.FAILED,
        (S.ACQUIRING, I.CANCEL): S.ENDED,  # the Acquire in flight is cancelled
        (S.ACQUIRING, I.ERROR): S.FAILED,
        (S.STOPPING, I.STOPPED): S.ENDED,
        (S.STOPPING, I.ERROR): S.FAILED,
    }
    for state in (S.STARTING, S.RUNNING, S.DRAINING):
        for inp, nxt in _LIVE_LEASE.items():
            t[state, inp] = nxt or state
    t[S.STARTING, I.ACTIVE] = S.RUNNING
    t[S.RUNNING, I.WORKERS_EXITED] = S.STOPPING
    t[S.DRAINING, I.WORKERS_EXITED] = S.STOPPING
    t[S.DRAINING, I.DRAINED] = S.STOPPING
    t[S.DRAINING, I.PREEMPTED] = S.DRAINING  # already draining
    t[S.DRAINING, I.UNRENEWABLE] = S.DRAINING
    # What arrives while stopping (the lease's end after the release, the workers' exit
    # after their stop, a second cancel) changes nothing.
    for inp in (
        I.ACTIVE,
        I.UPDATED,
        I.PREEMPTED,
        I.UNRENEWABLE,
        I.LEASE_ENDED,
        I.WORKERS_EXITED,
        I.DRAINED,
        I.CANCEL,
        I.RESIZE_WARNING,
        I.RESIZED,
    ):
        t[S.STOPPING, inp] = S.STOPPING
    return t


TRANSITIONS: Mapping[tuple[State, Input], State] = _table()
"""``(state, input) -> next state``; anything not listed is illegal."""

_CAUSE = {
    I.GIVE_UP: Cause.REFUSED,
    I.REJECTED: Cause.REJECTED,
    I.PREEMPTED: Cause.PREEMPTED,
    I.UNRENEWABLE: Cause.UNRENEWABLE,
    I.WORKERS_EXITED: Cause.EXITED,
    I.CANCEL: Cause.CANCELLED,
    I.ERROR: Cause.ERROR,
}
_END_CAUSE = {
    LeaseEventKind.REVOKED: Cause.REVOKED,
    LeaseEventKind.EXPIRED: Cause.EXPIRED,
    LeaseEventKind.RELEASED: Cause.RELEASED,
}


_ANSWERS = {
    Input.GRANTED,
    Input.ADOPTED,
    Input.REFUSED,
    Input.UNREACHABLE,
    Input.GIVE_UP,
    Input.REJECTED,
}
"""The inputs that answer a request (``Block.answered``)."""


class IllegalTransition(RuntimeError):
    """An input the transition table does not allow in the block's state."""


def transition(state: State, inp: Input) -> State:
    """The state after ``inp`` in ``state``; :class:`IllegalTransition` if not allowed."""
    try:
        return TRANSITIONS[state, inp]
    except KeyError:
        raise IllegalTransition(f"no transition from {state.name} on {inp.name}") from None


# ---------------------------------------------------------------------------------------
# What to ask for, and how to ask again


@dataclass(frozen=True)
class LeaseSpec:
    """The lease a block asks for (``size`` may be replaced per attempt by
    :meth:`Hooks.size`)."""

    size: Mapping[str, float]
    duration_s: float
    renew_margin_s: float | None = None
    """Renew this long before expiry (None: the client's default)."""
    lease_class: LeaseClass | str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    intent: Intent | None = None
    """An elastic lease: asked for at ``intent.min`` (``size`` and :meth:`Hooks.size` are
    not used), then grown and shrunk by the broker."""


@dataclass(frozen=True)
class Retry:
    """When to ask again: after a refusal, the broker's ``retry_after`` bounded by
    ``[min_s, max_s]`` (``max_s`` when it gave none); ``max_s`` after an unreachable
    broker. With ``refusals=False`` the first refusal ends the block (the engine has its
    own retry loop: Ray's autoscaler)."""

    min_s: float = 0.5
    max_s: float = 10.0
    refusals: bool = True

    def after(self, exc: BaseException) -> float:
        if isinstance(exc, Refused) and math.isfinite(exc.retry_after):
            return min(max(exc.retry_after, self.min_s), self.max_s)
        return self.max_s


# ---------------------------------------------------------------------------------------
# Threads


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on a thread of its own (not the loop's default executor: a stop or a
    drain may block for its whole grace period, and a few of them would fill it)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not fut.done():
            fut.set_result(value) if ok else fut.set_exception(value)

    def main() -> None:
        try:
            out = fn(*args)
        except BaseException as exc:
            ok, value = False, exc
        else:
            ok, value = True, out
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
            loop.call_soon_threadsafe(settle, ok, value)

    threading.Thread(
        target=main, name=f"bursar {getattr(fn, '__name__', 'call')}", daemon=True
    ).start()
    return await fut


# ---------------------------------------------------------------------------------------
# Worker processes


class ProcessTree:
    """The workers of a block: ``popen`` (started with ``start_new_session=True``) and
    everything under it.

    Its members are found when needed (to stop them): the root, its descendants, the
    processes of its session created after it (they outlive a parent that exits), the
    processes whose environment holds ``marker`` (``"NAME=value"``: what a launcher such
    as ``srun`` starts away from our process tree) and their descendants. Each is a
    ``psutil.Process``, which checks its creation time before a signal, so a reused PID
    is never hit. The same works for a tree left by a dead provider (``popen`` None,
    ``pid`` and ``create_time`` from its record)."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes] | None = None,
        *,
        pid: int | None = None,
        create_time: float | None = None,
        marker: str | None = None,
    ) -> None:
        self.popen = popen
        self.pid = popen.pid if popen is not None else pid
        self.marker = marker
        self.create_time = create_time
        if self.create_time is None and self.pid is not None:
            with contextlib.suppress(psutil.Error):
                self.create_time = psutil.Process(self.pid).create_time()

    @classmethod
    def start(
        cls,
        argv: list[str],
        env: dict[str, str],
        stdout_path: str | os.PathLike[str],
        stderr_path: str | os.PathLike[str],
    ) -> ProcessTree:
        """Start a block's workers: ``argv`` in a session of its own (so that the tree can
        be found and stopped whole), stdin closed, stdout and stderr to the given files."""
        with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
            proc = subprocess.Popen(
                argv,
                env=env,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return cls(proc)

    @property
    def returncode(self) -> int | None:
        return self.popen.poll() if self.popen is not None else None

    async def wait(self) -> int | None:
        """The root's exit status, once it exits (a pidfd readable on the loop: no poll).
        A tree not started here (taken over from a dead process: ``pid`` and
        ``create_time`` only) is waited for the same way, but its status is not ours to
        read: None."""
        if self.popen is None:
            return await self._wait_foreign()
        if self.popen.poll() is not None:
            return self.popen.returncode
        try:
            fd = os.pidfd_open(self.popen.pid)
        except (ProcessLookupError, OSError):
            return await in_thread(self.popen.wait)
        await _readable(fd)
        return self.popen.wait()  # it exited: this only reaps it

    async def _wait_foreign(self) -> None:
        if self.pid is None:
            return
        try:
            fd = os.pidfd_open(self.pid)
        except (ProcessLookupError, OSError):
            return  # gone already
        # The pidfd names whatever holds the PID now: only the root if it was born when
        # the root was (checked after opening it, so that a reuse cannot slip between).
        if self._root() is None:
            os.close(fd)
            return
        await _readable(fd)

    def _root(self) -> psutil.Process | None:
        if self.pid is None:
            return None
        try:
            p = psutil.Process(self.pid)
            if self.create_time is not None and abs(p.create_time() - self.create_time) > 0.01:
                return None  # the PID was reused
            return None if p.status() == psutil.STATUS_ZOMBIE else p
        except psutil.Error:
            return None

    def members(self) -> set[psutil.Process]:
        """The live processes of the tree now."""
        me = os.getpid()
        found: dict[int, psutil.Process] = {}
        root = self._root()
        if root is not None:
            found[root.pid] = root
        if self.pid is not None or self.marker:
            needle = self.marker
            born = self.create_time if self.create_time is not None else math.inf
            for p in psutil.process_iter():
                if p.pid in found or p.pid == me:
                    continue
                try:
                    if self.pid is not None and p.create_time() >= born - 0.01:
                        with contextlib.suppress(OSError):
                            if os.getsid(p.pid) == self.pid:
                                found[p.pid] = p
                                continue
                    if needle and needle in _environ(p):
                        found[p.pid] = p
                except psutil.Error:
                    continue
        for p in list(found.values()):
            with contextlib.suppress(psutil.Error):
                for child in p.children(recursive=True):
                    if child.pid != me:
                        found.setdefault(child.pid, child)
        return {p for p in found.values() if _alive(p)}

    def alive(self) -> bool:
        return bool(self.members())

    def stop(
        self, grace_s: float, *, first: Callable[[psutil.Process], bool] | None = None
    ) -> set[psutil.Process]:
        """TERM the tree, wait up to ``grace_s`` for it to go, KILL what is left
        (rescanning for what it started meanwhile). With ``first``, the members it
        selects are TERMed, and waited for up to ``grace_s``, before the rest get
        ``grace_s / 2`` (Ray: the raylet leaves before its workers die). Returns the
        processes signalled. ``grace_s`` 0: KILL at once."""
        seen = self.members()
        if first is not None and grace_s > 0:
            lead = {p for p in seen if _matches(first, p)}
            if lead:
                self._signal(lead, signal.SIGTERM)
                self._wait(lead, grace_s)
                grace_s /= 2
            seen |= self.members()
        if grace_s > 0:
            self._signal(seen, signal.SIGTERM)
            self._wait(seen, grace_s)
            seen |= self.members()
        self._signal(seen, signal.SIGKILL)
        self._wait(seen, 5.0)
        return seen

    def _signal(self, procs: set[psutil.Process], sig: signal.Signals) -> None:
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.send_signal(sig)

    def _wait(self, procs: set[psutil.Process], timeout: float) -> None:
        """Wait up to ``timeout`` for ``procs`` to exit: a pidfd each, polled together (a
        process counts as gone once it exited, reaped or not: a container's PID 1 may
        never reap the orphans)."""
        deadline = time.monotonic() + timeout
        fds: list[int] = []
        try:
            for p in procs:
                try:
                    fd = os.pidfd_open(p.pid)
                except OSError:
                    continue  # gone already
                fds.append(fd)
                if not _alive(p):  # gone, or its PID reused, before the pidfd was opened
                    fds.remove(fd)
                    os.close(fd)
            poller = select.poll()
            for fd in fds:
                poller.register(fd, select.POLLIN)
            left = set(fds)
            while left and (ms := (deadline - time.monotonic()) * 1000) > 0:
                for fd, _ in poller.poll(ms):
                    left.discard(fd)
                    poller.unregister(fd)
        finally:
            for fd in fds:
                os.close(fd)
        if self.popen is not None:
            self.popen.poll()  # reap the root (Popen keeps its exit status)


async def _readable(fd: int) -> None:
    """Wait on the loop until the pidfd ``fd`` is readable (its process exited); closes it."""
    loop = asyncio.get_running_loop()
    exited = asyncio.Event()
    loop.add_reader(fd, exited.set)
    try:
        await exited.wait()
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def _environ(p: psutil.Process) -> set[str]:
    try:
        return {f"{k}={v}" for k, v in p.environ().items()}
    except (psutil.Error, OSError):
        return set()


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _matches(pred: Callable[[psutil.Process], bool], p: psutil.Process) -> bool:
    try:
        return pred(p)
    except psutil.Error:
        return False


# ---------------------------------------------------------------------------------------
# The engine's part


class Hooks:
    """What an engine does at each step of a block's life. The defaults start no
    workers, drain nothing and stop the tree with a 5 s grace."""

    async def size(self, block: Block) -> Mapping[str, float] | None:
        """The size to ask for on this attempt (None: the spec's)."""
        return None

    async def start_workers(self, block: Block, lease: Lease) -> ProcessTree | None:
        """Start the workers on the lease that just became active."""
        return None

    async def drain(self, block: Block, deadline: float | None) -> None:
        """Drain the workers (no new work; let what runs finish) until ``deadline``
        (clock time; None when the broker gave none). Returning ends the drain and stops
        the block; the block cancels it when the lease ends or the block is cancelled."""

    async def stop_workers(self, block: Block, workers: ProcessTree, grace_s: float) -> None:
        await in_thread(workers.stop, grace_s)

    def stop_grace(self, block: Block) -> float:
        """Seconds the workers get between TERM and KILL, given ``block.cause``."""
        return 5.0

    def settle_s(self, block: Block, returncode: int) -> float:
        """How long to wait, after the workers exited with ``returncode``, for the lease's
        end to be reported (Slurm kills the workers of a lost allocation a moment before
        the broker says so)."""
        return 0.0

    async def resize(
        self,
        block: Block,
        lease: Lease,
        warned_to: Mapping[str, float],
        deadline: float | None,
    ) -> None:
        """An elastic lease will shrink to ``warned_to`` at ``deadline`` (server clock):
        stop using the rest (drain the workers on it) before then. ``lease`` is still the
        whole lease. Runs as a task of its own; a newer warning cancels it, and so does
        the block's stop. The default does nothing."""

    async def resized(self, block: Block, lease: Lease) -> None:
        """An elastic lease's size is now ``lease.size`` (``lease.nodes``): grown (use the
        new units now) or shrunk as a warning announced (whatever still runs on the lost
        units must stop). Called for every RESIZED, also one that repeats a size already
        seen (the grant's answer may carry the growth its RESIZED event reports), so it
        compares with what runs. The default does nothing."""

    def changed(self, block: Block, old: State, inp: Input) -> None:
        """Called on the loop after each input is applied (``block.state`` is the new
        state, ``old`` the one before: equal for inputs that change no state)."""


# ---------------------------------------------------------------------------------------
# One block


class Block:
    """One lease and the workers on it. Create it, then :meth:`start` it on the loop
    where ``client`` lives; :meth:`cancel` from the loop (``loop.call_soon_threadsafe``
    from elsewhere); ``answered`` is set once the broker answered the first request,
    ``done`` once the block ended."""

    def __init__(
        self,
        name: str,
        client: AsyncBrokerClient,
        spec: LeaseSpec,
        hooks: Hooks | None = None,
        *,
        retry: Retry | None = None,
        expiry_margin_s: float | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.name = name
        self.client = client
        self.spec = spec
        self.hooks = hooks if hooks is not None else Hooks()
        self.retry = retry if retry is not None else Retry()
        self.expiry_margin_s = expiry_margin_s
        self.clock: Clock = clock if clock is not None else getattr(client, "clock", SYSTEM)
        self.state = State.REQUESTED
        self.cause: Cause | None = None
        self.error: BaseException | None = None
        """The error that failed the block (the rejection of its request, or a bug)."""
        self.last_error: BaseException | None = None
        """The last refusal or unreachable broker."""
        self.refusals: list[str] = []
        """The broker's reason for each refused request, oldest first."""
        self.attempts = 0
        self.retry_at: float | None = None
        self.handle: LeaseHandle | None = None
        self.workers: ProcessTree | None = None
        self.returncode: int | None = None
        self.final: Lease | None = None
        """The lease as released (None: not released, or the broker was unreachable)."""
        self.history: list[tuple[float, State, Input]] = []
        self.answered = asyncio.Event()
        self.done = asyncio.Event()
        self._inbox: asyncio.Queue[tuple[Input, Any]] = asyncio.Queue()
        self._acquiring: asyncio.Task[None] | None = None
        self._granted: LeaseHandle | None = None
        self._posted: set[Input] = set()
        self._timer: asyncio.Task[None] | None = None
        self._guard: asyncio.Task[None] | None = None
        self._drain: asyncio.Task[None] | None = None
        self._resizing: asyncio.Task[None] | None = None
        self._warnings_seen = 0
        self._resizes_seen = 0
        self.warned_to: dict[str, float] | None = None
        """While a shrink is announced: the size the lease shrinks to (else None)."""
        self.resize_deadline: float | None = None
        """While a shrink is announced: when (server clock)."""
        self.resize_history: list[tuple[float, Input, dict[str, float]]] = []
        """Each resize input the block acted on: when, which, and the size it names."""
        self._tasks: set[asyncio.Task[Any]] = set()
        self._task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"<Block {self.name}: {self.state.name}, lease {self.lease_id or '-'}>"

    # ------------------------------------------------------------------ what it is

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    @property
    def lease(self) -> Lease | None:
        return self.handle.lease if self.handle is not None else None

    @property
    def lease_id(self) -> str:
        return self.handle.id if self.handle is not None else ""

    @property
    def lease_ended(self) -> bool:
        return self.handle is not None and self.handle.ended.is_set()

    @property
    def usable(self) -> dict[str, float]:
        """What the holder may use now: the lease's size, or the size a pending
        RESIZE_WARNING shrinks it to (empty before the grant)."""
        if self.warned_to is not None:
            return dict(self.warned_to)
        return dict(self.lease.size) if self.lease is not None else {}

    @property
    def preempt_event(self) -> LeaseEvent | None:
        return self.handle.preempt_event if self.handle is not None else None

    @property
    def end_event(self) -> LeaseEvent | None:
        return self.handle.end_event if self.handle is not None else None

    @property
    def ended_by_broker(self) -> bool:
        """The broker took the lease away (preempted, revoked, expired): not a failure
        of the block."""
        return self.cause in (Cause.PREEMPTED, Cause.REVOKED, Cause.EXPIRED)

    @property
    def refusal(self) -> str:
        """The last refusal in words, for an engine's status line: reason, the broker's
        message, the attempt and when the block asks again."""
        exc = self.last_error
        assert isinstance(exc, Refused)
        return (
            f"{exc.reason}: {exc.message} "
            f"(attempt {self.attempts}; again in {human_duration(self.retry.after(exc))})"
        )

    @property
    def final_state(self) -> str:
        """How the lease ended, in words: ``released``, ``revoked``, ... ``none`` (there
        was none), ``left to expire`` (the broker could not be told)."""
        if self.handle is None:
            return "none"
        return self.final.state.value.lower() if self.final is not None else "left to expire"

    # ------------------------------------------------------------------ control

    def start(self) -> asyncio.Task[None]:
        """Ask for the lease, on the running loop."""
        if self._task is not None:
            raise RuntimeError(f"block {self.name} was started already")
        self._task = asyncio.create_task(self._run(), name=f"bursar block {self.name}")
        self.post(Input.ASK)
        return self._task

    def adopt(self, handle: LeaseHandle, workers: ProcessTree) -> asyncio.Task[None]:
        """Take over, on the running loop, a lease and the workers running on it that a
        process now gone left behind (a restarted engine finding its nodes still up):
        ``handle`` from :meth:`AsyncBrokerClient.adopted_lease` (started: the lease is
        live and renewed from now on), ``workers`` a tree found by PID and start time.
        The block enters RUNNING at once, without :meth:`Hooks.start_workers`, hears the
        lease from here (a preempted lease drains, an ended one stops) and watches the
        workers' root exit; from then on it is like any other block."""
        if self._task is not None:
            raise RuntimeError(f"block {self.name} was started already")
        self._task = asyncio.create_task(self._run(), name=f"bursar block {self.name}")
        self.post(Input.ADOPTED, (handle, workers))
        return self._task

    @property
    def adopted(self) -> bool:
        """The block took over a lease and workers (:meth:`adopt`) rather than asking."""
        return any(inp is Input.ADOPTED for _, _, inp in self.history)

    def cancel(self) -> None:
        """Stop the workers and release the lease (or stop asking for one); idempotent."""
        self.post(Input.CANCEL)

    def post(self, inp: Input, data: Any = None) -> None:
        """Feed the state machine an input (on the loop); dropped once the block ended."""
        if not self.terminal:
            self._inbox.put_nowait((inp, data))

    async def wait(self) -> None:
        await self.done.wait()

    # ------------------------------------------------------------------ the machine

    async def _run(self) -> None:
        try:
            while not self.terminal:
                inp, data = await self._inbox.get()
                try:
                    await self._apply(inp, data)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # a bug or an OS error: stop, release, FAILED
                    log.exception("block %s: %s on %s failed", self.name, self.state.name, inp)
                    if self.error is None:
                        self.error = exc
                    if self.terminal:
                        break
                    try:
                        await self._apply(Input.ERROR, exc)
                    except Exception:
                        log.exception("block %s: failing it failed", self.name)
                        await self._release()
                        self.state = State.FAILED
        finally:
            for t in [*self._tasks]:
                if not t.done():
                    t.cancel()
            if not self.terminal and self.handle is not None:
                # Cancelled from outside (the loop is shutting down): let the lease go.
                with contextlib.suppress(BaseException):
                    await asyncio.shield(self._release())
            self.answered.set()
            self.done.set()

    async def _apply(self, inp: Input, data: Any) -> None:
        old = self.state
        new = transition(old, inp)
        self._note(inp, data, new)
        if new is not old:
            self._leave(old)
            self.state = new
            self.history.append((self.clock.now(), new, inp))
            log.info("block %s: %s -> %s (%s)", self.name, old.name, new.name, inp)
        self.hooks.changed(self, old, inp)
        if inp in _ANSWERS or new.terminal:
            self.answered.set()
        if new is not old:
            await self._enter(new)
        elif inp in (Input.UPDATED, Input.RESIZED, Input.RESIZE_WARNING):
            self._arm_guard()
        if inp in (Input.RESIZE_WARNING, Input.RESIZED):
            await self._on_resize(inp, data)

    def _note(self, inp: Input, data: Any, new: State) -> None:
        """Record what an input says, before the state changes."""
        if inp in (Input.REFUSED, Input.UNREACHABLE, Input.GIVE_UP):
            self.last_error = data
            if isinstance(data, Refused):
                if not self.refusals or self.refusals[-1] != data.reason:
                    # Once per change of reason: a block asking again every few seconds
                    # for the same reason says nothing new.
                    log.info(
                        "block %s: waiting for the broker: %s (%s); it expects about %s",
                        self.name,
                        data.reason,
                        data.message,
                        human_duration(max(0.0, data.retry_after)),
                    )
                self.refusals.append(data.reason)
        elif inp in (Input.REJECTED, Input.ERROR) and self.error is None:
            self.error = data
        elif inp is Input.GRANTED:
            self.handle = data
        elif inp is Input.ADOPTED:
            self.handle, self.workers = data
        elif inp is Input.WORKERS_EXITED:
            self.returncode = data
        elif inp is Input.RESIZE_WARNING:
            self.warned_to = dict(data.resize_to)
            self.resize_deadline = data.deadline
        elif inp is Input.RESIZED and self.lease is not None and self.warned_to is not None:
            # The announced shrink is done (or the lease grew instead): nothing pending.
            self.warned_to = self.resize_deadline = None
        if self.cause is None and (new in (State.DRAINING, State.STOPPING) or new.terminal):
            self.cause = self._lease_end_cause() if inp is Input.LEASE_ENDED else _CAUSE.get(inp)

    def _lease_end_cause(self) -> Cause:
        ev = self.end_event
        if ev is not None:
            return _END_CAUSE.get(ev.kind, Cause.RELEASED)
        state = self.lease.state.value if self.lease is not None else ""
        return {"REVOKED": Cause.REVOKED, "EXPIRED": Cause.EXPIRED}.get(state, Cause.RELEASED)

    def _leave(self, old: State) -> None:
        if old is State.REQUESTED:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self.retry_at = None
        if old is State.ACQUIRING and self._acquiring is not None:
            # Cancelled while asking: the broker withdraws a request whose call is cut
            # (and releases a grant that raced with it).
            self._acquiring.cancel()
        if old is State.DRAINING and self._drain is not None:
            self._drain.cancel()
            self._drain = None
        if old is State.RUNNING and self._resizing is not None:
            # Draining or stopping the whole block supersedes a partial drain.
            self._resizing.cancel()
            self._resizing = None

    async def _enter(self, new: State) -> None:
        if new.terminal and self.handle is None and self._granted is not None:
            # Granted, but cancelled before the grant was taken in: let it go.
            self.handle = self._granted
            await self._release()
        if new is State.REQUESTED:
            assert self.last_error is not None
            self.retry_at = self.clock.now() + self.retry.after(self.last_error)
            self._timer = self._spawn(self._ask_at(self.retry_at))
        elif new is State.ACQUIRING:
            self._acquiring = self._spawn(self._acquire())
        elif new is State.STARTING:
            assert self.handle is not None
            self.handle.add_listener(self._on_lease)
            self._on_lease(self.handle)
            self._arm_guard()
        elif new is State.RUNNING:
            assert self.handle is not None
            if self.adopted:
                # Its workers run already; from here on this block hears the lease (the
                # listener the grant added belonged to the process that is gone).
                self.handle.add_listener(self._on_lease)
                self._on_lease(self.handle)
                self._arm_guard()
            else:
                self.workers = await self.hooks.start_workers(self, self.handle.lease)
            if self.workers is not None and (self.workers.popen is not None or self.adopted):
                self._spawn(self._watch_exit(self.workers))
        elif new is State.DRAINING:
            deadline: float | None = None
            if self.cause is Cause.UNRENEWABLE and self.lease is not None:
                deadline = self.lease.expires_at
            elif self.handle is not None:
                deadline = self.handle.preempt_deadline
            self._drain = self._spawn(self._drain_until(deadline))
        elif new is State.STOPPING:
            await self._stop()

    # ------------------------------------------------------------------ actions

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _ask_at(self, t: float) -> None:
        await self.clock.sleep_until(t)
        self.post(Input.ASK)

    async def _acquire(self) -> None:
        self.attempts += 1
        try:
            intent = self.spec.intent
            size = {} if intent is not None else await self.hooks.size(self) or self.spec.size
            h = self.client.held_lease(
                size,
                self.spec.duration_s,
                renew_margin_s=self.spec.renew_margin_s,
                blocking=False,
                lease_class=self.spec.lease_class,
                labels=dict(self.spec.labels),
                intent=intent,
            )
            await h.start()
        except Refused as exc:
            self.post(Input.REFUSED if self.retry.refusals else Input.GIVE_UP, exc)
        except (Unavailable, DeadlineExceeded) as exc:
            self.post(Input.UNREACHABLE if self.retry.refusals else Input.REJECTED, exc)
        except BursarClientError as exc:
            self.post(Input.REJECTED, exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("block %s: the request failed", self.name)
            self.post(Input.ERROR, exc)
        else:
            self._granted = h
            self.post(Input.GRANTED, h)

    def _on_lease(self, h: LeaseHandle) -> None:
        """The handle's listener: every Watch event, renewal or release of the lease."""
        # Counts, not the latest event alone: the handle may have heard resize events
        # before this listener joined (at the grant), and they still count.
        if h.warnings > self._warnings_seen and h.resize_warning is not None:
            self._warnings_seen = h.warnings
            self.post(Input.RESIZE_WARNING, h.resize_warning)
        if h.resizes > self._resizes_seen:
            self._resizes_seen = h.resizes
            self.post(Input.RESIZED, h.resize_event)
        if h.ended.is_set():
            self._once(Input.LEASE_ENDED)
        elif h.preempted.is_set():
            self._once(Input.PREEMPTED)
        elif h.active.is_set() and Input.ACTIVE not in self._posted:
            self._once(Input.ACTIVE)
        else:
            self.post(Input.UPDATED)

    def _once(self, inp: Input) -> None:
        if inp not in self._posted:
            self._posted.add(inp)
            self.post(inp)

    def _arm_guard(self) -> None:
        """(Re)arm the timer that drains the block ``expiry_margin_s`` before its lease
        expires (renewals move the expiry, and so the timer)."""
        if self.expiry_margin_s is None or self.state not in (State.STARTING, State.RUNNING):
            return
        lease = self.lease
        if lease is None or lease.ended:
            return
        if self._guard is not None:
            self._guard.cancel()
        self._guard = self._spawn(self._unrenewable_at(lease.expires_at - self.expiry_margin_s))

    async def _unrenewable_at(self, t: float) -> None:
        await self.clock.sleep_until(t)
        self.post(Input.UNRENEWABLE)

    async def _watch_exit(self, workers: ProcessTree) -> None:
        rc = await workers.wait()
        settle = self.hooks.settle_s(self, rc) if rc is not None else 0.0
        if settle > 0 and self.handle is not None:
            await wait_event_until(self.clock, self.handle.ended, self.clock.now() + settle)
        self.post(Input.WORKERS_EXITED, rc)

    async def _on_resize(self, inp: Input, data: Any) -> None:
        lease = self.lease
        if lease is None:
            return
        size = dict(data.resize_to) if inp is Input.RESIZE_WARNING else dict(lease.size)
        self.resize_history.append((self.clock.now(), inp, size))
        if self.state is not State.RUNNING:
            return  # not started yet (it starts on `usable`), or letting go of it all
        if inp is Input.RESIZE_WARNING:
            if self._resizing is not None:
                self._resizing.cancel()  # the newer warning says what is left
            self._resizing = self._spawn(self._resize(lease, size, self.resize_deadline))
        else:
            await self.hooks.resized(self, lease)

    async def _resize(
        self, lease: Lease, warned_to: dict[str, float], deadline: float | None
    ) -> None:
        try:
            await self.hooks.resize(self, lease, warned_to, deadline)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the units are taken at the deadline whatever we do
            log.warning("block %s: resize to %s failed: %r", self.name, warned_to, exc)

    async def _drain_until(self, deadline: float | None) -> None:
        try:
            await self.hooks.drain(self, deadline)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the engine could not drain: stop the workers anyway
            log.warning("block %s: drain failed: %r", self.name, exc)
        self.post(Input.DRAINED)

    async def _stop(self) -> None:
        if self._guard is not None:
            self._guard.cancel()
        if self._resizing is not None:
            self._resizing.cancel()
        try:
            if self.workers is not None:
                await self.hooks.stop_workers(self, self.workers, self.hooks.stop_grace(self))
        except Exception:
            log.exception("block %s: could not stop its workers", self.name)
        await self._release()
        self.post(Input.ERROR if self.cause is Cause.ERROR else Input.STOPPED, self.error)

    async def _release(self) -> None:
        h = self.handle
        if h is None:
            return
        try:
            self.final = await h.release()
        except BursarClientError as exc:
            log.warning("block %s: could not release %s (%s): it expires", self.name, h.id, exc)
        with contextlib.suppress(Exception):
            await h.__aexit__(None, None, None)
