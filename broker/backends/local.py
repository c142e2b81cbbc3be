"""A pool backend on this machine's own cores and GPUs, with every lease enforced.

``bursar serve --backend local`` brokers one shared machine (a DGX, a workstation used by
several agents and notebooks). The engine decides as on any pool; this backend makes each
placed lease concrete and keeps its workers inside it:

* The pool comes from :mod:`.local_discovery`: one node (``local000``), or one per NUMA domain.
* ``place`` maps the lease's pieces to concrete CPU ids and GPUs of each node, chosen
  deterministically: free devices first, in id order; a lease whose pieces are fractional
  (two half-CPU leases) shares the least-held device, since a worker cannot be pinned to
  half a CPU. A piece always gets at least one CPU (a process cannot run on none). The
  lease's record (``RUN/leases/<id>/lease.json``) is what the worker wrapper
  (``python -m bursar.providers.local_exec``, which ``providers.launch.launch_argv`` puts in
  front of a worker's command line) reads to pin the worker: CPU affinity, the cgroup,
  ``CUDA_VISIBLE_DEVICES`` (UUIDs) and the BLAS/OpenMP thread counts.
* Where this process may create a delegated cgroup v2 subtree, each lease gets
  ``BASE/bursar-<id>`` with ``cpuset.cpus``, ``memory.max`` and ``pids.max``, and the
  wrapper joins it before exec; elsewhere the cgroup actions are logged as a dry-run plan
  (the affinity and environment are enforced either way). :attr:`LocalPool.mode` says which.
* ``unplace`` (release, expiry, revocation) removes the record (no new worker starts), sends
  SIGTERM to the lease's processes, then SIGKILL to those left after ``kill_grace_s`` (on a
  reaper thread, so the actuator is not held up), and removes the cgroup. A lease's
  processes are those carrying its marker (``BURSAR_LEASE_ID`` and ``BURSAR_LOCAL_RUN`` in
  ``/proc/PID/environ``: every descendant of the wrapper inherits them), the descendants of
  the wrappers registered in its pid files (found even when a worker cleared its
  environment), and those in its cgroup. They are found once, before any signal, and each
  is signalled only while its start time is still the one seen then (a pid the kernel gave
  to another process meanwhile is left alone), so no process outside the lease's own
  process tree is ever signalled.
* Every ``poll_interval_s``, ``due_events`` looks at each lease's processes: workers that
  all exited on their own are logged once (the lease stays: it is the holder's business),
  and a process whose affinity (``Cpus_allowed_list``) or cgroup is not its lease's is
  reported as escaped (log and :attr:`LocalPool.escapes`).
* After a restart ``adopt`` takes the journal's placements back from their records and
  ends the processes of leases that no longer exist.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

from bursar.broker.backends.base import (
    NO_ALLOCATION,
    NO_PIECES,
    BackendError,
    NodeState,
    Pieces,
    PlaceFailed,
    PoolBackend,
    check_clock,
    check_nodes,
)
from bursar.broker.backends.local_discovery import (
    CgroupProbe,
    Gpu,
    NodeDevices,
    format_cpulist,
    parse_cpulist,
)
from bursar.broker.events import Event, LeaseLost

__all__ = [
    "LEASE_ENV",
    "RUN_ENV",
    "LocalPool",
    "LocalSettings",
    "lease_processes",
    "lease_record_path",
]

log = logging.getLogger(__name__)

LEASE_ENV = "BURSAR_LEASE_ID"
RUN_ENV = "BURSAR_LOCAL_RUN"
"""The marker every worker of a lease carries: the lease id and the run directory of the
broker that placed it (two brokers on one machine never claim each other's workers)."""


@dataclass(frozen=True, slots=True)
class LocalSettings:
    run_dir: Path
    """Where lease records live (``leases/<id>/lease.json``, the wrappers' pid files)."""
    kill_grace_s: float = 5.0
    """SIGTERM → SIGKILL at a lease's end."""
    poll_interval_s: float = 1.0
    """How often the lease's processes are checked (exited, escaped)."""
    pids_max: int = 4096
    """Each lease cgroup's ``pids.max``."""


def lease_record_path(run_dir: Path | str, lease_id: str) -> Path:
    return Path(run_dir) / "leases" / lease_id / "lease.json"


@dataclass(slots=True)
class _Lease:
    nodes: tuple[str, ...]
    cpus: dict[str, tuple[int, ...]]
    gpus: dict[str, tuple[Gpu, ...]]
    mem_bytes: int
    cgroup: Path | None = None
    exited_logged: bool = False
    registered: int = 0

    def all_cpus(self) -> list[int]:
        return sorted({c for cs in self.cpus.values() for c in cs})

    def all_gpus(self) -> list[Gpu]:
        return [g for n in self.nodes for g in self.gpus.get(n, ())]


@dataclass(slots=True)
class _Holders:
    cpus: dict[int, set[str]] = field(default_factory=dict)
    gpus: dict[int, set[str]] = field(default_factory=dict)


class LocalPool(PoolBackend):
    """A ``PoolBackend`` over this machine (see the module docstring). Its calls read /proc
    and signal processes, so it is ``slow``: the service drives it from worker threads."""

    slow: ClassVar[bool] = True
    resizes: ClassVar[bool] = True

    def __init__(
        self,
        nodes: Sequence[NodeDevices],
        settings: LocalSettings,
        *,
        cgroup: CgroupProbe | None = None,
    ) -> None:
        if not nodes:
            raise BackendError("the local pool needs at least one node")
        self.settings = settings
        self.run_dir = Path(settings.run_dir).resolve()
        (self.run_dir / "leases").mkdir(parents=True, exist_ok=True)
        self.cgroup = cgroup or CgroupProbe(None, "no cgroup probe given")
        self._nodes = {n.name: n for n in nodes}
        self._state = {n: NodeState.ON for n in self._nodes}
        self._holders = {
            n.name: _Holders({c: set() for c in n.cpus}, {g.index: set() for g in n.gpus})
            for n in nodes
        }
        self._leases: dict[str, _Lease] = {}
        self._lock = threading.RLock()
        self._now = -math.inf
        self._next_poll = -math.inf
        self._due: list[Event] = []
        self._reapers: list[threading.Thread] = []
        self.escapes: list[tuple[str, int, str]] = []
        """(lease, pid, what) for each process found outside its lease's CPUs or cgroup."""
        self.exited: list[str] = []
        """Leases whose workers all exited on their own (each logged once)."""
        self.plan: deque[str] = deque(maxlen=1000)
        """The latest cgroup actions plan mode would have taken (all are logged)."""

    @property
    def mode(self) -> str:
        """``cgroup`` (lease cgroups are made) or ``plan`` (they are only logged)."""
        return self.cgroup.mode

    def describe_mode(self) -> str:
        n = len(self._nodes)
        cpus = sum(len(d.cpus) for d in self._nodes.values())
        gpus = sum(len(d.gpus) for d in self._nodes.values())
        return (
            f"local backend: {n} node(s), {cpus} CPU(s), {gpus} GPU(s); enforcement: affinity "
            f"+ CUDA_VISIBLE_DEVICES + thread counts; cgroups: {self.mode} ({self.cgroup.reason})"
        )

    # -- PoolBackend --------------------------------------------------------------------

    @property
    def boot_latency_s(self) -> float:
        return 0.0

    def node_states(self) -> Mapping[str, NodeState]:
        return MappingProxyType(self._state)

    def placements(self) -> Mapping[str, tuple[str, ...]]:
        with self._lock:
            return MappingProxyType({lid: a.nodes for lid, a in self._leases.items()})

    def start(self, nodes: Iterable[str], now: float) -> None:
        # The machine is on; nothing boots.
        with self._lock:
            check_nodes(nodes, self._state)
            self._advance(now)

    def stop(self, nodes: Iterable[str], now: float) -> None:
        with self._lock:
            check_nodes(nodes, self._state)
            self._advance(now)

    def allocation(self, lease_id: str) -> Mapping[str, str]:
        with self._lock:
            a = self._leases.get(lease_id)
            return self._describe(lease_id, a) if a is not None else NO_ALLOCATION

    def place(
        self, lease_id: str, nodes: Iterable[str], now: float, pieces: Pieces = NO_PIECES
    ) -> None:
        with self._lock:
            names = check_nodes(nodes, self._state)
            self._advance(now)
            if lease_id in self._leases:
                raise BackendError(f"lease {lease_id!r} is already placed")
            a = self._choose(lease_id, names, pieces, prefer=None)
            self._hold(lease_id, a)
            self._leases[lease_id] = a
            try:
                self._make_cgroup(lease_id, a)
                self._write_record(lease_id, a)
            except OSError as exc:
                self._drop(lease_id)
                raise PlaceFailed(f"local: cannot set lease {lease_id} up: {exc}") from None

    def resize(
        self, lease_id: str, nodes: Iterable[str], now: float, pieces: Pieces = NO_PIECES
    ) -> None:
        with self._lock:
            names = check_nodes(nodes, self._state)
            self._advance(now)
            old = self._leases.get(lease_id)
            if old is None:
                raise BackendError(f"lease {lease_id!r} is not placed")
            self._release(lease_id, old)
            # The lease keeps what it has where it can, so a growth does not move its workers.
            a = self._choose(lease_id, names, pieces, prefer=old)
            a.cgroup, a.registered = old.cgroup, old.registered
            self._hold(lease_id, a)
            self._leases[lease_id] = a
            self._set_cgroup_limits(lease_id, a)
            self._write_record(lease_id, a)
            cpus = set(a.all_cpus())
        # Running workers follow the new CPU set (a cgroup's cpuset already moved them).
        for pid in lease_processes(self.run_dir, lease_id):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(pid, cpus)

    def unplace(self, lease_id: str, now: float) -> None:
        with self._lock:
            self._advance(now)
            a = self._leases.get(lease_id)
            if a is None:
                return
            self._drop(lease_id)
        self._end_processes(lease_id, a)

    def due_events(self, now: float) -> list[Event]:
        with self._lock:
            self._advance(now)
            poll = now >= self._next_poll
            if poll:
                self._next_poll = now + self.settings.poll_interval_s
                leases = dict(self._leases)
        if poll:
            for lid, a in sorted(leases.items()):
                self._check(lid, a)
        with self._lock:
            out, self._due = sorted(self._due, key=lambda e: e.at), []
        return out

    def next_event_time(self) -> float | None:
        with self._lock:
            times = [e.at for e in self._due]
            if self._leases:
                times.append(self._next_poll)
            return max(self._now, min(times)) if times else None

    def adopt(
        self,
        nodes: Mapping[str, tuple[NodeState, float | None]],
        placements: Mapping[str, tuple[str, ...]],
        now: float,
    ) -> None:
        check_nodes(nodes, self._state)
        with self._lock:
            self._now = max(self._now, float(now))
            for lid in list(self._leases):
                self._drop(lid, keep_record=True)
            for lid, ns in placements.items():
                a = self._read_record(lid, tuple(ns))
                if a is None:
                    self._due.append(
                        LeaseLost(at=now, lease_id=lid, cause="local: the lease's record is gone")
                    )
                    continue
                self._hold(lid, a)
                self._leases[lid] = a
                log.info("lease %s: re-adopted on CPUs %s", lid, format_cpulist(a.all_cpus()))
            keep = set(self._leases)
        # Whatever runs under our run directory for a lease the journal does not hold ended
        # with the broker: its workers end now.
        for lid in sorted(_leases_with_processes(self.run_dir) - keep):
            log.warning("lease %s: ending the processes of a lease that no longer exists", lid)
            self._end_processes(lid, None)
        for d in sorted((self.run_dir / "leases").iterdir()):
            if d.name not in keep:
                _rmtree(d)

    # -- extras -------------------------------------------------------------------------

    def wait_reaped(self, timeout_s: float = 30.0) -> bool:
        """Wait for the lease-end reapers to finish (tests, shutdown); True if all did."""
        deadline = time.monotonic() + timeout_s
        for t in list(self._reapers):
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._reapers)

    def pool_spec(self) -> Any:
        """The PoolSpec of the nodes this backend was built over (what the config serves)."""
        from bursar.broker.backends.local_discovery import pool_spec

        return pool_spec(list(self._nodes.values()))

    def devices(self, lease_id: str) -> tuple[list[int], list[Gpu]]:
        """The lease's CPU ids and GPUs (empty when it is not placed)."""
        with self._lock:
            a = self._leases.get(lease_id)
            return (a.all_cpus(), a.all_gpus()) if a is not None else ([], [])

    # -- placement ----------------------------------------------------------------------

    def _choose(
        self, lease_id: str, names: tuple[str, ...], pieces: Pieces, prefer: _Lease | None
    ) -> _Lease:
        cpus: dict[str, tuple[int, ...]] = {}
        gpus: dict[str, tuple[Gpu, ...]] = {}
        mem = 0.0
        for n in names:
            piece = pieces.get(n, {})
            dev, held = self._nodes[n], self._holders[n]
            ncpu = max(1, math.ceil(float(piece.get("cpu", 0.0)) - 1e-9))
            ngpu = math.ceil(float(piece.get("gpu", 0.0)) - 1e-9)
            mine_c = set(prefer.cpus.get(n, ())) if prefer else set()
            mine_g = {g.index for g in prefer.gpus.get(n, ())} if prefer else set()
            cpus[n] = tuple(sorted(_pick(ncpu, dev.cpus, held.cpus, mine_c)))
            picked = set(_pick(ngpu, [g.index for g in dev.gpus], held.gpus, mine_g))
            gpus[n] = tuple(g for g in dev.gpus if g.index in picked)
            mem += float(piece.get("mem_gb", 0.0))
        return _Lease(names, cpus, gpus, int(mem * 2**30))

    def _hold(self, lease_id: str, a: _Lease) -> None:
        for n in a.nodes:
            for c in a.cpus[n]:
                self._holders[n].cpus[c].add(lease_id)
            for g in a.gpus[n]:
                self._holders[n].gpus[g.index].add(lease_id)

    def _release(self, lease_id: str, a: _Lease) -> None:
        for n in a.nodes:
            for s in self._holders[n].cpus.values():
                s.discard(lease_id)
            for s in self._holders[n].gpus.values():
                s.discard(lease_id)

    def _drop(self, lease_id: str, *, keep_record: bool = False) -> None:
        a = self._leases.pop(lease_id, None)
        if a is not None:
            self._release(lease_id, a)
        if not keep_record:
            # No new worker starts once the record is gone (the wrapper refuses).
            with contextlib.suppress(FileNotFoundError):
                lease_record_path(self.run_dir, lease_id).unlink()

    def _describe(self, lease_id: str, a: _Lease) -> dict[str, str]:
        out = {
            "backend": "local",
            "lease_id": lease_id,
            "run_dir": str(self.run_dir),
            "nodes": ",".join(a.nodes),
            "cpus": format_cpulist(a.all_cpus()),
            "cpu_count": str(len(a.all_cpus())),
            "gpus": ",".join(g.uuid for g in a.all_gpus()),
            "gpu_indices": ",".join(str(g.index) for g in a.all_gpus()),
            "mem_bytes": str(a.mem_bytes),
            "cgroup_mode": self.mode,
        }
        if a.cgroup is not None:
            out["cgroup"] = str(a.cgroup)
        return out

    def _write_record(self, lease_id: str, a: _Lease) -> None:
        path = lease_record_path(self.run_dir, lease_id)
        (path.parent / "pids").mkdir(parents=True, exist_ok=True)
        record = {
            "allocation": self._describe(lease_id, a),
            "cpus": {n: list(cs) for n, cs in a.cpus.items()},
            "gpus": {n: [g.index for g in gs] for n, gs in a.gpus.items()},
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, sort_keys=True))
        # Atomic, so a wrapper starting meanwhile reads the old record or the new, whole.
        os.replace(tmp, path)

    def _read_record(self, lease_id: str, nodes: tuple[str, ...]) -> _Lease | None:
        try:
            rec = json.loads(lease_record_path(self.run_dir, lease_id).read_text())
        except (OSError, ValueError):
            return None
        if tuple(rec.get("cpus", {})) != nodes:
            return None
        by_index = {n: {g.index: g for g in self._nodes[n].gpus} for n in nodes}
        cpus = {n: tuple(rec["cpus"][n]) for n in nodes}
        gpus = {n: tuple(by_index[n][i] for i in rec["gpus"].get(n, ())) for n in nodes}
        alloc = rec.get("allocation", {})
        cg = alloc.get("cgroup")
        return _Lease(nodes, cpus, gpus, int(alloc.get("mem_bytes", 0)), Path(cg) if cg else None)

    # -- cgroups ------------------------------------------------------------------------

    def _cg_action(self, what: str) -> None:
        self.plan.append(what)
        log.info("cgroup plan (dry run): %s", what)

    def _make_cgroup(self, lease_id: str, a: _Lease) -> None:
        base = self.cgroup.base
        path = (base or Path("<cgroup>")) / f"bursar-{lease_id}"
        if base is None:
            self._cg_action(f"mkdir {path}")
        else:
            path.mkdir(exist_ok=True)
            a.cgroup = path
        self._set_cgroup_limits(lease_id, a, path)

    def _set_cgroup_limits(self, lease_id: str, a: _Lease, path: Path | None = None) -> None:
        path = path or a.cgroup or Path("<cgroup>") / f"bursar-{lease_id}"
        limits = {
            "cpuset.cpus": format_cpulist(a.all_cpus()),
            "memory.max": str(a.mem_bytes) if a.mem_bytes > 0 else "max",
            "pids.max": str(self.settings.pids_max),
        }
        for name, value in limits.items():
            if a.cgroup is None:
                self._cg_action(f"echo {value} > {path / name}")
            else:
                (path / name).write_text(value)

    def _remove_cgroup(self, lease_id: str, a: _Lease | None) -> None:
        if a is None:
            return
        if a.cgroup is None:
            self._cg_action(f"rmdir <cgroup>/bursar-{lease_id}")
            return
        try:
            a.cgroup.rmdir()
        except OSError as exc:
            log.warning("lease %s: cannot remove cgroup %s: %s", lease_id, a.cgroup, exc)

    # -- processes ----------------------------------------------------------------------

    def _tree(self, lease_id: str) -> set[int]:
        """The registered wrappers (each the worker it exec'd) still alive as the process
        that registered (same start time: a reused pid is not it), and their descendants:
        found even when a worker cleared its environment."""
        pid_dir = lease_record_path(self.run_dir, lease_id).parent / "pids"
        roots = set()
        with contextlib.suppress(OSError):
            for f in pid_dir.iterdir():
                with contextlib.suppress(OSError, ValueError):
                    pid = int(f.name)
                    if f.read_text().strip() == str(_start_time(pid)):
                        roots.add(pid)
        return _descendants(roots) if roots else set()

    def _pids(self, lease_id: str, a: _Lease | None) -> list[int]:
        pids = set(lease_processes(self.run_dir, lease_id)) | self._tree(lease_id)
        if a is not None and a.cgroup is not None:
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(p) for p in (a.cgroup / "cgroup.procs").read_text().split())
        pids.discard(os.getpid())
        return sorted(pids)

    def _members(self, lease_id: str, a: _Lease | None) -> dict[int, int]:
        """The lease's live processes now, each with its start time (pid → ticks)."""
        out = {}
        for pid in self._pids(lease_id, a):
            t = _start_time(pid)
            if t is not None and _alive(pid):
                out[pid] = t
        return out

    def _signal(self, pids: Mapping[int, int], sig: int) -> int:
        """Signal the processes of a snapshot that are still the ones it saw (same start
        time: a pid the kernel gave to another process since is left alone)."""
        n = 0
        for pid, started in sorted(pids.items()):
            if pid == os.getpid() or _start_time(pid) != started or not _alive(pid):
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
                n += 1
        return n

    def _end_processes(self, lease_id: str, a: _Lease | None) -> None:
        # One snapshot before any signal: once a parent dies its children are re-parented
        # and no longer found through the ancestry, but they are still the lease's.
        seen = self._members(lease_id, a)
        n = self._signal(seen, signal.SIGTERM)
        if n:
            log.info("lease %s ended: SIGTERM to %d process(es)", lease_id, n)
        grace = self.settings.kill_grace_s
        if not seen:
            # Nothing runs (the common release of a lease whose workers already ended).
            self._finish(lease_id, a)
            return

        def left() -> dict[int, int]:
            now = self._members(lease_id, a)
            now.update((p, t) for p, t in seen.items() if _start_time(p) == t and _alive(p))
            return now

        def reap() -> None:
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and left():
                time.sleep(0.05)
            killed = self._signal(left(), signal.SIGKILL)
            if killed:
                log.warning(
                    "lease %s: SIGKILL to %d process(es) after %ss", lease_id, killed, grace
                )
            end = time.monotonic() + 5.0
            while time.monotonic() < end and left():
                time.sleep(0.02)
            self._finish(lease_id, a)

        t = threading.Thread(target=reap, name=f"bursar-local-reap-{lease_id}", daemon=True)
        with self._lock:
            self._reapers = [r for r in self._reapers if r.is_alive()] + [t]
        t.start()

    def _finish(self, lease_id: str, a: _Lease | None) -> None:
        self._remove_cgroup(lease_id, a)
        with self._lock:
            if lease_id not in self._leases:
                _rmtree(lease_record_path(self.run_dir, lease_id).parent)

    def _check(self, lease_id: str, a: _Lease) -> None:
        pid_dir = lease_record_path(self.run_dir, lease_id).parent / "pids"
        try:
            registered = len(list(pid_dir.iterdir()))
        except OSError:
            registered = 0
        pids = [p for p in self._pids(lease_id, a) if _alive(p)]
        allowed = set(a.all_cpus())
        for pid in pids:
            cpus = _cpus_allowed(pid)
            if cpus is not None and not cpus <= allowed:
                self._escaped(
                    lease_id, pid, f"runs on CPUs {format_cpulist(cpus)}, outside the lease's"
                )
            if a.cgroup is not None:
                cg = _cgroup_of(pid)
                if cg is not None and not cg.endswith(f"/bursar-{lease_id}"):
                    self._escaped(lease_id, pid, f"left its cgroup (now in {cg})")
        with self._lock:
            if registered > a.registered:
                a.registered, a.exited_logged = registered, False
            if registered and not pids and not a.exited_logged:
                a.exited_logged = True
                self.exited.append(lease_id)
                log.info(
                    "lease %s: its %d worker(s) exited on their own; the lease stays",
                    lease_id,
                    registered,
                )

    def _escaped(self, lease_id: str, pid: int, what: str) -> None:
        with self._lock:
            if any(e[:2] == (lease_id, pid) for e in self.escapes):
                return
            self.escapes.append((lease_id, pid, what))
        log.warning("lease %s: process %d escaped: %s", lease_id, pid, what)

    def _advance(self, now: float) -> None:
        # Worker threads may call in a slightly different order than they read the clock.
        self._now = max(self._now, check_clock(now, -math.inf))


# ------------------------------------------------------------------------------ helpers


def _pick(n: int, ids: Sequence[int], holders: Mapping[int, set[str]], mine: set[int]) -> list[int]:
    """``n`` of ``ids``: the lease's own first, then the least held, then the lowest id."""
    order = sorted(ids, key=lambda i: (i not in mine, len(holders.get(i, ())), i))
    return order[:n]


def _marker(run_dir: Path, lease_id: str) -> tuple[bytes, bytes]:
    return f"{LEASE_ENV}={lease_id}".encode(), f"{RUN_ENV}={run_dir}".encode()


def _environ(pid: int) -> list[bytes] | None:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None


def _has_marker(pid: int, run_dir: Path, lease_id: str) -> bool:
    env = _environ(pid)
    if env is None:
        return False
    lease, run = _marker(run_dir, lease_id)
    return lease in env and run in env


def _all_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def lease_processes(run_dir: Path | str, lease_id: str) -> list[int]:
    """The live processes that carry the lease's marker (the wrapper's descendants)."""
    run = Path(run_dir).resolve()
    return [p for p in _all_pids() if _alive(p) and _has_marker(p, run, lease_id)]


def _leases_with_processes(run_dir: Path) -> set[str]:
    run = f"{RUN_ENV}={run_dir}".encode()
    prefix = f"{LEASE_ENV}=".encode()
    out = set()
    for pid in _all_pids():
        env = _environ(pid)
        if env and run in env:
            out.update(e[len(prefix) :].decode() for e in env if e.startswith(prefix))
    return out


def _alive(pid: int) -> bool:
    """Running and not a zombie (a zombie is gone for every purpose but its parent's wait)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: fields start after the last ")".
    return stat.rsplit(")", 1)[1].split()


def _start_time(pid: int) -> int | None:
    f = _stat_fields(pid)
    return int(f[19]) if f is not None else None  # field 22: start time in clock ticks


def _descendants(roots: set[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid in _all_pids():
        f = _stat_fields(pid)
        if f is not None:
            children.setdefault(int(f[1]), []).append(pid)
    out, todo = set(roots), list(roots)
    while todo:
        for c in children.get(todo.pop(), ()):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def _cpus_allowed(pid: int) -> set[int] | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                return set(parse_cpulist(line.split(":", 1)[1]))
    except OSError:
        return None
    return None


def _cgroup_of(pid: int) -> str | None:
    try:
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:].strip()
    except OSError:
        return None
    return None


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def local_pool_from_machine(
    settings: LocalSettings,
    *,
    split_numa: bool = True,
    cgroup_base: Path | None = None,
    reader: Callable[[], Any] | None = None,
) -> tuple[Any, LocalPool]:
    """The discovered PoolSpec and the backend over it (``bursar serve --backend local``)."""
    from bursar.broker.backends.local_discovery import (
        layout_nodes,
        pool_spec,
        probe_cgroup,
        read_machine,
    )

    machine = (reader or read_machine)()
    nodes = layout_nodes(machine, split_numa=split_numa)
    return pool_spec(nodes), LocalPool(nodes, settings, cgroup=probe_cgroup(cgroup_base))
